// tools/cuda_cpu_sim's stand-in for <cuda_bf16.h>: __nv_bfloat16 and its conversions are in cuda_shim.h.
#pragma once
#include "cuda_shim.h"
