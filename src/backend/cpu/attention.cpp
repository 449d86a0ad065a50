// Multi-head attention with grouped K/V heads, GEMM-based.
//
// Layout: a qkv row holds [NH*hs q | NKV*hs k | NKV*hs v] (width W = (NH + 2 NKV) hs); query head
// h reads k/v head g = h / (NH/NKV) through a strided view (leading dimension W): the K/V of a
// group are never copied. With Q, K, V the [T, hs] views of batch b and O the [T, hs] view of
// out (leading dimension NH*hs):
//   S = Q K^T / sqrt(hs);  P = softmax over the keys j valid for query i;  O = P~ V
// where key j is valid for query i unless (causal and j > i) or mask[b,j] == 0, a row with no
// valid key has P = 0, and P~ = P * keep / (1-p) with keep_e = dropout_keep(key, e, p) for the
// flat index e = ((b NH + h) T + i) T + j of the element in att (P~ = P when p == 0). att keeps P.
//
// The query rows are processed in blocks [i0, i1) of kAttnBlock rows, and each block only looks
// at the key prefix [0, nk) that can be valid for it: nk = i1 when causal (the masked upper
// triangle is never computed), and nk never extends past the last unmasked key of the sequence
// (trailing padding is skipped). Every product runs as an sgemm on that [m x nk] block, causal or
// bidirectional alike.
//
// Causal, no mask, no dropout, NKV == NH is the GPT-2 path: it makes exactly the calls (same GEMMs,
// same blocks, same fast_expf softmax) of the original causal-only implementation, so its results
// are bitwise those of before.
//
// Threading: forward runs one (b, h) pair per OpenMP iteration (K/V are only read). Backward runs
// one (b, kv head) pair per iteration, looping over the query heads of the group inside, so one
// thread owns dK/dV of that pair: no races, and every gradient element receives its terms in a
// fixed order (query heads in order, row blocks in order) whatever the thread count. While OpenMP
// threads run concurrent sgemm calls, OpenBLAS is held to one thread (these GEMMs are small).
#include <cblas.h>

#include <cmath>
#include <vector>

#include <omp.h>

#include "backend/bf16.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/flash_bf16.h"
#include "backend/tf32.h"
#include "runtime/error.h"


namespace llmpi::cpu {

namespace {

// The shape of one attention call, and the views into qkv / out / att of a (b, h) pair.
struct AttentionShape {
  int B, T, NH, NKV, hs;
  int W;      // qkv row width: (NH + 2 NKV) hs
  int C;      // out row width: NH hs
  int group;  // query heads per kv head: NH / NKV
  bool causal;

  AttentionShape(int B_, int T_, int NH_, int NKV_, int hs_, bool causal_)
      : B(B_), T(T_), NH(NH_), NKV(NKV_), hs(hs_), W((NH_ + 2 * NKV_) * hs_), C(NH_ * hs_),
        group(NH_ / NKV_), causal(causal_) {}

  size_t q_offset(int b, int h) const {
    return static_cast<size_t>(b) * T * W + static_cast<size_t>(h) * hs;
  }
  size_t k_offset(int b, int g) const {
    return static_cast<size_t>(b) * T * W + static_cast<size_t>(NH + g) * hs;
  }
  size_t v_offset(int b, int g) const {
    return static_cast<size_t>(b) * T * W + static_cast<size_t>(NH + NKV + g) * hs;
  }
  size_t out_offset(int b, int h) const {
    return static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
  }
  size_t att_offset(int b, int h) const {
    return (static_cast<size_t>(b) * NH + h) * T * T;
  }
  // The keys a row block [i0, i1) may attend to: [0, nk). `kend` bounds the unmasked keys.
  int block_keys(int i1, int kend) const {
    const int lim = causal ? i1 : T;
    return lim < kend ? lim : kend;
  }
};

// One past the last key of sequence b that the mask leaves valid (T without a mask; 0 when every
// key is masked).
int valid_key_end(const int32_t* mask, int b, int T) {
  if (mask == nullptr) return T;
  const int32_t* m = mask + static_cast<size_t>(b) * T;
  int e = T;
  while (e > 0 && m[e - 1] == 0) e--;
  return e;
}

// Row i of a probability block, in place: p_j = exp(s_j - max) / Σ_{j'<=i} exp(s_j' - max) for
// j <= i, and p_j = 0 for i < j < T. (The causal, unmasked path: unchanged from the original.)
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

// A score row over the keys [0, n), in place, with the keys where keymask[j] == 0 excluded
// (keymask null: none excluded):
//   p_j = exp(s_j - max) / Σ_{valid j'} exp(s_j' - max) for valid j, 0 for the others and for
//   n <= j < T; a row with no valid key is all 0.
// Excluded keys enter the max as -inf, and their exp is replaced by +0 (a bit mask, so the loop
// vectorises; whatever fast_expf returned for them is discarded).
inline void masked_softmax_row(float* row, int n, int T, const int32_t* keymask) {
  float mx = -INFINITY;
  if (keymask == nullptr) {
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
  } else {
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; j++) {
      const float s = select_float(keymask[j] != 0, row[j], -INFINITY);
      mx = s > mx ? s : mx;
    }
  }
  if (mx == -INFINITY) {  // no valid key (or only -inf scores, which finite inputs never give)
    for (int j = 0; j < T; j++) row[j] = 0.0f;
    return;
  }
  float s = 0.0f;
  if (keymask == nullptr) {
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) {
      const float e = fast_expf(row[j] - mx);
      row[j] = e;
      s += e;
    }
  } else {
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) {
      const uint32_t valid = 0u - static_cast<uint32_t>(keymask[j] != 0);
      const float e = keep_or_zero(valid, fast_expf(row[j] - mx));
      row[j] = e;
      s += e;
    }
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int j = 0; j < n; j++) row[j] *= inv;
  for (int j = n; j < T; j++) row[j] = 0.0f;
}

// dropped[r, j] = p[r, j] * keep(e0 + r T + j) * inv_keep for the rows r < m, keys j < nk of a
// block (row stride T for both; e0 = flat att index of the block's first element; keep through
// dropout_keep_bits with threshold = dropout_threshold(p), i.e. dropout_keep(key, e, p)).
void dropout_block(float* dropped, const float* p, int m, int nk, int T, uint64_t e0,
                   uint64_t threshold, float inv_keep, uint64_t key) {
  for (int r = 0; r < m; r++) {
    const float* pr = p + static_cast<size_t>(r) * T;
    float* dr = dropped + static_cast<size_t>(r) * T;
    const uint64_t er = e0 + static_cast<uint64_t>(r) * T;
#pragma omp simd
    for (int j = 0; j < nk; j++)
      dr[j] = keep_or_zero(dropout_keep_bits(key, er + static_cast<uint64_t>(j), threshold),
                           pr[j] * inv_keep);
  }
}

// The arguments outside the contract that would otherwise read or write out of bounds or
// silently compute something else.
void check_attention_args(const char* op, int NH, int NKV, float p) {
  if (NKV <= 0 || NH % NKV != 0)
    fail(op, ": ", NH, " query heads cannot share ", NKV, " key/value heads (NH % NKV must be 0)");
  if (!(p >= 0.0f && p < 1.0f)) fail(op, ": dropout probability ", p, " is outside [0, 1)");
}

}  // namespace

// For each (b, h) and row block [i0, i1), m = i1 - i0, keys [0, nk):
//   att[i0:i1, 0:nk] = (1/sqrt(hs)) Q[i0:i1] K[0:nk]^T           sgemm (m x nk, k = hs)
//   att[i, :] <- softmax of row i over its valid keys (zeros elsewhere, up to T)
//   out[i0:i1]       = P~[i0:i1, 0:nk] V[0:nk]                    sgemm (m x hs, k = nk)
// (P~ = att itself without dropout, else a per-thread block buffer.)
void attention_forward(float* out, float* att, const float* qkv, const int32_t* mask, int B, int T,
                       int NH, int NKV, int hs, bool causal, float dropout_p,
                       uint64_t dropout_key) {
  check_attention_args("attention_forward", NH, NKV, dropout_p);
  const AttentionShape sh(B, T, NH, NKV, hs, causal);
  const int W = sh.W, C = sh.C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool dropout = dropout_p > 0.0f;
  const float inv_keep = dropout ? 1.0f / (1.0f - dropout_p) : 1.0f;
  const uint64_t threshold = dropout_threshold(dropout_p);
  const bool causal_plain = causal && mask == nullptr;  // the original causal softmax
  const int BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel if (par)
  {
    std::vector<float> dropped(dropout ? static_cast<size_t>(kAttnBlock) * T : 0);
#pragma omp for schedule(static)
    for (int bh = 0; bh < BH; bh++) {
      const int b = bh / NH, h = bh % NH, g = h / sh.group;
      const float* q = qkv + sh.q_offset(b, h);
      const float* k = qkv + sh.k_offset(b, g);
      const float* v = qkv + sh.v_offset(b, g);
      float* a = att + sh.att_offset(b, h);
      float* o = out + sh.out_offset(b, h);
      const int32_t* keymask = mask ? mask + static_cast<size_t>(b) * T : nullptr;
      const int kend = valid_key_end(mask, b, T);
      for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
        const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
        const int m = i1 - i0;
        const int nk = sh.block_keys(i1, kend);
        float* ab = a + static_cast<size_t>(i0) * T;
        if (nk == 0) {  // every key of the block masked: P = 0, out = 0
          for (size_t e = 0; e < static_cast<size_t>(m) * T; e++) ab[e] = 0.0f;
          for (int i = i0; i < i1; i++)
            for (int d = 0; d < hs; d++) o[static_cast<size_t>(i) * C + d] = 0.0f;
          continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hs, sc,
                    q + static_cast<size_t>(i0) * W, W, k, W, 0.0f, ab, T);
        if (causal_plain) {
          for (int i = i0; i < i1; i++) causal_softmax_row(a + static_cast<size_t>(i) * T, i, T);
        } else {
          for (int i = i0; i < i1; i++) {
            const int n = causal && i + 1 < nk ? i + 1 : nk;
            masked_softmax_row(a + static_cast<size_t>(i) * T, n, T, keymask);
          }
        }
        const float* pb = ab;
        if (dropout) {
          dropout_block(dropped.data(), ab, m, nk, T,
                        sh.att_offset(b, h) + static_cast<size_t>(i0) * T, threshold, inv_keep,
                        dropout_key);
          pb = dropped.data();
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, nk, 1.0f, pb, T, v, W, 0.0f,
                    o + static_cast<size_t>(i0) * C, C);
      }
    }
  }
}

// For each (b, kv head g), each query head h of its group, row block [i0, i1), keys [0, nk), with
// P = att, dO the [T, hs] view of dout and, with dropout, P~ = P keep inv_keep (recomputed from
// the key into a per-thread block buffer):
//   dV[0:nk]        += P~[i0:i1, 0:nk]^T dO[i0:i1]               sgemm, beta = 1
//   dP~[i0:i1, 0:nk] = dO[i0:i1] V[0:nk]^T                        sgemm -> scratch
//   dS_ij            = P_ij (dP_ij - Σ_j' dP_ij' P_ij')           (softmax backward; masked and
//                                                                  causal-future keys have P = 0)
//     where dP_ij = dP~_ij keep_ij inv_keep, so that P_ij dP_ij = P~_ij dP~_ij and
//     dS_ij = P~_ij dP~_ij - P_ij Σ_j' P~_ij' dP~_ij'   (no second pass over the keep mask)
//   dQ[i0:i1]       += (1/sqrt(hs)) dS[i0:i1, 0:nk] K[0:nk]       sgemm, beta = 1
//   dK[0:nk]        += (1/sqrt(hs)) dS[i0:i1, 0:nk]^T Q[i0:i1]    sgemm, beta = 1
// (dQ, dK, dV are the strided views of dqkv, like Q, K, V of qkv.)
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, const int32_t* mask, int B, int T, int NH, int NKV,
                        int hs, bool causal, float dropout_p, uint64_t dropout_key) {
  check_attention_args("attention_backward", NH, NKV, dropout_p);
  const AttentionShape sh(B, T, NH, NKV, hs, causal);
  const int W = sh.W, C = sh.C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool dropout = dropout_p > 0.0f;
  const float inv_keep = dropout ? 1.0f / (1.0f - dropout_p) : 1.0f;
  const uint64_t threshold = dropout_threshold(dropout_p);
  const int BG = B * NKV;
  const bool par = BG > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel if (par)
  {
    std::vector<float> dropped(dropout ? static_cast<size_t>(kAttnBlock) * T : 0);
#pragma omp for schedule(static)
    for (int bg = 0; bg < BG; bg++) {
      const int b = bg / NKV, g = bg % NKV;
      const float* k = qkv + sh.k_offset(b, g);
      const float* v = qkv + sh.v_offset(b, g);
      float* dk = dqkv + sh.k_offset(b, g);
      float* dv = dqkv + sh.v_offset(b, g);
      const int kend = valid_key_end(mask, b, T);
      for (int h = g * sh.group; h < (g + 1) * sh.group; h++) {
        const float* q = qkv + sh.q_offset(b, h);
        float* dq = dqkv + sh.q_offset(b, h);
        const float* p = att + sh.att_offset(b, h);
        float* ds = scratch + sh.att_offset(b, h);
        const float* dO = dout + sh.out_offset(b, h);
        for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
          const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
          const int m = i1 - i0;
          const int nk = sh.block_keys(i1, kend);
          if (nk == 0) continue;  // P = 0 on the whole block: nothing flows back
          float* dsb = ds + static_cast<size_t>(i0) * T;
          const float* pb = p + static_cast<size_t>(i0) * T;
          const float* dOb = dO + static_cast<size_t>(i0) * C;
          if (dropout) {
            dropout_block(dropped.data(), pb, m, nk, T,
                          sh.att_offset(b, h) + static_cast<size_t>(i0) * T, threshold, inv_keep,
                          dropout_key);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, m, 1.0f, dropped.data(),
                        T, dOb, C, 1.0f, dv, W);
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hs, 1.0f, dOb, C, v, W,
                      0.0f, dsb, T);
          for (int i = i0; i < i1; i++) {
            const float* pr = p + static_cast<size_t>(i) * T;
            float* dr = ds + static_cast<size_t>(i) * T;
            const int n = causal && i + 1 < nk ? i + 1 : nk;
            float dot = 0.0f;
            if (dropout) {
              const float* tr = dropped.data() + static_cast<size_t>(i - i0) * T;
#pragma omp simd reduction(+ : dot)
              for (int j = 0; j < n; j++) dot += dr[j] * tr[j];
#pragma omp simd
              for (int j = 0; j < n; j++) dr[j] = tr[j] * dr[j] - pr[j] * dot;
            } else {
#pragma omp simd reduction(+ : dot)
              for (int j = 0; j < n; j++) dot += dr[j] * pr[j];
#pragma omp simd
              for (int j = 0; j < n; j++) dr[j] = pr[j] * (dr[j] - dot);
            }
            for (int j = n; j < nk; j++) dr[j] = 0.0f;
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, nk, sc, dsb, T, k, W,
                      1.0f, dq + static_cast<size_t>(i0) * W, W);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, m, sc, dsb, T,
                      q + static_cast<size_t>(i0) * W, W, 1.0f, dk, W);
          if (!dropout)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, m, 1.0f, pb, T, dOb, C,
                        1.0f, dv, W);
        }
      }
    }
  }
}

// ---- fused attention: the same results without storing P ---------------------------------------
//
// flash_attention_forward/backward (contracts in backend/op_list.h) compute what the two ops
// above compute, with P living only in a per-thread block of kAttnBlock x T floats (a row block
// against all its keys), never in a [B, NH, T, T] tensor. The forward keeps, per query row, the
// log-sum-exp lse_i = max_i + log Σ_j exp(S_ij - max_i) of its visible scores; the backward
// recomputes P_ij = exp(S_ij - lse_i) block by block (FlashAttention-2's recomputation; one more
// Q K^T product than attention_backward) and uses D_i = dO_i · out_i in place of the row sum
// Σ_j P~_ij dP~_ij (equal: out_i = Σ_j P~_ij v_j). Blocking, skipped keys, threading (forward
// per (b, h), backward per (b, kv head) with the group's query heads in order) and the GEMMs are
// those of the ops above, so the two agree to rounding (test_flash_attention.cpp).

namespace {

// Row i of a score block over keys [0, nk), in place, for a row whose keys [0, n) may be visible
// (n <= nk; keymask as in masked_softmax_row): p_j = exp(s_j - max) / Σ exp(s_j' - max) over the
// visible j, 0 for the others up to nk. Returns lse = max + log Σ exp(s_j' - max), or -inf for a
// row with no visible key (then all of [0, nk) is 0).
inline float softmax_row_lse(float* row, int n, int nk, const int32_t* keymask) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < n; j++) {
    const float s = keymask ? select_float(keymask[j] != 0, row[j], -INFINITY) : row[j];
    mx = s > mx ? s : mx;
  }
  if (mx == -INFINITY) {
    for (int j = 0; j < nk; j++) row[j] = 0.0f;
    return -INFINITY;
  }
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; j++) {
    const uint32_t valid = keymask ? 0u - static_cast<uint32_t>(keymask[j] != 0) : ~0u;
    const float e = keep_or_zero(valid, fast_expf(row[j] - mx));
    row[j] = e;
    s += e;
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int j = 0; j < n; j++) row[j] *= inv;
  for (int j = n; j < nk; j++) row[j] = 0.0f;
  return mx + std::log(s);
}

// The same row recomputed from its lse: p_j = exp(s_j - lse) for visible j < n, 0 elsewhere
// up to nk (all 0 when lse = -inf: no visible key).
inline void probs_from_lse(float* row, int n, int nk, const int32_t* keymask, float lse) {
  if (lse == -INFINITY) n = 0;
#pragma omp simd
  for (int j = 0; j < n; j++) {
    const uint32_t valid = keymask ? 0u - static_cast<uint32_t>(keymask[j] != 0) : ~0u;
    row[j] = keep_or_zero(valid, fast_expf(row[j] - lse));
  }
  for (int j = n; j < nk; j++) row[j] = 0.0f;
}

// ---- the bf16 and tf32 variants: the CUDA tensor-core kernels' rounding, emulated -------------
//
// What is rounded and where: backend/flash_bf16.h; `rnd` is round_to_bf16 (prec = bf16) or
// round_to_tf32 (prec = tf32), applied at the same points. Rounding the operands into fp32 copies and
// running the same sgemm calls is exact emulation up to summation order (a product of two bf16,
// or two tf32, values is exact in fp32). The forward needs no key tiling: with the integer running maximum
// of the kernel, its P V operand bf16(2^(t - M)) depends only on the row's final M = ceil(max t).

using Rounding = float (*)(float);

// dst [T, hs] (contiguous) = the rounding of T rows of hs floats at src with row stride ld (one
// head of qkv or dout): per-thread copies, O(T hs), never a copy of the whole qkv.
void round_head(float* dst, const float* src, int T, int ld, int hs, Rounding rnd) {
  for (int t = 0; t < T; t++)
    for (int d = 0; d < hs; d++)
      dst[static_cast<size_t>(t) * hs + d] = rnd(src[static_cast<size_t>(t) * ld + d]);
}

// For each (b, h) and row block [i0, i1), keys [0, nk):
//   Tb = c Qr[i0:i1] Kr[0:nk]^T                    sgemm (c = log2 e / sqrt(hs); Qr, Kr rounded)
//   per row: M = ceil(max visible t), e_j = 2^(t_j - M), l = Σ e_j, l_r = Σ rnd(e_j),
//            Tb_j <- rnd(e_j) keep_j (0 for the invisible keys), lse = (M + log2 l) ln 2,
//            f = (1/(1-p)) / l_r
//   out[i0:i1] = Tb Vr[0:nk], row i scaled by its f  sgemm (Vr rounded)
void flash_forward_rounded(float* out, float* lse, const float* qkv, const int32_t* mask, int B, int T,
                           int NH, int NKV, int hs, bool causal, float dropout_p, uint64_t dropout_key,
                           Rounding rnd) {
  const AttentionShape sh(B, T, NH, NKV, hs, causal);
  const int W = sh.W, C = sh.C;
  const float c = flash_bf16_score_scale(hs);
  const bool dropout = dropout_p > 0.0f;
  const float inv_keep = dropout ? 1.0f / (1.0f - dropout_p) : 1.0f;
  const uint64_t threshold = dropout_threshold(dropout_p);
  const int BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel if (par)
  {
    std::vector<float> probs(static_cast<size_t>(kAttnBlock) * T);
    std::vector<float> f(kAttnBlock);
    const size_t head = static_cast<size_t>(T) * hs;
    std::vector<float> qr(head), kr(head), vr(head);  // [T, hs], rounded
#pragma omp for schedule(static)
    for (int bh = 0; bh < BH; bh++) {
      const int b = bh / NH, h = bh % NH, g = h / sh.group;
      round_head(qr.data(), qkv + sh.q_offset(b, h), T, W, hs, rnd);
      round_head(kr.data(), qkv + sh.k_offset(b, g), T, W, hs, rnd);
      round_head(vr.data(), qkv + sh.v_offset(b, g), T, W, hs, rnd);
      const float* q = qr.data();
      const float* k = kr.data();
      const float* v = vr.data();
      float* o = out + sh.out_offset(b, h);
      float* l = lse + static_cast<size_t>(bh) * T;
      const int32_t* keymask = mask ? mask + static_cast<size_t>(b) * T : nullptr;
      const int kend = valid_key_end(mask, b, T);
      const uint64_t e0 = sh.att_offset(b, h);
      for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
        const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
        const int m = i1 - i0;
        const int nk = sh.block_keys(i1, kend);
        if (nk == 0) {
          for (int i = i0; i < i1; i++) {
            l[i] = -INFINITY;
            for (int d = 0; d < hs; d++) o[static_cast<size_t>(i) * C + d] = 0.0f;
          }
          continue;
        }
        float* pb = probs.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hs, c,
                    q + static_cast<size_t>(i0) * hs, hs, k, hs, 0.0f, pb, T);
        for (int i = i0; i < i1; i++) {
          float* row = pb + static_cast<size_t>(i - i0) * T;
          const int n = causal && i + 1 < nk ? i + 1 : nk;
          float mx = -INFINITY;
          for (int j = 0; j < n; j++)
            if (keymask == nullptr || keymask[j] != 0) mx = row[j] > mx ? row[j] : mx;
          if (mx == -INFINITY) {
            for (int j = 0; j < nk; j++) row[j] = 0.0f;
            l[i] = -INFINITY;
            f[i - i0] = 0.0f;
            continue;
          }
          const float M = std::ceil(mx);
          float sum = 0.0f, sum_r = 0.0f;  // of e, and of rnd(e)
          const uint64_t er = e0 + static_cast<uint64_t>(i) * T;
          for (int j = 0; j < n; j++) {
            if (keymask != nullptr && keymask[j] == 0) {
              row[j] = 0.0f;
              continue;
            }
            const float e = std::exp2(row[j] - M);
            const float e_r = rnd(e);
            sum += e;
            sum_r += e_r;
            const bool keep = !dropout || dropout_keep_bits(dropout_key, er + j, threshold);
            row[j] = keep ? e_r : 0.0f;
          }
          for (int j = n; j < nk; j++) row[j] = 0.0f;
          l[i] = (M + std::log2(sum)) * kFlashLn2;
          f[i - i0] = inv_keep / sum_r;
        }
        float* ob = o + static_cast<size_t>(i0) * C;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, nk, 1.0f, pb, T, v, hs, 0.0f,
                    ob, C);
        for (int r = 0; r < m; r++)
          for (int d = 0; d < hs; d++) ob[static_cast<size_t>(r) * C + d] *= f[r];
      }
    }
  }
}

// For each (b, kv head g), each query head h of its group (in order), row block [i0, i1), keys
// [0, nk) (Qr, Kr, Vr, dOr the rounded copies):
//   Tb = c Qr Kr^T;  P_ij = 2^(t_ij - lse_i log2 e) (visible), else 0;  P~ = P keep/(1-p)
//   D_i = dO_i · out_i (unrounded)
//   dV += rnd(P~)^T dOr;  dP~ = dOr Vr^T;  dS' = rnd(sc (P~ dP~ - P D))
//   dQ += dS' Kr;  dK += dS'^T Qr
void flash_backward_rounded(float* dqkv, const float* dout, const float* out, const float* lse,
                            const float* qkv, const int32_t* mask, int B, int T, int NH, int NKV,
                            int hs, bool causal, float dropout_p, uint64_t dropout_key, Rounding rnd) {
  const AttentionShape sh(B, T, NH, NKV, hs, causal);
  const int W = sh.W, C = sh.C;
  const float c = flash_bf16_score_scale(hs);
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool dropout = dropout_p > 0.0f;
  const float inv_keep = dropout ? 1.0f / (1.0f - dropout_p) : 1.0f;
  const uint64_t threshold = dropout_threshold(dropout_p);
  const int BG = B * NKV;
  const bool par = BG > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel if (par)
  {
    const size_t block = static_cast<size_t>(kAttnBlock) * T;
    std::vector<float> probs(block), dropped(block), dprobs(block);
    std::vector<float> Drow(kAttnBlock);
    const size_t head = static_cast<size_t>(T) * hs;
    std::vector<float> qr(head), kr(head), vr(head), dOr(head);  // [T, hs], rounded
#pragma omp for schedule(static)
    for (int bg = 0; bg < BG; bg++) {
      const int b = bg / NKV, g = bg % NKV;
      round_head(kr.data(), qkv + sh.k_offset(b, g), T, W, hs, rnd);
      round_head(vr.data(), qkv + sh.v_offset(b, g), T, W, hs, rnd);
      const float* k = kr.data();
      const float* v = vr.data();
      float* dk = dqkv + sh.k_offset(b, g);
      float* dv = dqkv + sh.v_offset(b, g);
      const int32_t* keymask = mask ? mask + static_cast<size_t>(b) * T : nullptr;
      const int kend = valid_key_end(mask, b, T);
      for (int h = g * sh.group; h < (g + 1) * sh.group; h++) {
        round_head(qr.data(), qkv + sh.q_offset(b, h), T, W, hs, rnd);
        round_head(dOr.data(), dout + sh.out_offset(b, h), T, C, hs, rnd);
        const float* q = qr.data();
        float* dq = dqkv + sh.q_offset(b, h);
        const float* dO = dout + sh.out_offset(b, h);
        const float* O = out + sh.out_offset(b, h);
        const float* l = lse + (static_cast<size_t>(b) * NH + h) * T;
        const uint64_t e0 = sh.att_offset(b, h);
        for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
          const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
          const int m = i1 - i0;
          const int nk = sh.block_keys(i1, kend);
          if (nk == 0) continue;
          const float* dOb = dOr.data() + static_cast<size_t>(i0) * hs;
          float* pb = probs.data();
          float* tb = dropped.data();
          float* dsb = dprobs.data();
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hs, c,
                      q + static_cast<size_t>(i0) * hs, hs, k, hs, 0.0f, pb, T);
          for (int i = i0; i < i1; i++) {
            float* pr = pb + static_cast<size_t>(i - i0) * T;
            float* tr = tb + static_cast<size_t>(i - i0) * T;
            const int n = l[i] == -INFINITY ? 0 : causal && i + 1 < nk ? i + 1 : nk;
            const float Lb = l[i] * kFlashLog2e;
            const uint64_t er = e0 + static_cast<uint64_t>(i) * T;
            for (int j = 0; j < n; j++) {
              const bool visible = keymask == nullptr || keymask[j] != 0;
              pr[j] = visible ? std::exp2(pr[j] - Lb) : 0.0f;
              const bool keep = !dropout || dropout_keep_bits(dropout_key, er + j, threshold);
              tr[j] = keep ? pr[j] * inv_keep : 0.0f;
            }
            for (int j = n; j < nk; j++) pr[j] = tr[j] = 0.0f;
            const float* dOi = dO + static_cast<size_t>(i) * C;
            const float* Oi = O + static_cast<size_t>(i) * C;
            float dot = 0.0f;
            for (int d = 0; d < hs; d++) dot += dOi[d] * Oi[d];
            Drow[i - i0] = dot;
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hs, 1.0f, dOb, hs, v, hs,
                      0.0f, dsb, T);
          for (int r = 0; r < m; r++) {
            const float* pr = pb + static_cast<size_t>(r) * T;
            float* tr = tb + static_cast<size_t>(r) * T;
            float* dr = dsb + static_cast<size_t>(r) * T;
            const float D = Drow[r];
            for (int j = 0; j < nk; j++) {
              dr[j] = rnd(sc * (tr[j] * dr[j] - pr[j] * D));
              tr[j] = rnd(tr[j]);
            }
          }
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, m, 1.0f, tb, T, dOb, hs,
                      1.0f, dv, W);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, nk, 1.0f, dsb, T, k, hs,
                      1.0f, dq + static_cast<size_t>(i0) * W, W);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, m, 1.0f, dsb, T,
                      q + static_cast<size_t>(i0) * hs, hs, 1.0f, dk, W);
        }
      }
    }
  }
}

}  // namespace

// For each (b, h) and row block [i0, i1), keys [0, nk), with a per-thread block buffer P:
//   P = (1/sqrt(hs)) Q[i0:i1] K[0:nk]^T                           sgemm (m x nk, k = hs)
//   P[i, :] <- softmax of row i over its visible keys; lse[b,h,i] = its log-sum-exp
//   out[i0:i1] = P~ V[0:nk]                                       sgemm (m x hs, k = nk)
void flash_attention_forward(float* out, float* lse, const float* qkv, const int32_t* mask, int B,
                             int T, int NH, int NKV, int hs, bool causal, float dropout_p,
                             uint64_t dropout_key, GemmPrecision prec) {
  check_attention_args("flash_attention_forward", NH, NKV, dropout_p);
  if (prec != GemmPrecision::fp32) {  // bf16, tf32: the tensor-core kernels' rounding
    flash_forward_rounded(out, lse, qkv, mask, B, T, NH, NKV, hs, causal, dropout_p, dropout_key,
                          prec == GemmPrecision::bf16 ? round_to_bf16 : round_to_tf32);
    return;
  }
  const AttentionShape sh(B, T, NH, NKV, hs, causal);
  const int W = sh.W, C = sh.C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool dropout = dropout_p > 0.0f;
  const float inv_keep = dropout ? 1.0f / (1.0f - dropout_p) : 1.0f;
  const uint64_t threshold = dropout_threshold(dropout_p);
  const int BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel if (par)
  {
    std::vector<float> probs(static_cast<size_t>(kAttnBlock) * T);
    std::vector<float> dropped(dropout ? static_cast<size_t>(kAttnBlock) * T : 0);
#pragma omp for schedule(static)
    for (int bh = 0; bh < BH; bh++) {
      const int b = bh / NH, h = bh % NH, g = h / sh.group;
      const float* q = qkv + sh.q_offset(b, h);
      const float* k = qkv + sh.k_offset(b, g);
      const float* v = qkv + sh.v_offset(b, g);
      float* o = out + sh.out_offset(b, h);
      float* l = lse + static_cast<size_t>(bh) * T;
      const int32_t* keymask = mask ? mask + static_cast<size_t>(b) * T : nullptr;
      const int kend = valid_key_end(mask, b, T);
      for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
        const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
        const int m = i1 - i0;
        const int nk = sh.block_keys(i1, kend);
        if (nk == 0) {  // every key of the block masked: out = 0, lse = -inf
          for (int i = i0; i < i1; i++) {
            l[i] = -INFINITY;
            for (int d = 0; d < hs; d++) o[static_cast<size_t>(i) * C + d] = 0.0f;
          }
          continue;
        }
        float* pb = probs.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hs, sc,
                    q + static_cast<size_t>(i0) * W, W, k, W, 0.0f, pb, T);
        for (int i = i0; i < i1; i++) {
          const int n = causal && i + 1 < nk ? i + 1 : nk;
          l[i] = softmax_row_lse(pb + static_cast<size_t>(i - i0) * T, n, nk, keymask);
        }
        if (dropout) {
          dropout_block(dropped.data(), pb, m, nk, T,
                        sh.att_offset(b, h) + static_cast<size_t>(i0) * T, threshold, inv_keep,
                        dropout_key);
          pb = dropped.data();
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, nk, 1.0f, pb, T, v, W, 0.0f,
                    o + static_cast<size_t>(i0) * C, C);
      }
    }
  }
}

// For each (b, kv head g), each query head h of its group (in order), row block [i0, i1), keys
// [0, nk), with per-thread block buffers P, dP (and P~ with dropout):
//   P  = (1/sqrt(hs)) Q[i0:i1] K[0:nk]^T;  P_ij <- exp(P_ij - lse_i) (visible), else 0
//   D_i = dO_i · out_i
//   dV[0:nk] += P~^T dO[i0:i1]                                    sgemm, beta = 1
//   dP = dO[i0:i1] V[0:nk]^T                                      sgemm
//   dS_ij = P~_ij dP_ij - P_ij D_i                                (in dP)
//   dQ[i0:i1] += (1/sqrt(hs)) dS K[0:nk];  dK[0:nk] += (1/sqrt(hs)) dS^T Q[i0:i1]
void flash_attention_backward(float* dqkv, const float* dout, const float* out, const float* lse,
                              const float* qkv, const int32_t* mask, int B, int T, int NH,
                              int NKV, int hs, bool causal, float dropout_p,
                              uint64_t dropout_key, GemmPrecision prec) {
  check_attention_args("flash_attention_backward", NH, NKV, dropout_p);
  if (prec != GemmPrecision::fp32) {
    flash_backward_rounded(dqkv, dout, out, lse, qkv, mask, B, T, NH, NKV, hs, causal, dropout_p,
                           dropout_key, prec == GemmPrecision::bf16 ? round_to_bf16 : round_to_tf32);
    return;
  }
  const AttentionShape sh(B, T, NH, NKV, hs, causal);
  const int W = sh.W, C = sh.C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const bool dropout = dropout_p > 0.0f;
  const float inv_keep = dropout ? 1.0f / (1.0f - dropout_p) : 1.0f;
  const uint64_t threshold = dropout_threshold(dropout_p);
  const int BG = B * NKV;
  const bool par = BG > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel if (par)
  {
    const size_t block = static_cast<size_t>(kAttnBlock) * T;
    std::vector<float> probs(block), dprobs(block), dropped(dropout ? block : 0);
    std::vector<float> Drow(kAttnBlock);
#pragma omp for schedule(static)
    for (int bg = 0; bg < BG; bg++) {
      const int b = bg / NKV, g = bg % NKV;
      const float* k = qkv + sh.k_offset(b, g);
      const float* v = qkv + sh.v_offset(b, g);
      float* dk = dqkv + sh.k_offset(b, g);
      float* dv = dqkv + sh.v_offset(b, g);
      const int32_t* keymask = mask ? mask + static_cast<size_t>(b) * T : nullptr;
      const int kend = valid_key_end(mask, b, T);
      for (int h = g * sh.group; h < (g + 1) * sh.group; h++) {
        const float* q = qkv + sh.q_offset(b, h);
        float* dq = dqkv + sh.q_offset(b, h);
        const float* dO = dout + sh.out_offset(b, h);
        const float* O = out + sh.out_offset(b, h);
        const float* l = lse + (static_cast<size_t>(b) * NH + h) * T;
        for (int i0 = 0; i0 < T; i0 += kAttnBlock) {
          const int i1 = i0 + kAttnBlock < T ? i0 + kAttnBlock : T;
          const int m = i1 - i0;
          const int nk = sh.block_keys(i1, kend);
          if (nk == 0) continue;  // P = 0 on the whole block: nothing flows back
          const float* dOb = dO + static_cast<size_t>(i0) * C;
          float* pb = probs.data();
          float* dsb = dprobs.data();
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hs, sc,
                      q + static_cast<size_t>(i0) * W, W, k, W, 0.0f, pb, T);
          for (int i = i0; i < i1; i++) {
            const int n = causal && i + 1 < nk ? i + 1 : nk;
            probs_from_lse(pb + static_cast<size_t>(i - i0) * T, n, nk, keymask, l[i]);
            const float* dOi = dO + static_cast<size_t>(i) * C;
            const float* Oi = O + static_cast<size_t>(i) * C;
            float dot = 0.0f;
            for (int d = 0; d < hs; d++) dot += dOi[d] * Oi[d];
            Drow[i - i0] = dot;
          }
          const float* pt = pb;  // P~
          if (dropout) {
            dropout_block(dropped.data(), pb, m, nk, T,
                          sh.att_offset(b, h) + static_cast<size_t>(i0) * T, threshold, inv_keep,
                          dropout_key);
            pt = dropped.data();
          }
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, m, 1.0f, pt, T, dOb, C,
                      1.0f, dv, W);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, hs, 1.0f, dOb, C, v, W,
                      0.0f, dsb, T);
          for (int r = 0; r < m; r++) {
            const float* pr = pb + static_cast<size_t>(r) * T;
            const float* tr = pt + static_cast<size_t>(r) * T;
            float* dr = dsb + static_cast<size_t>(r) * T;
            const float D = Drow[r];
#pragma omp simd
            for (int j = 0; j < nk; j++) dr[j] = tr[j] * dr[j] - pr[j] * D;
          }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, nk, sc, dsb, T, k, W,
                      1.0f, dq + static_cast<size_t>(i0) * W, W);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, m, sc, dsb, T,
                      q + static_cast<size_t>(i0) * W, W, 1.0f, dk, W);
        }
      }
    }
  }
}

}  // namespace llmpi::cpu
