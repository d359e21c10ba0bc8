// The layer ops for the baseline x86-64 (generic vectors): run on any CPU.
#define PI_LAYER_NS layer_ops_default
#include "layer_ops_vec.h"
