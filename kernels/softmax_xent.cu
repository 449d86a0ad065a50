// Fused softmax + cross-entropy over the vocabulary, and its backward, in place.
//
// One block per row n, logits z (length V), target y:
//   mx = max_j z_j;  S = Σ_j exp(z_j - mx)            (block reductions; every term in (0, 1])
//   loss_n = log S + mx - z_y                          (= -log softmax(z)_y, no overflow)
//   if grad_scale != 0:  z_j <- grad_scale * (exp(z_j - mx) / S - [j == y])
// Three passes over the row (max; sum of exps; write), the row staying in L2 between them.
// z_y is read before any write. Targets outside [0, V) are reported like the CPU backend does
// (an llmpi::Error naming the row): the kernel records the first bad row in a device flag, which
// the host reads after the kernel (the caller reads the losses right after anyway).
#include <climits>

#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

constexpr int kThreads = 512;

__global__ void softmax_xent_kernel(float* __restrict__ logits, float* __restrict__ losses,
                                    const int32_t* __restrict__ targets, int* __restrict__ bad_row,
                                    int V, float grad_scale) {
  __shared__ float sh[32];
  const int n = blockIdx.x;
  float* z = logits + static_cast<size_t>(n) * V;
  const int y = targets[n];
  if (y < 0 || y >= V) {
    if (threadIdx.x == 0) {
      atomicMin(bad_row, n);
      losses[n] = __int_as_float(0x7fc00000);  // NaN
    }
    return;
  }
  const float zy = z[y];
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx, sh);
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(z[j] - mx);
  s = block_sum(s, sh);
  if (threadIdx.x == 0) losses[n] = logf(s) + (mx - zy);
  if (grad_scale != 0.0f) {
    __syncthreads();  // every thread has read z[y] (and all of z) before anyone writes
    const float f = grad_scale / s;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
      z[j] = expf(z[j] - mx) * f - (j == y ? grad_scale : 0.0f);
  }
}

__global__ void set_int_kernel(int* p, int v) { *p = v; }

}  // namespace

void softmax_xent(float* logits, float* losses, const int32_t* targets, int N, int V,
                  float grad_scale) {
  if (N <= 0) return;
  cudaStream_t s = compute_stream();
  int* bad = static_cast<int*>(workspace(kWsFlag, sizeof(int)));
  set_int_kernel<<<1, 1, 0, s>>>(bad, INT_MAX);
  LLMPI_LAUNCH_CHECK("set_int");
  softmax_xent_kernel<<<N, kThreads, 0, s>>>(logits, losses, targets, bad, V, grad_scale);
  LLMPI_LAUNCH_CHECK("softmax_xent");
  int bad_host = INT_MAX;
  LLMPI_CUDA_CHECK(cudaMemcpyAsync(&bad_host, bad, sizeof(int), cudaMemcpyDeviceToHost, s));
  LLMPI_CUDA_CHECK(cudaStreamSynchronize(s));
  if (bad_host != INT_MAX) {
    int32_t t = 0;
    LLMPI_CUDA_CHECK(cudaMemcpy(&t, targets + bad_host, sizeof(int32_t), cudaMemcpyDeviceToHost));
    fail("softmax_xent: target ", t, " at row ", bad_host, " is outside the vocabulary [0, ", V,
         "); check the data set's vocab_size against the model's");
  }
}

}  // namespace llmpi::cuda
