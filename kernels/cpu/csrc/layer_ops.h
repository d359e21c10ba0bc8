// The decoder layer's small ops on the CPU (RMSNorm, residual add + RMSNorm, rotary embedding with
// Qwen3's per-head norm, SiLU-and-multiply): what each call does, and their entry points, one set
// per instruction set (layer_ops_vec.h compiled by layer_ops_{default,avx2,avx512}.cpp;
// layer_ops.cpp checks the arguments and picks the set isa.cpp found at run time).
//
// Every op reads its rows once, computes in float32 (norm statistics, weight multiply, rotation,
// SiLU) and rounds each output element once to the tensor's dtype (float32 or bfloat16). Rows are
// independent: a call splits them over the intra-op threads. Strides are in elements; the last
// dimension of every tensor is unit-stride.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace pagedinfer_cpu {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (transformers' RMSNorm, weight multiply in float32).
template <typename T>
struct NormRows {
  const T* x;
  int64_t x_stride;
  T* out;
  int64_t out_stride;
  const T* weight;  // [hidden]
  int64_t rows, hidden;
  float eps;
};

// s = residual[r] + x[r] in float32; residual[r] = s rounded to T (the residual stream stays in the
// model's dtype, as in transformers and vLLM); x[r] = RMSNorm(s) * weight from the float32 sum (vLLM's
// fused_add_rms_norm; transformers normalises the rounded sum): a pre-norm block boundary in one call.
template <typename T>
struct AddNormRows {
  T* x;
  int64_t x_stride;
  T* residual;
  int64_t residual_stride;
  const T* weight;
  int64_t rows, hidden;
  float eps;
};

// In place on the query heads [0, query_heads) and key heads [query_heads, query_heads + key_heads)
// of each token's row of qkv (head h at columns [h * head_dim, (h + 1) * head_dim)): optional
// per-head RMSNorm (Qwen3's q_norm / k_norm, before RoPE), then the rotate_half ("neox") rotation
// by the cos/sin of the token's position: cos_sin row p is [cos(p * f) | sin(p * f)] over the
// head_dim / 2 frequencies f, scaling included (float32).
template <typename T>
struct RotaryRows {
  const int64_t* positions;  // [tokens], each in [0, cache_rows): checked by the caller
  T* qkv;
  int64_t qkv_stride;
  const float* cos_sin;  // [cache_rows, head_dim]
  int64_t tokens, query_heads, key_heads, head_dim;
  const T* query_norm;  // [head_dim] or null (no per-head norm)
  const T* key_norm;
  float eps;
};

// out[r] = silu(x[r][:width]) * x[r][width:]: gate and up side by side, as one gate_up GEMM writes them.
template <typename T>
struct SiluMulRows {
  const T* x;
  int64_t x_stride;
  T* out;
  int64_t out_stride;
  int64_t rows, width;
};

#define PI_DECLARE_LAYER_OPS(ns)                                  \
  namespace ns {                                                  \
  template <typename T> void rms_norm(const NormRows<T>& p);      \
  template <typename T> void add_rms_norm(const AddNormRows<T>& p); \
  template <typename T> void rotary(const RotaryRows<T>& p);      \
  template <typename T> void silu_and_mul(const SiluMulRows<T>& p); \
  }

PI_DECLARE_LAYER_OPS(layer_ops_default)
PI_DECLARE_LAYER_OPS(layer_ops_avx2)
PI_DECLARE_LAYER_OPS(layer_ops_avx512)

#undef PI_DECLARE_LAYER_OPS

}  // namespace pagedinfer_cpu
