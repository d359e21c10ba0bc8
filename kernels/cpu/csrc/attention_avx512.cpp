// The AVX-512 CPU paged attention: float32 and bfloat16 caches, head sizes multiples of 16 (32 for
// bfloat16 values).
//
// Same algorithm and invariants as attention_vec.h (flash attention's online softmax in
// float32 over paged K/V, masking by selection so cache garbage, even NaN, never reaches an
// output), written with intrinsics so that a bfloat16 cache costs half a float32 one:
// - per key chunk (up to 16 keys of one block) and KV head, the keys are read once for all the
//   rows (query token x query head) of that KV head's group, straight from the cache into a
//   transposed tile by a 16 x 16 register transpose of 32-bit lanes: float32 keys as they are;
//   bfloat16 keys either as (d, d+1) pairs, scored by avx512_bf16's dot product
//   (_mm512_dpbf16_ps: the bf16 products are exact in float32, summed in float32), or, on
//   AVX-512 without avx512_bf16, widened to float32 by a shift;
// - scores are a register-blocked outer product (up to 8 rows x 16 keys), the softmax's exp a
//   vectorised Cephes polynomial (scalef for 2^n), and values are read once per key for up to 4
//   rows, widened in registers (no float32 copy of the cache; bfloat16 32 dims per load, even and
//   odd dims apart, see acc_index), accumulated in float32.
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

// Per-thread tiles. Row state (max, sum, accumulator) of KV head h starts at row h * tile_rows.
struct Scratch {
  int64_t tile_rows;
  std::vector<float> q;          // [kv_heads * tile_rows][head_dim]: float32 query rows times scale
  std::vector<uint16_t> q_bf16;  // same rows as bfloat16 bits (the bf16 dot path; scale applied after)
  std::vector<float> key_t;      // [head_dim][16] float32 keys, or [head_dim / 2][16] bf16 (d, d+1) pairs
  std::vector<float> probs;      // [tile_rows][16]: one KV head's scores, then probabilities
  std::vector<float> acc, row_max, row_sum;
  Scratch(int64_t tile_rows, int64_t kv_heads, int64_t head_dim, int64_t value_dim, bool bf16_dot)
      : tile_rows(tile_rows), q(bf16_dot ? 0 : kv_heads * tile_rows * head_dim),
        q_bf16(bf16_dot ? kv_heads * tile_rows * head_dim : 0), key_t(head_dim * kChunk), probs(tile_rows * kChunk),
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

// scores[r][:] = q[r] . key_t for R rows of float32 queries (scale already applied).
template <int R>
PI_AVX512 inline void score_rows(const float* q, int64_t head_dim, const float* key_t, float* scores) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    const __m512 k = _mm512_loadu_ps(key_t + d * 16);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * head_dim + d]), k, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(scores + r * 16, acc[r]);
}

// The same for bfloat16 queries against key pairs: one dpbf16 per pair of dims, then times scale.
template <int R>
PI_AVX512_BF16 void score_rows_bf16_dot(const uint16_t* q, int64_t head_dim, const float* key_t, float scale,
                                        float* scores) {
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
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(scores + r * 16, _mm512_mul_ps(acc[r], _mm512_set1_ps(scale)));
}

template <int R = kScoreRows>
PI_AVX512 inline void score_micro_tile(int64_t rows, const float* q, const uint16_t* q_bf16, int64_t head_dim,
                                       const float* key_t, float scale, float* scores) {
  if constexpr (R > 1) {
    if (rows < R) return score_micro_tile<R - 1>(rows, q, q_bf16, head_dim, key_t, scale, scores);
  }
  if (q_bf16 != nullptr) score_rows_bf16_dot<R>(q_bf16, head_dim, key_t, scale, scores);
  else score_rows<R>(q, head_dim, key_t, scores);
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

// Lanes c < count of the chunk at key position `start` that a row at position `pos` sees:
// start + c <= pos and, with a window W, start + c > pos - W.
inline __mmask16 visible_keys(int64_t start, int64_t count, int64_t pos, int64_t window) {
  const int64_t c_hi = std::clamp<int64_t>(pos - start + 1, 0, count);
  const int64_t c_lo = window > 0 ? std::clamp<int64_t>(pos - window + 1 - start, 0, c_hi) : 0;
  return static_cast<__mmask16>(((1u << c_hi) - 1u) & ~((1u << c_lo) - 1u));
}

// Fold one row's 16 scores (in place: they become probabilities) into its running max and sum.
PI_AVX512 inline void softmax_row(float* scores, __mmask16 visible, float& row_max, float& row_sum, float* acc,
                                  int64_t value_dim) {
  if (visible == 0) {
    _mm512_storeu_ps(scores, _mm512_setzero_ps());
    return;
  }
  const __m512 x = _mm512_loadu_ps(scores);
  const float new_max = std::max(row_max, _mm512_mask_reduce_max_ps(visible, x));
  const __m512 e = _mm512_maskz_mov_ps(visible, exp16(_mm512_sub_ps(x, _mm512_set1_ps(new_max))));
  _mm512_storeu_ps(scores, e);
  const float rescale = std::exp(row_max - new_max);  // 0 for the first visible chunk (row_max = -inf)
  row_sum = row_sum * rescale + _mm512_reduce_add_ps(e);
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

// acc[r][:] += sum_c probs[r][c] * value[c][:] for R rows (in the accumulator's layout); each value
// row is read (and widened) once for the R rows, 64 dims at a time, then 16.
template <int R, typename T>
PI_AVX512 inline void accumulate_rows(const float* probs, int64_t count, const T* value, int64_t stride,
                                      int64_t value_dim, float* acc) {
  int64_t d = 0;
  for (; d + 64 <= value_dim; d += 64) {
    __m512 a[R][4];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < 4; ++u) a[r][u] = _mm512_loadu_ps(acc + r * value_dim + d + 16 * u);
    for (int64_t c = 0; c < count; ++c) {
      __m512 v[4];
      for (int u = 0; u < 4; ++u) v[u] = load_values(value + c * stride, d + 16 * u);
      for (int r = 0; r < R; ++r) {
        const __m512 p = _mm512_set1_ps(probs[r * 16 + c]);
        for (int u = 0; u < 4; ++u) a[r][u] = _mm512_fmadd_ps(p, v[u], a[r][u]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(acc + r * value_dim + d + 16 * u, a[r][u]);
  }
  for (; d < value_dim; d += 16) {
    __m512 a[R];
    for (int r = 0; r < R; ++r) a[r] = _mm512_loadu_ps(acc + r * value_dim + d);
    for (int64_t c = 0; c < count; ++c) {
      const __m512 v = load_values(value + c * stride, d);
      for (int r = 0; r < R; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(probs[r * 16 + c]), v, a[r]);
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + r * value_dim + d, a[r]);
  }
}

template <typename T>
PI_AVX512 inline void accumulate_values(int64_t rows, const float* probs, int64_t count, const T* value,
                                        int64_t stride, int64_t value_dim, float* acc) {
  int64_t r = 0;
  for (; r + kValueRows <= rows; r += kValueRows)
    accumulate_rows<kValueRows>(probs + r * 16, count, value, stride, value_dim, acc + r * value_dim);
  switch (rows - r) {
    case 3: accumulate_rows<3>(probs + r * 16, count, value, stride, value_dim, acc + r * value_dim); break;
    case 2: accumulate_rows<2>(probs + r * 16, count, value, stride, value_dim, acc + r * value_dim); break;
    case 1: accumulate_rows<1>(probs + r * 16, count, value, stride, value_dim, acc + r * value_dim); break;
    default: break;
  }
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
  for (int64_t start = span.lo; start < span.hi;) {
    const Chunk chunk = chunk_at(p, table, start, span.hi);
    prefetch_ahead(p, table, start, span.lo, span.hi);
    for (int64_t h = 0; h < KVH; ++h) {
      const T* k = p.key_cache + chunk.slot0 * key_stride + h * D;
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        if (bf16_dot) load_key_pairs(k, key_stride, chunk.count, D, s.key_t.data());
        else load_keys(k, key_stride, chunk.count, D, s.key_t.data());
      } else {
        load_keys(k, key_stride, chunk.count, D, s.key_t.data());
      }
      const int64_t base = h * tile;
      for (int64_t r0 = 0; r0 < rows; r0 += kScoreRows) {
        const int64_t micro = std::min<int64_t>(kScoreRows, rows - r0);
        float* scores = s.probs.data() + r0 * 16;
        score_micro_tile(micro, bf16_dot ? nullptr : s.q.data() + (base + r0) * D,
                         bf16_dot ? s.q_bf16.data() + (base + r0) * D : nullptr, D, s.key_t.data(), p.scale, scores);
        for (int64_t r = r0; r < r0 + micro; ++r)
          softmax_row(s.probs.data() + r * 16, visible_keys(start, chunk.count, span.first_pos + r / p.group, p.window),
                      s.row_max[base + r], s.row_sum[base + r], s.acc.data() + (base + r) * DV, DV);
      }
      accumulate_values(rows, s.probs.data(), chunk.count, p.value_cache + chunk.slot0 * value_stride + h * DV,
                        value_stride, DV, s.acc.data() + base * DV);
    }
    start += chunk.count;
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
      for (int64_t i = begin; i < end; ++i) attend_item(p, items[i], scratch, dot);
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
