// The `at::vec` attention for AVX-512 (what attention_avx512.cpp does not take: float16 caches,
// head sizes not multiples of 16), run only where isa.cpp found it (see target_avx512.h).
#include "target_avx512.h"
#define PI_VEC_ENTRY attend_vec_avx512
#include "attention_vec.h"
