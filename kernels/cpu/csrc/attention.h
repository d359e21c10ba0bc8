// What the CPU paged-attention kernels share: the problem of one call, its work items, the
// key-chunk walk and its prefetch, and the kernels' entry points (one per instruction set).
//
// Every translation unit here is compiled for the baseline x86-64 (no -march): a kernel for a
// wider instruction set marks its functions with a target attribute (attention_avx512.cpp) or its
// translation unit with a target pragma (attention_vec_avx2.cpp, attention_vec_avx512.cpp) and
// runs only where `isa.cpp` found that set at run time, so the library runs on any x86-64 CPU.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pagedinfer_cpu {

constexpr int64_t kChunk = 16;          // keys scored at once (one block's slots, never across blocks)
constexpr int64_t kRowTile = 64;        // rows (query token x query head) per KV head in one work item
constexpr int64_t kPrefetchChunks = 1;  // how many K/V chunks ahead are prefetched

struct WorkItem {
  int64_t seq;
  int64_t first_token;  // within the sequence's query tokens
  int64_t num_tokens;
};

// One call. A row is one (query token, query head); the rows of KV head h are its group's query
// heads (query head q uses KV head q / group, transformers' repeat_kv order).
template <typename T>
struct Problem {
  const T* query;            // [num_tokens, num_heads, head_dim]
  const T* key_cache;        // [num_blocks, block_size, num_kv_heads, head_dim]
  const T* value_cache;      // [num_blocks, block_size, num_kv_heads, value_dim]
  T* out;                    // [num_tokens, num_heads, value_dim]
  const int32_t* block_tables;
  int64_t block_table_stride;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;
  int64_t num_heads, num_kv_heads, group, head_dim, value_dim, block_size;
  float scale;
  int64_t window;            // 0: no sliding window
};

// Where an item's rows sit and which keys they see: keys [lo, hi), causal (hi = last token's
// position + 1) and, with a window W, lo = first position - W + 1.
struct ItemSpan {
  int64_t token0;     // first query token of the item in the packed batch
  int64_t first_pos;  // position of that token in its sequence
  int64_t rows;       // rows per KV head: num_tokens * group
  int64_t lo, hi;
};

template <typename T>
inline ItemSpan item_span(const Problem<T>& p, const WorkItem& item) {
  const int64_t query_len = p.query_start_loc[item.seq + 1] - p.query_start_loc[item.seq];
  const int64_t first_pos = p.seq_lens[item.seq] - query_len + item.first_token;
  const int64_t lo = p.window > 0 ? std::max<int64_t>(0, first_pos - p.window + 1) : 0;
  return {p.query_start_loc[item.seq] + item.first_token, first_pos, item.num_tokens * p.group, lo,
          first_pos + item.num_tokens};
}

// The chunk starting at key position `start`: up to kChunk keys, all in one block (a block's
// slots are contiguous, so one linear read per cache covers every KV head of the chunk).
struct Chunk {
  int64_t count;  // keys in the chunk
  int64_t slot0;  // cache slot of its first key
};

template <typename T>
inline Chunk chunk_at(const Problem<T>& p, const int32_t* table, int64_t start, int64_t hi) {
  const int64_t offset = start % p.block_size;
  const int64_t count = std::min({kChunk, p.block_size - offset, hi - start});
  return {count, static_cast<int64_t>(table[start / p.block_size]) * p.block_size + offset};
}

// Prefetch the cache slots of the chunk starting at key position `start` (`_MM_HINT_T1`:
// locality 2). One chunk ahead is enough: a chunk's work (every KV head's 16 keys and values)
// takes longer than a memory access, and a chunk of every KV head is 8-32 KB of K and as much of
// V, so more chunks in flight would evict each other from the L1 before their use.
template <typename T>
inline void prefetch_chunk(const Problem<T>& p, const int32_t* table, int64_t start, int64_t hi) {
  if (start >= hi) return;
  const Chunk c = chunk_at(p, table, start, hi);
  const char* k = reinterpret_cast<const char*>(p.key_cache + c.slot0 * p.num_kv_heads * p.head_dim);
  const char* v = reinterpret_cast<const char*>(p.value_cache + c.slot0 * p.num_kv_heads * p.value_dim);
  const int64_t key_bytes = c.count * p.num_kv_heads * p.head_dim * int64_t(sizeof(T));
  const int64_t value_bytes = c.count * p.num_kv_heads * p.value_dim * int64_t(sizeof(T));
  for (int64_t b = 0; b < key_bytes; b += 64) __builtin_prefetch(k + b, 0, 2);
  for (int64_t b = 0; b < value_bytes; b += 64) __builtin_prefetch(v + b, 0, 2);
}

// The hardware prefetcher cannot guess the next block: every chunk asks for the one
// kPrefetchChunks ahead; the walk's first kPrefetchChunks were asked for by `prefetch_item`.
template <typename T>
inline void prefetch_ahead(const Problem<T>& p, const int32_t* table, int64_t start, int64_t hi) {
  prefetch_chunk(p, table, start + kPrefetchChunks * kChunk, hi);
}

// The first kPrefetchChunks chunks of an item's walk, asked for one item ahead (a decode's whole
// walk is a few dozen chunks: without this, each sequence's first chunks would wait on memory).
template <typename T>
inline void prefetch_item(const Problem<T>& p, const WorkItem& item) {
  const ItemSpan span = item_span(p, item);
  const int32_t* table = p.block_tables + item.seq * p.block_table_stride;
  for (int64_t ahead = 0; ahead < kPrefetchChunks; ++ahead) prefetch_chunk(p, table, span.lo + ahead * kChunk, span.hi);
}

// Runs attend(item) over items [begin, end), each next item's first chunks prefetched first.
template <typename T, typename Attend>
inline void walk_items(const Problem<T>& p, const std::vector<WorkItem>& items, int64_t begin, int64_t end,
                       const Attend& attend) {
  if (begin < end) prefetch_item(p, items[begin]);
  for (int64_t i = begin; i < end; ++i) {
    if (i + 1 < end) prefetch_item(p, items[i + 1]);
    attend(items[i]);
  }
}

// The at::vec kernel (any dtype, any head_dim, attention_vec.h), one per instruction set:
// generic vectors (any CPU), AVX2 and AVX-512, each run only where isa.cpp found its set.
template <typename T>
void attend_vec_default(const Problem<T>& p, const std::vector<WorkItem>& items, int64_t tile_rows);
template <typename T>
void attend_vec_avx2(const Problem<T>& p, const std::vector<WorkItem>& items, int64_t tile_rows);
template <typename T>
void attend_vec_avx512(const Problem<T>& p, const std::vector<WorkItem>& items, int64_t tile_rows);

// The AVX-512 kernel (float32 and bfloat16): attention_avx512.cpp. `avx512_fits` says whether it
// takes this problem (dtype and head sizes); it runs only where `isa.cpp` found AVX-512 at run
// time, and scores bfloat16 with avx512_bf16's dot product where `bf16_dot` (that set found too).
template <typename T>
bool avx512_fits(const Problem<T>& p);
template <typename T>
void attend_avx512(const Problem<T>& p, const std::vector<WorkItem>& items, int64_t tile_rows, bool bf16_dot);

}  // namespace pagedinfer_cpu
