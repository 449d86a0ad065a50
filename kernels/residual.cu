// Residual connection: out = a + b, elementwise (out may alias a or b, so no __restrict__).
#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

// out[i] = a[i] + b[i]
__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

}  // namespace

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  if (n == 0) return;
  residual_forward_kernel<<<grid_for(n, 256), 256, 0, compute_stream()>>>(out, a, b, n);
  LLMPI_LAUNCH_CHECK("residual_forward");
}

}  // namespace llmpi::cuda
