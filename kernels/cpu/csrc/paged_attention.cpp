// The CPU paged-attention and KV-cache-write ops: argument checks, the work split, and the
// choice of kernel by the instruction sets isa.cpp found at run time: attention_avx512.cpp where
// the CPU has AVX-512 and the problem fits it, else attention_vec.h for the widest set it has. The work is split into items (sequence, tile of
// consecutive query tokens, at most kRowTile rows per KV head): items are independent, so
// at::parallel_for runs them over the intra-op threads.

#include "attention.h"
#include "isa.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

namespace {

using at::Tensor;
using pagedinfer_cpu::Problem;
using pagedinfer_cpu::WorkItem;

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
  const int64_t tile_tokens = std::max<int64_t>(1, pagedinfer_cpu::kRowTile / group);
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
  const pagedinfer_cpu::Isa isa = pagedinfer_cpu::active_isa();
  const auto run = [&](auto zero) {
    using scalar_t = decltype(zero);
    const Problem<scalar_t> problem{
        query.data_ptr<scalar_t>(), key_cache.data_ptr<scalar_t>(), value_cache.data_ptr<scalar_t>(),
        out.data_ptr<scalar_t>(), block_tables.data_ptr<int32_t>(), table_width, lens, starts,
        num_heads, num_kv_heads, group, query.size(2), value_dim, block_size, static_cast<float>(scale), window};
    const int64_t tile_rows = tile_tokens * group;
    if (isa >= pagedinfer_cpu::Isa::kAvx512 && pagedinfer_cpu::avx512_fits(problem))
      pagedinfer_cpu::attend_avx512(problem, items, tile_rows, isa == pagedinfer_cpu::Isa::kAvx512Bf16);
    else if (isa >= pagedinfer_cpu::Isa::kAvx512)
      pagedinfer_cpu::attend_vec_avx512(problem, items, tile_rows);
    else if (isa == pagedinfer_cpu::Isa::kAvx2)
      pagedinfer_cpu::attend_vec_avx2(problem, items, tile_rows);
    else
      pagedinfer_cpu::attend_vec_default(problem, items, tile_rows);
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

// Not a tensor op (it picks the attention kernel, see isa.h), so defined here with a catch-all kernel.
TORCH_LIBRARY_FRAGMENT(pagedinfer, m) {
  m.def("cpu_attention_isa(str request) -> str", [](std::string request) { return pagedinfer_cpu::request_isa(request); });
}
