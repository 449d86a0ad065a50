// A double-precision reference of the transformer of model/transformer.h, written straight from
// the definitions (no ops table, no fused buffers beyond what the table lays out), for whole-model
// gradient checks by finite differences. Parameters are read by role from the model's own table.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer.h"

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
};

}  // namespace llmpi::test
