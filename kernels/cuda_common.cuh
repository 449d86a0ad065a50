// Private to the CUDA backend: the functions behind cuda_ops() (see src/backend/ops.h for the
// contract of each), the one compute stream and cuBLAS handle they share, a cached scratch
// workspace, error checks, and the warp/block reductions the kernels use.
//
// Execution model: every op is enqueued on ONE stream (compute_stream(), a blocking stream of the
// device bound by cuda_bind_device), so ops run in call order and scratch buffers can be reused
// from one op to the next without synchronisation. The host waits only where the contract needs a
// host value: copy_to_host, sum_squares (returns a double) and softmax_xent (target check).
//
// Determinism: no float atomics anywhere. Column sums (dbias, LayerNorm dweight/dbias) are summed
// per fixed chunk of rows, then the chunks in order; the embedding backward sorts positions by
// token (stable) and sums each token's rows in position order; sum_squares uses a grid that
// depends only on n. Results are bitwise repeatable run to run on the same card.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace llmpi::cuda {

// ---- errors: throw llmpi::Error naming the call, the file:line and CUDA's message ----------------
[[noreturn]] void throw_cuda(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line);

#define LLMPI_CUDA_CHECK(call)                                                        \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) ::llmpi::cuda::throw_cuda(e_, #call, __FILE__, __LINE__); \
  } while (0)
#define LLMPI_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                            \
    cublasStatus_t s_ = (call);                                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) ::llmpi::cuda::throw_cublas(s_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: launch-configuration errors (bad grid, no kernel image) surface here.
#define LLMPI_LAUNCH_CHECK(name) LLMPI_CUDA_CHECK(cudaPeekAtLastError())

// ---- shared state (memory.cu) ------------------------------------------------------------------
cudaStream_t compute_stream();
cublasHandle_t cublas();
// Scratch buffers that persist between calls and grow on demand (never shrink). A slot's content
// is valid only within one op (ops on the one stream never overlap, so slots are reused freely).
enum WorkspaceSlot { kWsPartials = 0, kWsSortKeys, kWsSortVals, kWsSortTemp, kWsReduce, kWsFlag, kWsSlots };
void* workspace(WorkspaceSlot slot, size_t bytes);
size_t workspace_bytes();  // all slots together

// Blocks for a grid-stride loop over n items: one item per thread, at most 2^20 blocks.
inline unsigned grid_for(size_t n, int threads) {
  size_t b = (n + threads - 1) / threads;
  const size_t cap = size_t(1) << 20;
  if (b > cap) b = cap;
  return b == 0 ? 1u : static_cast<unsigned>(b);
}

// ---- row-major sgemm (matmul.cu), the cblas_sgemm(CblasRowMajor, ...) of the CPU backend -------
// C[M,N] = alpha op(A) op(B) + beta C, all row-major with leading dimensions lda/ldb/ldc.
// A row-major matrix is its column-major transpose, so this is the column-major
//   C^T = alpha op(B)^T op(A)^T + beta C^T
// i.e. cublasSgemm with the operands (and M/N) swapped and the same transpose flags.
void sgemm_rm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc);
// The same for `batch` products whose operands start strideA/strideB/strideC floats apart.
void sgemm_rm_batched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A,
                      int lda, long long strideA, const float* B, int ldb, long long strideB,
                      float beta, float* C, int ldc, long long strideC, int batch);

// ---- ops (contract: backend/ops.h) --------------------------------------------------------------
// memory.cu
void* alloc(size_t bytes);
void free(void* p);
void zero(void* p, size_t bytes);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// embedding.cu
void embedding_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                       int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                        int T, int C);
// layernorm.cu
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);
// matmul.cu
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);
// Column sums, deterministic: colsum[j] += Σ_n x[n, j] for x [N, M] (matmul.cu).
void add_column_sums(float* colsum, const float* x, int N, int M);
// attention.cu
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);
// gelu.cu
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
// residual.cu
void residual_forward(float* out, const float* a, const float* b, size_t n);
// softmax_xent.cu
void softmax_xent(float* logits, float* losses, const int32_t* targets, int N, int V,
                  float grad_scale);
// adamw.cu
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);
void sgd_update(float* params, const float* grads, size_t n, float lr, float weight_decay);
double sum_squares(const float* x, size_t n);
void scale(float* x, float s, size_t n);

// ---- device helpers ------------------------------------------------------------------------------
template <typename F>
__device__ __forceinline__ F warp_sum(F v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `sh` is 32 elements of shared memory; the function may be called repeatedly with the same `sh`.
template <typename F>
__device__ F block_sum(F v, F* sh) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // protects sh from a previous call's readers
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  F r = lane < nw ? sh[lane] : F(0);
  return warp_sum(r);
}
__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : -INFINITY;
  return warp_max(r);
}

}  // namespace llmpi::cuda
