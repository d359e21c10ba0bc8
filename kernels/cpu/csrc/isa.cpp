// Run-time instruction-set detection for the attention kernels (see isa.h).

#include "isa.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace pagedinfer_cpu {
namespace {

constexpr const char* kNames[] = {"portable", "avx2", "avx512", "avx512_bf16"};

std::atomic<int> override_level{-1};  // -1: none

Isa detect() {
#if !defined(__x86_64__)
  return Isa::kPortable;  // the wider kernels are x86-64's; elsewhere at::vec's default vectors
#else
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("fma");
  if (!avx512) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::kAvx2 : Isa::kPortable;
  return __builtin_cpu_supports("avx512bf16") ? Isa::kAvx512Bf16 : Isa::kAvx512;
#endif
}

}  // namespace

Isa detected_isa() {
  static const Isa detected = detect();
  return detected;
}

Isa active_isa() {
  const int level = override_level.load(std::memory_order_relaxed);
  return level < 0 ? detected_isa() : static_cast<Isa>(level);
}

std::string request_isa(const std::string& request) {
  if (request == "auto") {
    override_level.store(-1);
  } else if (!request.empty()) {
    int level = -1;
    for (int i = 0; i < 4; ++i)
      if (request == kNames[i]) level = i;
    TORCH_CHECK(level >= 0, "unknown CPU attention ISA '", request, "': use auto, portable, avx2, avx512 or avx512_bf16");
    TORCH_CHECK(level <= static_cast<int>(detected_isa()), "this CPU lacks ", request, " (it has ",
                kNames[static_cast<int>(detected_isa())], ")");
    override_level.store(level);
  }
  return kNames[static_cast<int>(active_isa())];
}

}  // namespace pagedinfer_cpu
