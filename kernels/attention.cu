// Multi-head attention with grouped K/V heads (GQA; MHA when NKV = NH, MQA when NKV = 1), causal
// or bidirectional, with an optional key padding mask and attention-probability dropout. The
// products run on cuBLAS strided-batched sgemm, the masked softmax (and its backward) in kernels.
//
// Layout (backend/op_list.h): a row of qkv [B,T,W], W = (NH + 2 NKV) hs, is
//   [ q heads 0..NH-1 | k heads 0..NKV-1 | v heads 0..NKV-1 ], each head hs floats,
// and query head h reads K/V head g = h / G, G = NH / NKV (the G query heads h = gG .. gG+G-1
// share head g; nothing is copied or repeated). Per (batch b, head), Q, K, V, dO, O are [T, hs]
// strided views (leading dimension W for qkv/dqkv, NH hs for out/dout), P and dS [T, T] blocks of
// att / scratch [B, NH, T, T].
//
// Visibility: key j is visible to query i of batch b when (!causal || j <= i) and
// (mask == null || mask[b, j] != 0). sc = 1/sqrt(hs); with dropout p > 0, the keep mask of att
// element e = ((b NH + h) T + i) T + j is M_e = dropout_keep(key, e, p) / (1 - p) (0 or 1/(1-p)).
//
//   forward   S = sc Q K^T                                      sgemm NT [T x T], k = hs -> att
//             P_ij = exp(S_ij - max) / Σ_{visible j'} exp(...)   kernel, in place; 0 where j is
//                                                                not visible; a row with no
//                                                                visible key is all 0
//             P~ = P ⊙ M (only when p > 0: into a workspace, one batch element at a time, since
//                  att keeps the undropped P)
//             O = P~ V                                           sgemm NN [T x hs], k = T
//   backward  P~ = P ⊙ M                                         kernel -> scratch (p > 0 only)
//             dV_g += Σ_{h in group g} P~_h^T dO_h               (see "group sums" below)
//             dP~ = dO V^T                                       sgemm NT -> scratch (overwrites)
//             dP = dP~ ⊙ M;  dS_ij = P_ij (dP_ij - Σ_j' dP_ij' P_ij')   kernel, in place
//             dQ += sc dS K                                      sgemm NN, beta = 1
//             dK_g += sc Σ_{h in group g} dS_h^T Q_h             (group sums)
// The GEMMs compute the full T x T square (masked entries are wasted work: a fused
// flash-attention kernel is the next step for speed). Masked entries of P and dS are exact
// zeros, so they add nothing to O, dQ, dK or dV.
//
// Batching: a product "per query head h with K/V head g(h)" is issued as strided-batched calls.
// When G <= NKV, one call per (b, r) batches the NKV heads h = gG + r (g = 0..NKV-1: query
// operands G hs apart, K/V operands hs apart); otherwise one call per (b, g) batches the G heads
// of group g, with the K/V operand's batch stride 0. That is B min(G, NKV) calls per product
// (B for MHA). The outputs of one call are distinct [T, x] blocks (column slices
// of out / dqkv interleave in memory but never share an element).
//
// Group sums (dK, dV), deterministic, no atomics: for G = 1 a beta = 1 sgemm per head straight
// into dqkv; for G > 1 each query head's product goes to a workspace [B, NH, T, hs] (beta = 0)
// and a kernel adds, per element, the G products of the group in head order to dqkv.
#include <cmath>

#include "backend/dropout_hash.h"
#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // softmax kernels: one warp per row of T scores
constexpr int kThreads = 256;

// Matrices of one kind, one per (batch element b, head k): matrix (b, k) starts at
// base + b batch_stride + k head_stride floats, with rows ld floats apart.
template <typename F>
struct HeadMats {
  F* base;
  int ld;
  long long batch_stride;
  long long head_stride;
  F* at(int b, int k) const { return base + b * batch_stride + k * head_stride; }
};

// For every batch element b < B and query head h < NH, with K/V head g = h / G (G = NH / NKV):
//   C(b,h) = alpha op(A(b,h)) op(KV(b,g)) + beta C(b,h)        (each C(b,h) is M x N)
// NKV = NH makes it a plain per-head product (KV then indexed by the query head).
void gemm_query_heads(bool tA, bool tB, int M, int N, int K, float alpha,
                      const HeadMats<const float>& A, const HeadMats<const float>& KV, float beta,
                      const HeadMats<float>& C, int B, int NH, int NKV) {
  const int G = NH / NKV;
  for (int b = 0; b < B; b++) {
    if (G <= NKV) {
      // heads h = gG + r for g = 0..NKV-1: A and C G heads apart, KV one head apart
      for (int r = 0; r < G; r++)
        sgemm_rm_batched(tA, tB, M, N, K, alpha, A.at(b, r), A.ld, G * A.head_stride,
                         KV.at(b, 0), KV.ld, KV.head_stride, beta, C.at(b, r), C.ld,
                         G * C.head_stride, NKV);
    } else {
      // heads h = gG .. gG+G-1, all reading KV(b, g): KV's stride between products is 0
      for (int g = 0; g < NKV; g++)
        sgemm_rm_batched(tA, tB, M, N, K, alpha, A.at(b, g * G), A.ld, A.head_stride,
                         KV.at(b, g), KV.ld, 0, beta, C.at(b, g * G), C.ld, C.head_stride, G);
    }
  }
}

// tmp [B, NH, M, N] holds one product per query head; for every (b, g, m, c):
//   D(b,g)[m, c] += Σ_{r = 0..G-1, in order} tmp[b, gG + r, m, c]
// One thread per element of D, consecutive threads on consecutive c (coalesced on both sides).
__global__ void add_group_sums_kernel(float* __restrict__ D, int ldd, long long d_batch_stride,
                                      long long d_head_stride, const float* __restrict__ tmp,
                                      int B, int NH, int NKV, int M, int N) {
  const int G = NH / NKV;
  const size_t total = static_cast<size_t>(B) * M * NKV * N;
  const size_t head_mat = static_cast<size_t>(M) * N;
  for (size_t k = grid_first(); k < total; k += grid_stride()) {
    size_t q = k;
    const int c = static_cast<int>(q % N);
    q /= N;
    const int g = static_cast<int>(q % NKV);
    q /= NKV;
    const int m = static_cast<int>(q % M);
    const size_t b = q / M;
    const float* t = tmp + (b * NH + static_cast<size_t>(g) * G) * head_mat +
                     static_cast<size_t>(m) * N + c;
    float* d = D + b * d_batch_stride + g * d_head_stride + static_cast<size_t>(m) * ldd + c;
    float acc = *d;
    for (int r = 0; r < G; r++) acc += t[r * head_mat];
    *d = acc;
  }
}

// For every b and K/V head g:  D(b,g) += alpha Σ_{h = gG .. gG+G-1, in order} A(b,h)^T Bq(b,h)
// (A(b,h) is K x M, Bq(b,h) K x N, D(b,g) M x N).
void gemm_group_sums(int M, int N, int K, float alpha, const HeadMats<const float>& A,
                     const HeadMats<const float>& Bq, const HeadMats<float>& D, int B, int NH,
                     int NKV) {
  if (NKV == NH) {  // one query head per group: accumulate straight into D
    gemm_query_heads(true, false, M, N, K, alpha, A, Bq, 1.0f, D, B, NH, NH);
    return;
  }
  const size_t head_mat = static_cast<size_t>(M) * N;
  float* tmp = static_cast<float*>(
      workspace(kWsAttn, static_cast<size_t>(B) * NH * head_mat * sizeof(float)));
  const long long mat = static_cast<long long>(head_mat);
  const HeadMats<float> per_head{tmp, N, NH * mat, mat};
  gemm_query_heads(true, false, M, N, K, alpha, A, Bq, 0.0f, per_head, B, NH, NH);
  const size_t total = static_cast<size_t>(B) * M * NKV * N;
  add_group_sums_kernel<<<grid_for(total, kThreads), kThreads, 0, compute_stream()>>>(
      D.base, D.ld, D.batch_stride, D.head_stride, tmp, B, NH, NKV, M, N);
  LLMPI_LAUNCH_CHECK("add_group_sums");
}

// Whether key j is visible to query i; mask_b is the batch element's row of the padding mask
// (null: every key valid).
__device__ __forceinline__ bool key_visible(const int32_t* mask_b, bool causal, int i, int j) {
  return (!causal || j <= i) && (mask_b == nullptr || mask_b[j] != 0);
}

// Row r of the [B NH T, T] score matrix (b = r / (NH T), query i = r % T), in place:
//   P_j = exp(S_j - max_vis S) / Σ_vis exp(S_j' - max_vis S) for visible j, 0 otherwise;
//   a row with no visible key is all 0.
// Keys beyond the causal limit (j > i) are never read.
__global__ void masked_softmax_kernel(float* __restrict__ att, const int32_t* __restrict__ mask,
                                      long long rows, int T, int NH, bool causal) {
  const long long r = static_cast<long long>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;  // whole warps leave together
  const int i = static_cast<int>(r % T);
  const long long b = r / (static_cast<long long>(NH) * T);
  const int32_t* mask_b = mask != nullptr ? mask + b * T : nullptr;
  const int jend = causal ? i + 1 : T;
  float* row = att + r * T;
  float mx = -INFINITY;
  bool any = false;
  for (int j = lane; j < jend; j += 32)
    if (key_visible(mask_b, causal, i, j)) {
      mx = fmaxf(mx, row[j]);
      any = true;
    }
  if (!__any_sync(0xffffffffu, any)) {  // no visible key: P = 0 (warp-uniform branch)
    for (int j = lane; j < T; j += 32) row[j] = 0.0f;
    return;
  }
  mx = warp_max(mx);
  float s = 0.0f;
  for (int j = lane; j < jend; j += 32) {
    const float e = key_visible(mask_b, causal, i, j) ? expf(row[j] - mx) : 0.0f;
    row[j] = e;
    s += e;
  }
  const float inv = 1.0f / warp_sum(s);
  for (int j = lane; j < jend; j += 32) row[j] *= inv;
  for (int j = jend + lane; j < T; j += 32) row[j] = 0.0f;
}

// Row r of dP~ (in ds, overwritten with dS), P the matching row of att; jend as in the forward:
//   dP_j = dP~_j M_e (M_e = keep / (1-p), e = r T + j; M = 1 without dropout)
//   dS_j = P_j (dP_j - Σ_{j' < jend} dP_j' P_j')  for j < jend (0 where P_j = 0);  0 for j >= jend
__global__ void masked_softmax_backward_kernel(float* __restrict__ ds,
                                               const float* __restrict__ att, long long rows,
                                               int T, bool causal, float dropout_p,
                                               float dropout_scale, uint64_t dropout_key) {
  const long long r = static_cast<long long>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int i = static_cast<int>(r % T);
  const int jend = causal ? i + 1 : T;
  float* d = ds + r * T;
  const float* p = att + r * T;
  const uint64_t e0 = static_cast<uint64_t>(r) * static_cast<uint64_t>(T);
  const bool dropout = dropout_p > 0.0f;
  float dot = 0.0f;
  for (int j = lane; j < jend; j += 32) {
    float dp = d[j];
    if (dropout) dp = dropout_keep(dropout_key, e0 + j, dropout_p) ? dp * dropout_scale : 0.0f;
    d[j] = dp;
    dot += dp * p[j];
  }
  dot = warp_sum(dot);
  for (int j = lane; j < jend; j += 32) {
    const float pj = p[j];
    d[j] = pj != 0.0f ? pj * (d[j] - dot) : 0.0f;
  }
  for (int j = jend + lane; j < T; j += 32) d[j] = 0.0f;
}

// dst[k] = M_{e0 + k} src[k] for k < n: the dropped probabilities (dst and src do not overlap).
__global__ void dropout_probs_kernel(float* __restrict__ dst, const float* __restrict__ src,
                                     size_t n, uint64_t e0, float p, float scale, uint64_t key) {
  for (size_t k = grid_first(); k < n; k += grid_stride())
    dst[k] = dropout_keep(key, e0 + k, p) ? src[k] * scale : 0.0f;
}

// The views of one attention call.
struct AttnViews {
  HeadMats<const float> q, k, v;  // of qkv, per query head (q) or per K/V head (k, v)
  HeadMats<const float> dout;     // [B,T,NH hs], per query head
  HeadMats<float> out;            // the same layout
  HeadMats<float> dq, dk, dv;     // of dqkv
  long long TT;                   // T*T, one head's probability block
};

AttnViews make_views(float* out, const float* dout, const float* qkv, float* dqkv, int T, int NH,
                     int NKV, int hs) {
  const int W = (NH + 2 * NKV) * hs;  // qkv row
  const int C = NH * hs;              // out row
  const long long qkv_b = static_cast<long long>(T) * W, out_b = static_cast<long long>(T) * C;
  const long long koff = static_cast<long long>(NH) * hs;  // first k column
  const long long voff = koff + static_cast<long long>(NKV) * hs;  // first v column
  AttnViews a{};
  a.q = {qkv, W, qkv_b, hs};
  a.k = {qkv + koff, W, qkv_b, hs};
  a.v = {qkv + voff, W, qkv_b, hs};
  a.dout = {dout, C, out_b, hs};
  a.out = {out, C, out_b, hs};
  if (dqkv != nullptr) {
    a.dq = {dqkv, W, qkv_b, hs};
    a.dk = {dqkv + koff, W, qkv_b, hs};
    a.dv = {dqkv + voff, W, qkv_b, hs};
  }
  a.TT = static_cast<long long>(T) * T;
  return a;
}

void check_heads(const char* op, int NH, int NKV) {
  if (NKV <= 0 || NH % NKV != 0)
    fail(op, ": ", NH, " query heads cannot be grouped over ", NKV, " K/V heads (NH % NKV != 0)");
}

unsigned row_blocks(long long rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, const int32_t* mask, int B, int T,
                       int NH, int NKV, int hs, bool causal, float dropout_p,
                       uint64_t dropout_key) {
  check_dropout_p("attention_forward", dropout_p);
  if (B <= 0 || T <= 0 || NH <= 0 || hs <= 0) return;
  check_heads("attention_forward", NH, NKV);
  cudaStream_t s = compute_stream();
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const AttnViews a = make_views(out, nullptr, qkv, nullptr, T, NH, NKV, hs);
  const HeadMats<float> P{att, T, NH * a.TT, a.TT};
  const HeadMats<const float> Pc{att, T, NH * a.TT, a.TT};

  // S = sc Q K^T -> att
  gemm_query_heads(false, true, T, T, hs, sc, a.q, a.k, 0.0f, P, B, NH, NKV);
  // P = masked softmax(S), in place
  const long long rows = static_cast<long long>(B) * NH * T;
  masked_softmax_kernel<<<row_blocks(rows), 32 * kRowsPerBlock, 0, s>>>(att, mask, rows, T, NH,
                                                                         causal);
  LLMPI_LAUNCH_CHECK("masked_softmax");

  if (dropout_p == 0.0f) {  // O = P V
    gemm_query_heads(false, false, T, hs, T, 1.0f, Pc, a.v, 0.0f, a.out, B, NH, NKV);
    return;
  }
  // O = P~ V, one batch element at a time through a [NH, T, T] workspace (att keeps P).
  const float scale = 1.0f / (1.0f - dropout_p);
  const size_t per_b = static_cast<size_t>(NH) * static_cast<size_t>(a.TT);
  float* pd = static_cast<float*>(workspace(kWsAttn, per_b * sizeof(float)));
  const HeadMats<const float> Pd{pd, T, 0, a.TT};
  for (int b = 0; b < B; b++) {
    const uint64_t e0 = static_cast<uint64_t>(b) * per_b;
    dropout_probs_kernel<<<grid_for(per_b, kThreads), kThreads, 0, s>>>(
        pd, att + e0, per_b, e0, dropout_p, scale, dropout_key);
    LLMPI_LAUNCH_CHECK("dropout_probs");
    const HeadMats<const float> vb{a.v.at(b, 0), a.v.ld, 0, a.v.head_stride};
    const HeadMats<float> ob{a.out.at(b, 0), a.out.ld, 0, a.out.head_stride};
    gemm_query_heads(false, false, T, hs, T, 1.0f, Pd, vb, 0.0f, ob, 1, NH, NKV);
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, const int32_t* mask, int B, int T, int NH, int NKV,
                        int hs, bool causal, float dropout_p, uint64_t dropout_key) {
  (void)mask;  // masked entries of att are exact zeros: dS = P (...) is 0 there without it
  check_dropout_p("attention_backward", dropout_p);
  if (B <= 0 || T <= 0 || NH <= 0 || hs <= 0) return;
  check_heads("attention_backward", NH, NKV);
  cudaStream_t s = compute_stream();
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const AttnViews a = make_views(nullptr, dout, qkv, dqkv, T, NH, NKV, hs);
  const long long rows = static_cast<long long>(B) * NH * T;
  const size_t att_n = static_cast<size_t>(rows) * T;
  const bool dropout = dropout_p > 0.0f;
  const float scale = 1.0f / (1.0f - dropout_p);
  const HeadMats<const float> P{att, T, NH * a.TT, a.TT};
  const HeadMats<const float> Scr{scratch, T, NH * a.TT, a.TT};
  const HeadMats<float> ScrOut{scratch, T, NH * a.TT, a.TT};

  // dV_g += Σ_h P~_h^T dO_h  (P~ = P ⊙ M in scratch when dropping, else P itself)
  if (dropout) {
    dropout_probs_kernel<<<grid_for(att_n, kThreads), kThreads, 0, s>>>(
        scratch, att, att_n, 0, dropout_p, scale, dropout_key);
    LLMPI_LAUNCH_CHECK("dropout_probs");
  }
  gemm_group_sums(T, hs, T, 1.0f, dropout ? Scr : P, a.dout, a.dv, B, NH, NKV);

  // dP~ = dO V^T -> scratch;  dS = softmax backward of (dP~ ⊙ M), in place
  gemm_query_heads(false, true, T, T, hs, 1.0f, a.dout, a.v, 0.0f, ScrOut, B, NH, NKV);
  masked_softmax_backward_kernel<<<row_blocks(rows), 32 * kRowsPerBlock, 0, s>>>(
      scratch, att, rows, T, causal, dropout_p, scale, dropout_key);
  LLMPI_LAUNCH_CHECK("masked_softmax_backward");

  // dQ += sc dS K;  dK_g += sc Σ_h dS_h^T Q_h
  gemm_query_heads(false, false, T, hs, T, sc, Scr, a.k, 1.0f, a.dq, B, NH, NKV);
  gemm_group_sums(T, hs, T, sc, Scr, a.q, a.dk, B, NH, NKV);
}

}  // namespace llmpi::cuda
