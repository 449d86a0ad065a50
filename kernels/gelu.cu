// GELU, tanh approximation (GPT-2):  gelu(x) = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x³),
// k = sqrt(2/pi). As in the CPU backend, 0.5 (1 + tanh(u)) is written as sigmoid(2u) with
// e = exp(-|2u|) <= 1 (never overflows, no cancellation for large negative x):
//   s = sigmoid(2u) = (u >= 0 ? 1 : e) / (1 + e),   s (1 - s) = e / (1 + e)²
//   forward   out  = x s
//   backward  dinp += (s + 2 x s (1 - s) k (1 + 3·0.044715 x²)) · dout
// Elementwise, grid-stride loops, float4 accesses when the pointers are 16-byte aligned (and a
// bf16 output 8-byte aligned; vector_access.cuh); expf is the accurate (non-intrinsic) one. The
// forward may write its output in fp32 and / or rounded to bf16 (gelu_forward_to: the bf16
// path of matmul_gelu_forward, whose act_bf16 a bf16 Model keeps instead of the fp32 act).
#include <cuda_bf16.h>

#include "cuda_common.cuh"
#include "vector_access.cuh"

namespace llmpi::cuda {

namespace {

constexpr float kK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;

// gelu(x) and gelu'(x), as in the comment above
__device__ __forceinline__ float gelu_value(float x) {
  const float a = 2.0f * kK * (x + kA * x * x * x);
  const float e = expf(-fabsf(a));
  const float s = (a >= 0.0f ? 1.0f : e) / (1.0f + e);
  return x * s;
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float x2 = x * x;
  const float a = 2.0f * kK * (x + kA * x2 * x);
  const float e = expf(-fabsf(a));
  const float r = 1.0f / (1.0f + e);
  const float s = (a >= 0.0f ? 1.0f : e) * r;
  const float ss = e * r * r;  // s (1 - s)
  return s + 2.0f * x * ss * kK * (1.0f + 3.0f * kA * x2);
}

// V floats per access for the first n - n % V elements, then the rest one by one; the output in
// fp32 (out) and / or rounded to bf16 (out16), either may be null (store_floats_bf16)
template <int V>
__global__ void gelu_forward_kernel(float* __restrict__ out, __nv_bfloat16* __restrict__ out16,
                                    const float* __restrict__ inp, size_t n) {
  const size_t nv = n / V;
  for (size_t q = grid_first(); q < nv; q += grid_stride()) {
    const Floats<V> xv = load_floats<V>(inp + q * V);
    Floats<V> ov;
#pragma unroll
    for (int j = 0; j < V; j++) ov.v[j] = gelu_value(xv.v[j]);
    store_floats_bf16<V>(out ? out + q * V : nullptr, out16 ? out16 + q * V : nullptr, ov);
  }
  for (size_t i = nv * V + grid_first(); i < n; i += grid_stride()) {
    Floats<1> o1;
    o1.v[0] = gelu_value(inp[i]);
    store_floats_bf16<1>(out ? out + i : nullptr, out16 ? out16 + i : nullptr, o1);
  }
}

template <int V>
__global__ void gelu_backward_kernel(float* __restrict__ dinp, const float* __restrict__ inp,
                                     const float* __restrict__ dout, size_t n) {
  const size_t nv = n / V;
  for (size_t q = grid_first(); q < nv; q += grid_stride()) {
    const Floats<V> xv = load_floats<V>(inp + q * V), dv = load_floats<V>(dout + q * V);
    Floats<V> gv = load_floats<V>(dinp + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) gv.v[j] += gelu_grad(xv.v[j]) * dv.v[j];
    store_floats<V>(dinp + q * V, gv);
  }
  for (size_t i = nv * V + grid_first(); i < n; i += grid_stride())
    dinp[i] += gelu_grad(inp[i]) * dout[i];
}

// d[i] = gelu'(pre[i]) · d[i] (the unfused path of matmul_dgelu_backward, which overwrites its
// output: every bf16 run's dGELU, measured faster there than cuBLASLt's DGELU pass); elementwise,
// so V = 4 and V = 1 give the same bits
template <int V>
__global__ void gelu_grad_multiply_kernel(float* __restrict__ d, const float* __restrict__ pre, size_t n) {
  const size_t nv = n / V;
  for (size_t q = grid_first(); q < nv; q += grid_stride()) {
    const Floats<V> xv = load_floats<V>(pre + q * V);
    Floats<V> dv = load_floats<V>(d + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) dv.v[j] = gelu_grad(xv.v[j]) * dv.v[j];
    store_floats<V>(d + q * V, dv);
  }
  for (size_t i = nv * V + grid_first(); i < n; i += grid_stride()) d[i] = gelu_grad(pre[i]) * d[i];
}

}  // namespace

void gelu_grad_multiply(float* d, const float* pre, size_t n) {
  if (n == 0) return;
  if (path_on(Path::gelu_grad_vec4) && vec4_rows(0, {d, pre}))  // alignment only: the kernel does the n % 4 tail
    gelu_grad_multiply_kernel<4><<<grid_for(n / 4 + 1, 256), 256, 0, compute_stream()>>>(d, pre, n);
  else
    gelu_grad_multiply_kernel<1><<<grid_for(n, 256), 256, 0, compute_stream()>>>(d, pre, n);
  LLMPI_LAUNCH_CHECK("gelu_grad_multiply");
}

void gelu_forward_to(float* out, uint16_t* out_bf16, const float* inp, size_t n) {
  if (n == 0) return;
  auto* out16 = reinterpret_cast<__nv_bfloat16*>(out_bf16);
  // alignment only: the kernel does the n % 4 tail
  if (vec4_rows(0, {out, inp}) && reinterpret_cast<uintptr_t>(out16) % 8 == 0)
    gelu_forward_kernel<4><<<grid_for(n / 4 + 1, 256), 256, 0, compute_stream()>>>(out, out16, inp, n);
  else
    gelu_forward_kernel<1><<<grid_for(n, 256), 256, 0, compute_stream()>>>(out, out16, inp, n);
  LLMPI_LAUNCH_CHECK("gelu_forward");
}

void gelu_forward(float* out, const float* inp, size_t n) { gelu_forward_to(out, nullptr, inp, n); }

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  if (n == 0) return;
  if (vec4_rows(0, {dinp, inp, dout}))
    gelu_backward_kernel<4><<<grid_for(n / 4 + 1, 256), 256, 0, compute_stream()>>>(dinp, inp, dout, n);
  else
    gelu_backward_kernel<1><<<grid_for(n, 256), 256, 0, compute_stream()>>>(dinp, inp, dout, n);
  LLMPI_LAUNCH_CHECK("gelu_backward");
}

}  // namespace llmpi::cuda
