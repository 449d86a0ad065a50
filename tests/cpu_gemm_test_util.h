// Shared by the CPU GEMM engine tests (test_cpu_bf16_gemm.cpp, test_cpu_fp32_gemm.cpp): bitwise
// equality of float vectors, and OpenMP's and OpenBLAS's thread counts set for a scope.
#pragma once
#include <omp.h>

#include <cstring>
#include <vector>

extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace llmpi::test {

inline bool same_float_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// OpenMP's and OpenBLAS's thread counts (the GEMMs' is OpenBLAS's) for the lifetime of the object.
struct GemmThreads {
  int saved_omp = omp_get_max_threads(), saved_blas = openblas_get_num_threads();
  GemmThreads(int omp, int blas) {
    omp_set_num_threads(omp);
    openblas_set_num_threads(blas);
  }
  ~GemmThreads() {
    omp_set_num_threads(saved_omp);
    openblas_set_num_threads(saved_blas);
  }
  GemmThreads(const GemmThreads&) = delete;
  GemmThreads& operator=(const GemmThreads&) = delete;
};

}  // namespace llmpi::test
