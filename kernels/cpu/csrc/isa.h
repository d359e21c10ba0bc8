// Which attention kernel runs: the instruction sets this CPU has, found at run time, and an
// override (tests and benches compare the kernels on one machine).
#pragma once

#include <string>

namespace pagedinfer_cpu {

// Ordered: each level's kernel needs the sets of the levels below it too.
enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

// The best level this CPU supports (cpuid, once per process).
Isa detected_isa();

// The level the kernels use now: the override if one is set, else detected_isa().
Isa active_isa();

// "auto" clears the override; "portable", "avx2", "avx512" or "avx512_bf16" sets it (an error if this
// CPU lacks it). Returns the active level's name; an empty request only reads it.
std::string request_isa(const std::string& request);

}  // namespace pagedinfer_cpu
