// Included FIRST by a translation unit compiled for AVX-512 (attention_vec_avx512.cpp,
// layer_ops_avx512.cpp), whose code runs only where isa.cpp found it. As in target_avx2.h, the
// baseline translation units are linked first and the feature macros are defined by hand.
#pragma once
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
