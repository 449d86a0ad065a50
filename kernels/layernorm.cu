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
// rows, one thread per column (coalesced), then the chunks added in order.
#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kChunkRows = 32;
constexpr int kColThreads = 256;

__global__ void layernorm_forward_kernel(float* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const float* __restrict__ inp,
                                         const float* __restrict__ weight,
                                         const float* __restrict__ bias, int N, int C,
                                         float eps) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const float* x = inp + static_cast<size_t>(n) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / C + eps);
  float* o = out + static_cast<size_t>(n) * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * weight[c] + bias[c];
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

__global__ void layernorm_dinp_kernel(float* __restrict__ dinp, const float* __restrict__ dout,
                                      const float* __restrict__ inp,
                                      const float* __restrict__ weight,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ rstd, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const float* x = inp + static_cast<size_t>(n) * C;
  const float* dy = dout + static_cast<size_t>(n) * C;
  float* dx = dinp + static_cast<size_t>(n) * C;
  const float m = mean[n], r = rstd[n];
  float sg = 0.0f, sgn = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float nrm = (x[c] - m) * r;
    const float g = weight[c] * dy[c];
    sg += g;
    sgn += g * nrm;
  }
  const float mg = warp_sum(sg) / C, mgn = warp_sum(sgn) / C;
  for (int c = lane; c < C; c += 32) {
    const float nrm = (x[c] - m) * r;
    const float g = weight[c] * dy[c];
    dx[c] += r * (g - mg - nrm * mgn);
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

__global__ void layernorm_dparams_final_kernel(float* __restrict__ dweight,
                                               float* __restrict__ dbias,
                                               const float* __restrict__ part, int nchunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0.0f, sb = 0.0f;
  for (int k = 0; k < nchunks; k++) {
    sw += part[static_cast<size_t>(k) * 2 * C + c];
    sb += part[static_cast<size_t>(k) * 2 * C + C + c];
  }
  dweight[c] += sw;
  dbias[c] += sb;
}

// Fused residual + norm (pre-norm blocks), one warp per row: res = a + b written, then the norm of
// layernorm_forward_kernel / rmsnorm_forward_kernel over it, every sum in the same lane order, so
// the bits equal residual_forward then the norm's kernel. Each lane reads back only the elements it
// wrote (c = lane, lane + 32, ...), so no synchronisation is needed. res may alias a or b.
template <bool kLayerNorm>
__global__ void residual_norm_forward_kernel(float* res, float* __restrict__ out, float* __restrict__ mean,
                                             float* __restrict__ rstd, const float* a, const float* b,
                                             const float* __restrict__ weight, const float* __restrict__ bias,
                                             int N, int C, float eps) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const size_t row = static_cast<size_t>(n) * C;
  float* x = res + row;
  float* o = out + row;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = a[row + c] + b[row + c];
    x[c] = v;
    s += kLayerNorm ? v : v * v;
  }
  if (kLayerNorm) {
    const float m = warp_sum(s) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float d = x[c] - m;
      var += d * d;
    }
    const float r = 1.0f / sqrtf(warp_sum(var) / C + eps);
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    if (lane == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  } else {
    const float r = 1.0f / sqrtf(warp_sum(s) / C + eps);
    for (int c = lane; c < C; c += 32) o[c] = x[c] * r * weight[c];
    if (lane == 0) rstd[n] = r;
  }
}

__global__ void rmsnorm_forward_kernel(float* __restrict__ out, float* __restrict__ rstd,
                                       const float* __restrict__ inp,
                                       const float* __restrict__ weight, int N, int C, float eps) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const float* x = inp + static_cast<size_t>(n) * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
  const float r = 1.0f / sqrtf(warp_sum(ss) / C + eps);
  float* o = out + static_cast<size_t>(n) * C;
  for (int c = lane; c < C; c += 32) o[c] = x[c] * r * weight[c];
  if (lane == 0) rstd[n] = r;
}

__global__ void rmsnorm_dinp_kernel(float* __restrict__ dinp, const float* __restrict__ dout,
                                    const float* __restrict__ inp, const float* __restrict__ weight,
                                    const float* __restrict__ rstd, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const float* x = inp + static_cast<size_t>(n) * C;
  const float* dy = dout + static_cast<size_t>(n) * C;
  float* dx = dinp + static_cast<size_t>(n) * C;
  const float r = rstd[n];
  float sgn = 0.0f;
  for (int c = lane; c < C; c += 32) sgn += weight[c] * dy[c] * (x[c] * r);
  const float mgn = warp_sum(sgn) / C;
  for (int c = lane; c < C; c += 32) dx[c] += r * (weight[c] * dy[c] - x[c] * r * mgn);
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

__global__ void rmsnorm_dweight_final_kernel(float* __restrict__ dweight,
                                             const float* __restrict__ part, int nchunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0.0f;
  for (int k = 0; k < nchunks; k++) sw += part[static_cast<size_t>(k) * C + c];
  dweight[c] += sw;
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_forward_kernel<<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
      out, mean, rstd, inp, weight, bias, N, C, eps);
  LLMPI_LAUNCH_CHECK("layernorm_forward");
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  if (N <= 0 || C <= 0) return;
  cudaStream_t s = compute_stream();
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_dinp_kernel<<<blocks, 32 * kRowsPerBlock, 0, s>>>(dinp, dout, inp, weight, mean, rstd,
                                                              N, C);
  LLMPI_LAUNCH_CHECK("layernorm_dinp");
  const int nchunks = (N + kChunkRows - 1) / kChunkRows;
  float* part = static_cast<float*>(
      workspace(kWsPartials, static_cast<size_t>(nchunks) * 2 * C * sizeof(float)));
  const int cblocks = (C + kColThreads - 1) / kColThreads;
  const dim3 grid(cblocks, chunk_grid_y(nchunks));
  layernorm_dparams_partial_kernel<<<grid, kColThreads, 0, s>>>(part, dout, inp, mean, rstd, N, C);
  LLMPI_LAUNCH_CHECK("layernorm_dparams_partial");
  layernorm_dparams_final_kernel<<<cblocks, kColThreads, 0, s>>>(dweight, dbias, part, nchunks, C);
  LLMPI_LAUNCH_CHECK("layernorm_dparams_final");
}

void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* weight, const float* bias, int N, int C,
                                float eps) {
  if (N <= 0 || C <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  residual_norm_forward_kernel<true><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
      res, out, mean, rstd, a, b, weight, bias, N, C, eps);
  LLMPI_LAUNCH_CHECK("residual_layernorm_forward");
}

void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                              const float* weight, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  residual_norm_forward_kernel<false><<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(
      res, out, nullptr, rstd, a, b, weight, nullptr, N, C, eps);
  LLMPI_LAUNCH_CHECK("residual_rmsnorm_forward");
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
  if (N <= 0 || C <= 0) return;
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  rmsnorm_forward_kernel<<<blocks, 32 * kRowsPerBlock, 0, compute_stream()>>>(out, rstd, inp,
                                                                               weight, N, C, eps);
  LLMPI_LAUNCH_CHECK("rmsnorm_forward");
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  cudaStream_t s = compute_stream();
  const int blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  rmsnorm_dinp_kernel<<<blocks, 32 * kRowsPerBlock, 0, s>>>(dinp, dout, inp, weight, rstd, N, C);
  LLMPI_LAUNCH_CHECK("rmsnorm_dinp");
  const int nchunks = (N + kChunkRows - 1) / kChunkRows;
  float* part = static_cast<float*>(
      workspace(kWsPartials, static_cast<size_t>(nchunks) * C * sizeof(float)));
  const int cblocks = (C + kColThreads - 1) / kColThreads;
  const dim3 grid(cblocks, chunk_grid_y(nchunks));
  rmsnorm_dweight_partial_kernel<<<grid, kColThreads, 0, s>>>(part, dout, inp, rstd, N, C);
  LLMPI_LAUNCH_CHECK("rmsnorm_dweight_partial");
  rmsnorm_dweight_final_kernel<<<cblocks, kColThreads, 0, s>>>(dweight, part, nchunks, C);
  LLMPI_LAUNCH_CHECK("rmsnorm_dweight_final");
}

}  // namespace llmpi::cuda
