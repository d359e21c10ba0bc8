// The layer ops for AVX-512, run only where isa.cpp found it (see target_avx512.h).
#include "target_avx512.h"
#define PI_LAYER_NS layer_ops_avx512
#include "layer_ops_vec.h"
