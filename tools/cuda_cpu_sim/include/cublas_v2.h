// tools/cuda_cpu_sim's stand-in for <cublas_v2.h>: the three GEMMs kernels/matmul.cu calls,
// computed on the CPU in column-major order as cuBLAS defines them (fp32 sums in k order;
// bf16 operands read as their values; CUBLAS_COMPUTE_32F_FAST_TF32 rounds the fp32 operands to
// tf32 first, backend/tf32.h). A reference for the code around the GEMMs (operand conversions,
// ragged splits, padded rows, bias and GELU passes), not a model of cuBLAS's own rounding.
#pragma once
#include "cuda_runtime.h"

struct cublasContext {
  cudaStream_t stream = nullptr;  // cublasSetStream's: a GEMM runs after what it holds
};
using cublasHandle_t = cublasContext*;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 };
enum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
inline const char* cublasGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS (simulated)"; }
inline const char* cublasGetStatusString(cublasStatus_t) { return "(simulated)"; }

namespace llmpi::sim {
// C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C
cublasStatus_t gemm_col_major(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                              const void* A, cudaDataType_t at, int lda, const void* B, cudaDataType_t bt, int ldb,
                              float beta, float* C, int ldc, bool tf32);
}  // namespace llmpi::sim

inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float* alpha, const float* A, int lda, const float* B, int ldb,
                                  const float* beta, float* C, int ldc) {
  llmpi::sim::reach(h->stream);
  return llmpi::sim::gemm_col_major(ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, ldc,
                                    false);
}
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                int n, int k, const float* alpha, const float* A, int lda,
                                                long long sA, const float* B, int ldb, long long sB,
                                                const float* beta, float* C, int ldc, long long sC, int batch) {
  llmpi::sim::reach(h->stream);
  for (int i = 0; i < batch; i++) {
    const cublasStatus_t s = llmpi::sim::gemm_col_major(ta, tb, m, n, k, *alpha, A + i * sA, CUDA_R_32F, lda,
                                                        B + i * sB, CUDA_R_32F, ldb, *beta, C + i * sC, ldc, false);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void* alpha, const void* A, cudaDataType_t at, int lda, const void* B,
                                   cudaDataType_t bt, int ldb, const void* beta, void* C, cudaDataType_t ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t) {
  llmpi::sim::reach(h->stream);
  if (ct != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
  return llmpi::sim::gemm_col_major(ta, tb, m, n, k, *static_cast<const float*>(alpha), A, at, lda, B, bt, ldb,
                                    *static_cast<const float*>(beta), static_cast<float*>(C), ldc,
                                    compute == CUBLAS_COMPUTE_32F_FAST_TF32);
}
