// Dense layer on OpenBLAS sgemm. Row-major throughout; transposes are expressed with the BLAS
// transpose flags, never with copies.
#include <cblas.h>

#include <omp.h>

#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

// out[N,OC] = inp[N,C] · weight[OC,C]^T + bias[OC]
// With a bias, out is first filled with the bias rows and sgemm accumulates (beta = 1); this
// costs the same single pass over out as sgemm's own beta = 0 clearing would.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  float beta = 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * OC > (1 << 16))
    for (int n = 0; n < N; n++) {
      float* o = out + static_cast<size_t>(n) * OC;
#pragma omp simd
      for (int j = 0; j < OC; j++) o[j] = bias[j];
    }
    beta = 1.0f;
  }
  if (C <= 0) {
    if (bias == nullptr)
      for (size_t i = 0; i < static_cast<size_t>(N) * OC; i++) out[i] = 0.0f;
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta,
              out, OC);
}

// dinp[N,C]     += dout[N,OC] · weight[OC,C]         (sgemm, beta = 1)
// dweight[OC,C] += dout[N,OC]^T · inp[N,C]           (sgemm, beta = 1)
// dbias[OC]     += Σ_n dout[n, :]                    (column sum; threads split the columns,
//                                                     each column summed in row order)
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  if (N <= 0 || OC <= 0 || C <= 0) return;
  if (dinp != nullptr)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
              dweight, C);
  if (dbias != nullptr) {
#pragma omp parallel if (static_cast<long long>(N) * OC > (1 << 16) && OC >= 32)
    {
      const int nt = omp_get_num_threads(), it = omp_get_thread_num();
      const size_t lines = (static_cast<size_t>(OC) + 15) / 16;
      size_t l0, l1;
      split_range(lines, nt, it, &l0, &l1);
      const int j0 = static_cast<int>(l0 * 16);
      const int j1 = static_cast<int>(l1 * 16 < static_cast<size_t>(OC) ? l1 * 16 : OC);
      for (int n = 0; n < N; n++) {
        const float* d = dout + static_cast<size_t>(n) * OC;
#pragma omp simd
        for (int j = j0; j < j1; j++) dbias[j] += d[j];
      }
    }
  }
}

}  // namespace llmpi::cpu
