// What a simulation's main can set and read of tools/cuda_cpu_sim/sim_runtime.cpp.
#pragma once
#include "cuda_common.cuh"

namespace llmpi::sim {
extern bool g_epilogues;  // cuda_gemm_epilogues_enabled() (LLMPI_CUDA_EPILOGUES); true at first
extern long long g_lt_counts[static_cast<int>(cuda::LtCount::kinds)];  // lt_count's counters
}  // namespace llmpi::sim
