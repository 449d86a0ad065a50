// Whole-model checks of the GPT-2 family on the CPU backend (the per-family checks of llama and
// bert, and of gpt2 through the shared reference, are in test_model_families.cpp):
//  - the float forward loss equals a plain double-precision reference forward (within the
//    rounding bound test_model_families.cpp holds it to),
//  - EVERY parameter's analytic gradient equals central finite differences of that reference (as
//    there: within gamma_K of the magnitudes, plus the differences' error estimate),
//  - loss at initialisation is within 0.1 of ln(vocab),
//  - a tiny model overfits one batch to a loss below 0.1,
//  - grads_ready() reports prefixes in order and ends at the whole buffer,
//  - the parameter table finds each of many tensors by name, and refuses absurd layer counts.
#include <gtest/gtest.h>

#include <cmath>

#include "model/transformer.h"
#include "model_test_util.h"
#include "ref_transformer.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/rng.h"

using namespace llmpi;

namespace {

// ---- double-precision reference forward, straight from the definitions ----
struct Ref {
  const ModelDesc& s;
  const ParamTable& t;
  const std::vector<double>& P;
  const double* at(const std::string& n) const { return P.data() + t.at(n).offset; }

  static std::vector<double> layernorm(const std::vector<double>& x, const double* w, const double* b, int N, int C) {
    std::vector<double> y(x.size());
    for (int n = 0; n < N; n++) {
      double m = 0, v = 0;
      for (int c = 0; c < C; c++) m += x[n * C + c];
      m /= C;
      for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
      v /= C;
      for (int c = 0; c < C; c++) y[n * C + c] = (x[n * C + c] - m) / std::sqrt(v + 1e-5) * w[c] + b[c];
    }
    return y;
  }
  static std::vector<double> linear(const std::vector<double>& x, const double* W, const double* b, int N, int in, int out) {
    std::vector<double> y((size_t)N * out);
    for (int n = 0; n < N; n++)
      for (int o = 0; o < out; o++) {
        double acc = b ? b[o] : 0.0;
        for (int i = 0; i < in; i++) acc += x[(size_t)n * in + i] * W[(size_t)o * in + i];
        y[(size_t)n * out + o] = acc;
      }
    return y;
  }

  double loss(const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B, int T) const {
    const int C = s.d_model, NH = s.n_head, hs = C / NH, V = s.vocab_size, N = B * T;
    std::vector<double> x((size_t)N * C);
    const double *wte = at("wte.weight"), *wpe = at("wpe.weight");
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) x[(b * T + t) * C + c] = wte[in[b * T + t] * C + c] + wpe[t * C + c];
    for (int l = 0; l < s.n_layer; l++) {
      std::string h = "h." + std::to_string(l) + ".";
      auto a = layernorm(x, at(h + "ln_1.weight"), at(h + "ln_1.bias"), N, C);
      auto qkv = linear(a, at(h + "attn.c_attn.weight"), at(h + "attn.c_attn.bias"), N, C, 3 * C);
      std::vector<double> y((size_t)N * C, 0.0);
      for (int b = 0; b < B; b++)
        for (int hd = 0; hd < NH; hd++)
          for (int i = 0; i < T; i++) {
            const double* q = &qkv[(b * T + i) * 3 * C + hd * hs];
            std::vector<double> sc(i + 1);
            double mx = -1e300, z = 0;
            for (int j = 0; j <= i; j++) {
              const double* k = &qkv[(b * T + j) * 3 * C + C + hd * hs];
              double d = 0;
              for (int e = 0; e < hs; e++) d += q[e] * k[e];
              sc[j] = d / std::sqrt((double)hs);
              mx = std::max(mx, sc[j]);
            }
            for (int j = 0; j <= i; j++) z += (sc[j] = std::exp(sc[j] - mx));
            for (int j = 0; j <= i; j++) {
              const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + hd * hs];
              for (int e = 0; e < hs; e++) y[(b * T + i) * C + hd * hs + e] += sc[j] / z * v[e];
            }
          }
      auto pr = linear(y, at(h + "attn.c_proj.weight"), at(h + "attn.c_proj.bias"), N, C, C);
      for (size_t k = 0; k < x.size(); k++) x[k] += pr[k];
      auto a2 = layernorm(x, at(h + "ln_2.weight"), at(h + "ln_2.bias"), N, C);
      auto f = linear(a2, at(h + "mlp.c_fc.weight"), at(h + "mlp.c_fc.bias"), N, C, 4 * C);
      for (auto& u : f) u = 0.5 * u * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
      auto p2 = linear(f, at(h + "mlp.c_proj.weight"), at(h + "mlp.c_proj.bias"), N, 4 * C, C);
      for (size_t k = 0; k < x.size(); k++) x[k] += p2[k];
    }
    auto xf = layernorm(x, at("ln_f.weight"), at("ln_f.bias"), N, C);
    auto logits = linear(xf, wte, nullptr, N, C, V);
    double total = 0;
    for (int n = 0; n < N; n++) {
      double mx = -1e300, z = 0;
      for (int v = 0; v < V; v++) mx = std::max(mx, logits[n * V + v]);
      for (int v = 0; v < V; v++) z += std::exp(logits[n * V + v] - mx);
      total += -(logits[n * V + tg[n]] - mx - std::log(z));
    }
    return total / N;
  }
};

void random_batch(std::vector<int32_t>& in, std::vector<int32_t>& tg, int B, int T, int V, uint64_t seed) {
  Rng rng(seed);
  in.resize(B * T);
  tg.resize(B * T);
  for (auto& x : in) x = (int32_t)rng.below(V);
  for (auto& x : tg) x = (int32_t)rng.below(V);
}

// The GPT-2 model of the given shape (n_layer, n_head, d_model, max_seq_len, vocab).
ModelDesc shape(int L, int NH, int C, int T, int V) { return test::desc_of("gpt2", L, NH, C, T, V); }

Batch lm_batch(const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B, int T) {
  Batch b;
  b.B = B;
  b.T = T;
  b.tokens = in.data();
  b.targets = tg.data();
  return b;
}

}  // namespace

TEST(Gpt2Model, ParamTableIsBackwardOrderAndComplete) {
  ModelDesc s = shape(3, 2, 8, 6, 11);
  ParamTable t = build_param_table(s);
  EXPECT_EQ(t.slices.front().name, "ln_f.weight");
  EXPECT_EQ(t.slices.back().name, "wte.weight");
  EXPECT_LT(t.at("h.2.ln_1.bias").offset, t.at("h.1.mlp.c_proj.weight").offset);
  size_t off = 0;
  for (auto& sl : t.slices) {
    EXPECT_EQ(sl.offset, off) << sl.name;
    off += sl.numel;
  }
  EXPECT_EQ(off, t.numel);
  const size_t C = 8;
  EXPECT_EQ(t.numel, 2 * C + 3 * (12 * C * C + 13 * C) + 6 * C + 11 * C);
}

// The table's index from name to tensor: 20,000 layers' worth of GPT-2's block tensors (twelve a
// block), each found by name at its own place and offset; an unknown name is not found; a name
// given twice is refused and leaves the table as it was; a copy finds its own slices.
TEST(ParamTable, ManyTensorsAreFoundByName) {
  const int layers = 20000;
  ParamTable t;
  std::vector<std::string> names;
  for (int l = 0; l < layers; l++)
    for (int role = kNorm1W; role <= kProjB; role++)
      for (const std::string& n : family_tensor_names(Family::gpt2, role, l)) {
        ParamSlice s;
        s.name = n;
        s.shape = {1 + static_cast<int>(names.size() % 5)};
        s.layer = l;
        s.role = role;
        t.add(std::move(s));
        names.push_back(n);
      }
  ASSERT_EQ(t.slices.size(), size_t(layers) * 12);
  size_t off = 0;
  for (size_t i = 0; i < names.size(); i++) {
    const ParamSlice* s = t.find(names[i]);
    ASSERT_EQ(s, &t.slices[i]) << names[i];
    ASSERT_EQ(&t.at(names[i]), s);
    EXPECT_EQ(s->offset, off) << names[i];
    off += s->numel;
  }
  EXPECT_EQ(t.numel, off);
  EXPECT_EQ(t.at("h.19999.mlp.c_proj.weight").layer, 19999);
  EXPECT_EQ(t.at("h.0.ln_1.weight").offset, 0u);
  EXPECT_EQ(t.find("h.20000.ln_1.weight"), nullptr);
  EXPECT_EQ(t.find("wte.weight"), nullptr);
  EXPECT_THROW(t.at("h.20000.ln_1.weight"), Error);
  ParamSlice dup;
  dup.name = "h.123.attn.c_attn.bias";
  dup.shape = {3};
  try {
    t.add(dup);
    ADD_FAILURE() << "a name given twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'h.123.attn.c_attn.bias' appears twice"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(t.slices.size(), names.size());
  EXPECT_EQ(t.numel, off);
  const ParamTable copy = t;
  EXPECT_EQ(copy.find(names[7]), &copy.slices[7]);
}

// A model's layer count is checked before its table is built: kMaxLayers layers are built (in time
// linear in their tensors), one more is refused naming the key and the limit, and so is 2e9 at once.
TEST(ParamTable, AbsurdLayerCountsAreRefusedBeforeBuilding) {
  ModelDesc s = shape(3, 2, 8, 6, 11);
  s.n_layer = kMaxLayers;
  const ParamTable t = build_param_table(s);
  EXPECT_EQ(t.slices.size(), size_t(12) * kMaxLayers + 4);  // + ln_f's weight and bias, wpe, wte
  EXPECT_EQ(t.at("h.9999.ln_1.weight").layer, 9999);
  for (const int n : {kMaxLayers + 1, 2000000000}) {
    s.n_layer = n;
    try {
      build_param_table(s);
      ADD_FAILURE() << n << " layers were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'model.n_layer' " + std::string(n == 2000000000 ? "2,000,000,000" : "10,001") +
                                           " is more than 10,000, the most transformer blocks"),
                std::string::npos)
          << e.what();
    }
  }
  try {
    test::desc_of("gpt2", 2000000000, 2, 8, 6, 11);
    ADD_FAILURE() << "model.n_layer 2e9 was configured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.n_layer' must be in 1..10000"), std::string::npos) << e.what();
  }
}

TEST(Gpt2Model, EveryGradientMatchesFiniteDifferences) {
  ModelDesc s = shape(2, 2, 8, 6, 11);
  s.init_std = 0.3;  // large init so every path carries signal
  const int B = 2, T = 6;
  Model m(s, cpu_ops());
  Activations acts(m, B, T);
  m.init_params(3);
  // Randomise biases and LayerNorm parameters too, so their gradients are exercised off 0/1.
  Rng rng(11);
  for (size_t i = 0; i < m.table.numel; i++) m.params[i] += (float)(0.1 * rng.normal());
  std::vector<int32_t> in, tg;
  random_batch(in, tg, B, T, s.vocab_size, 5);

  m.zero_grads();
  float loss = m.forward(acts, lm_batch(in, tg, B, T), HeadMode::train);
  m.backward(acts);

  const std::vector<float> grads = m.grads_host();
  std::vector<double> P(m.params, m.params + m.table.numel);
  Ref ref{s, m.table, P};
  const double ref_loss = ref.loss(in, tg, B, T), K = test::longest_sum(s, B, T);
  // Bound: the loss within gamma_K of the magnitudes of what it sums (test::loss_bound; the
  // logits' magnitude from the shared reference, the same model).
  const Batch batch = lm_batch(in, tg, B, T);
  const double lb = test::loss_bound(ref_loss, test::RefTransformer{s, m.table}.logit_magnitude(P, batch), K);
  EXPECT_LE(std::fabs(loss - ref_loss), lb) << loss << " vs " << ref_loss;

  // Bound: every gradient tensor within gamma_K of the magnitude of what it sums over the batch
  // (test::gradient_magnitude) of the exact gradient, the finite differences within their error
  // estimate (test::model_fd) of it.
  const std::vector<double> mag = test::gradient_magnitude(m, batch, B, T);
  std::vector<double> Q = P;  // (ref reads P: the differences perturb a copy handed in)
  const test::ModelFd fd = test::model_fd(
      [&](const std::vector<double>& p) {
        P = p;
        return ref.loss(in, tg, B, T);
      },
      Q, lb / test::kUnitFp32);
  P = Q;
  for (auto& sl : m.table.slices) {
    double err2 = 0, ref2 = 0, mag2 = 0, fd2 = 0;
    for (size_t k = sl.offset; k < sl.offset + sl.numel; k++) {
      err2 += (grads[k] - fd.g[k]) * (grads[k] - fd.g[k]);
      ref2 += fd.g[k] * fd.g[k];
      mag2 += mag[k] * mag[k];
      fd2 += fd.err[k] * fd.err[k];
    }
    ASSERT_GT(ref2, 0) << sl.name << " has an all-zero gradient";
    EXPECT_LE(std::sqrt(err2), test::gamma_n(K) * std::sqrt(mag2) + std::sqrt(fd2)) << sl.name;
  }
}

TEST(Gpt2Model, InitialLossIsLnVocab) {
  ModelDesc s = shape(2, 4, 64, 32, 512);
  Model m(s, cpu_ops());
  Activations acts(m, 4, 32);
  m.init_params(1);
  std::vector<int32_t> in, tg;
  random_batch(in, tg, 4, 32, s.vocab_size, 9);
  float loss = m.forward(acts, lm_batch(in, tg, 4, 32), HeadMode::eval);
  // Bound (of the model, not of rounding): at init a logit sums C = 64 products of N(0, 0.02²) weights
  // and unit-size normalised inputs, so its std is σ ≈ 0.02·√64 = 0.16, and the mean cross-entropy
  // of such near-zero logits is ln V + σ²/2 ± σ/√N (N = 128 rows): within 0.03 of ln V; 0.1 leaves 3x.
  EXPECT_NEAR(loss, std::log(512.0), 0.1);
}

TEST(Gpt2Model, OverfitsOneBatch) {
  ModelDesc s = shape(2, 2, 32, 16, 64);
  const int B = 2, T = 16;
  Model m(s, cpu_ops());
  Activations acts(m, B, T);
  m.init_params(2);
  std::vector<int32_t> in, tg;
  random_batch(in, tg, B, T, s.vocab_size, 4);
  std::vector<float> mom(m.table.numel, 0.f), vel(m.table.numel, 0.f);
  float first = 0, loss = 0;
  for (int it = 1; it <= 300; it++) {
    m.zero_grads();
    loss = m.forward(acts, lm_batch(in, tg, B, T), HeadMode::train);
    if (it == 1) first = loss;
    m.backward(acts);
    cpu_ops().adamw_update(m.params, m.grads, mom.data(), vel.data(), m.table.numel, 3e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, it);
  }
  // Bound: the initial loss as in InitialLossIsLnVocab (σ ≈ 0.02·√32 = 0.11 here); the last is a
  // check of learning, not of rounding: 0.1 is far below ln V (4.2) and far above any rounding.
  EXPECT_NEAR(first, std::log(64.0), 0.1);
  EXPECT_LT(loss, 0.1f) << "after 300 AdamW steps on one batch";
}

TEST(Gpt2Model, GradsReadyReportsGrowingPrefixes) {
  ModelDesc s = shape(3, 2, 8, 4, 11);
  Model m(s, cpu_ops());
  Activations acts(m, 1, 4);
  m.init_params(1);
  std::vector<int32_t> in, tg;
  random_batch(in, tg, 1, 4, s.vocab_size, 1);
  m.zero_grads();
  m.forward(acts, lm_batch(in, tg, 1, 4), HeadMode::train);
  std::vector<size_t> seen;
  m.backward(acts, [&](size_t k) { seen.push_back(k); });
  ASSERT_EQ(seen.size(), (size_t)6 * s.n_layer + 2);
  for (size_t i = 1; i < seen.size(); i++) EXPECT_GT(seen[i], seen[i - 1]);
  // ln_f first, then layer 2's groups in backward order, ..., then everything.
  EXPECT_EQ(seen[0], m.table.at("h.2.mlp.c_proj.weight").offset);
  EXPECT_EQ(seen[1], m.table.at("h.2.mlp.c_fc.weight").offset);
  EXPECT_EQ(seen[2], m.table.at("h.2.ln_2.weight").offset);
  EXPECT_EQ(seen[6], m.table.at("h.1.mlp.c_proj.weight").offset);
  EXPECT_EQ(seen[6 * s.n_layer], m.table.at("wpe.weight").offset);
  EXPECT_EQ(seen.back(), m.table.numel);
}
