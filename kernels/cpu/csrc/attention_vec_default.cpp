// The `at::vec` attention for the baseline x86-64 (generic vectors): runs on any CPU.
#define PI_VEC_ENTRY attend_vec_default
#include "attention_vec.h"
