// Fused softmax + cross-entropy over the vocabulary, and its backward, in place.
//
// One block per row n, logits z (length V), target y:
//   mx = max_j z_j;  S = Σ_j exp(z_j - mx)            (every term in (0, 1])
//   loss_n = log S + mx - z_y                          (= -log softmax(z)_y, no overflow)
//   if grad_scale != 0:  z_j <- grad_scale * (exp(z_j - mx) / S - [j == y])
// Two passes over the row (an online max and sum; the write). The first is "online softmax"
// (Milakov & Gimelshein 2018): each thread keeps its running maximum m and its sum s of
// exp(z - m) over its elements, rescaling s by exp(m_old - m_new) when the maximum grows (one exp
// per element either way); then the block's maximum M and S = Σ_threads s_t·exp(m_t - M). A NaN
// logit makes S (so the loss) NaN, as the three-pass kernel did; a -inf one adds nothing.
// z_y is read before any write. Targets outside [0, V) are recorded, never read: the kernel keeps
// the first bad row (and its target) in a 64-bit key, max-combined (an integer atomicMax: the
// result does not depend on the order; backend/step_scalars.h encode_bad_target).
//   softmax_xent         the checked op: the key in a workspace flag, waited for and read back
//                        after the kernel, an out-of-range target raises the CPU backend's error
//   softmax_xent_record  no host wait: the key goes to the caller's flag (a training step's
//                        StepScalars), which the step reads once with the loss and gradient norm
//   softmax_xent_bf16_grad  softmax_xent_record writing the gradient as bf16 into another buffer
//                        (a bf16 LM head's GEMM operand; rows padded with zeros)
// The last two take the rows' stride ld >= V (the LM head's padded logits rows; the padding is
// neither read nor, in the logits, written).
#include <cuda_bf16.h>

#include <type_traits>

#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void store_grad(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_grad(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Rows are ld >= V values apart, in the logits and in grad. G = float: the gradient over the
// logits (grad = logits; the padding untouched); G = __nv_bfloat16: into grad [N, ld] as bf16,
// padding columns zero, logits only read. One template, so the gradient's value
// is the same expression in both (its products rounded explicitly, as the CPU rounds them: e·f,
// then − grad_scale on the target; no contraction into an FMA).
template <typename G>
__global__ void softmax_xent_kernel(const float* logits, G* grad, int ld,  // (they alias for G = float)
                                    float* __restrict__ losses, const int32_t* __restrict__ targets,
                                    unsigned long long* __restrict__ bad, int V, int row0,
                                    float grad_scale) {
  __shared__ float sh[32];
  const int n = blockIdx.x;
  const float* z = logits + static_cast<size_t>(n) * ld;
  const int y = targets[n];
  if (y < 0 || y >= V) {
    if (threadIdx.x == 0) {
      atomicMax(bad, static_cast<unsigned long long>(encode_bad_target(row0 + n, y)));
      losses[n] = __int_as_float(0x7fc00000);  // NaN
    }
    return;
  }
  const float zy = z[y];
  float m = -INFINITY, st = 0.0f;  // this thread's running maximum and Σ exp(z - m)
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = z[j];
    if (x > m) {
      st = st * expf(m - x) + 1.0f;  // m = -inf at first: expf(-inf) = 0
      m = x;
    } else {
      st += x == -INFINITY ? 0.0f : expf(x - m);  // NaN stays NaN
    }
  }
  const float mx = block_max(m, sh);
  // (a thread that saw only -inf adds 0; one that saw a NaN, even with m = -inf, adds NaN)
  float s = block_sum(m == -INFINITY && st == 0.0f ? 0.0f : st * expf(m - mx), sh);
  if (threadIdx.x == 0) losses[n] = logf(s) + (mx - zy);
  if (grad_scale != 0.0f) {
    __syncthreads();  // every thread has read z[y] (and all of z) before anyone writes (in place)
    const float f = grad_scale / s;
    G* g = grad + static_cast<size_t>(n) * ld;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float e = __fmul_rn(expf(z[j] - mx), f);
      store_grad(g + j, j == y ? __fsub_rn(e, grad_scale) : e);
    }
    if constexpr (!std::is_same_v<G, float>)
      for (int j = V + threadIdx.x; j < ld; j += blockDim.x) store_grad(g + j, 0.0f);
  }
}

}  // namespace

void softmax_xent_record(float* logits, int ld, float* losses, const int32_t* targets, int N, int V,
                         float grad_scale, uint64_t* bad, int row0) {
  if (ld < V) fail("internal: softmax_xent_record with ld ", ld, " < V ", V);
  if (N <= 0) return;
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "atomicMax on the 64-bit key");
  softmax_xent_kernel<float><<<N, kThreads, 0, compute_stream()>>>(
      logits, logits, ld, losses, targets, reinterpret_cast<unsigned long long*>(bad), V, row0, grad_scale);
  LLMPI_LAUNCH_CHECK("softmax_xent");
}

void softmax_xent_bf16_grad(const float* logits, int ld, float* losses, const int32_t* targets, int N, int V,
                            float grad_scale, uint16_t* grad, uint64_t* bad, int row0) {
  if (grad_scale == 0.0f || ld < V) fail("internal: softmax_xent_bf16_grad needs grad_scale != 0 and ld >= V");
  if (N <= 0) return;
  softmax_xent_kernel<__nv_bfloat16><<<N, kThreads, 0, compute_stream()>>>(
      logits, reinterpret_cast<__nv_bfloat16*>(grad), ld, losses, targets, reinterpret_cast<unsigned long long*>(bad),
      V, row0, grad_scale);
  LLMPI_LAUNCH_CHECK("softmax_xent_bf16_grad");
}

void softmax_xent(float* logits, float* losses, const int32_t* targets, int N, int V,
                  float grad_scale) {
  count_readback();
  if (N <= 0) return;
  cudaStream_t s = compute_stream();
  uint64_t* bad = static_cast<uint64_t*>(workspace(kWsFlag, sizeof(uint64_t)));
  LLMPI_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(uint64_t), s));
  softmax_xent_record(logits, V, losses, targets, N, V, grad_scale, bad, 0);
  uint64_t key = 0;
  LLMPI_CUDA_CHECK(cudaMemcpyAsync(&key, bad, sizeof(uint64_t), cudaMemcpyDeviceToHost, s));
  wait_for_stream();
  if (key != 0)
    fail("softmax_xent: target ", bad_target_value(key), " at row ", bad_target_row(key),
         " is outside the vocabulary [0, ", V, "); check the data set's vocab_size against the model's");
}

}  // namespace llmpi::cuda
