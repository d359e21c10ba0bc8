// The `at::vec` attention for AVX2 + FMA, run only where isa.cpp found them (see target_avx2.h).
#include "target_avx2.h"
#define PI_VEC_ENTRY attend_vec_avx2
#include "attention_vec.h"
