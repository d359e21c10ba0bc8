// Paged attention and the KV-cache write on CPU, reading K/V in place through the block tables.
//
// Algorithm (flash attention's online softmax, Dao et al. 2022, over paged K/V as in vLLM's CPU
// backend): the work is split into items (sequence, tile of consecutive query tokens). A row is
// one (query token, query head); the rows of KV head h are its group's query heads (query head
// q uses KV head q / group, transformers' repeat_kv order), so every query head of a group
// shares each K/V chunk the item loads. A tile holds up to kRowTile rows per KV head, so its key
// range [lo, hi) is narrow: hi = last token's position + 1 (causal), lo = first position -
// window + 1. Keys are walked block by block through the block table, up to kChunk keys at a
// time, all KV heads of a chunk together (a block's slots are contiguous, so the chunk is one
// linear read; chunks up to kPrefetchChunks ahead are prefetched). Per KV head the chunk is converted to float32 into
// a small per-thread tile (K transposed, V row-major; only keys < hi are read, the rest of the
// tile is zero), scores are a register-blocked outer product, masked per row (k <= p, k > p -
// window) and folded into each row's running (max, sum, float32 accumulator). A slot past a
// sequence's end or outside its window is never read or is masked by selection (never by
// multiplication), so cache garbage, even NaN, cannot reach an output. Every row sees at least
// its own position, so its sum is positive.
//
// Items are independent: at::parallel_for runs them over the intra-op threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

using at::Tensor;
using Vec = at::vec::Vectorized<float>;

constexpr int64_t kChunk = Vec::size();  // keys scored at once: one vector of scores per row
constexpr int64_t kRowTile = 64;         // rows per KV head sharing each converted K/V chunk
constexpr int64_t kMicroRows = 8;        // rows scored together in registers
constexpr int64_t kValueRows = 4;        // rows accumulating values together in registers
constexpr int64_t kPrefetchChunks = 4;   // how far ahead the K/V chunks are prefetched

struct WorkItem {
  int64_t seq;
  int64_t first_token;  // within the sequence's query tokens
  int64_t num_tokens;
};

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
  int64_t num_heads, num_kv_heads, group, head_dim, value_dim, value_dim_padded, block_size;
  float scale;
  int64_t window;            // 0: no sliding window
};

// Per-thread float32 tiles, sized once per parallel chunk; rows of KV head h start at h * tile_rows.
struct Scratch {
  int64_t tile_rows;
  std::vector<float> q, key_t, value, staging, probs, acc, row_max, row_sum, row_pos;
  Scratch(int64_t tile_rows, int64_t num_kv_heads, int64_t head_dim, int64_t value_dim_padded)
      : tile_rows(tile_rows), q(num_kv_heads * tile_rows * head_dim), key_t(num_kv_heads * head_dim * kChunk, 0.f),
        value(num_kv_heads * kChunk * value_dim_padded, 0.f), staging(kChunk * head_dim), probs(num_kv_heads * tile_rows * kChunk),
        acc(num_kv_heads * tile_rows * value_dim_padded), row_max(num_kv_heads * tile_rows),
        row_sum(num_kv_heads * tile_rows), row_pos(tile_rows) {}
};

// scores[r] = sum_d q[r][d] * key_t[d][:], one vector of kChunk keys per row.
template <int R>
inline void score_rows(const float* q, int64_t head_dim, const float* key_t, Vec* scores) {
  Vec acc[R];
  for (int r = 0; r < R; ++r) acc[r] = Vec(0.f);
  for (int64_t d = 0; d < head_dim; ++d) {
    const Vec k = Vec::loadu(key_t + d * kChunk);
    for (int r = 0; r < R; ++r) acc[r] = at::vec::fmadd(Vec(q[r * head_dim + d]), k, acc[r]);
  }
  for (int r = 0; r < R; ++r) scores[r] = acc[r];
}

inline void score_micro_tile(int64_t rows, const float* q, int64_t head_dim, const float* key_t, Vec* scores) {
  switch (rows) {
    case 1: score_rows<1>(q, head_dim, key_t, scores); break;
    case 2: score_rows<2>(q, head_dim, key_t, scores); break;
    case 3: score_rows<3>(q, head_dim, key_t, scores); break;
    case 4: score_rows<4>(q, head_dim, key_t, scores); break;
    default: score_rows<kMicroRows>(q, head_dim, key_t, scores); break;
  }
}

// acc[r][:] += sum_c probs[r][c] * value[c][:] for R rows over `count` keys (value rows zero-padded).
template <int R>
inline void accumulate_rows(const float* probs, int64_t count, const float* value, int64_t dim_padded,
                            float* acc) {
  constexpr int64_t kUnroll = 4;
  constexpr int64_t step = Vec::size();
  int64_t d = 0;
  for (; d + kUnroll * step <= dim_padded; d += kUnroll * step) {
    Vec a[R][kUnroll];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < kUnroll; ++u) a[r][u] = Vec::loadu(acc + r * dim_padded + d + u * step);
    for (int64_t c = 0; c < count; ++c) {
      Vec v[kUnroll];
      for (int u = 0; u < kUnroll; ++u) v[u] = Vec::loadu(value + c * dim_padded + d + u * step);
      for (int r = 0; r < R; ++r) {
        const Vec p(probs[r * kChunk + c]);
        for (int u = 0; u < kUnroll; ++u) a[r][u] = at::vec::fmadd(p, v[u], a[r][u]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < kUnroll; ++u) a[r][u].store(acc + r * dim_padded + d + u * step);
  }
  for (; d < dim_padded; d += step) {
    for (int r = 0; r < R; ++r) {
      Vec a = Vec::loadu(acc + r * dim_padded + d);
      for (int64_t c = 0; c < count; ++c)
        a = at::vec::fmadd(Vec(probs[r * kChunk + c]), Vec::loadu(value + c * dim_padded + d), a);
      a.store(acc + r * dim_padded + d);
    }
  }
}

inline void accumulate_values(int64_t rows, const float* probs, int64_t count, const float* value,
                              int64_t dim_padded, float* acc) {
  int64_t r = 0;
  for (; r + kValueRows <= rows; r += kValueRows)
    accumulate_rows<kValueRows>(probs + r * kChunk, count, value, dim_padded, acc + r * dim_padded);
  for (; r < rows; ++r) accumulate_rows<1>(probs + r * kChunk, count, value, dim_padded, acc + r * dim_padded);
}

// Fold one micro tile's scores into its rows' running max and sum; writes the rows' probabilities.
inline void softmax_update(const Vec* scores, int64_t rows, const float* row_pos, const Vec& key_pos,
                           float last_key, int64_t window, float* row_max, float* row_sum, float* probs,
                           float* acc, int64_t dim_padded) {
  const Vec neg_inf(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    const float pos = row_pos[r];
    auto visible = key_pos <= Vec(std::min(pos, last_key));
    if (window > 0) visible = visible & (key_pos > Vec(pos - static_cast<float>(window)));
    const Vec masked = Vec::blendv(neg_inf, scores[r], visible);
    const float chunk_max =
        at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, masked);
    const float new_max = std::max(row_max[r], chunk_max);
    float* p = probs + r * kChunk;
    if (new_max == -std::numeric_limits<float>::infinity()) {  // no visible key yet
      Vec(0.f).store(p);
      continue;
    }
    const Vec e = Vec::blendv(Vec(0.f), (masked - Vec(new_max)).exp_u20(), visible);
    e.store(p);
    const float rescale = std::exp(row_max[r] - new_max);
    row_sum[r] = row_sum[r] * rescale + at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, e);
    row_max[r] = new_max;
    if (rescale != 1.f) {
      float* a = acc + r * dim_padded;
      for (int64_t d = 0; d < dim_padded; d += Vec::size()) (Vec::loadu(a + d) * Vec(rescale)).store(a + d);
    }
  }
}

// Prefetch the cache slots of the chunk starting at key position `start` (one contiguous run per cache).
template <typename T>
inline void prefetch_chunk(const Problem<T>& p, const int32_t* table, int64_t start, int64_t hi) {
  if (start >= hi) return;
  const int64_t offset = start % p.block_size;
  const int64_t count = std::min({kChunk, p.block_size - offset, hi - start});
  const int64_t slot = static_cast<int64_t>(table[start / p.block_size]) * p.block_size + offset;
  const char* k = reinterpret_cast<const char*>(p.key_cache + slot * p.num_kv_heads * p.head_dim);
  const char* v = reinterpret_cast<const char*>(p.value_cache + slot * p.num_kv_heads * p.value_dim);
  const int64_t key_bytes = count * p.num_kv_heads * p.head_dim * int64_t(sizeof(T));
  const int64_t value_bytes = count * p.num_kv_heads * p.value_dim * int64_t(sizeof(T));
  for (int64_t b = 0; b < key_bytes; b += 64) __builtin_prefetch(k + b);
  for (int64_t b = 0; b < value_bytes; b += 64) __builtin_prefetch(v + b);
}

template <typename T>
void attend_item(const Problem<T>& p, const WorkItem& item, Scratch& s) {
  const int64_t D = p.head_dim, DV = p.value_dim, DVP = p.value_dim_padded, KVH = p.num_kv_heads;
  const int64_t token0 = p.query_start_loc[item.seq] + item.first_token;
  const int64_t query_len = p.query_start_loc[item.seq + 1] - p.query_start_loc[item.seq];
  const int64_t seq_len = p.seq_lens[item.seq];
  const int64_t first_pos = seq_len - query_len + item.first_token;  // position of the tile's first token
  const int64_t rows = item.num_tokens * p.group;  // per KV head
  const int64_t tile = s.tile_rows;

  for (int64_t h = 0; h < KVH; ++h) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t token = i / p.group, head = h * p.group + i % p.group;
      const T* q = p.query + (token0 + token) * p.num_heads * D + head * D;
      float* qs = s.q.data() + (h * tile + i) * D;
      for (int64_t d = 0; d < D; ++d) qs[d] = static_cast<float>(q[d]) * p.scale;
    }
  }
  for (int64_t i = 0; i < rows; ++i) s.row_pos[i] = static_cast<float>(first_pos + i / p.group);
  for (int64_t h = 0; h < KVH; ++h) {  // only the rows this item uses (a decode uses `group` of `tile`)
    std::fill_n(s.row_max.begin() + h * tile, rows, -std::numeric_limits<float>::infinity());
    std::fill_n(s.row_sum.begin() + h * tile, rows, 0.f);
    std::fill_n(s.acc.begin() + h * tile * DVP, rows * DVP, 0.f);
  }

  const int64_t hi = first_pos + item.num_tokens;
  const int64_t lo = p.window > 0 ? std::max<int64_t>(0, first_pos - p.window + 1) : 0;
  const int32_t* table = p.block_tables + item.seq * p.block_table_stride;
  const int64_t slot_elems = KVH * D, slot_value_elems = KVH * DV;
  Vec scores[kMicroRows];

  for (int64_t start = lo; start < hi;) {
    const int64_t block_index = start / p.block_size;
    const int64_t offset = start % p.block_size;
    const int64_t count = std::min({kChunk, p.block_size - offset, hi - start});
    const int64_t slot0 = static_cast<int64_t>(table[block_index]) * p.block_size + offset;
    const int64_t next = start + count;
    // The hardware prefetcher cannot guess the next block: ask for the chunks kPrefetchChunks ahead.
    if (start == lo)
      for (int64_t ahead = 1; ahead < kPrefetchChunks; ++ahead) prefetch_chunk(p, table, start + ahead * kChunk, hi);
    prefetch_chunk(p, table, start + kPrefetchChunks * kChunk, hi);
    const Vec key_pos = Vec::arange(static_cast<float>(start), 1.f);
    const float last_key = static_cast<float>(start + count - 1);
    // Convert the chunk's keys (transposed) and values of every KV head, reading its slots in
    // memory order; lanes >= count stay zero (never cache data).
    for (int64_t h = 0; h < KVH; ++h) {
      const T* k = p.key_cache + slot0 * slot_elems + h * D;
      float* kt = s.key_t.data() + h * D * kChunk;
      if constexpr (std::is_same_v<T, float>) {
        at::vec::transpose_mxn<float>(k, slot_elems, kt, kChunk, static_cast<int>(count), static_cast<int>(D));
      } else {
        for (int64_t c = 0; c < count; ++c)
          for (int64_t d = 0; d < D; ++d) s.staging[c * D + d] = static_cast<float>(k[c * slot_elems + d]);
        at::vec::transpose_mxn<float>(s.staging.data(), D, kt, kChunk, static_cast<int>(count), static_cast<int>(D));
      }
      for (int64_t c = 0; c < count; ++c) {
        const T* v = p.value_cache + (slot0 + c) * slot_value_elems + h * DV;
        float* vrow = s.value.data() + (h * kChunk + c) * DVP;
        for (int64_t d = 0; d < DV; ++d) vrow[d] = static_cast<float>(v[d]);
      }
    }
    if (count < kChunk) {
      for (int64_t h = 0; h < KVH; ++h) {
        for (int64_t d = 0; d < D; ++d)
          std::fill_n(s.key_t.data() + (h * D + d) * kChunk + count, kChunk - count, 0.f);
        std::fill_n(s.value.data() + (h * kChunk + count) * DVP, (kChunk - count) * DVP, 0.f);
      }
    }
    for (int64_t h = 0; h < KVH; ++h) {
      const int64_t base = h * tile;
      for (int64_t r0 = 0; r0 < rows; r0 += kMicroRows) {
        const int64_t micro = std::min(kMicroRows, rows - r0);
        score_micro_tile(micro, s.q.data() + (base + r0) * D, D, s.key_t.data() + h * D * kChunk, scores);
        softmax_update(scores, micro, s.row_pos.data() + r0, key_pos, last_key, p.window,
                       s.row_max.data() + base + r0, s.row_sum.data() + base + r0,
                       s.probs.data() + (base + r0) * kChunk, s.acc.data() + (base + r0) * DVP, DVP);
      }
      accumulate_values(rows, s.probs.data() + base * kChunk, count, s.value.data() + h * kChunk * DVP, DVP,
                        s.acc.data() + base * DVP);
    }
    start = next;
  }

  for (int64_t h = 0; h < KVH; ++h) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t token = i / p.group, head = h * p.group + i % p.group;
      T* o = p.out + (token0 + token) * p.num_heads * DV + head * DV;
      const float* a = s.acc.data() + (h * tile + i) * DVP;
      const float inv = 1.f / s.row_sum[h * tile + i];
      for (int64_t d = 0; d < DV; ++d) o[d] = static_cast<T>(a[d] * inv);
    }
  }
}

// Calls fn(T{}) for the cache dtypes the kernels handle: float32, bfloat16, float16.
template <typename Fn>
void dispatch_cache_dtype(at::ScalarType dtype, const Fn& fn) {
  switch (dtype) {
    case at::kFloat: fn(float{}); break;
    case at::kBFloat16: fn(c10::BFloat16{}); break;
    case at::kHalf: fn(c10::Half{}); break;
    default: TORCH_CHECK(false, "the native CPU kernels take float32, bfloat16 or float16, got ", dtype);
  }
}

void check_cpu_contiguous(const Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == dim, name, " must be ", dim, "-d, got ", t.dim(), "-d");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

Tensor paged_attention_cpu(const Tensor& query, const Tensor& key_cache, const Tensor& value_cache,
                           const Tensor& block_tables, const Tensor& seq_lens, const Tensor& query_start_loc,
                           double scale, std::optional<int64_t> sliding_window) {
  check_cpu_contiguous(query, "query", 3);
  check_cpu_contiguous(key_cache, "key_cache", 4);
  check_cpu_contiguous(value_cache, "value_cache", 4);
  check_cpu_contiguous(block_tables, "block_tables", 2);
  check_cpu_contiguous(seq_lens, "seq_lens", 1);
  check_cpu_contiguous(query_start_loc, "query_start_loc", 1);
  TORCH_CHECK(key_cache.scalar_type() == query.scalar_type() && value_cache.scalar_type() == query.scalar_type(),
              "query, key_cache and value_cache must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  query_start_loc.scalar_type() == at::kInt,
              "block_tables, seq_lens and query_start_loc must be int32");
  const int64_t num_seqs = seq_lens.size(0);
  TORCH_CHECK(query_start_loc.size(0) == num_seqs + 1 && block_tables.size(0) == num_seqs,
              "seq_lens, query_start_loc and block_tables disagree on the number of sequences");
  const int64_t num_heads = query.size(1), num_kv_heads = key_cache.size(2);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(query.size(2) == key_cache.size(3), "query and key_cache head_dim differ");
  TORCH_CHECK(value_cache.size(0) == key_cache.size(0) && value_cache.size(1) == key_cache.size(1) &&
                  value_cache.size(2) == num_kv_heads,
              "value_cache's blocks differ from key_cache's");
  const int64_t window = sliding_window.value_or(0);
  TORCH_CHECK(window >= 0, "sliding_window must be positive or None");

  const int64_t value_dim = value_cache.size(3);
  Tensor out = at::empty({query.size(0), num_heads, value_dim}, query.options());
  const int64_t group = num_heads / num_kv_heads;
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const int64_t block_size = key_cache.size(1);
  const int64_t table_width = block_tables.size(1);
  const int64_t tile_tokens = std::max<int64_t>(1, kRowTile / group);
  std::vector<WorkItem> items;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t query_len = starts[seq + 1] - starts[seq];
    TORCH_CHECK(query_len >= 1 && query_len <= lens[seq], "sequence ", seq, ": query length ", query_len,
                " must be in [1, seq_len = ", lens[seq], "]");
    TORCH_CHECK((lens[seq] + block_size - 1) / block_size <= table_width, "sequence ", seq,
                ": block_tables has too few columns for seq_len ", lens[seq]);
    for (int64_t first = 0; first < query_len; first += tile_tokens)
      items.push_back({seq, first, std::min(tile_tokens, query_len - first)});
  }
  const int64_t step = Vec::size();
  const auto run = [&](auto zero) {
    using scalar_t = decltype(zero);
    const Problem<scalar_t> problem{
        query.data_ptr<scalar_t>(), key_cache.data_ptr<scalar_t>(), value_cache.data_ptr<scalar_t>(),
        out.data_ptr<scalar_t>(), block_tables.data_ptr<int32_t>(), table_width, lens, starts,
        num_heads, num_kv_heads, group, query.size(2), value_dim, (value_dim + step - 1) / step * step,
        block_size, static_cast<float>(scale), window};
    at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
      Scratch scratch(tile_tokens * group, num_kv_heads, problem.head_dim, problem.value_dim_padded);
      for (int64_t i = begin; i < end; ++i) attend_item(problem, items[i], scratch);
    });
  };
  dispatch_cache_dtype(query.scalar_type(), run);
  return out;
}

void write_kv_cpu(const Tensor& key, const Tensor& value, const Tensor& key_cache, const Tensor& value_cache,
                  const Tensor& slot_mapping) {
  check_cpu_contiguous(key_cache, "key_cache", 4);
  check_cpu_contiguous(value_cache, "value_cache", 4);
  check_cpu_contiguous(slot_mapping, "slot_mapping", 1);
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "slot_mapping must be int64");
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3, "key and value must be [num_tokens, num_kv_heads, head_dim]");
  TORCH_CHECK(key.stride(2) == 1 && value.stride(2) == 1, "key and value need a unit-stride last dimension");
  TORCH_CHECK(key.scalar_type() == key_cache.scalar_type() && value.scalar_type() == value_cache.scalar_type(),
              "key/value must have their cache's dtype");
  const int64_t num_tokens = slot_mapping.size(0);
  TORCH_CHECK(key.size(0) == num_tokens && value.size(0) == num_tokens, "slot_mapping has ", num_tokens,
              " entries, key has ", key.size(0));
  TORCH_CHECK(key.size(1) == key_cache.size(2) && key.size(2) == key_cache.size(3) &&
                  value.size(1) == value_cache.size(2) && value.size(2) == value_cache.size(3),
              "key/value heads or head_dim differ from the caches'");
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_tokens; ++t)
    TORCH_CHECK(slots[t] < num_slots, "slot_mapping[", t, "] = ", slots[t], " is out of range [0, ", num_slots, ")");
  const int64_t kv_heads = key.size(1), head_dim = key.size(2), value_dim = value.size(2);
  dispatch_cache_dtype(key_cache.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* k = key.data_ptr<scalar_t>();
    const scalar_t* v = value.data_ptr<scalar_t>();
    scalar_t* kc = key_cache.data_ptr<scalar_t>();
    scalar_t* vc = value_cache.data_ptr<scalar_t>();
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (slots[t] < 0) continue;  // a padding token writes nothing
      for (int64_t h = 0; h < kv_heads; ++h) {
        std::copy_n(k + t * key.stride(0) + h * key.stride(1), head_dim,
                    kc + (slots[t] * kv_heads + h) * head_dim);
        std::copy_n(v + t * value.stride(0) + h * value.stride(1), value_dim,
                    vc + (slots[t] * kv_heads + h) * value_dim);
      }
    }
  });
}

}  // namespace

// The schemas are defined in Python (pagedinfer/kernels/cpu/ops.py) with their fake kernels.
TORCH_LIBRARY_IMPL(pagedinfer, CPU, m) {
  m.impl("cpu_paged_attention", &paged_attention_cpu);
  m.impl("cpu_write_kv", &write_kv_cpu);
}
