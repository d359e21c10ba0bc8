// The `at::vec` CPU paged attention: any cache dtype, any head_dim; the fallback where
// attention_avx512.cpp does not run. Included by one translation unit per instruction set
// (attention_vec_{default,avx2,avx512}.cpp), each defining PI_VEC_ENTRY (the entry's name) and,
// for a wider set, CPU_CAPABILITY as ATen does and the matching `#pragma GCC target` first.
//
// Algorithm (flash attention's online softmax, Dao et al. 2022, over paged K/V as in vLLM's CPU
// backend): per work item (sequence, tile of query tokens) and key chunk (up to one vector of keys
// of one block), every KV head's keys (transposed) and values are converted to float32 into a
// small per-thread tile (only keys < hi are read, the rest of the tile is zero); scores are a
// register-blocked outer product, masked per row (k <= p, k > p - window) by selection (never by
// multiplication, so cache garbage, even NaN, cannot reach an output) and folded into each row's
// running (max, sum, float32 accumulator). Every row sees at least its own position, so its sum is
// positive.

#pragma once

#include "attention.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <limits>
#include <type_traits>

namespace pagedinfer_cpu {
namespace {

using Vec = at::vec::Vectorized<float>;

constexpr int64_t kVecChunk = Vec::size();  // keys scored at once: one vector of scores per row
constexpr int64_t kMicroRows = 8;           // rows scored together in registers
constexpr int64_t kValueRows = 4;           // rows accumulating values together in registers

// Per-thread float32 tiles, sized once per parallel chunk; rows of KV head h start at h * tile_rows.
struct Scratch {
  int64_t tile_rows, value_dim_padded;
  std::vector<float> q, key_t, value, staging, probs, acc, row_max, row_sum, row_pos;
  Scratch(int64_t tile_rows, int64_t num_kv_heads, int64_t head_dim, int64_t value_dim_padded)
      : tile_rows(tile_rows), value_dim_padded(value_dim_padded), q(num_kv_heads * tile_rows * head_dim),
        key_t(num_kv_heads * head_dim * kVecChunk, 0.f), value(num_kv_heads * kVecChunk * value_dim_padded, 0.f),
        staging(kVecChunk * head_dim), probs(num_kv_heads * tile_rows * kVecChunk),
        acc(num_kv_heads * tile_rows * value_dim_padded), row_max(num_kv_heads * tile_rows),
        row_sum(num_kv_heads * tile_rows), row_pos(tile_rows) {}
};

// scores[r] = sum_d q[r][d] * key_t[d][:], one vector of kVecChunk keys per row.
template <int R>
inline void score_rows(const float* q, int64_t head_dim, const float* key_t, Vec* scores) {
  Vec acc[R];
  for (int r = 0; r < R; ++r) acc[r] = Vec(0.f);
  for (int64_t d = 0; d < head_dim; ++d) {
    const Vec k = Vec::loadu(key_t + d * kVecChunk);
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
        const Vec p(probs[r * kVecChunk + c]);
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
        a = at::vec::fmadd(Vec(probs[r * kVecChunk + c]), Vec::loadu(value + c * dim_padded + d), a);
      a.store(acc + r * dim_padded + d);
    }
  }
}

inline void accumulate_values(int64_t rows, const float* probs, int64_t count, const float* value,
                              int64_t dim_padded, float* acc) {
  int64_t r = 0;
  for (; r + kValueRows <= rows; r += kValueRows)
    accumulate_rows<kValueRows>(probs + r * kVecChunk, count, value, dim_padded, acc + r * dim_padded);
  for (; r < rows; ++r) accumulate_rows<1>(probs + r * kVecChunk, count, value, dim_padded, acc + r * dim_padded);
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
    float* p = probs + r * kVecChunk;
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

template <typename T>
void attend_item(const Problem<T>& p, const WorkItem& item, Scratch& s) {
  const int64_t D = p.head_dim, DV = p.value_dim, DVP = s.value_dim_padded, KVH = p.num_kv_heads;
  const ItemSpan span = item_span(p, item);
  const int64_t token0 = span.token0, first_pos = span.first_pos, rows = span.rows;
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

  const int64_t hi = span.hi, lo = span.lo;
  const int32_t* table = p.block_tables + item.seq * p.block_table_stride;
  const int64_t slot_elems = KVH * D, slot_value_elems = KVH * DV;
  Vec scores[kMicroRows];

  for (int64_t start = lo; start < hi;) {
    const Chunk chunk = chunk_at(p, table, start, std::min(hi, start + kVecChunk));
    const int64_t count = chunk.count, slot0 = chunk.slot0;
    const int64_t next = start + count;
    prefetch_ahead(p, table, start, hi);
    const Vec key_pos = Vec::arange(static_cast<float>(start), 1.f);
    const float last_key = static_cast<float>(start + count - 1);
    // Convert the chunk's keys (transposed) and values of every KV head, reading its slots in
    // memory order; lanes >= count stay zero (never cache data).
    for (int64_t h = 0; h < KVH; ++h) {
      const T* k = p.key_cache + slot0 * slot_elems + h * D;
      float* kt = s.key_t.data() + h * D * kVecChunk;
      if constexpr (std::is_same_v<T, float>) {
        at::vec::transpose_mxn<float>(k, slot_elems, kt, kVecChunk, static_cast<int>(count), static_cast<int>(D));
      } else {
        for (int64_t c = 0; c < count; ++c)
          for (int64_t d = 0; d < D; ++d) s.staging[c * D + d] = static_cast<float>(k[c * slot_elems + d]);
        at::vec::transpose_mxn<float>(s.staging.data(), D, kt, kVecChunk, static_cast<int>(count), static_cast<int>(D));
      }
      for (int64_t c = 0; c < count; ++c) {
        const T* v = p.value_cache + (slot0 + c) * slot_value_elems + h * DV;
        float* vrow = s.value.data() + (h * kVecChunk + c) * DVP;
        for (int64_t d = 0; d < DV; ++d) vrow[d] = static_cast<float>(v[d]);
      }
    }
    if (count < kVecChunk) {
      for (int64_t h = 0; h < KVH; ++h) {
        for (int64_t d = 0; d < D; ++d)
          std::fill_n(s.key_t.data() + (h * D + d) * kVecChunk + count, kVecChunk - count, 0.f);
        std::fill_n(s.value.data() + (h * kVecChunk + count) * DVP, (kVecChunk - count) * DVP, 0.f);
      }
    }
    for (int64_t h = 0; h < KVH; ++h) {
      const int64_t base = h * tile;
      for (int64_t r0 = 0; r0 < rows; r0 += kMicroRows) {
        const int64_t micro = std::min(kMicroRows, rows - r0);
        score_micro_tile(micro, s.q.data() + (base + r0) * D, D, s.key_t.data() + h * D * kVecChunk, scores);
        softmax_update(scores, micro, s.row_pos.data() + r0, key_pos, last_key, p.window,
                       s.row_max.data() + base + r0, s.row_sum.data() + base + r0,
                       s.probs.data() + (base + r0) * kVecChunk, s.acc.data() + (base + r0) * DVP, DVP);
      }
      accumulate_values(rows, s.probs.data() + base * kVecChunk, count, s.value.data() + h * kVecChunk * DVP, DVP,
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

}  // namespace

template <typename T>
void PI_VEC_ENTRY(const Problem<T>& p, const std::vector<WorkItem>& items, int64_t tile_rows) {
  const int64_t dim_padded = (p.value_dim + Vec::size() - 1) / Vec::size() * Vec::size();
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(tile_rows, p.num_kv_heads, p.head_dim, dim_padded);
    walk_items(p, items, begin, end, [&](const WorkItem& item) { attend_item(p, item, scratch); });
  });
}

template void PI_VEC_ENTRY(const Problem<float>&, const std::vector<WorkItem>&, int64_t);
template void PI_VEC_ENTRY(const Problem<c10::BFloat16>&, const std::vector<WorkItem>&, int64_t);
template void PI_VEC_ENTRY(const Problem<c10::Half>&, const std::vector<WorkItem>&, int64_t);

}  // namespace pagedinfer_cpu
