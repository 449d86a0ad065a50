// Residual connection and the first-token slice (BERT's [CLS] pooling input), elementwise.
//
//   residual_forward      out = a + b                       (out may alias a or b: no __restrict__)
//   first_token_forward   out[b, c]      = inp[b, 0, c]      inp [B,T,C], out [B,C]
//   first_token_backward  dinp[b, 0, c] += dout[b, c]        (rows t > 0 of dinp untouched)
// residual_forward moves float4s when all three pointers are 16-byte aligned (vector_access.cuh),
// the last n % 4 elements one by one.
#include "cuda_common.cuh"
#include "vector_access.cuh"

namespace llmpi::cuda {

namespace {

constexpr int kThreads = 256;

// out[i] = a[i] + b[i]: V floats per access for the first n - n % V, then the rest one by one
template <int V>
__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  const size_t nv = n / V;
  for (size_t q = grid_first(); q < nv; q += grid_stride()) {
    const Floats<V> av = load_floats<V>(a + q * V), bv = load_floats<V>(b + q * V);
    Floats<V> ov;
#pragma unroll
    for (int j = 0; j < V; j++) ov.v[j] = av.v[j] + bv.v[j];
    store_floats<V>(out + q * V, ov);
  }
  for (size_t i = nv * V + grid_first(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
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
  if (vec4_rows(0, {out, a, b}))  // alignment only: the kernel does the n % 4 tail
    residual_forward_kernel<4><<<grid_for(n / 4 + 1, kThreads), kThreads, 0, compute_stream()>>>(out, a, b, n);
  else
    residual_forward_kernel<1><<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(out, a, b, n);
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
