// Residual connection and the first-token slice (BERT's [CLS] pooling input), elementwise.
//
//   residual_forward      out = a + b                       (out may alias a or b: no __restrict__)
//   first_token_forward   out[b, c]      = inp[b, 0, c]      inp [B,T,C], out [B,C]
//   first_token_backward  dinp[b, 0, c] += dout[b, c]        (rows t > 0 of dinp untouched)
#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

constexpr int kThreads = 256;

// out[i] = a[i] + b[i]
__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = grid_first(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

// One thread per (b, c): out[b, c] = inp[(b T + 0) C + c]
__global__ void first_token_forward_kernel(float* __restrict__ out, const float* __restrict__ inp,
                                           int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * C;
  for (size_t k = grid_first(); k < total; k += grid_stride()) {
    const size_t b = k / C;
    const size_t c = k - b * C;
    out[k] = inp[b * T * static_cast<size_t>(C) + c];
  }
}

// dinp[(b T + 0) C + c] += dout[b, c]
__global__ void first_token_backward_kernel(float* __restrict__ dinp,
                                            const float* __restrict__ dout, int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * C;
  for (size_t k = grid_first(); k < total; k += grid_stride()) {
    const size_t b = k / C;
    const size_t c = k - b * C;
    dinp[b * T * static_cast<size_t>(C) + c] += dout[k];
  }
}

}  // namespace

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  if (n == 0) return;
  residual_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(out, a, b, n);
  LLMPI_LAUNCH_CHECK("residual_forward");
}

void first_token_forward(float* out, const float* inp, int B, int T, int C) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  first_token_forward_kernel<<<grid_for(static_cast<size_t>(B) * C, kThreads), kThreads, 0,
                               compute_stream()>>>(out, inp, B, T, C);
  LLMPI_LAUNCH_CHECK("first_token_forward");
}

void first_token_backward(float* dinp, const float* dout, int B, int T, int C) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  first_token_backward_kernel<<<grid_for(static_cast<size_t>(B) * C, kThreads), kThreads, 0,
                                compute_stream()>>>(dinp, dout, B, T, C);
  LLMPI_LAUNCH_CHECK("first_token_backward");
}

}  // namespace llmpi::cuda
