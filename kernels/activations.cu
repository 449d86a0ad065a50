// Pointwise activations beside GELU-tanh (gelu.cu): exact GELU, SwiGLU, tanh, dropout.
// Every backward ADDS into dinp. Grid-stride loops, one element per thread per step; expf, erfcf
// and tanhf are CUDA's accurate (non-intrinsic) functions.
//
//   gelu_erf   Φ(x) = erfc(-x/√2)/2 (the normal CDF; erfc keeps it accurate for x << 0, where
//              (1 + erf) would cancel), φ(x) = exp(-x²/2)/√(2π):
//              forward   out   = x Φ(x)
//              backward  dinp += (Φ(x) + x φ(x)) dout
//   swiglu     row n of inp [N, 2F] is [gate g | up u]; σ(g) = 1/(1+exp(-g)), silu(g) = g σ(g):
//              forward   out[n,f]  = silu(g_f) u_f
//              backward  dg_f     += dout[n,f] u_f σ(g_f) (1 + g_f (1 - σ(g_f)))
//                        du_f     += dout[n,f] silu(g_f)
//              σ is evaluated with e = exp(-|g|) <= 1 (never overflows).
//   tanh       forward   out = tanh(x);   backward  dinp += dout (1 - out²)  (from the output)
//   dropout    keep_i = dropout_keep(key, i, p) (backend/dropout_hash.h), s = 1/(1-p) rounded to
//              float (p outside [0, 1) is an Error, as on the CPU):
//              forward   out[i]   = keep_i ? inp[i] s : 0       (out may alias inp)
//              backward  dinp[i] += keep_i ? dout[i] s : 0
#include <cuda_bf16.h>

#include "backend/dropout_hash.h"
#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kInvSqrt2 = 0.70710678118654752f;    // 1/√2
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/√(2π)

// An activation's output value: fp32 into out and / or its bf16 rounding into out16 (either may be
// null: out_bf16 of op_list.h), the one value computed once.
__device__ __forceinline__ void store_activation(float* out, __nv_bfloat16* out16, size_t i, float v) {
  if (out) out[i] = v;
  if (out16) out16[i] = __float2bfloat16_rn(v);
}

__global__ void gelu_erf_forward_kernel(float* __restrict__ out, __nv_bfloat16* __restrict__ out16,
                                        const float* __restrict__ inp, size_t n) {
  for (size_t i = grid_first(); i < n; i += grid_stride()) {
    const float x = inp[i];
    store_activation(out, out16, i, x * 0.5f * erfcf(-x * kInvSqrt2));
  }
}

__global__ void gelu_erf_backward_kernel(float* __restrict__ dinp, const float* __restrict__ inp,
                                         const float* __restrict__ dout, size_t n) {
  for (size_t i = grid_first(); i < n; i += grid_stride()) {
    const float x = inp[i];
    const float cdf = 0.5f * erfcf(-x * kInvSqrt2);
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    dinp[i] += (cdf + x * pdf) * dout[i];
  }
}

// σ(g) without overflow: e = exp(-|g|), σ = (g >= 0 ? 1 : e) / (1 + e).
__device__ __forceinline__ float stable_sigmoid(float g) {
  const float e = expf(-fabsf(g));
  return (g >= 0.0f ? 1.0f : e) / (1.0f + e);
}

__global__ void swiglu_forward_kernel(float* __restrict__ out, __nv_bfloat16* __restrict__ out16,
                                      const float* __restrict__ inp, int N, int F) {
  const size_t total = static_cast<size_t>(N) * F;
  for (size_t k = grid_first(); k < total; k += grid_stride()) {
    const size_t n = k / F;
    const size_t f = k - n * F;
    const float* row = inp + n * 2 * static_cast<size_t>(F);
    const float g = row[f], u = row[F + f];
    store_activation(out, out16, k, g * stable_sigmoid(g) * u);
  }
}

__global__ void swiglu_backward_kernel(float* __restrict__ dinp, const float* __restrict__ inp,
                                       const float* __restrict__ dout, int N, int F) {
  const size_t total = static_cast<size_t>(N) * F;
  for (size_t k = grid_first(); k < total; k += grid_stride()) {
    const size_t n = k / F;
    const size_t f = k - n * F;
    const size_t row = n * 2 * static_cast<size_t>(F);
    const float g = inp[row + f], u = inp[row + F + f];
    const float sg = stable_sigmoid(g);
    const float dy = dout[k];
    dinp[row + f] += dy * u * sg * (1.0f + g * (1.0f - sg));
    dinp[row + F + f] += dy * g * sg;
  }
}

__global__ void tanh_forward_kernel(float* __restrict__ out, const float* __restrict__ inp,
                                    size_t n) {
  for (size_t i = grid_first(); i < n; i += grid_stride()) out[i] = tanhf(inp[i]);
}

__global__ void tanh_backward_kernel(float* __restrict__ dinp, const float* __restrict__ out,
                                     const float* __restrict__ dout, size_t n) {
  for (size_t i = grid_first(); i < n; i += grid_stride()) {
    const float y = out[i];
    dinp[i] += dout[i] * (1.0f - y * y);
  }
}

// out may alias inp: no __restrict__.
__global__ void dropout_forward_kernel(float* out, const float* inp, size_t n, float p,
                                       float scale, uint64_t key) {
  for (size_t i = grid_first(); i < n; i += grid_stride())
    out[i] = dropout_keep(key, i, p) ? inp[i] * scale : 0.0f;
}

__global__ void dropout_backward_kernel(float* dinp, const float* dout, size_t n, float p,
                                        float scale, uint64_t key) {
  for (size_t i = grid_first(); i < n; i += grid_stride())
    if (dropout_keep(key, i, p)) dinp[i] += dout[i] * scale;
}

}  // namespace

void check_dropout_p(const char* op, float p) {
  if (!(p >= 0.0f && p < 1.0f)) fail(op, ": dropout probability ", p, " is outside [0, 1)");
}

void gelu_erf_forward(float* out, const float* inp, size_t n, uint16_t* out_bf16) {
  if (n == 0) return;
  gelu_erf_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(
      out, reinterpret_cast<__nv_bfloat16*>(out_bf16), inp, n);
  LLMPI_LAUNCH_CHECK("gelu_erf_forward");
}

void gelu_erf_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  if (n == 0) return;
  gelu_erf_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(dinp, inp,
                                                                                     dout, n);
  LLMPI_LAUNCH_CHECK("gelu_erf_backward");
}

void swiglu_forward(float* out, const float* inp, int N, int F, uint16_t* out_bf16) {
  if (N <= 0 || F <= 0) return;
  swiglu_forward_kernel<<<grid_for(static_cast<size_t>(N) * F, kThreads), kThreads, 0,
                          compute_stream()>>>(out, reinterpret_cast<__nv_bfloat16*>(out_bf16), inp, N, F);
  LLMPI_LAUNCH_CHECK("swiglu_forward");
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
  if (N <= 0 || F <= 0) return;
  swiglu_backward_kernel<<<grid_for(static_cast<size_t>(N) * F, kThreads), kThreads, 0,
                           compute_stream()>>>(dinp, inp, dout, N, F);
  LLMPI_LAUNCH_CHECK("swiglu_backward");
}

void tanh_forward(float* out, const float* inp, size_t n) {
  if (n == 0) return;
  tanh_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(out, inp, n);
  LLMPI_LAUNCH_CHECK("tanh_forward");
}

void tanh_backward(float* dinp, const float* out, const float* dout, size_t n) {
  if (n == 0) return;
  tanh_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(dinp, out, dout,
                                                                                 n);
  LLMPI_LAUNCH_CHECK("tanh_backward");
}

void dropout_forward(float* out, const float* inp, size_t n, float p, uint64_t key) {
  check_dropout_p("dropout_forward", p);
  if (n == 0) return;
  const float scale = 1.0f / (1.0f - p);
  dropout_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(out, inp, n, p,
                                                                                   scale, key);
  LLMPI_LAUNCH_CHECK("dropout_forward");
}

void dropout_backward(float* dinp, const float* dout, size_t n, float p, uint64_t key) {
  check_dropout_p("dropout_backward", p);
  if (n == 0) return;
  const float scale = 1.0f / (1.0f - p);
  dropout_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, compute_stream()>>>(dinp, dout, n,
                                                                                    p, scale, key);
  LLMPI_LAUNCH_CHECK("dropout_backward");
}

}  // namespace llmpi::cuda
