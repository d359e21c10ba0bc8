// The `at::vec` attention for AVX-512 (what attention_avx512.cpp does not take: float16 caches,
// head sizes not multiples of 16), run only where isa.cpp found it. As in attention_vec_avx2.cpp,
// the baseline translation units are linked first and the feature macros are defined by hand.
#if defined(__x86_64__)  // elsewhere isa.cpp never selects it: the default vectors
#pragma GCC target("avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#endif
#define PI_VEC_ENTRY attend_vec_avx512
#include "attention_vec.h"
