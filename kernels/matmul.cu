// Dense layer on cuBLAS sgemm (pure fp32, no TF32), row-major as in backend/ops.h, plus the
// deterministic column-sum kernels used for dbias.
//
//   forward   out[N,OC]     = inp[N,C] · W[OC,C]^T + bias[OC]
//             (bias rows written by a kernel first, then sgemm with beta = 1)
//   backward  dinp[N,C]    += dout[N,OC] · W[OC,C]          sgemm NN, beta = 1
//             dW[OC,C]     += dout[N,OC]^T · inp[N,C]       sgemm TN, beta = 1
//             dbias[OC]    += Σ_n dout[n, :]                two-pass column sum (below)
#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

inline cublasOperation_t op(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

// out[n, j] = bias[j]
__global__ void bias_rows_kernel(float* __restrict__ out, const float* __restrict__ bias, int N,
                                 int OC) {
  const size_t total = static_cast<size_t>(N) * OC;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

// Column sums in two passes, no atomics:
//   pass 1: part[k, j] = Σ_{n in chunk k} x[n, j]      (chunks of kColChunk rows, rows in order)
//   pass 2: colsum[j] += Σ_k part[k, j]                  (chunks in order)
// Threads of a block take consecutive columns, so every row read is coalesced.
constexpr int kColChunk = 32;
constexpr int kColThreads = 256;

__global__ void colsum_partial_kernel(float* __restrict__ part, const float* __restrict__ x, int N,
                                      int M) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= M) return;
  for (int k = blockIdx.y; k * kColChunk < N; k += gridDim.y) {  // chunk k (grid-stride in y)
    const int n0 = k * kColChunk;
    const int n1 = min(n0 + kColChunk, N);
    float s = 0.0f;
    for (int n = n0; n < n1; n++) s += x[static_cast<size_t>(n) * M + j];
    part[static_cast<size_t>(k) * M + j] = s;
  }
}

__global__ void colsum_final_kernel(float* __restrict__ colsum, const float* __restrict__ part,
                                    int nchunks, int M) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= M) return;
  float s = 0.0f;
  for (int k = 0; k < nchunks; k++) s += part[static_cast<size_t>(k) * M + j];
  colsum[j] += s;
}

}  // namespace

void sgemm_rm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc) {
  LLMPI_CUBLAS_CHECK(cublasSgemm(cublas(), op(transB), op(transA), N, M, K, &alpha, B, ldb, A, lda,
                                 &beta, C, ldc));
}

void sgemm_rm_batched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A,
                      int lda, long long strideA, const float* B, int ldb, long long strideB,
                      float beta, float* C, int ldc, long long strideC, int batch) {
  LLMPI_CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), op(transB), op(transA), N, M, K, &alpha, B,
                                               ldb, strideB, A, lda, strideA, &beta, C, ldc,
                                               strideC, batch));
}

void add_column_sums(float* colsum, const float* x, int N, int M) {
  if (N <= 0 || M <= 0) return;
  const int nchunks = (N + kColChunk - 1) / kColChunk;
  float* part = static_cast<float*>(
      workspace(kWsPartials, static_cast<size_t>(nchunks) * M * sizeof(float)));
  cudaStream_t s = compute_stream();
  const dim3 g1((M + kColThreads - 1) / kColThreads, chunk_grid_y(nchunks));
  colsum_partial_kernel<<<g1, kColThreads, 0, s>>>(part, x, N, M);
  LLMPI_LAUNCH_CHECK("colsum_partial");
  colsum_final_kernel<<<(M + kColThreads - 1) / kColThreads, kColThreads, 0, s>>>(colsum, part,
                                                                                   nchunks, M);
  LLMPI_LAUNCH_CHECK("colsum_final");
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  if (N <= 0 || OC <= 0) return;
  cudaStream_t s = compute_stream();
  float beta = 0.0f;
  if (bias != nullptr) {
    bias_rows_kernel<<<grid_for(static_cast<size_t>(N) * OC, 256), 256, 0, s>>>(out, bias, N, OC);
    LLMPI_LAUNCH_CHECK("bias_rows");
    beta = 1.0f;
  }
  if (C <= 0) {
    if (bias == nullptr)
      LLMPI_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(N) * OC * sizeof(float), s));
    return;
  }
  sgemm_rm(false, true, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  if (N <= 0 || OC <= 0 || C <= 0) return;
  if (dinp != nullptr) sgemm_rm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  if (dweight != nullptr) sgemm_rm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) add_column_sums(dbias, dout, N, OC);
}

}  // namespace llmpi::cuda
