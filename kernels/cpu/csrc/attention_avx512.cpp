// The AVX-512 CPU paged attention: float32 and bfloat16 caches, head sizes multiples of 16 (32 for
// bfloat16 values).
//
// Same invariants as attention_vec.h (flash attention's online softmax in float32 over paged
// K/V, masking by selection so cache garbage, even NaN, never reaches an output), written with
// intrinsics so that a bfloat16 cache costs half a float32 one, and with the softmax folded once
// per span of up to kSpan keys rather than once per chunk:
// - per span and KV head, every row's scores over the whole span are computed first (the keys
//   chunk by chunk), then each row's span is folded into its running (max, sum) at once (one
//   rescale of its accumulator per span, not per chunk: in a decode, a KV head has only 2-3 rows
//   and the per-chunk reductions and rescales cost as much as the dot products), then the span's
//   values are accumulated with those probabilities;
// - per key chunk (up to 16 keys of one block) and KV head, the keys are read once for all the
//   rows (query token x query head) of that KV head's group, straight from the cache into a
//   transposed tile by a 16 x 16 register transpose of 32-bit lanes: float32 keys as they are;
//   bfloat16 keys either as (d, d+1) pairs, scored by avx512_bf16's dot product
//   (_mm512_dpbf16_ps: the bf16 products are exact in float32, summed in float32), or, on
//   AVX-512 without avx512_bf16, widened to float32 by a shift;
// - scores are a register-blocked outer product (up to 8 rows x 16 keys), the softmax's exp a
//   vectorised Cephes polynomial (scalef for 2^n), and values are read once per key for up to 4
//   rows, widened in registers (no float32 copy of the cache; bfloat16 32 dims per load, even and
//   odd dims apart, see acc_index), accumulated in float32, 64, 32 or 16 dims per pass over the keys;
// - a decode (a few rows per KV head) is bound by memory latency, not by the transpose or the dot
//   products: its walk asks for the next chunk's keys and values into L1 (prefetch_slots_l1).
// Every function here carries a target attribute: the library is compiled for the baseline
// x86-64 and this code runs only where isa.cpp found AVX-512 (and avx512_bf16 for the dot) at
// run time.

#include "attention.h"

#if defined(__x86_64__)

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#define PI_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define PI_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16"), noinline))

namespace pagedinfer_cpu {
namespace {

constexpr int kScoreRows = 8;  // rows scored together in registers
constexpr int kValueRows = 4;  // rows accumulating values together (4 rows x 64 dims: 16 registers)
constexpr int64_t kSpan = 128;  // keys scored before the softmax folds them in (a multiple of kChunk)
constexpr int64_t kSpanStride = kSpan + kChunk;  // a row's scores; a chunk stores 16 lanes from any offset

// Per-thread tiles. Row state (max, sum, accumulator) of KV head h starts at row h * tile_rows.
struct Scratch {
  int64_t tile_rows;
  std::vector<float> q;          // [kv_heads * tile_rows][head_dim]: float32 query rows times scale
  std::vector<uint16_t> q_bf16;  // same rows as bfloat16 bits (the bf16 dot path; scale applied after)
  std::vector<float> key_t;      // [head_dim][16] float32 keys, or [head_dim / 2][16] bf16 (d, d+1) pairs
  std::vector<float> probs;      // [rows][kSpanStride]: scores over a span of the KV heads walked together, then probabilities
  std::vector<float> acc, row_max, row_sum;
  Scratch(int64_t tile_rows, int64_t kv_heads, int64_t head_dim, int64_t value_dim, bool bf16_dot)
      : tile_rows(tile_rows), q(bf16_dot ? 0 : kv_heads * tile_rows * head_dim),
        q_bf16(bf16_dot ? kv_heads * tile_rows * head_dim : 0), key_t(head_dim * kChunk), probs(std::max(tile_rows, kv_heads * kScoreRows) * kSpanStride),
        acc(kv_heads * tile_rows * value_dim), row_max(kv_heads * tile_rows), row_sum(kv_heads * tile_rows) {}
};

PI_AVX512 inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }

PI_AVX512 inline __m512 load16(const c10::BFloat16* x) {  // bfloat16 -> float32 is a 16-bit shift
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// Transpose 16 rows of 16 32-bit lanes; column j goes to out + 16 * j. Pure lane moves: the bits
// (a pair of bfloat16 included) are copied, never converted.
PI_AVX512 inline void transpose16(const __m512* r, float* out) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + j]: column j of each 128-bit lane, rows i..i+3
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int j = 0; j < 4; ++j) {  // lane L of u[4g + j] holds column 4L + j of rows 4g..4g+3
    const __m512 v = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88), w = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xdd);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
    const __m512 w2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xdd);
    _mm512_storeu_ps(out + 16 * j, _mm512_shuffle_f32x4(v, v2, 0x88));
    _mm512_storeu_ps(out + 16 * (8 + j), _mm512_shuffle_f32x4(v, v2, 0xdd));
    _mm512_storeu_ps(out + 16 * (4 + j), _mm512_shuffle_f32x4(w, w2, 0x88));
    _mm512_storeu_ps(out + 16 * (12 + j), _mm512_shuffle_f32x4(w, w2, 0xdd));
  }
}

// key_t[d][c] = float32 key c's dim d (c < count; lanes >= count zero, never cache data).
template <typename T>
PI_AVX512 inline void load_keys(const T* k, int64_t stride, int64_t count, int64_t head_dim, float* key_t) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += 16) {
    __m512 rows[16];
    for (int64_t c = 0; c < 16; ++c) rows[c] = c < count ? load16(k + c * stride + d0) : _mm512_setzero_ps();
    transpose16(rows, key_t + d0 * 16);
  }
}

// key_t[i][c] = the bits of key c's bfloat16 pair (2i, 2i + 1), for the dot product.
PI_AVX512 inline void load_key_pairs(const c10::BFloat16* k, int64_t stride, int64_t count, int64_t head_dim,
                                     float* key_t) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += 32) {
    __m512 rows[16];
    for (int64_t c = 0; c < 16; ++c)
      rows[c] = c < count ? _mm512_castsi512_ps(_mm512_loadu_si512(k + c * stride + d0)) : _mm512_setzero_ps();
    transpose16(rows, key_t + d0 / 2 * 16);
  }
}

// scores[r * ld + c] = q[r] . key c (c < 16) for R rows of float32 queries (scale already applied).
template <int R>
PI_AVX512 inline void score_rows(const float* q, int64_t head_dim, const float* key_t, float* scores, int64_t ld) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    const __m512 k = _mm512_loadu_ps(key_t + d * 16);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * head_dim + d]), k, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(scores + r * ld, acc[r]);
}

// The same for bfloat16 queries against key pairs: one dpbf16 per pair of dims, then times scale.
template <int R>
PI_AVX512_BF16 void score_rows_bf16_dot(const uint16_t* q, int64_t head_dim, const float* key_t, float scale,
                                        float* scores, int64_t ld) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const __m512bh k = (__m512bh)_mm512_castps_si512(_mm512_loadu_ps(key_t + i * 16));
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, q + r * head_dim + 2 * i, sizeof(pair));
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(pair), k);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(scores + r * ld, _mm512_mul_ps(acc[r], _mm512_set1_ps(scale)));
}

template <int R = kScoreRows>
PI_AVX512 inline void score_micro_tile(int64_t rows, const float* q, const uint16_t* q_bf16, int64_t head_dim,
                                       const float* key_t, float scale, float* scores, int64_t ld) {
  if constexpr (R > 1) {
    if (rows < R) return score_micro_tile<R - 1>(rows, q, q_bf16, head_dim, key_t, scale, scores, ld);
  }
  if (q_bf16 != nullptr) score_rows_bf16_dot<R>(q_bf16, head_dim, key_t, scale, scores, ld);
  else score_rows<R>(q, head_dim, key_t, scores, ld);
}

// e^x, Cephes' expf: x = n ln2 + r (ln2 in two parts), e^r by a degree-6 polynomial, times 2^n
// (scalef). Within 2 ulp over the clamped range; e^x for x <= -87.3 is below 1e-38.
PI_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, n);
}

// The keys [begin, end) of a span that a row at position `pos` sees: <= pos and, with a window W,
// > pos - W (within [lo, hi) of its item: never a key the span does not hold).
struct Visible {
  int64_t begin, end;
};

inline Visible visible_keys(int64_t span_lo, int64_t span_hi, int64_t pos, int64_t window) {
  const int64_t end = std::min(span_hi, pos + 1);
  const int64_t begin = window > 0 ? std::max(span_lo, pos - window + 1) : span_lo;
  return {begin, std::max(begin, end)};
}

// The lanes [from, to) of the 16 starting at `base`, as a mask.
inline __mmask16 lanes(int64_t base, int64_t from, int64_t to) {
  const int64_t lo = std::clamp<int64_t>(from - base, 0, 16), hi = std::clamp<int64_t>(to - base, 0, 16);
  return static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

// Fold one row's scores over a span of n keys (row[0, n): keys span_lo..; in place: they become
// probabilities, 0 for a key the row does not see, so garbage there never reaches the values)
// into its running max and sum, rescaling its accumulator once.
PI_AVX512 inline void softmax_span_row(float* row, int64_t n, int64_t span_lo, Visible seen, float& row_max,
                                       float& row_sum, float* acc, int64_t value_dim) {
  const int64_t from = seen.begin - span_lo, to = seen.end - span_lo;
  if (from >= to) {
    for (int64_t c = 0; c < n; c += 16) _mm512_storeu_ps(row + c, _mm512_setzero_ps());
    return;
  }
  __m512 max_vec = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t c = from & ~int64_t(15); c < to; c += 16)
    max_vec = _mm512_mask_max_ps(max_vec, lanes(c, from, to), max_vec, _mm512_loadu_ps(row + c));
  const float new_max = std::max(row_max, _mm512_reduce_max_ps(max_vec));
  const __m512 shift = _mm512_set1_ps(new_max);
  __m512 sum_vec = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __m512 e = _mm512_maskz_mov_ps(lanes(c, from, to), exp16(_mm512_sub_ps(_mm512_loadu_ps(row + c), shift)));
    _mm512_storeu_ps(row + c, e);
    sum_vec = _mm512_add_ps(sum_vec, e);
  }
  const float rescale = std::exp(row_max - new_max);  // 0 for the first visible span (row_max = -inf)
  row_sum = row_sum * rescale + _mm512_reduce_add_ps(sum_vec);
  row_max = new_max;
  if (rescale != 1.f) {
    const __m512 factor = _mm512_set1_ps(rescale);
    for (int64_t d = 0; d < value_dim; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), factor));
  }
}

// Accumulator layouts: float32 values accumulate in dim order; bfloat16 ones per 32 dims, the 16
// even dims then the 16 odd ones, so that widening one 64-byte load of 32 bfloat16 is a shift
// (even dims: the low halves of its 32-bit lanes) and a mask (odd dims: the high halves).
inline int64_t acc_index(int64_t d, bool bf16) { return bf16 ? (d & ~int64_t(31)) + (d & 1) * 16 + (d & 31) / 2 : d; }

// The 16 float32 values at accumulator offset `d` (a multiple of 16) of one value row.
PI_AVX512 inline __m512 load_values(const float* v, int64_t d) { return _mm512_loadu_ps(v + d); }

PI_AVX512 inline __m512 load_values(const c10::BFloat16* v, int64_t d) {
  const __m512i bits = _mm512_loadu_si512(v + (d & ~int64_t(31)));
  return _mm512_castsi512_ps((d & 16) ? _mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u)))
                                      : _mm512_slli_epi32(bits, 16));
}

// acc[r][:] += sum_c probs[r * ld + c] * value[c][:] for R rows and U * 16 dims from `d` (in the
// accumulator's layout): each value row is read (and widened) once for the R rows.
template <int R, int U, typename T>
PI_AVX512 inline void accumulate_dims(const float* probs, int64_t ld, int64_t count, const T* value, int64_t stride,
                                      int64_t value_dim, int64_t d, float* acc) {
  __m512 a[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) a[r][u] = _mm512_loadu_ps(acc + r * value_dim + d + 16 * u);
  for (int64_t c = 0; c < count; ++c) {
    __m512 v[U];
    for (int u = 0; u < U; ++u) v[u] = load_values(value + c * stride, d + 16 * u);
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(probs[r * ld + c]);
      for (int u = 0; u < U; ++u) a[r][u] = _mm512_fmadd_ps(p, v[u], a[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) _mm512_storeu_ps(acc + r * value_dim + d + 16 * u, a[r][u]);
}

// The same over every dim: 64 at a time, then 32 (head_dim 32: both halves of a value row in one
// pass over the keys, each probability broadcast once), then 16.
template <int R, typename T>
PI_AVX512 inline void accumulate_rows(const float* probs, int64_t ld, int64_t count, const T* value, int64_t stride,
                                      int64_t value_dim, float* acc) {
  int64_t d = 0;
  for (; d + 64 <= value_dim; d += 64) accumulate_dims<R, 4>(probs, ld, count, value, stride, value_dim, d, acc);
  for (; d + 32 <= value_dim; d += 32) accumulate_dims<R, 2>(probs, ld, count, value, stride, value_dim, d, acc);
  for (; d < value_dim; d += 16) accumulate_dims<R, 1>(probs, ld, count, value, stride, value_dim, d, acc);
}

template <typename T>
PI_AVX512 inline void accumulate_values(int64_t rows, const float* probs, int64_t ld, int64_t count, const T* value,
                                        int64_t stride, int64_t value_dim, float* acc) {
  int64_t r = 0;
  for (; r + kValueRows <= rows; r += kValueRows)
    accumulate_rows<kValueRows>(probs + r * ld, ld, count, value, stride, value_dim, acc + r * value_dim);
  switch (rows - r) {
    case 3: accumulate_rows<3>(probs + r * ld, ld, count, value, stride, value_dim, acc + r * value_dim); break;
    case 2: accumulate_rows<2>(probs + r * ld, ld, count, value, stride, value_dim, acc + r * value_dim); break;
    case 1: accumulate_rows<1>(probs + r * ld, ld, count, value, stride, value_dim, acc + r * value_dim); break;
    default: break;
  }
}

// The slots [slot0, slot0 + count) of a cache (every KV head), asked for into L1 (`_MM_HINT_T0`).
// Few rows per KV head (a decode) are bound by memory latency, not arithmetic (perf on the tiny
// model's decode step: ~80% of the kernel's cycles wait on the first loads of a chunk's keys and
// values): prefetch_ahead's request one chunk ahead (into L2) is not enough, so the next chunk's keys
// are also asked for into L1 while this one's are scored, and the next chunk's values while this
// one's are accumulated (a span's values were read long before, when it was scored).
template <typename T>
inline void prefetch_slots_l1(const T* cache, int64_t slot0, int64_t count, int64_t slot_elems) {
  const char* first = reinterpret_cast<const char*>(cache + slot0 * slot_elems);
  const int64_t bytes = count * slot_elems * int64_t(sizeof(T));
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(first + b, 0, 3);
}

template <typename T>
PI_AVX512 void attend_item(const Problem<T>& p, const WorkItem& item, Scratch& s, bool bf16_dot) {
  const int64_t D = p.head_dim, DV = p.value_dim, KVH = p.num_kv_heads, tile = s.tile_rows;
  const ItemSpan span = item_span(p, item);
  const int64_t rows = span.rows;
  for (int64_t h = 0; h < KVH; ++h) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t token = i / p.group, head = h * p.group + i % p.group;
      const T* q = p.query + (span.token0 + token) * p.num_heads * D + head * D;
      if (bf16_dot) std::memcpy(s.q_bf16.data() + (h * tile + i) * D, q, D * sizeof(T));
      else for (int64_t d = 0; d < D; ++d) s.q[(h * tile + i) * D + d] = static_cast<float>(q[d]) * p.scale;
    }
    std::fill_n(s.row_max.begin() + h * tile, rows, -std::numeric_limits<float>::infinity());
    std::fill_n(s.row_sum.begin() + h * tile, rows, 0.f);
    std::fill_n(s.acc.begin() + h * tile * DV, rows * DV, 0.f);
  }

  const int32_t* table = p.block_tables + item.seq * p.block_table_stride;
  const int64_t key_stride = KVH * D, value_stride = KVH * DV;
  // A few rows per KV head (a decode: its group) walk every KV head per chunk, reading each
  // block's slots (all KV heads side by side) in memory order; many rows walk one KV head at a time
  // (their scores over a span stay in L1 / L2).
  const int64_t heads_at_once = rows <= kScoreRows ? KVH : 1;
  const bool prefetch_next = heads_at_once > 1;  // the few-rows walk: see prefetch_slots_l1
  Chunk chunks[kSpan];  // the span's chunks (at least one key each)
  for (int64_t span_lo = span.lo; span_lo < span.hi;) {
    const int64_t span_hi = std::min(span.hi, span_lo + kSpan);
    int64_t num_chunks = 0;
    for (int64_t start = span_lo; start < span_hi; start += chunks[num_chunks++].count)
      chunks[num_chunks] = chunk_at(p, table, start, span_hi);
    for (int64_t h0 = 0; h0 < KVH; h0 += heads_at_once) {
      // 1. every row's scores over the span, chunk by chunk (keys of one block, transposed)
      for (int64_t i = 0, start = span_lo; i < num_chunks; start += chunks[i++].count) {
        const Chunk& chunk = chunks[i];
        if (h0 == 0) prefetch_ahead(p, table, start, span.hi);
        if (prefetch_next && i + 1 < num_chunks)
          prefetch_slots_l1(p.key_cache, chunks[i + 1].slot0, chunks[i + 1].count, key_stride);
        for (int64_t h = h0; h < h0 + heads_at_once; ++h) {
          const T* k = p.key_cache + chunk.slot0 * key_stride + h * D;
          if constexpr (std::is_same_v<T, c10::BFloat16>) {
            if (bf16_dot) load_key_pairs(k, key_stride, chunk.count, D, s.key_t.data());
            else load_keys(k, key_stride, chunk.count, D, s.key_t.data());
          } else {
            load_keys(k, key_stride, chunk.count, D, s.key_t.data());
          }
          float* scores = s.probs.data() + (h - h0) * rows * kSpanStride + (start - span_lo);
          for (int64_t r0 = 0; r0 < rows; r0 += kScoreRows) {
            const int64_t micro = std::min<int64_t>(kScoreRows, rows - r0);
            score_micro_tile(micro, bf16_dot ? nullptr : s.q.data() + (h * tile + r0) * D,
                             bf16_dot ? s.q_bf16.data() + (h * tile + r0) * D : nullptr, D, s.key_t.data(), p.scale,
                             scores + r0 * kSpanStride, kSpanStride);
          }
        }
      }
      // 2. each row's span folded into its softmax at once
      for (int64_t h = h0; h < h0 + heads_at_once; ++h)
        for (int64_t r = 0; r < rows; ++r)
          softmax_span_row(s.probs.data() + ((h - h0) * rows + r) * kSpanStride, span_hi - span_lo, span_lo,
                           visible_keys(span_lo, span_hi, span.first_pos + r / p.group, p.window),
                           s.row_max[h * tile + r], s.row_sum[h * tile + r], s.acc.data() + (h * tile + r) * DV, DV);
      // 3. the span's values, weighted by those probabilities
      for (int64_t i = 0, start = span_lo; i < num_chunks; start += chunks[i++].count) {
        if (prefetch_next && i + 1 < num_chunks)
          prefetch_slots_l1(p.value_cache, chunks[i + 1].slot0, chunks[i + 1].count, value_stride);
        for (int64_t h = h0; h < h0 + heads_at_once; ++h)
          accumulate_values(rows, s.probs.data() + (h - h0) * rows * kSpanStride + (start - span_lo), kSpanStride,
                            chunks[i].count, p.value_cache + chunks[i].slot0 * value_stride + h * DV, value_stride, DV,
                            s.acc.data() + h * tile * DV);
      }
    }
    span_lo = span_hi;
  }

  for (int64_t h = 0; h < KVH; ++h) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t token = i / p.group, head = h * p.group + i % p.group;
      T* o = p.out + (span.token0 + token) * p.num_heads * DV + head * DV;
      const float* a = s.acc.data() + (h * tile + i) * DV;
      const float inv = 1.f / s.row_sum[h * tile + i];
      for (int64_t d = 0; d < DV; ++d) o[d] = static_cast<T>(a[acc_index(d, std::is_same_v<T, c10::BFloat16>)] * inv);
    }
  }
}

}  // namespace

template <typename T>
bool avx512_fits(const Problem<T>& p) {
  // bfloat16 values are widened 32 dims at a time (see acc_index)
  return (std::is_same_v<T, float> && p.head_dim % 16 == 0 && p.value_dim % 16 == 0) ||
         (std::is_same_v<T, c10::BFloat16> && p.head_dim % 16 == 0 && p.value_dim % 32 == 0);
}

template <typename T>
void attend_avx512(const Problem<T>& p, const std::vector<WorkItem>& items, int64_t tile_rows, bool bf16_dot) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    TORCH_CHECK(false, "the AVX-512 attention takes float32 or bfloat16");
  } else {
    const bool dot = std::is_same_v<T, c10::BFloat16> && bf16_dot && p.head_dim % 32 == 0;
    at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
      Scratch scratch(tile_rows, p.num_kv_heads, p.head_dim, p.value_dim, dot);
      walk_items(p, items, begin, end, [&](const WorkItem& item) { attend_item(p, item, scratch, dot); });
    });
  }
}

}  // namespace pagedinfer_cpu

#else  // not x86-64: isa.cpp never selects this kernel

#include <c10/util/Exception.h>

namespace pagedinfer_cpu {

template <typename T>
bool avx512_fits(const Problem<T>&) {
  return false;
}

template <typename T>
void attend_avx512(const Problem<T>&, const std::vector<WorkItem>&, int64_t, bool) {
  TORCH_CHECK(false, "the AVX-512 attention runs on x86-64 only");
}

}  // namespace pagedinfer_cpu

#endif

namespace pagedinfer_cpu {  // the instances paged_attention.cpp calls

template bool avx512_fits(const Problem<float>&);
template bool avx512_fits(const Problem<c10::BFloat16>&);
template bool avx512_fits(const Problem<c10::Half>&);
template void attend_avx512(const Problem<float>&, const std::vector<WorkItem>&, int64_t, bool);
template void attend_avx512(const Problem<c10::BFloat16>&, const std::vector<WorkItem>&, int64_t, bool);
template void attend_avx512(const Problem<c10::Half>&, const std::vector<WorkItem>&, int64_t, bool);

}  // namespace pagedinfer_cpu
