// The layer ops of layer_ops.h as torch ops: argument checks, then the entry points of the widest
// instruction set isa.cpp found (or the one forced through cpu_attention_isa): AVX-512 (also on
// avx512_bf16 CPUs), AVX2, else the portable vectors. Schemas and fake kernels: kernels/cpu/layer_ops.py.

#include "isa.h"
#include "layer_ops.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>

namespace {

using at::Tensor;
using pagedinfer_cpu::Isa;

// Calls fn(T{}, ops) with the tensor's element type (float32 or bfloat16) and the active ISA's entry
// points, as a tag type whose static members are that set's functions.
#define PI_LAYER_OPS_TAG(tag, ns)                                                                      \
  struct tag {                                                                                         \
    template <typename T> static void rms_norm(const pagedinfer_cpu::NormRows<T>& p) { pagedinfer_cpu::ns::rms_norm(p); } \
    template <typename T> static void add_rms_norm(const pagedinfer_cpu::AddNormRows<T>& p) { pagedinfer_cpu::ns::add_rms_norm(p); } \
    template <typename T> static void rotary(const pagedinfer_cpu::RotaryRows<T>& p) { pagedinfer_cpu::ns::rotary(p); } \
    template <typename T> static void silu_and_mul(const pagedinfer_cpu::SiluMulRows<T>& p) { pagedinfer_cpu::ns::silu_and_mul(p); } \
  };
PI_LAYER_OPS_TAG(Avx512Ops, layer_ops_avx512)
PI_LAYER_OPS_TAG(Avx2Ops, layer_ops_avx2)
PI_LAYER_OPS_TAG(PortableOps, layer_ops_default)
#undef PI_LAYER_OPS_TAG

template <typename Fn>
void dispatch(at::ScalarType dtype, const Fn& fn) {
  const auto with_ops = [&](auto zero) {
    const Isa isa = pagedinfer_cpu::active_isa();
    if (isa >= Isa::kAvx512)
      fn(zero, Avx512Ops{});
    else if (isa == Isa::kAvx2)
      fn(zero, Avx2Ops{});
    else
      fn(zero, PortableOps{});
  };
  switch (dtype) {
    case at::kFloat: with_ops(float{}); break;
    case at::kBFloat16: with_ops(c10::BFloat16{}); break;
    default: TORCH_CHECK(false, "the native CPU layer ops take float32 or bfloat16, got ", dtype);
  }
}

void check_rows(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == 2, name, " must be 2-d [rows, columns], got ", t.dim(), "-d");
  TORCH_CHECK(t.stride(1) == 1 || t.size(1) <= 1, name, " needs a unit-stride last dimension");
}

void check_weight(const Tensor& weight, const Tensor& x, int64_t size, const char* name) {
  TORCH_CHECK(weight.device().is_cpu() && weight.dim() == 1 && weight.is_contiguous(), name,
              " must be a contiguous 1-d CPU tensor");
  TORCH_CHECK(weight.size(0) == size, name, " has ", weight.size(0), " elements, expected ", size);
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), name, " must have the input's dtype");
}

Tensor rms_norm_cpu(const Tensor& x, const Tensor& weight, double eps) {
  check_rows(x, "input");
  check_weight(weight, x, x.size(1), "weight");
  Tensor out = at::empty(x.sizes(), x.options());
  dispatch(x.scalar_type(), [&](auto zero, auto ops) {
    using T = decltype(zero);
    decltype(ops)::rms_norm(pagedinfer_cpu::NormRows<T>{
        x.data_ptr<T>(), x.stride(0), out.data_ptr<T>(), out.stride(0), weight.data_ptr<T>(), x.size(0), x.size(1),
        static_cast<float>(eps)});
  });
  return out;
}

void fused_add_rms_norm_cpu(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps) {
  check_rows(x, "input");
  check_rows(residual, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes(), "residual ", residual.sizes(), " and input ", x.sizes(), " differ");
  TORCH_CHECK(residual.scalar_type() == x.scalar_type(), "residual must have the input's dtype");
  check_weight(weight, x, x.size(1), "weight");
  dispatch(x.scalar_type(), [&](auto zero, auto ops) {
    using T = decltype(zero);
    decltype(ops)::add_rms_norm(pagedinfer_cpu::AddNormRows<T>{
        x.data_ptr<T>(), x.stride(0), residual.data_ptr<T>(), residual.stride(0), weight.data_ptr<T>(), x.size(0),
        x.size(1), static_cast<float>(eps)});
  });
}

void rotary_embedding_cpu(const Tensor& positions, const Tensor& qkv, const Tensor& cos_sin_cache,
                          int64_t num_query_heads, int64_t num_key_heads, int64_t head_dim,
                          const std::optional<Tensor>& query_norm, const std::optional<Tensor>& key_norm, double eps) {
  check_rows(qkv, "qkv");
  TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0, "head_dim must be even and positive, got ", head_dim);
  TORCH_CHECK(num_query_heads >= 0 && num_key_heads >= 0 && (num_query_heads + num_key_heads) * head_dim <= qkv.size(1),
              "qkv has ", qkv.size(1), " columns, fewer than (", num_query_heads, " + ", num_key_heads, ") heads x ",
              head_dim);
  TORCH_CHECK(positions.device().is_cpu() && positions.dim() == 1 && positions.is_contiguous() &&
                  positions.scalar_type() == at::kLong,
              "positions must be a contiguous 1-d int64 CPU tensor");
  TORCH_CHECK(positions.size(0) == qkv.size(0), "positions has ", positions.size(0), " entries, qkv ", qkv.size(0),
              " rows");
  TORCH_CHECK(cos_sin_cache.device().is_cpu() && cos_sin_cache.dim() == 2 && cos_sin_cache.is_contiguous() &&
                  cos_sin_cache.scalar_type() == at::kFloat && cos_sin_cache.size(1) == head_dim,
              "cos_sin_cache must be a contiguous float32 [positions, head_dim = ", head_dim, "] CPU tensor");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t cache_rows = cos_sin_cache.size(0);
  for (int64_t t = 0; t < positions.size(0); ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cache_rows, "positions[", t, "] = ", pos[t], " is out of the rotary cache's range [0, ",
                cache_rows, ")");
  if (query_norm) check_weight(*query_norm, qkv, head_dim, "query_norm");
  if (key_norm) check_weight(*key_norm, qkv, head_dim, "key_norm");
  dispatch(qkv.scalar_type(), [&](auto zero, auto ops) {
    using T = decltype(zero);
    decltype(ops)::rotary(pagedinfer_cpu::RotaryRows<T>{
        pos, qkv.data_ptr<T>(), qkv.stride(0), cos_sin_cache.data_ptr<float>(), qkv.size(0), num_query_heads,
        num_key_heads, head_dim, query_norm ? query_norm->data_ptr<T>() : nullptr,
        key_norm ? key_norm->data_ptr<T>() : nullptr, static_cast<float>(eps)});
  });
}

Tensor silu_and_mul_cpu(const Tensor& x) {
  check_rows(x, "input");
  TORCH_CHECK(x.size(1) % 2 == 0, "input's last dimension (gate | up) must be even, got ", x.size(1));
  const int64_t width = x.size(1) / 2;
  Tensor out = at::empty({x.size(0), width}, x.options());
  dispatch(x.scalar_type(), [&](auto zero, auto ops) {
    using T = decltype(zero);
    decltype(ops)::silu_and_mul(pagedinfer_cpu::SiluMulRows<T>{
        x.data_ptr<T>(), x.stride(0), out.data_ptr<T>(), out.stride(0), x.size(0), width});
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(pagedinfer, CPU, m) {
  m.impl("cpu_rms_norm", &rms_norm_cpu);
  m.impl("cpu_fused_add_rms_norm", &fused_add_rms_norm_cpu);
  m.impl("cpu_rotary_embedding", &rotary_embedding_cpu);
  m.impl("cpu_silu_and_mul", &silu_and_mul_cpu);
}
