// Causal multi-head self-attention, GEMM-based.
//
// Per (batch b, head h), with Q, K, V the [T, hs] strided views of qkv (leading dimension 3C;
// head h starts at column h*hs of its third) and O the [T, hs] view of out (leading dimension C):
//   S = Q K^T / sqrt(hs);  P = softmax_rows(S masked to j <= i);  O = P V
// The query rows are processed in blocks [i0, i1) of kAttnBlock rows. Rows of a block attend only
// to keys [0, i1), so each GEMM runs on the block's [i1]-wide prefix: about half of the T x T
// work (the masked upper triangle) is never computed.
//
// Threading: one (b, h) pair per OpenMP iteration; pairs write disjoint parts of out/att/dqkv and
// scratch, so there are no races and results do not depend on the thread count. While OpenMP
// threads run concurrent sgemm calls, OpenBLAS is held to one thread (these GEMMs are small).
#include <cblas.h>

#include <cmath>

#include <omp.h>

#include "backend/cpu/cpu_ops.h"

extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace llmpi::cpu {

namespace {

// Keeps OpenBLAS single-threaded for the lifetime of the object when `active`.
struct SerialBlas {
  int saved = 0;
  explicit SerialBlas(bool active) {
    if (active) {
      saved = openblas_get_num_threads();
      if (saved > 1) openblas_set_num_threads(1);
      else saved = 0;
    }
  }
  ~SerialBlas() {
    if (saved > 1) openblas_set_num_threads(saved);
  }
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;
};

// Row i of a probability block, in place: p_j = exp(s_j - max) / Σ_{j'<=i} exp(s_j' - max) for
// j <= i, and p_j = 0 for i < j < T.
inline void causal_softmax_row(float* row, int i, int T) {
  const int n = i + 1;
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; j++) {
    const float e = fast_expf(row[j] - mx);
    row[j] = e;
    s += e;
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int j = 0; j < n; j++) row[j] *= inv;
  for (int j = n; j < T; j++) row[j] = 0.0f;
}

}  // namespace

// For each (b, h) and row block [i0, i1), m = i1 - i0:
//   att[i0:i1, 0:i1] = (1/sqrt(hs)) Q[i0:i1] K[0:i1]^T          sgemm (m x i1, k = hs)
//   att[i, :] <- causal softmax of row i (zeros right of the diagonal, up to T)
//   out[i0:i1]       = att[i0:i1, 0:i1] V[0:i1]                  sgemm (m x hs, k = i1)
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const int BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel for schedule(static) if (par)
  for (int bh = 0; bh < BH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + static_cast<size_t>(bh) * T * T;
    float* o = out + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
    for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
      const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
      const int m = i1 - i0;
      float* ab = a + static_cast<size_t>(i0) * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, hs, sc,
                  q + static_cast<size_t>(i0) * C3, C3, k, C3, 0.0f, ab, T);
      for (int i = i0; i < i1; i++) causal_softmax_row(a + static_cast<size_t>(i) * T, i, T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, i1, 1.0f, ab, T, v, C3, 0.0f,
                  o + static_cast<size_t>(i0) * C, C);
    }
  }
}

// For each (b, h), with P = att, dO the [T, hs] view of dout, and row block [i0, i1):
//   dP[i0:i1, 0:i1]  = dO[i0:i1] V[0:i1]^T                       sgemm -> scratch
//   dS_ij            = P_ij (dP_ij - Σ_j' dP_ij' P_ij')           (softmax backward; 0 for j > i)
//   dQ[i0:i1]       += (1/sqrt(hs)) dS[i0:i1, 0:i1] K[0:i1]       sgemm, beta = 1
//   dK[0:i1]        += (1/sqrt(hs)) dS[i0:i1, 0:i1]^T Q[i0:i1]    sgemm, beta = 1
//   dV[0:i1]        += P[i0:i1, 0:i1]^T dO[i0:i1]                 sgemm, beta = 1
// (dQ, dK, dV are the strided views of dqkv, like Q, K, V of qkv.)
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const int BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel for schedule(static) if (par)
  for (int bh = 0; bh < BH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const size_t qoff = static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
    const float* q = qkv + qoff;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + qoff;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* p = att + static_cast<size_t>(bh) * T * T;
    float* ds = scratch + static_cast<size_t>(bh) * T * T;
    const float* dO = dout + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
    for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
      const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
      const int m = i1 - i0;
      float* dsb = ds + static_cast<size_t>(i0) * T;
      const float* pb = p + static_cast<size_t>(i0) * T;
      const float* dOb = dO + static_cast<size_t>(i0) * C;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, hs, 1.0f, dOb, C, v, C3, 0.0f,
                  dsb, T);
      for (int i = i0; i < i1; i++) {
        const float* pr = p + static_cast<size_t>(i) * T;
        float* dr = ds + static_cast<size_t>(i) * T;
        const int n = i + 1;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < n; j++) dot += dr[j] * pr[j];
#pragma omp simd
        for (int j = 0; j < n; j++) dr[j] = pr[j] * (dr[j] - dot);
        for (int j = n; j < i1; j++) dr[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, i1, sc, dsb, T, k, C3, 1.0f,
                  dq + static_cast<size_t>(i0) * C3, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, m, sc, dsb, T,
                  q + static_cast<size_t>(i0) * C3, C3, 1.0f, dk, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, m, 1.0f, pb, T, dOb, C, 1.0f,
                  dv, C3);
    }
  }
}

}  // namespace llmpi::cpu
