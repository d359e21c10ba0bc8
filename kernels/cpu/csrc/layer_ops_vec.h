// The layer ops of layer_ops.h over `at::vec` vectors of float32: included by one translation unit
// per instruction set (layer_ops_{default,avx2,avx512}.cpp), each defining PI_LAYER_NS (the
// namespace of its entry points) and, for a wider set, CPU_CAPABILITY as ATen does and the matching
// `#pragma GCC target` first (target_avx2.h, target_avx512.h).
//
// Each row is walked in whole vectors, then a scalar tail (any width, any head_dim): the tail
// computes the same float32 expression per element, so an element's result does not depend on
// where the vector loop ends. bfloat16 elements are widened to float32 on load and rounded (to
// nearest even) once on store.

#pragma once

#include "layer_ops.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <cstring>

namespace pagedinfer_cpu {
namespace PI_LAYER_NS {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();
constexpr int64_t kRowGrain = 8;  // rows per parallel task at least

inline Vec load(const float* p) { return Vec::loadu(p); }

inline Vec load(const c10::BFloat16* p) {
  Vec out;
  at::vec::load_to_float<c10::BFloat16>(p, out);
  return out;
}

inline void store(float* p, const Vec& v) { v.store(p); }

// Rounded to bfloat16 (nearest even) in a register, stored through a full-width stack copy: a partial
// Vectorized<BFloat16>::store is a masked store, microcoded and several times slower on AMD's Zen 4.
inline void store(c10::BFloat16* p, const Vec& v) {
  alignas(64) c10::BFloat16 rounded[2 * kLanes];
  at::vec::convert_from_float<c10::BFloat16>(v, v).store(rounded);
  std::memcpy(p, rounded, kLanes * sizeof(c10::BFloat16));
}

inline float sum(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, v);
}

// 1 / sqrt(mean(x^2) + eps) over n elements.
template <typename T>
float inverse_rms(const T* x, int64_t n, float eps) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec v = load(x + i);
    acc = acc + v * v;
  }
  float squares = sum(acc);
  for (; i < n; ++i) squares += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  return 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
}

// out = (x * inv) * weight, transformers' order of the two products.
template <typename T>
void scale_row(const T* x, float inv, const T* weight, T* out, int64_t n) {
  const Vec scale(inv);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(out + i, (load(x + i) * scale) * load(weight + i));
  for (; i < n; ++i) out[i] = static_cast<T>(static_cast<float>(x[i]) * inv * static_cast<float>(weight[i]));
}

// One head in place: optional RMSNorm by `norm`, then x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
template <typename T>
void rotate_head(T* x, int64_t head_dim, const float* cos, const float* sin, const T* norm, float eps) {
  const int64_t half = head_dim / 2;
  const float inv = norm ? inverse_rms(x, head_dim, eps) : 1.f;
  const Vec scale(inv);
  int64_t i = 0;
  for (; i + kLanes <= half; i += kLanes) {
    Vec x1 = load(x + i), x2 = load(x + half + i);
    if (norm) {
      x1 = (x1 * scale) * load(norm + i);
      x2 = (x2 * scale) * load(norm + half + i);
    }
    const Vec c = Vec::loadu(cos + i), s = Vec::loadu(sin + i);
    store(x + i, x1 * c - x2 * s);
    store(x + half + i, x2 * c + x1 * s);
  }
  for (; i < half; ++i) {
    float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[half + i]);
    if (norm) {
      x1 = x1 * inv * static_cast<float>(norm[i]);
      x2 = x2 * inv * static_cast<float>(norm[half + i]);
    }
    x[i] = static_cast<T>(x1 * cos[i] - x2 * sin[i]);
    x[half + i] = static_cast<T>(x2 * cos[i] + x1 * sin[i]);
  }
}

}  // namespace

template <typename T>
void rms_norm(const NormRows<T>& p) {
  at::parallel_for(0, p.rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* x = p.x + r * p.x_stride;
      scale_row(x, inverse_rms(x, p.hidden, p.eps), p.weight, p.out + r * p.out_stride, p.hidden);
    }
  });
}

template <typename T>
void add_rms_norm(const AddNormRows<T>& p) {
  // Two reads of each row (hot in L1 the second time) and no scratch: the first pass sums the float32
  // squares of residual + x, the second recomputes the sum, writes the residual rounded to T and
  // normalises the float32 sum (not the rounded residual, as vLLM's fused_add_rms_norm).
  const float hidden = static_cast<float>(p.hidden);
  at::parallel_for(0, p.rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* x = p.x + r * p.x_stride;
      T* residual = p.residual + r * p.residual_stride;
      Vec acc(0.f);
      int64_t i = 0;
      for (; i + kLanes <= p.hidden; i += kLanes) {
        const Vec s = load(residual + i) + load(x + i);
        acc = acc + s * s;
      }
      float squares = sum(acc);
      for (; i < p.hidden; ++i) {
        const float s = static_cast<float>(residual[i]) + static_cast<float>(x[i]);
        squares += s * s;
      }
      const float inv = 1.f / std::sqrt(squares / hidden + p.eps);
      const Vec scale(inv);
      for (i = 0; i + kLanes <= p.hidden; i += kLanes) {
        const Vec s = load(residual + i) + load(x + i);
        store(residual + i, s);
        store(x + i, (s * scale) * load(p.weight + i));
      }
      for (; i < p.hidden; ++i) {
        const float s = static_cast<float>(residual[i]) + static_cast<float>(x[i]);
        residual[i] = static_cast<T>(s);
        x[i] = static_cast<T>(s * inv * static_cast<float>(p.weight[i]));
      }
    }
  });
}

template <typename T>
void rotary(const RotaryRows<T>& p) {
  const int64_t half = p.head_dim / 2;
  at::parallel_for(0, p.tokens, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = p.cos_sin + p.positions[t] * p.head_dim;
      const float* sin = cos + half;
      T* row = p.qkv + t * p.qkv_stride;
      for (int64_t h = 0; h < p.query_heads; ++h)
        rotate_head(row + h * p.head_dim, p.head_dim, cos, sin, p.query_norm, p.eps);
      for (int64_t h = p.query_heads; h < p.query_heads + p.key_heads; ++h)
        rotate_head(row + h * p.head_dim, p.head_dim, cos, sin, p.key_norm, p.eps);
    }
  });
}

template <typename T>
void silu_and_mul(const SiluMulRows<T>& p) {
  // silu(g) = g / (1 + exp(-g)), torch's own vectorised SiLU expression
  const Vec one(1.f);
  at::parallel_for(0, p.rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = p.x + r * p.x_stride;
      const T* up = gate + p.width;
      T* out = p.out + r * p.out_stride;
      int64_t i = 0;
      for (; i + kLanes <= p.width; i += kLanes) {
        const Vec g = load(gate + i);
        store(out + i, (g / (one + g.neg().exp())) * load(up + i));
      }
      for (; i < p.width; ++i) {
        const float g = static_cast<float>(gate[i]);
        out[i] = static_cast<T>(g / (1.f + std::exp(-g)) * static_cast<float>(up[i]));
      }
    }
  });
}

#define PI_INSTANTIATE_LAYER_OPS(T)                  \
  template void rms_norm(const NormRows<T>&);        \
  template void add_rms_norm(const AddNormRows<T>&); \
  template void rotary(const RotaryRows<T>&);        \
  template void silu_and_mul(const SiluMulRows<T>&);

PI_INSTANTIATE_LAYER_OPS(float)
PI_INSTANTIATE_LAYER_OPS(c10::BFloat16)

#undef PI_INSTANTIATE_LAYER_OPS

}  // namespace PI_LAYER_NS
}  // namespace pagedinfer_cpu
