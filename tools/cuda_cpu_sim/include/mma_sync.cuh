// tools/cuda_cpu_sim's stand-in for kernels/mma_sync.cuh: the simulated mma.sync and round_tf32
// are in cuda_shim.h (found before kernels/ on the sim's include path).
#pragma once
#include "cuda_shim.h"
