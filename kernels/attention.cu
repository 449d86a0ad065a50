// Causal multi-head self-attention: the two products on cuBLAS strided-batched sgemm, the causal
// softmax (and its backward) in a kernel.
//
// Per (batch b, head h), Q, K, V are the [T, hs] strided views of qkv (leading dimension 3C; head
// h starts at column h*hs of its third) and O the [T, hs] view of out (leading dimension C). The
// heads of one batch element are equally spaced (hs floats apart), so each product is ONE
// strided-batched sgemm over the NH heads per batch element (B calls in all):
//   forward   S = (1/sqrt(hs)) Q K^T                    sgemm NT, [T x T], k = hs  -> att
//             P = causal_softmax_rows(S)                 kernel, in place (0 for j > i)
//             O = P V                                    sgemm NN, [T x hs], k = T
//   backward  dP = dO V^T                                sgemm NT -> scratch
//             dS_ij = P_ij (dP_ij - Σ_j' dP_ij' P_ij')   kernel, in place (0 for j > i)
//             dQ += (1/sqrt(hs)) dS K                    sgemm NN, beta = 1
//             dK += (1/sqrt(hs)) dS^T Q                  sgemm TN, beta = 1
//             dV += P^T dO                               sgemm TN, beta = 1
// The GEMMs compute the full T x T square (the masked half is wasted work: the blocked variant of
// the CPU backend, or a fused flash-attention kernel, is the next step for speed). Masked entries
// of P and dS are exact zeros, so they add nothing to O, dQ, dK or dV.
// The outputs of one batched call (the heads' column slices of out / dqkv) interleave in memory
// but never share an element.
#include <cmath>

#include "cuda_common.cuh"

namespace llmpi::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

// Row r of the [B*NH*T, T] score matrix, query position i = r % T, in place:
//   p_j = exp(s_j - max_{j'<=i} s_j') / Σ_{j'<=i} exp(s_j' - max)   for j <= i;  p_j = 0 for j > i
__global__ void causal_softmax_kernel(float* __restrict__ att, int rows, int T) {
  const int r = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int i = r % T;
  float* row = att + static_cast<size_t>(r) * T;
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, row[j]);
  mx = warp_max(mx);
  float s = 0.0f;
  for (int j = lane; j <= i; j += 32) {
    const float e = expf(row[j] - mx);
    row[j] = e;
    s += e;
  }
  const float inv = 1.0f / warp_sum(s);
  for (int j = lane; j <= i; j += 32) row[j] *= inv;
  for (int j = i + 1 + lane; j < T; j += 32) row[j] = 0.0f;
}

// Row r of dP (in ds, overwritten with dS), P the matching row of att:
//   dS_j = P_j (dP_j - Σ_{j'<=i} dP_j' P_j')  for j <= i;  0 for j > i
__global__ void causal_softmax_backward_kernel(float* __restrict__ ds, const float* __restrict__ att,
                                               int rows, int T) {
  const int r = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int i = r % T;
  float* d = ds + static_cast<size_t>(r) * T;
  const float* p = att + static_cast<size_t>(r) * T;
  float dot = 0.0f;
  for (int j = lane; j <= i; j += 32) dot += d[j] * p[j];
  dot = warp_sum(dot);
  for (int j = lane; j <= i; j += 32) d[j] = p[j] * (d[j] - dot);
  for (int j = i + 1 + lane; j < T; j += 32) d[j] = 0.0f;
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  const int hs = C / NH, C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const long long TT = static_cast<long long>(T) * T;
  // S = sc · Q K^T, for every (b, h)
  for (int b = 0; b < B; b++) {
    const float* q = qkv + static_cast<size_t>(b) * T * C3;
    sgemm_rm_batched(false, true, T, T, hs, sc, q, C3, hs, q + C, C3, hs, 0.0f,
                     att + static_cast<size_t>(b) * NH * TT, T, TT, NH);
  }
  const int rows = B * NH * T;
  causal_softmax_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0,
                          compute_stream()>>>(att, rows, T);
  LLMPI_LAUNCH_CHECK("causal_softmax");
  // O = P V
  for (int b = 0; b < B; b++) {
    const float* v = qkv + static_cast<size_t>(b) * T * C3 + 2 * C;
    sgemm_rm_batched(false, false, T, hs, T, 1.0f, att + static_cast<size_t>(b) * NH * TT, T, TT,
                     v, C3, hs, 0.0f, out + static_cast<size_t>(b) * T * C, C, hs, NH);
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  const int hs = C / NH, C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const long long TT = static_cast<long long>(T) * T;
  // dP = dO V^T -> scratch
  for (int b = 0; b < B; b++) {
    const float* v = qkv + static_cast<size_t>(b) * T * C3 + 2 * C;
    const float* dO = dout + static_cast<size_t>(b) * T * C;
    sgemm_rm_batched(false, true, T, T, hs, 1.0f, dO, C, hs, v, C3, hs, 0.0f,
                     scratch + static_cast<size_t>(b) * NH * TT, T, TT, NH);
  }
  const int rows = B * NH * T;
  causal_softmax_backward_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock,
                                   0, compute_stream()>>>(scratch, att, rows, T);
  LLMPI_LAUNCH_CHECK("causal_softmax_backward");
  // dQ += sc · dS K;  dK += sc · dS^T Q;  dV += P^T dO
  for (int b = 0; b < B; b++) {
    const size_t qoff = static_cast<size_t>(b) * T * C3;
    const float* q = qkv + qoff;
    const float* k = q + C;
    float* dq = dqkv + qoff;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* p = att + static_cast<size_t>(b) * NH * TT;
    const float* ds = scratch + static_cast<size_t>(b) * NH * TT;
    const float* dO = dout + static_cast<size_t>(b) * T * C;
    sgemm_rm_batched(false, false, T, hs, T, sc, ds, T, TT, k, C3, hs, 1.0f, dq, C3, hs, NH);
    sgemm_rm_batched(true, false, T, hs, T, sc, ds, T, TT, q, C3, hs, 1.0f, dk, C3, hs, NH);
    sgemm_rm_batched(true, false, T, hs, T, 1.0f, p, T, TT, dO, C, hs, 1.0f, dv, C3, hs, NH);
  }
}

}  // namespace llmpi::cuda
