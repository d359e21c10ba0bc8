// The layer ops for AVX2 + FMA, run only where isa.cpp found them (see target_avx2.h).
#include "target_avx2.h"
#define PI_LAYER_NS layer_ops_avx2
#include "layer_ops_vec.h"
