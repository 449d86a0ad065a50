// A double-precision reference of the transformer of model/transformer.h, written straight from
// the definitions (no ops table, no fused buffers beyond what the table lays out), for whole-model
// gradient checks by finite differences. Parameters are read by role from the model's own table.
// Also some ops in running error analysis (grad_check.h Err: their exact results and a bound on
// their rounding): the norms, the tanh GELU and the CPU's attention ops (full and fused, fp32), for
// the op tests; and the magnitudes of a model's gradients, for the model tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/dropout_hash.h"
#include "grad_check.h"
#include "model/transformer.h"
#include "model_test_util.h"

namespace llmpi::test {

struct RefTransformer {
  const ModelDesc& d;
  const ParamTable& t;
  int l0 = 0, l1 = -1;  // blocks run (whole model by default)

  using Vec = std::vector<double>;

  // The first part of a role's tensor in layer `layer` (fused parts are adjacent).
  const double* at(const Vec& P, int role, int layer) const {
    const auto names = family_tensor_names(d.family, role, layer);
    if (names.empty()) return nullptr;
    const ParamSlice* s = t.find(names[0]);
    return s ? P.data() + s->offset : nullptr;
  }

  static Vec layernorm(const Vec& x, const double* w, const double* b, int N, int C, double eps) {
    Vec y(x.size());
    for (int n = 0; n < N; n++) {
      double m = 0, v = 0;
      for (int c = 0; c < C; c++) m += x[(size_t)n * C + c];
      m /= C;
      for (int c = 0; c < C; c++) v += (x[(size_t)n * C + c] - m) * (x[(size_t)n * C + c] - m);
      v /= C;
      for (int c = 0; c < C; c++) y[(size_t)n * C + c] = (x[(size_t)n * C + c] - m) / std::sqrt(v + eps) * w[c] + (b ? b[c] : 0.0);
    }
    return y;
  }
  static Vec rmsnorm(const Vec& x, const double* w, int N, int C, double eps) {
    Vec y(x.size());
    for (int n = 0; n < N; n++) {
      double ms = 0;
      for (int c = 0; c < C; c++) ms += x[(size_t)n * C + c] * x[(size_t)n * C + c];
      ms /= C;
      for (int c = 0; c < C; c++) y[(size_t)n * C + c] = x[(size_t)n * C + c] / std::sqrt(ms + eps) * w[c];
    }
    return y;
  }
  Vec norm(const Vec& x, const double* w, const double* b, int N) const {
    return d.norm == NormKind::layernorm ? layernorm(x, w, b, N, d.d_model, d.norm_eps)
                                         : rmsnorm(x, w, N, d.d_model, d.norm_eps);
  }
  static Vec linear(const Vec& x, const double* W, const double* b, int N, int in, int out) {
    Vec y((size_t)N * out);
    for (int n = 0; n < N; n++)
      for (int o = 0; o < out; o++) {
        double acc = b ? b[o] : 0.0;
        for (int i = 0; i < in; i++) acc += x[(size_t)n * in + i] * W[(size_t)o * in + i];
        y[(size_t)n * out + o] = acc;
      }
    return y;
  }
  // HF rotate-half RoPE on nh heads at column offset `col` of rows of width `stride`.
  void rope(Vec& x, int B, int T, int nh, int col, int stride) const {
    const int hs = d.head_dim(), half = hs / 2;
    for (int b = 0; b < B; b++)
      for (int tt = 0; tt < T; tt++)
        for (int h = 0; h < nh; h++) {
          double* v = &x[((size_t)b * T + tt) * stride + col + (size_t)h * hs];
          for (int i = 0; i < half; i++) {
            const double f = std::pow(d.rope_theta, -2.0 * i / hs), a = tt * f;
            const double x1 = v[i], x2 = v[i + half];
            v[i] = x1 * std::cos(a) - x2 * std::sin(a);
            v[i + half] = x2 * std::cos(a) + x1 * std::sin(a);
          }
        }
  }

  // Hidden state entering block l0 from the embedding.
  Vec embed(const Vec& P, const Batch& bt) const {
    const int C = d.d_model, T = bt.T, N = bt.B * bt.T;
    Vec x((size_t)N * C);
    const double *wte = at(P, kTokEmb, -1), *wpe = d.learned_positions ? at(P, kPosEmb, -1) : nullptr;
    const double* tte = d.type_vocab_size > 0 ? at(P, kTypeEmb, -1) : nullptr;
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) {
        double v = wte[(size_t)bt.tokens[n] * C + c];
        if (wpe) v += wpe[(size_t)(n % T) * C + c];
        if (tte) v += tte[(size_t)(bt.token_types ? bt.token_types[n] : 0) * C + c];
        x[(size_t)n * C + c] = v;
      }
    if (d.embedding_norm) x = layernorm(x, at(P, kEmbNormW, -1), at(P, kEmbNormB, -1), N, C, d.norm_eps);
    return x;
  }

  Vec attention(const Vec& qkv, const Batch& bt) const {
    const int B = bt.B, T = bt.T, NH = d.n_head, NKV = d.n_kv_head, hs = d.head_dim(), W = d.qkv_dim();
    const int AY = NH * hs;
    Vec y((size_t)B * T * AY, 0.0);
    for (int b = 0; b < B; b++)
      for (int h = 0; h < NH; h++) {
        const int g = h / (NH / NKV);
        for (int i = 0; i < T; i++) {
          const double* q = &qkv[((size_t)b * T + i) * W + (size_t)h * hs];
          std::vector<double> sc(T, 0.0);
          std::vector<bool> ok(T, false);
          double mx = -1e300, z = 0;
          for (int j = 0; j < T; j++) {
            ok[j] = !(d.causal && j > i) && !(bt.attn_mask && bt.attn_mask[b * T + j] == 0);
            if (!ok[j]) continue;
            const double* k = &qkv[((size_t)b * T + j) * W + AY + (size_t)g * hs];
            double s = 0;
            for (int e = 0; e < hs; e++) s += q[e] * k[e];
            sc[j] = s / std::sqrt((double)hs);
            mx = std::max(mx, sc[j]);
          }
          for (int j = 0; j < T; j++)
            if (ok[j]) z += (sc[j] = std::exp(sc[j] - mx));
          for (int j = 0; j < T; j++) {
            if (!ok[j]) continue;
            const double* v = &qkv[((size_t)b * T + j) * W + AY + (size_t)NKV * hs + (size_t)g * hs];
            for (int e = 0; e < hs; e++) y[((size_t)b * T + i) * AY + (size_t)h * hs + e] += sc[j] / z * v[e];
          }
        }
      }
    return y;
  }

  void blocks(const Vec& P, Vec& x, const Batch& bt) const {
    const int C = d.d_model, N = bt.B * bt.T, F = d.ffn_dim, W = d.qkv_dim(), AY = d.n_head * d.head_dim();
    const int last = l1 < 0 ? d.n_layer : l1;
    for (int l = l0; l < last; l++) {
      auto mlp = [&](const Vec& h) {
        Vec f = linear(h, at(P, kFcW, l), at(P, kFcB, l), N, C, d.fc_dim());
        Vec a((size_t)N * F);
        for (int n = 0; n < N; n++)
          for (int k = 0; k < F; k++) {
            double u = f[(size_t)n * d.fc_dim() + k];
            if (d.mlp == MlpKind::gelu_tanh) {
              a[(size_t)n * F + k] = 0.5 * u * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
            } else if (d.mlp == MlpKind::gelu_erf) {
              a[(size_t)n * F + k] = 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
            } else {
              const double up = f[(size_t)n * d.fc_dim() + F + k];
              a[(size_t)n * F + k] = u / (1.0 + std::exp(-u)) * up;
            }
          }
        return linear(a, at(P, kProjW, l), at(P, kProjB, l), N, F, C);
      };
      auto attn = [&](const Vec& h) {
        Vec qkv = linear(h, at(P, kQkvW, l), at(P, kQkvB, l), N, C, W);
        if (!d.learned_positions) {
          rope(qkv, bt.B, bt.T, d.n_head, 0, W);
          rope(qkv, bt.B, bt.T, d.n_kv_head, AY, W);
        }
        return linear(attention(qkv, bt), at(P, kAttnOutW, l), at(P, kAttnOutB, l), N, AY, C);
      };
      if (d.pre_norm) {
        Vec a = attn(norm(x, at(P, kNorm1W, l), at(P, kNorm1B, l), N));
        for (size_t k = 0; k < x.size(); k++) x[k] += a[k];
        Vec m = mlp(norm(x, at(P, kNorm2W, l), at(P, kNorm2B, l), N));
        for (size_t k = 0; k < x.size(); k++) x[k] += m[k];
      } else {
        Vec a = attn(x);
        for (size_t k = 0; k < x.size(); k++) x[k] += a[k];
        x = norm(x, at(P, kNorm1W, l), at(P, kNorm1B, l), N);
        Vec m = mlp(x);
        for (size_t k = 0; k < x.size(); k++) x[k] += m[k];
        x = norm(x, at(P, kNorm2W, l), at(P, kNorm2B, l), N);
      }
    }
  }

  static double xent(const Vec& logits, int row, int K, int target) {
    double mx = -1e300, z = 0;
    for (int v = 0; v < K; v++) mx = std::max(mx, logits[(size_t)row * K + v]);
    for (int v = 0; v < K; v++) z += std::exp(logits[(size_t)row * K + v] - mx);
    return -(logits[(size_t)row * K + target] - mx - std::log(z));
  }

  double head(const Vec& P, const Vec& x, const Batch& bt) const {
    const int C = d.d_model, N = bt.B * bt.T;
    double total = 0;
    if (d.head == HeadKind::lm) {
      Vec xf = d.final_norm ? norm(x, at(P, kFinalNormW, -1), at(P, kFinalNormB, -1), N) : x;
      const double* Wout = d.tie_embeddings ? at(P, kTokEmb, -1) : at(P, kLmHead, -1);
      Vec logits = linear(xf, Wout, nullptr, N, C, d.vocab_size);
      for (int n = 0; n < N; n++) total += xent(logits, n, d.vocab_size, bt.targets[n]);
      return total / N;
    }
    Vec cls((size_t)bt.B * C);
    for (int b = 0; b < bt.B; b++)
      for (int c = 0; c < C; c++) cls[(size_t)b * C + c] = x[(size_t)b * bt.T * C + c];
    Vec pooled = linear(cls, at(P, kPoolerW, -1), at(P, kPoolerB, -1), bt.B, C, C);
    for (auto& v : pooled) v = std::tanh(v);
    Vec logits = linear(pooled, at(P, kClsW, -1), at(P, kClsB, -1), bt.B, C, d.num_labels);
    for (int b = 0; b < bt.B; b++) total += xent(logits, b, d.num_labels, bt.labels[b]);
    return total / bt.B;
  }

  double loss(const Vec& P, const Batch& bt) const {
    Vec x = embed(P, bt);
    blocks(P, x, bt);
    return head(P, x, bt);
  }

  // The mean over the rows of the largest magnitude of a logit's sum, max_j (|b_j| + Σ_c |x_c W_jc|):
  // how far a logit's rounding (gamma of it) can move a row's loss lse(z) − z_y (twice it, at most).
  double logit_magnitude(const Vec& P, const Batch& bt) const {
    Vec x = embed(P, bt);
    blocks(P, x, bt);
    const int C = d.d_model;
    auto most = [&](const Vec& in, int rows, const double* W, const double* b, int K) {
      double total = 0;
      for (int n = 0; n < rows; n++) {
        double m = 0;
        for (int k = 0; k < K; k++) {
          double acc = b ? std::fabs(b[k]) : 0.0;
          for (int c = 0; c < C; c++) acc += std::fabs(in[(size_t)n * C + c] * W[(size_t)k * C + c]);
          m = std::max(m, acc);
        }
        total += m;
      }
      return total / rows;
    };
    if (d.head == HeadKind::lm) {
      const int N = bt.B * bt.T;
      Vec xf = d.final_norm ? norm(x, at(P, kFinalNormW, -1), at(P, kFinalNormB, -1), N) : x;
      return most(xf, N, d.tie_embeddings ? at(P, kTokEmb, -1) : at(P, kLmHead, -1), nullptr, d.vocab_size);
    }
    Vec cls((size_t)bt.B * C);
    for (int b = 0; b < bt.B; b++)
      for (int c = 0; c < C; c++) cls[(size_t)b * C + c] = x[(size_t)b * bt.T * C + c];
    Vec pooled = linear(cls, at(P, kPoolerW, -1), at(P, kPoolerB, -1), bt.B, C, C);
    for (auto& v : pooled) v = std::tanh(v);
    return most(pooled, bt.B, at(P, kClsW, -1), at(P, kClsB, -1), d.num_labels);
  }
};

// A model's loss against the exact one: the loss is a mean of lse(z) − z_y over the rows, each
// logit a sum within gamma_K of its magnitude M (logit_magnitude; K the step's longest sum, the
// rounding of the layers below passed on), moving a row's loss by at most 2 gamma_K M, and the
// cross-entropy's own sums within gamma_K of the loss.
inline double loss_bound(double loss, double M, double K) { return gamma_n(K) * (std::fabs(loss) + 2.0 * M); }

// Central differences of a whole model's loss f(P) in every parameter, with an error estimate
// (the gradient tests of test_model.cpp, test_model_families.cpp). With D_h the difference at step
// h, D_h = f' + h² f‴/6 + O(h⁴), so D_h's truncation is about (D_2h − D_h)/3 (Richardson): an
// estimate from f itself, where no bound on f‴ is at hand. Each difference's roundoff is within
// u F / h (D_2h's half that), u = 2^-53, F the loss's double evaluation's error over u: the fp32
// model's loss_bound over 2^-24 (the same operations); and the step's own rounding as in fd_grad.
struct ModelFd {
  std::vector<double> g, err;
};
inline ModelFd model_fd(const std::function<double(const std::vector<double>&)>& f, std::vector<double> P, double F,
                        double h = 1e-5) {
  ModelFd r;
  for (size_t k = 0; k < P.size(); k++) {
    const double orig = P[k];
    auto at = [&](double dx) {
      P[k] = orig + dx;
      const double v = f(P);
      P[k] = orig;
      return v;
    };
    const double d1 = (at(h) - at(-h)) / (2 * h), d2 = (at(2 * h) - at(-2 * h)) / (4 * h);
    r.g.push_back(d1);
    r.err.push_back(std::fabs(d2 - d1) / 3 + 1.5 * kUnitFp64 * F / h +
                    kUnitFp64 * (std::fabs(orig) + h) / h * std::fabs(d1));
  }
  return r;
}


// ---- norms and GELU with their rounding bound (grad_check.h Err) ----------------------------------------

// layernorm_forward (backend/cpu/layernorm.cpp; the CUDA kernel computes the same): mean = Σx / C,
// d = x − mean, var = Σd² / C, rstd = 1/√(var + eps), out = d rstd w + b. The variance's bound is
// the two-pass one: every d carries the mean's error δ, but Σ(x − mean) = 0 lets δ into Σd² only
// as C δ², beside each d's own rounding ε and the sum's: a row with a large mean keeps an accurate
// rstd (what the two passes are for; E[x²] − mean² would not).
struct NormErr {
  std::vector<Err> out, mean, rstd;
};
inline NormErr layernorm_err(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                             int N, int C, float eps) {
  NormErr r;
  std::vector<Err> xs(C);
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) xs[c] = Err(x[(size_t)n * C + c]);
    const Err m = sum(xs) / Err(C);
    double V = 0.0, E1 = C * m.e * m.e;
    std::vector<Err> d(C);
    for (int c = 0; c < C; c++) {
      d[c] = xs[c] - m;
      const double y = x[(size_t)n * C + c] - m.v, eps_c = kUnitFp32 * (std::fabs(y) + m.e);
      V += y * y;
      E1 += (2.0 * std::fabs(y) + 2.0 * m.e + eps_c) * eps_c;
    }
    const Err var{V, E1 + gamma_n(C) * (V + E1)};
    const Err rs = Err(1.0) / sqrt(var / Err(C) + Err(eps));
    for (int c = 0; c < C; c++) r.out.push_back(d[c] * rs * Err(w[c]) + Err(b[c]));
    r.mean.push_back(m);
    r.rstd.push_back(rs);
  }
  return r;
}

// rmsnorm_forward: rstd = 1/√(Σx²/C + eps), out = x rstd w (no cancellation anywhere).
inline NormErr rmsnorm_err(const std::vector<float>& x, const std::vector<float>& w, int N, int C, float eps) {
  NormErr r;
  std::vector<Err> sq(C);
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) sq[c] = Err(x[(size_t)n * C + c]) * Err(x[(size_t)n * C + c]);
    const Err rs = Err(1.0) / sqrt(sum(sq) / Err(C) + Err(eps));
    for (int c = 0; c < C; c++) r.out.push_back(Err(x[(size_t)n * C + c]) * rs * Err(w[c]));
    r.rstd.push_back(rs);
  }
  return r;
}

inline Err err_abs(const Err& a) { return {std::fabs(a.v), a.e}; }

// The tanh GELU's exp: cpu::fast_expf, or CUDA's expf (cuda: at most 2 ulp, 4u; no flush to 0).
inline Err gelu_exp(const Err& a, bool cuda) { return cuda ? exp(a, 4 * kUnitFp32) : fast_exp(a); }

// gelu_tanh_value (backend/cpu/activations.cpp; kernels/gelu.cu the same with expf):
// a = (2 kK)(x + kA x³), e = exp(−|a|), s = (a ≥ 0 ? 1 : e) / (1 + e), x s (kK, kA the floats of
// √(2/π) and 0.044715).
inline Err gelu_tanh_err(float xf, bool cuda = false) {
  const Err kK = constant(0.7978845608028654), kA = constant(0.044715);
  const Err x(xf), a = Err(2.0) * kK * (x + kA * x * x * x);
  const Err e = gelu_exp(-err_abs(a), cuda);
  return x * ((a.v >= 0.0 ? Err(1.0) : e) / (Err(1.0) + e));
}

// gelu_tanh_grad: s + 2 x s(1 − s) kK (1 + 3 kA x²), with s(1 − s) = e r², r = 1 / (1 + e).
inline Err gelu_tanh_grad_err(float xf, bool cuda = false) {
  const Err kK = constant(0.7978845608028654), kA = constant(0.044715);
  const Err x(xf), x2 = x * x, a = Err(2.0) * kK * (x + kA * x2 * x);
  const Err e = gelu_exp(-err_abs(a), cuda), r = Err(1.0) / (Err(1.0) + e);
  const Err s = (a.v >= 0.0 ? Err(1.0) : e) * r, ss = e * r * r;
  return s + Err(2.0) * x * ss * kK * (Err(1.0) + Err(3.0) * kA * x2);
}

// ---- the attention ops with their rounding bound --------------------------------------------------------

// One call of attention_forward/backward (fused: flash_attention_forward/backward) in fp32.
struct AttentionCall {
  int B, T, NH, NKV, hs;
  bool causal;
  const int32_t* mask;  // [B, T] or null
  float p;              // attention-probability dropout
  uint64_t key;
  bool fused;
  int W() const { return (NH + 2 * NKV) * hs; }
  bool visible(int b, int i, int j) const {
    return !(causal && j > i) && (mask == nullptr || mask[static_cast<size_t>(b) * T + j] != 0);
  }
};

// The exact results of one call and the bound on the op's rounding of each (grad_check.h Err):
// out [B, T, NH hs], P [B, NH, T, T] (zero where invisible), lse [B, NH, T] (-inf for a row with no
// visible key) and dqkv (dqkv0 plus the gradient; empty without dout). Built operation by operation
// as backend/cpu/attention.cpp computes: S = (1/√hs) Q K^T, P = exp(S − max) / Σ (fast_expf; the max
// enters exactly, softmax not depending on it), P~ = P keep / (1 − p), out = P~ V; backward
// dP~ = dO V^T, dS = P (dP − Σ P dP) (full; with dropout P~ dP~ − P Σ P~ dP~) or P~ dP~ − P D with
// P = exp(S − lse), D = dO · out (fused); dQ += (1/√hs) dS K, dK += (1/√hs) dS^T Q, dV += P~^T dO,
// K's and V's over the group's query heads and every row block. Every GEMM is a sum in some order
// of its products, each scaled by alpha and rounded (a kernel scaling the sum instead rounds no
// more), with the output as one more term where it accumulates (beta = 1).
struct AttentionErr {
  std::vector<Err> out, P, lse, dqkv;
};

inline AttentionErr attention_err(const AttentionCall& c, const std::vector<float>& qkv,
                                  const std::vector<float>& dout = {}, const std::vector<float>& dqkv0 = {}) {
  const int T = c.T, W = c.W(), C = c.NH * c.hs, hs = c.hs, G = c.NH / c.NKV;
  const Err sc = Err(1.0) / sqrt(Err(static_cast<double>(hs)));  // 1.0f / sqrt(float(hs))
  const Err inv_keep = c.p > 0.0f ? Err(1.0) / (Err(1.0) - Err(c.p)) : Err(1.0);
  AttentionErr r;
  r.out.assign(static_cast<size_t>(c.B) * T * C, Err(0.0));
  r.P.assign(static_cast<size_t>(c.B) * c.NH * T * T, Err(0.0));
  r.lse.assign(static_cast<size_t>(c.B) * c.NH * T, Err(-INFINITY));
  const bool backward = !dout.empty();
  // dqkv's terms, gathered per element: their Sum bounds any order the GEMMs add them in
  std::vector<Sum> terms(backward ? qkv.size() : 0);
  for (size_t e = 0; e < terms.size(); e++) terms[e].add(Err(dqkv0[e]));
  auto at = [&](int b, int t, int col) { return Err(qkv[(static_cast<size_t>(b) * T + t) * W + col]); };
  auto dropped = [&](const Err& p, uint64_t e) {
    if (c.p == 0.0f) return p;
    return dropout_keep(c.key, e, c.p) ? p * inv_keep : Err(0.0);
  };
  std::vector<Err> S(T), P(T), Pt(T), dP(T), dS(T);
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.NH; h++) {
      const int g = h / G, qc = h * hs, kc = (c.NH + g) * hs, vc = (c.NH + c.NKV + g) * hs;
      for (int i = 0; i < T; i++) {
        const size_t row = (static_cast<size_t>(b) * c.NH + h) * T + i;
        double mx = -INFINITY;
        for (int j = 0; j < T; j++) {
          S[j] = Err(0.0);
          if (!c.visible(b, i, j)) continue;
          Sum qk;
          for (int d = 0; d < hs; d++) qk.add(sc * at(b, i, qc + d) * at(b, j, kc + d));
          S[j] = qk.result();
          mx = std::max(mx, S[j].v);
        }
        if (mx == -INFINITY) continue;  // no visible key: P = 0, out = 0, lse = -inf, no gradient (exact)
        Sum ex;
        for (int j = 0; j < T; j++) {
          P[j] = Err(0.0);
          if (c.visible(b, i, j)) ex.add(P[j] = fast_exp(S[j] - Err(mx)));
        }
        const Err s = ex.result(), inv = Err(1.0) / s;
        r.lse[row] = Err(mx) + log(s, kLogfRel);
        for (int j = 0; j < T; j++) {
          if (c.visible(b, i, j)) P[j] = P[j] * inv;
          Pt[j] = dropped(P[j], row * T + j);
          r.P[row * T + j] = P[j];
        }
        const size_t orow = (static_cast<size_t>(b) * T + i) * C + qc;
        for (int d = 0; d < hs; d++) {
          Sum pv;
          for (int j = 0; j < T; j++)
            if (c.visible(b, i, j)) pv.add(Pt[j] * at(b, j, vc + d));
          r.out[orow + d] = pv.result();
        }
        if (!backward) continue;
        if (c.fused)  // the backward's P: recomputed from S and the stored lse
          for (int j = 0; j < T; j++)
            if (c.visible(b, i, j)) {
              P[j] = fast_exp(S[j] - r.lse[row]);
              Pt[j] = dropped(P[j], row * T + j);
            }
        const float* dO = &dout[(static_cast<size_t>(b) * T + i) * C + qc];
        Sum dots;
        for (int j = 0; j < T; j++) {
          dP[j] = Err(0.0);
          if (!c.visible(b, i, j)) continue;
          Sum dv;
          for (int d = 0; d < hs; d++) dv.add(Err(dO[d]) * at(b, j, vc + d));
          dP[j] = dv.result();
          dots.add(dP[j] * Pt[j]);
        }
        Err D;
        if (c.fused) {
          Sum od;
          for (int d = 0; d < hs; d++) od.add(Err(dO[d]) * r.out[orow + d]);
          D = od.result();
        } else {
          D = dots.result();
        }
        for (int j = 0; j < T; j++) {
          dS[j] = Err(0.0);
          if (!c.visible(b, i, j)) continue;
          dS[j] = c.fused || c.p > 0.0f ? Pt[j] * dP[j] - P[j] * D : P[j] * (dP[j] - D);
        }
        const size_t qrow = (static_cast<size_t>(b) * T + i) * W;
        for (int j = 0; j < T; j++) {
          if (!c.visible(b, i, j)) continue;
          const size_t krow = (static_cast<size_t>(b) * T + j) * W;
          for (int d = 0; d < hs; d++) {
            terms[qrow + qc + d].add(sc * dS[j] * at(b, j, kc + d));
            terms[krow + kc + d].add(sc * dS[j] * at(b, i, qc + d));
            terms[krow + vc + d].add(Pt[j] * Err(dO[d]));
          }
        }
      }
    }
  if (backward) {
    r.dqkv.resize(qkv.size());
    for (size_t e = 0; e < qkv.size(); e++) r.dqkv[e] = terms[e].result();
  }
  return r;
}

// fd_grad's third for f(qkv) = Σ dout · out of one attention call, per qkv element (grad_check.h
// fd_grad). Row i's part of f is E_P[c] = Σ_j P_ij c_j, c_j = d_ij dO_i · v_j (d_ij = keep/(1 − p)),
// a softmax-weighted mean. Along q_id every score of the row moves by a_j = sc k_jd: the third
// derivative of a softmax mean along such a direction is a joint cumulant of c and a, at most
// 4 R_c R_a³ (R: ranges over the visible keys). Along k_jd only S_ij moves, by sc q_id, and E_P[c]
// = C' + σ(S_ij − λ)(c_j − C') with σ the logistic function, whose third derivative is at most
// σ(1 − σ) ≤ P_ij: at most P_ij R_c (sc q_id)³, summed over the rows and query heads that see key j.
// v enters linearly: 0.
inline std::vector<double> attention_third(const AttentionCall& c, const std::vector<float>& qkv,
                                           const std::vector<float>& dout, const std::vector<Err>& P) {
  const int T = c.T, W = c.W(), C = c.NH * c.hs, hs = c.hs, G = c.NH / c.NKV;
  const double sc = 1.0 / std::sqrt(static_cast<double>(hs)), inv_keep = 1.0 / (1.0 - c.p);
  std::vector<double> m3(qkv.size(), 0.0);
  auto at = [&](int b, int t, int col) {
    return static_cast<double>(qkv[(static_cast<size_t>(b) * T + t) * W + col]);
  };
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.NH; h++) {
      const int g = h / G, qc = h * hs, kc = (c.NH + g) * hs, vc = (c.NH + c.NKV + g) * hs;
      for (int i = 0; i < T; i++) {
        const size_t row = (static_cast<size_t>(b) * c.NH + h) * T + i;
        double cmin = INFINITY, cmax = -INFINITY;
        for (int j = 0; j < T; j++) {
          if (!c.visible(b, i, j)) continue;
          double cj = 0.0;
          for (int d = 0; d < hs; d++) cj += dout[(static_cast<size_t>(b) * T + i) * C + qc + d] * at(b, j, vc + d);
          if (c.p > 0.0f) cj *= dropout_keep(c.key, row * T + j, c.p) ? inv_keep : 0.0;
          cmin = std::min(cmin, cj), cmax = std::max(cmax, cj);
        }
        if (cmin > cmax) continue;  // no visible key
        const double Rc = cmax - cmin;
        for (int d = 0; d < hs; d++) {
          double amin = INFINITY, amax = -INFINITY;
          for (int j = 0; j < T; j++)
            if (c.visible(b, i, j)) amin = std::min(amin, at(b, j, kc + d)), amax = std::max(amax, at(b, j, kc + d));
          const double Ra = sc * (amax - amin), a = sc * std::fabs(at(b, i, qc + d));
          m3[(static_cast<size_t>(b) * T + i) * W + qc + d] += 4.0 * Rc * Ra * Ra * Ra;
          for (int j = 0; j < T; j++)
            if (c.visible(b, i, j)) m3[(static_cast<size_t>(b) * T + j) * W + kc + d] += P[row * T + j].v * Rc * a * a * a;
        }
      }
    }
  return m3;
}

// The longest sum one training step of the model on B x T tokens takes, forward or backward: over
// the rows (a weight's gradient), the head's outputs (the vocabulary, or the labels), the width, a
// dense layer's inputs or outputs, a head's size, the keys (every query head of a group, for a
// key's gradient). Two computations of a step that sum in other orders give each gradient within
// about 2 gamma_K of the magnitude of what it sums (gradient_magnitude), the rounding of each sum
// passing on through the layers after it (docs/TESTING.md "Tolerances").
inline double longest_sum(const ModelDesc& d, int B, int T) {
  const double G = static_cast<double>(d.n_head) / d.n_kv_head;
  return std::max({static_cast<double>(B) * T, static_cast<double>(d.head == HeadKind::lm ? d.vocab_size : d.num_labels),
                   static_cast<double>(d.d_model), static_cast<double>(d.qkv_dim()), static_cast<double>(d.fc_dim()),
                   static_cast<double>(d.ffn_dim), static_cast<double>(d.head_dim()), G * T});
}

// The magnitude gradients_within holds tensor s to: its own, or for BERT's key bias its layer's
// query bias's (below).
inline size_t magnitude_offset(const ParamTable& t, const ParamSlice& s) {
  const size_t kb = s.name.find("key.bias");
  return kb == std::string::npos ? s.offset : t.at(s.name.substr(0, kb) + "query.bias").offset;
}

// Every tensor of table t: ‖a − b‖ within bound ‖mag‖ over the tensor (rel_to_magnitude). BERT's
// key bias has a gradient of 0 in exact arithmetic (softmax ignores a shift common to all of a
// row's scores), so both sides hold only the rounding of the sum of the rows' key gradients; the
// query bias's gradient sums the rows' query gradients, dS K against dS^T Q (the same scores'
// gradients, against keys or queries of the same size): the key bias is held to its layer's
// query-bias magnitude.
inline ::testing::AssertionResult gradients_within(const ParamTable& t, const std::vector<float>& a,
                                                   const std::vector<float>& b, const std::vector<double>& mag,
                                                   double bound, const std::string& what = "") {
  std::string failed;
  double worst = 0.0;
  for (const ParamSlice& s : t.slices) {
    const double r =
        rel_to_magnitude(a.data() + s.offset, b.data() + s.offset, mag.data() + magnitude_offset(t, s), s.numel);
    worst = std::max(worst, r);
    if (!(r <= bound)) failed += " " + s.name + " (" + std::to_string(r) + ")";
  }
  if (std::getenv("LLMPI_PRINT_BOUNDS") != nullptr)
    std::printf("  bound %-60s %zu tensors, worst |error| / bound %.4g\n", what.c_str(), t.slices.size(),
                worst / bound);
  if (failed.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": beyond " << bound << " of their magnitude:" << failed;
}

}  // namespace llmpi::test
