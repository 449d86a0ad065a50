// GELU, tanh approximation (GPT-2):  gelu(x) = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x³),
// k = sqrt(2/pi). As in the CPU backend, 0.5 (1 + tanh(u)) is written as sigmoid(2u) with
// e = exp(-|2u|) <= 1 (never overflows, no cancellation for large negative x):
//   s = sigmoid(2u) = (u >= 0 ? 1 : e) / (1 + e),   s (1 - s) = e / (1 + e)²
//   forward   out  = x s
//   backward  dinp += (s + 2 x s (1 - s) k (1 + 3·0.044715 x²)) · dout
// Elementwise, grid-stride loops; expf is the accurate (non-intrinsic) one.
#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

constexpr float kK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;

__global__ void gelu_forward_kernel(float* __restrict__ out, const float* __restrict__ inp,
                                    size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float a = 2.0f * kK * (x + kA * x * x * x);
    const float e = expf(-fabsf(a));
    const float s = (a >= 0.0f ? 1.0f : e) / (1.0f + e);
    out[i] = x * s;
  }
}

__global__ void gelu_backward_kernel(float* __restrict__ dinp, const float* __restrict__ inp,
                                     const float* __restrict__ dout, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float x2 = x * x;
    const float a = 2.0f * kK * (x + kA * x2 * x);
    const float e = expf(-fabsf(a));
    const float r = 1.0f / (1.0f + e);
    const float s = (a >= 0.0f ? 1.0f : e) * r;
    const float ss = e * r * r;  // s (1 - s)
    const float g = s + 2.0f * x * ss * kK * (1.0f + 3.0f * kA * x2);
    dinp[i] += g * dout[i];
  }
}

// d[i] = g(pre[i]) · d[i], g the derivative of gelu_backward_kernel (the unfused path of
// matmul_dgelu_backward, which overwrites its output)
__global__ void gelu_grad_multiply_kernel(float* __restrict__ d, const float* __restrict__ pre, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float x = pre[i];
    const float x2 = x * x;
    const float a = 2.0f * kK * (x + kA * x2 * x);
    const float e = expf(-fabsf(a));
    const float r = 1.0f / (1.0f + e);
    const float s = (a >= 0.0f ? 1.0f : e) * r;
    const float ss = e * r * r;  // s (1 - s)
    const float g = s + 2.0f * x * ss * kK * (1.0f + 3.0f * kA * x2);
    d[i] = g * d[i];
  }
}

}  // namespace

void gelu_grad_multiply(float* d, const float* pre, size_t n) {
  if (n == 0) return;
  gelu_grad_multiply_kernel<<<grid_for(n, 256), 256, 0, compute_stream()>>>(d, pre, n);
  LLMPI_LAUNCH_CHECK("gelu_grad_multiply");
}

void gelu_forward(float* out, const float* inp, size_t n) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n, 256), 256, 0, compute_stream()>>>(out, inp, n);
  LLMPI_LAUNCH_CHECK("gelu_forward");
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n, 256), 256, 0, compute_stream()>>>(dinp, inp, dout, n);
  LLMPI_LAUNCH_CHECK("gelu_backward");
}

}  // namespace llmpi::cuda
