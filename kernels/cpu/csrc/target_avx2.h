// Included FIRST by a translation unit compiled for AVX2 + FMA (attention_vec_avx2.cpp,
// layer_ops_avx2.cpp), whose code runs only where isa.cpp found them. Everything after the
// pragma (the headers' inline functions too) is compiled for AVX2: build.py links the baseline
// translation units first, so the linker keeps their copy of any inline function they share.
// GCC's target pragma does not define the feature macros that sleef.h and ATen test: done here.
#pragma once
#if defined(__x86_64__)  // elsewhere isa.cpp never selects it: the default vectors
#pragma GCC target("avx,avx2,fma,f16c")
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif
