// LayerNorm and RMSNorm over the last dimension (C), eps given by the caller.
//
// ---- LayerNorm (biased variance) ----
// forward, per row x = inp[n, :] (one warp per row):
//   mean = Σ_c x_c / C;  var = Σ_c (x_c - mean)² / C;  rstd = 1 / sqrt(var + eps)
//   out_c = (x_c - mean) * rstd * weight_c + bias_c
//   (two passes over the row, which stays in L1, instead of E[x²] - mean², which cancels)
//
// backward, with norm_c = (x_c - mean) * rstd and g_c = weight_c * dout_c:
//   dinp_c    += rstd * (g_c - mean_c'(g) - norm_c * mean_c'(g * norm))     (one warp per row)
//   dweight_c += Σ_n norm_c * dout_c;   dbias_c += Σ_n dout_c
//
// ---- RMSNorm ----
// forward, per row x (one warp per row):
//   rstd = 1 / sqrt(Σ_c x_c² / C + eps);   out_c = x_c * rstd * weight_c
// backward, with norm_c = x_c * rstd and g_c = weight_c * dout_c (d rstd / d x_k = -rstd³ x_k / C):
//   dinp_c    += rstd * (g_c - norm_c * mean_c'(g * norm))                   (one warp per row)
//   dweight_c += Σ_n norm_c * dout_c
//
// The column sums are deterministic (no atomics): partial sums over fixed chunks of kChunkRows
// rows, one thread per column (coalesced), then the chunks added in a fixed order (add_partial_sums).
//
// Every forward may also (or only: out null) write its output rounded to bf16 (out_bf16, a bf16
// GEMM's input kept in bf16): the same value rounded, stored next to or instead of the fp32 one.
//
// The row kernels (one warp per row) are templated on V, the floats per access
// (vector_access.cuh): V = 4 (128-bit loads and stores) when C % 4 == 0 and the rows are 16-byte
// aligned, else V = 1. A lane sums its quads q = lane, lane + 32, ... and within a quad in index
// order; V = 1 is the plain c = lane, lane + 32, ... order.
#include <cuda_bf16.h>

#include "cuda_common.cuh"
#include "vector_access.cuh"

namespace llmpi::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kChunkRows = 32;
constexpr int kColThreads = 256;

// The V rule of a norm's forward: V = 4 when its rows (C floats) at out, inp and the parameters
// are float4-aligned and the bf16 output's rows 8-byte aligned (null pointers ignored), so that an
// op writing only the bf16 output sums in the order of one writing the fp32 one.
inline bool norm_vec4(int C, std::initializer_list<const void*> f32, const void* out16) {
  return vec4_rows(C, f32) && reinterpret_cast<uintptr_t>(out16) % 8 == 0;
}

// The rest of a LayerNorm row (one warp) once each lane holds its part s of the row's sum: the
// mean, the variance (a second pass over x), the output and the saved mean and rstd. Shared by
// layernorm_forward_kernel and the fused residual + norm, so that both give the same bits.
template <int V>
__device__ __forceinline__ void layernorm_row_finish(float* __restrict__ o, __nv_bfloat16* __restrict__ o16,
                                                     float* __restrict__ mean,
                                                     float* __restrict__ rstd, const float* x,
                                                     const float* __restrict__ weight,
                                                     const float* __restrict__ bias, float s, int n,
                                                     int C, float eps, int lane) {
  const int Q = C / V;
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) {
      const float d = xv.v[j] - m;
      v += d * d;
    }
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / C + eps);
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V), wv = load_floats<V>(weight + q * V),
                    bv = load_floats<V>(bias + q * V);
    Floats<V> ov;
#pragma unroll
    for (int j = 0; j < V; j++) ov.v[j] = (xv.v[j] - m) * r * wv.v[j] + bv.v[j];
    store_floats_bf16<V>(o ? o + q * V : nullptr, o16 ? o16 + q * V : nullptr, ov);
  }
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// The same for RMSNorm, from each lane's part ss of the row's sum of squares.
template <int V>
__device__ __forceinline__ void rmsnorm_row_finish(float* __restrict__ o, __nv_bfloat16* __restrict__ o16,
                                                   float* __restrict__ rstd,
                                                   const float* x, const float* __restrict__ weight,
                                                   float ss, int n, int C, float eps, int lane) {
  const int Q = C / V;
  const float r = 1.0f / sqrtf(warp_sum(ss) / C + eps);
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V), wv = load_floats<V>(weight + q * V);
    Floats<V> ov;
#pragma unroll
    for (int j = 0; j < V; j++) ov.v[j] = xv.v[j] * r * wv.v[j];
    store_floats_bf16<V>(o ? o + q * V : nullptr, o16 ? o16 + q * V : nullptr, ov);
  }
  if (lane == 0) rstd[n] = r;
}

template <int V>
__global__ void layernorm_forward_kernel(float* __restrict__ out, __nv_bfloat16* __restrict__ out16,
                                         float* __restrict__ mean,
                                         float* __restrict__ rstd, const float* __restrict__ inp,
                                         const float* __restrict__ weight,
                                         const float* __restrict__ bias, int N, int C,
                                         float eps) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const int Q = C / V;
  const float* x = inp + static_cast<size_t>(n) * C;
  float s = 0.0f;
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) s += xv.v[j];
  }
  const size_t row = static_cast<size_t>(n) * C;
  layernorm_row_finish<V>(out ? out + row : nullptr, out16 ? out16 + row : nullptr, mean, rstd, x, weight, bias, s,
                          n, C, eps, lane);
}

template <int V>
__global__ void layernorm_dinp_kernel(float* __restrict__ dinp, const float* __restrict__ dout,
                                      const float* __restrict__ inp,
                                      const float* __restrict__ weight,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ rstd, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const int Q = C / V;
  const float* x = inp + static_cast<size_t>(n) * C;
  const float* dy = dout + static_cast<size_t>(n) * C;
  float* dx = dinp + static_cast<size_t>(n) * C;
  const float m = mean[n], r = rstd[n];
  float sg = 0.0f, sgn = 0.0f;
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V), wv = load_floats<V>(weight + q * V),
                    dyv = load_floats<V>(dy + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) {
      const float nrm = (xv.v[j] - m) * r;
      const float g = wv.v[j] * dyv.v[j];
      sg += g;
      sgn += g * nrm;
    }
  }
  const float mg = warp_sum(sg) / C, mgn = warp_sum(sgn) / C;
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V), wv = load_floats<V>(weight + q * V),
                    dyv = load_floats<V>(dy + q * V);
    Floats<V> dxv = load_floats<V>(dx + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) {
      const float nrm = (xv.v[j] - m) * r;
      const float g = wv.v[j] * dyv.v[j];
      dxv.v[j] += r * (g - mg - nrm * mgn);
    }
    store_floats<V>(dx + q * V, dxv);
  }
}

// part[k, 0:C] = Σ_{n in chunk k} norm * dout;  part[k, C:2C] = Σ_{n in chunk k} dout
__global__ void layernorm_dparams_partial_kernel(float* __restrict__ part,
                                                 const float* __restrict__ dout,
                                                 const float* __restrict__ inp,
                                                 const float* __restrict__ mean,
                                                 const float* __restrict__ rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int k = blockIdx.y; k * kChunkRows < N; k += gridDim.y) {  // chunk k (grid-stride in y)
    const int n0 = k * kChunkRows, n1 = min(n0 + kChunkRows, N);
    float pw = 0.0f, pb = 0.0f;
    for (int n = n0; n < n1; n++) {
      const size_t i = static_cast<size_t>(n) * C + c;
      const float dy = dout[i];
      pw += (inp[i] - mean[n]) * rstd[n] * dy;
      pb += dy;
    }
    part[static_cast<size_t>(k) * 2 * C + c] = pw;
    part[static_cast<size_t>(k) * 2 * C + C + c] = pb;
  }
}

// Fused residual + norm (pre-norm blocks), one warp per row: res = a + b written, then the norm of
// layernorm_forward_kernel / rmsnorm_forward_kernel over it, every sum in the same lane order, so
// the bits equal residual_forward then the norm's kernel. Each lane reads back only the elements it
// wrote (its quads), so no synchronisation is needed. res may alias a or b. V is chosen from res,
// out and the norm's parameters, as the norm's own kernel chooses it from inp (= res), out and its
// parameters, so both sum in the same order; a and b are read as float4 only where ab_vec says
// they are aligned.
template <bool kLayerNorm, int V>
__global__ void residual_norm_forward_kernel(float* res, float* __restrict__ out, __nv_bfloat16* __restrict__ out16,
                                             float* __restrict__ mean,
                                             float* __restrict__ rstd, const float* a, const float* b,
                                             const float* __restrict__ weight, const float* __restrict__ bias,
                                             int N, int C, float eps, bool ab_vec) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const int Q = C / V;
  const size_t row = static_cast<size_t>(n) * C;
  float* x = res + row;
  float* o = out ? out + row : nullptr;
  __nv_bfloat16* o16 = out16 ? out16 + row : nullptr;
  float s = 0.0f;
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> av = load_floats_any<V>(a + row + q * V, ab_vec),
                    bv = load_floats_any<V>(b + row + q * V, ab_vec);
    Floats<V> xv;
#pragma unroll
    for (int j = 0; j < V; j++) {
      const float v = av.v[j] + bv.v[j];
      xv.v[j] = v;
      s += kLayerNorm ? v : v * v;
    }
    store_floats<V>(x + q * V, xv);
  }
  if constexpr (kLayerNorm)
    layernorm_row_finish<V>(o, o16, mean, rstd, x, weight, bias, s, n, C, eps, lane);
  else
    rmsnorm_row_finish<V>(o, o16, rstd, x, weight, s, n, C, eps, lane);
}

template <int V>
__global__ void rmsnorm_forward_kernel(float* __restrict__ out, __nv_bfloat16* __restrict__ out16,
                                       float* __restrict__ rstd,
                                       const float* __restrict__ inp,
                                       const float* __restrict__ weight, int N, int C, float eps) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const int Q = C / V;
  const float* x = inp + static_cast<size_t>(n) * C;
  float ss = 0.0f;
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) ss += xv.v[j] * xv.v[j];
  }
  const size_t row = static_cast<size_t>(n) * C;
  rmsnorm_row_finish<V>(out ? out + row : nullptr, out16 ? out16 + row : nullptr, rstd, x, weight, ss, n, C, eps,
                        lane);
}

template <int V>
__global__ void rmsnorm_dinp_kernel(float* __restrict__ dinp, const float* __restrict__ dout,
                                    const float* __restrict__ inp, const float* __restrict__ weight,
                                    const float* __restrict__ rstd, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const int Q = C / V;
  const float* x = inp + static_cast<size_t>(n) * C;
  const float* dy = dout + static_cast<size_t>(n) * C;
  float* dx = dinp + static_cast<size_t>(n) * C;
  const float r = rstd[n];
  float sgn = 0.0f;
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V), wv = load_floats<V>(weight + q * V),
                    dyv = load_floats<V>(dy + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) sgn += wv.v[j] * dyv.v[j] * (xv.v[j] * r);
  }
  const float mgn = warp_sum(sgn) / C;
  for (int q = lane; q < Q; q += 32) {
    const Floats<V> xv = load_floats<V>(x + q * V), wv = load_floats<V>(weight + q * V),
                    dyv = load_floats<V>(dy + q * V);
    Floats<V> dxv = load_floats<V>(dx + q * V);
#pragma unroll
    for (int j = 0; j < V; j++) dxv.v[j] += r * (wv.v[j] * dyv.v[j] - xv.v[j] * r * mgn);
    store_floats<V>(dx + q * V, dxv);
  }
}

// part[k, c] = Σ_{n in chunk k} x * rstd * dout
__global__ void rmsnorm_dweight_partial_kernel(float* __restrict__ part,
                                               const float* __restrict__ dout,
                                               const float* __restrict__ inp,
                                               const float* __restrict__ rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int k = blockIdx.y; k * kChunkRows < N; k += gridDim.y) {  // chunk k (grid-stride in y)
    const int n0 = k * kChunkRows, n1 = min(n0 + kChunkRows, N);
    float pw = 0.0f;
    for (int n = n0; n < n1; n++) {
      const size_t i = static_cast<size_t>(n) * C + c;
      pw += inp[i] * rstd[n] * dout[i];
    }
    part[static_cast<size_t>(k) * C + c] = pw;
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps, uint16_t* out_bf16) {
  if (N <= 0 || C <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  auto* o16 = reinterpret_cast<__nv_bfloat16*>(out_bf16);
  if (norm_vec4(C, {out, inp, weight, bias}, o16))
    layernorm_forward_kernel<4><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
        out, o16, mean, rstd, inp, weight, bias, N, C, eps);
  else
    layernorm_forward_kernel<1><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
        out, o16, mean, rstd, inp, weight, bias, N, C, eps);
  LLMPI_LAUNCH_CHECK("layernorm_forward");
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  if (N <= 0 || C <= 0) return;
  cudaStream_t s = compute_stream();
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  if (vec4_rows(C, {dinp, dout, inp, weight}))
    layernorm_dinp_kernel<4><<<blocks, 32 * kRowsPerBlock, 0, s>>>(dinp, dout, inp, weight, mean,
                                                                   rstd, N, C);
  else
    layernorm_dinp_kernel<1><<<blocks, 32 * kRowsPerBlock, 0, s>>>(dinp, dout, inp, weight, mean,
                                                                   rstd, N, C);
  LLMPI_LAUNCH_CHECK("layernorm_dinp");
  const int nchunks = (N + kChunkRows - 1) / kChunkRows;
  float* part = static_cast<float*>(
      workspace(kWsPartials, static_cast<size_t>(nchunks) * 2 * C * sizeof(float)));
  const int cblocks = (C + kColThreads - 1) / kColThreads;
  const dim3 grid(cblocks, chunk_grid_y(nchunks));
  layernorm_dparams_partial_kernel<<<grid, kColThreads, 0, s>>>(part, dout, inp, mean, rstd, N, C);
  LLMPI_LAUNCH_CHECK("layernorm_dparams_partial");
  add_partial_sums(dweight, dbias, C, part, nchunks, 2 * C);  // part's columns: [dweight | dbias]
}

void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* weight, const float* bias, int N, int C,
                                float eps, uint16_t* out_bf16) {
  if (N <= 0 || C <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const bool ab_vec = vec4_rows(C, {a, b});
  auto* o16 = reinterpret_cast<__nv_bfloat16*>(out_bf16);
  if (norm_vec4(C, {out, res, weight, bias}, o16))  // layernorm_forward's rule, with inp = res
    residual_norm_forward_kernel<true, 4><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
        res, out, o16, mean, rstd, a, b, weight, bias, N, C, eps, ab_vec);
  else
    residual_norm_forward_kernel<true, 1><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
        res, out, o16, mean, rstd, a, b, weight, bias, N, C, eps, false);
  LLMPI_LAUNCH_CHECK("residual_layernorm_forward");
}

void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                              const float* weight, int N, int C, float eps, uint16_t* out_bf16) {
  if (N <= 0 || C <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const bool ab_vec = vec4_rows(C, {a, b});
  auto* o16 = reinterpret_cast<__nv_bfloat16*>(out_bf16);
  if (norm_vec4(C, {out, res, weight}, o16))  // rmsnorm_forward's rule, with inp = res
    residual_norm_forward_kernel<false, 4><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
        res, out, o16, nullptr, rstd, a, b, weight, nullptr, N, C, eps, ab_vec);
  else
    residual_norm_forward_kernel<false, 1><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
        res, out, o16, nullptr, rstd, a, b, weight, nullptr, N, C, eps, false);
  LLMPI_LAUNCH_CHECK("residual_rmsnorm_forward");
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, uint16_t* out_bf16) {
  if (N <= 0 || C <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  auto* o16 = reinterpret_cast<__nv_bfloat16*>(out_bf16);
  if (norm_vec4(C, {out, inp, weight}, o16))
    rmsnorm_forward_kernel<4><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(out, o16, rstd, inp,
                                                                                  weight, N, C, eps);
  else
    rmsnorm_forward_kernel<1><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(out, o16, rstd, inp,
                                                                                  weight, N, C, eps);
  LLMPI_LAUNCH_CHECK("rmsnorm_forward");
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  cudaStream_t s = compute_stream();
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  if (vec4_rows(C, {dinp, dout, inp, weight}))
    rmsnorm_dinp_kernel<4><<<blocks, 32 * kRowsPerBlock, 0, s>>>(dinp, dout, inp, weight, rstd, N, C);
  else
    rmsnorm_dinp_kernel<1><<<blocks, 32 * kRowsPerBlock, 0, s>>>(dinp, dout, inp, weight, rstd, N, C);
  LLMPI_LAUNCH_CHECK("rmsnorm_dinp");
  const int nchunks = (N + kChunkRows - 1) / kChunkRows;
  float* part = static_cast<float*>(
      workspace(kWsPartials, static_cast<size_t>(nchunks) * C * sizeof(float)));
  const int cblocks = (C + kColThreads - 1) / kColThreads;
  const dim3 grid(cblocks, chunk_grid_y(nchunks));
  rmsnorm_dweight_partial_kernel<<<grid, kColThreads, 0, s>>>(part, dout, inp, rstd, N, C);
  LLMPI_LAUNCH_CHECK("rmsnorm_dweight_partial");
  add_partial_sums(dweight, nullptr, C, part, nchunks, C);
}

}  // namespace llmpi::cuda
