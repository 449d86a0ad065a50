// Generation (model/generate.h):
//  - the KV-cache forward gives, at every position, the full forward's logits (gpt2; llama with
//    full and grouped K/V heads), fed one token at a time and in chunks (prefill);
//  - the uncached mode gives the same tokens as the cached one;
//  - greedy = top-k 1 = temperature 0; a seed reproduces a sampled sequence, another seed does not;
//  - top-k and top-p keep exactly the ids they should, and draw in proportion to the probabilities;
//  - errors: a bert model, a prompt that fills the context, ids outside the vocabulary, bad values,
//    weights that are not finite (named by tensor), logits that are not finite (named by step).
//  - greedy generation of the Hugging Face fixture models (tests/fixtures/hf/{gpt2,llama}: tiny
//    random models and transformers' greedy tokens, tools/make_hf_fixtures.py) gives exactly
//    transformers' tokens, with and without the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "hf/hf_import.h"
#include "model/generate.h"
#include "model_test_util.h"
#include "runtime/error.h"

namespace llmpi {
namespace {

using test::desc_of;

struct GenCase {
  const char* name;
  const char* family;
  int n_head;
  std::vector<std::string> extra;
};

void PrintTo(const GenCase& c, std::ostream* os) { *os << c.name; }

const GenCase kGenCases[] = {
    {"gpt2", "gpt2", 4, {"model.init_std=0.2"}},
    {"gpt2_untied", "gpt2", 2, {"model.init_std=0.2", "model.tie_embeddings=false"}},
    {"llama", "llama", 4, {"model.init_std=0.2"}},
    {"llama_gqa", "llama", 4, {"model.init_std=0.2", "model.n_kv_head=2"}},
    {"llama_mqa", "llama", 4, {"model.init_std=0.2", "model.n_kv_head=1", "model.rope_theta=500"}},
};

class Generate : public ::testing::TestWithParam<GenCase> {
 protected:
  ModelDesc desc(int L, int C, int T, int V) const {
    return desc_of(GetParam().family, L, GetParam().n_head, C, T, V, GetParam().extra);
  }
};

// The full forward's logits [T, V] of one sequence.
std::vector<float> full_logits(const Model& m, const std::vector<int32_t>& tokens) {
  const int T = static_cast<int>(tokens.size());
  std::vector<int32_t> targets(tokens.size(), 0);
  Batch b;
  b.B = 1;
  b.T = T;
  b.tokens = tokens.data();
  b.targets = targets.data();
  Activations a;
  a.all_logits = true;  // every row's logits, in contiguous rows of V
  a.allocate(m, 1, T);
  m.forward(a, b, HeadMode::eval);
  return std::vector<float>(a.logits, a.logits + static_cast<size_t>(T) * m.desc.vocab_size);
}

// max |a - b| / (1 + max |b|) over rows [r0, r1) of two [*, V] arrays.
double rel_diff(const float* a, const float* b, size_t count) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < count; i++) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return worst / (1.0 + scale);
}

// Bound for a cached or chunked forward against the full one (on rel_diff's scale): both compute
// every dot product of the model in other orders (a single row's sgemv or a GEMM of other rows,
// the cache's rows), each within gamma_K = K·u/(1 − K·u), u = 2^-24, of the exact value relative
// to the magnitude of its terms, passed on through the layers, whose norms keep it at the logits'
// scale (1 + max|logit|); the two differ by at most 2·gamma_K of it, K the longest sum: the MLP's
// channels, d_model or the attention's T positions.
double forward_bound(const ModelDesc& d) {
  const double K = std::max({d.d_model, d.ffn_dim, d.max_seq_len}), u = 0x1p-24;
  return 2 * K * u / (1 - K * u);
}

std::vector<int32_t> random_tokens(int n, int V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.below(V));
  return t;
}

TEST_P(Generate, CachedLogitsEqualFullForwardAtEveryPosition) {
  const ModelDesc d = desc(3, 32, 24, 53);
  Model m(d, cpu_ops());
  m.init_params(11);
  const int T = d.max_seq_len, V = d.vocab_size;
  const std::vector<int32_t> tokens = random_tokens(T, V, 5);
  const std::vector<float> ref = full_logits(m, tokens);
  // The logits must carry signal, or equal logits would prove nothing.
  double spread = 0;
  for (int v = 0; v < V; v++) spread = std::max(spread, std::fabs(double(ref[v] - ref[V + v])));
  ASSERT_GT(spread, 0.1);

  // One token at a time: the logits of position t from the cache equal row t of the full forward.
  Generator g(m);
  EXPECT_EQ(g.capacity(), T);
  std::vector<float> logits(V);
  for (int t = 0; t < T; t++) {
    g.feed(&tokens[t], 1, logits.data());
    EXPECT_LT(rel_diff(logits.data(), &ref[size_t(t) * V], V), forward_bound(d)) << "position " << t;
  }
  EXPECT_EQ(g.position(), T);

  // Chunks of 1, 5, 7, ... positions (prefill then more), with every row's logits.
  g.reset();
  std::vector<float> chunk(static_cast<size_t>(T) * V);
  const int sizes[] = {1, 5, 7, 2, 9};
  for (int t = 0, k = 0; t < T; t += sizes[k % 5], k++) {
    const int n = std::min(sizes[k % 5], T - t);
    g.feed(&tokens[t], n, chunk.data(), /*all_logits=*/true);
    EXPECT_LT(rel_diff(chunk.data(), &ref[size_t(t) * V], size_t(n) * V), forward_bound(d))
        << "chunk at " << t << " of " << n;
  }

  // Exact: the uncached mode runs the full forward of the whole history itself, the same
  // operations as the full forward of that prefix (a prefix's forward differs from the longer
  // one's by GEMM rounding).
  Generator full(m, 0, /*kv_cache=*/false);
  const std::vector<int32_t> p7(tokens.begin(), tokens.begin() + 7), p8(tokens.begin(), tokens.begin() + 8);
  full.feed(tokens.data(), 7, chunk.data(), true);
  EXPECT_EQ(0, std::memcmp(chunk.data(), full_logits(m, p7).data(), size_t(7) * V * sizeof(float)));
  full.feed(&tokens[7], 1, logits.data());
  EXPECT_EQ(0, std::memcmp(logits.data(), &full_logits(m, p8)[size_t(7) * V], size_t(V) * sizeof(float)));
}

TEST_P(Generate, WideLayersMatchToo) {
  // Large enough that a single row's dense layers run as blocked, threaded sgemv (generate.cpp).
  const ModelDesc d = desc(1, 256, 6, 3001);
  Model m(d, cpu_ops());
  m.init_params(2);
  const int V = d.vocab_size;
  const std::vector<int32_t> tokens = random_tokens(6, V, 9);
  const std::vector<float> ref = full_logits(m, tokens);
  Generator g(m);
  std::vector<float> logits(V);
  // Sums of 256 (d_model) and 1024 (MLP) float products: OpenBLAS's sgemv rounds differently from
  // its sgemm (measured up to 5.1e-6 on every kernel path; the bound, K = 1024: 1.2e-4). A wrong
  // position, head or cache row is > 1e-2.
  for (int t = 0; t < 6; t++) {
    g.feed(&tokens[t], 1, logits.data());
    EXPECT_LT(rel_diff(logits.data(), &ref[size_t(t) * V], V), forward_bound(d)) << "position " << t;
  }
}

TEST_P(Generate, CacheDependsOnPositionAndHistory) {
  // Guards against a cache that ignores the offset or the earlier tokens: the same token fed
  // after different histories gives different logits, matching the full forward each time.
  const ModelDesc d = desc(2, 32, 16, 41);
  Model m(d, cpu_ops());
  m.init_params(3);
  const int V = d.vocab_size;
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 2, 3, 4}, c = {2, 3, 4};
  std::vector<float> la(V), lb(V), lc(V);
  Generator g(m);
  g.feed(a.data(), 3, la.data());
  g.feed(&a[3], 1, la.data());
  g.reset();
  g.feed(b.data(), 4, lb.data());
  g.reset();
  g.feed(c.data(), 3, lc.data());
  // Other histories: a real difference, far above forward_bound (K ≤ 128 here: ≤ 1.6e-5).
  EXPECT_GT(rel_diff(la.data(), lb.data(), V), 1e-3);
  EXPECT_GT(rel_diff(la.data(), lc.data(), V), 1e-3);
  EXPECT_LT(rel_diff(la.data(), &full_logits(m, a)[3 * V], V), forward_bound(d));
  EXPECT_LT(rel_diff(lc.data(), &full_logits(m, c)[2 * V], V), forward_bound(d));
}

TEST_P(Generate, GreedyTopK1AndTemperatureZeroAgreeAndMatchUncached) {
  const ModelDesc d = desc(2, 32, 40, 61);
  Model m(d, cpu_ops());
  m.init_params(21);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  Generator g(m), full(m, 0, false);
  SamplingParams greedy;
  greedy.greedy = true;
  Rng r1(1), r2(2), r3(3), r4(4);
  const auto a = generate(g, prompt, 30, greedy, r1, 0, -1);
  SamplingParams k1;
  k1.top_k = 1;
  k1.temperature = 1.7f;
  const auto b = generate(g, prompt, 30, k1, r2, 0, -1);
  SamplingParams t0;
  t0.temperature = 0.0f;
  const auto c = generate(g, prompt, 30, t0, r3, 0, -1);
  const auto e = generate(full, prompt, 30, greedy, r4, 0, -1);
  ASSERT_EQ(a.size(), 30u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(a, e);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 1u);  // not a constant sequence
}

TEST_P(Generate, SeedReproducesSampling) {
  const ModelDesc d = desc(2, 32, 40, 61);
  Model m(d, cpu_ops());
  m.init_params(8);
  const std::vector<int32_t> prompt = {7};
  SamplingParams s;
  s.temperature = 1.0f;
  s.top_p = 0.95f;
  Generator g(m);
  Rng r1(42), r2(42), r3(43);
  const auto a = generate(g, prompt, 30, s, r1, 0, -1);
  const auto b = generate(g, prompt, 30, s, r2, 0, -1);
  const auto c = generate(g, prompt, 30, s, r3, 0, -1);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // The choice is limited to choose_vocab ids.
  Rng r4(42);
  for (int32_t id : generate(g, prompt, 30, s, r4, 10, -1)) EXPECT_LT(id, 10);
}

TEST_P(Generate, StopsAtStopIdOrAtTheContext) {
  const ModelDesc d = desc(1, 16, 12, 29);
  Model m(d, cpu_ops());
  m.init_params(4);
  Generator g(m);
  SamplingParams greedy;
  greedy.greedy = true;
  Rng rng(0);
  const std::vector<int32_t> prompt = {1, 2, 3};
  const auto all = generate(g, prompt, 100, greedy, rng, 0, -1);
  EXPECT_EQ(all.size(), size_t(d.max_seq_len) - prompt.size());  // the sequence fills the context
  std::vector<int32_t> seen;
  const auto stopped = generate(g, prompt, 100, greedy, rng, 0, all[4], [&](int32_t id) { seen.push_back(id); });
  const size_t first = std::find(all.begin(), all.end(), all[4]) - all.begin();
  EXPECT_EQ(stopped, std::vector<int32_t>(all.begin(), all.begin() + first + 1));
  EXPECT_EQ(seen, stopped);  // every token is reported as it is chosen
  EXPECT_EQ(generate(g, prompt, 3, greedy, rng, 0, -1), std::vector<int32_t>(all.begin(), all.begin() + 3));
  EXPECT_TRUE(generate(g, prompt, 0, greedy, rng, 0, -1).empty());
}

INSTANTIATE_TEST_SUITE_P(Families, Generate, ::testing::ValuesIn(kGenCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- choosing a token -----------------------------------------------------------------------

TEST(ChooseToken, GreedyIsTheFirstArgmax) {
  const float l[] = {0.5f, 2.0f, -1.0f, 2.0f};
  SamplingParams s;
  s.greedy = true;
  Rng rng(1);
  EXPECT_EQ(choose_next_token(l, 4, s, rng), 1);
  EXPECT_EQ(choose_next_token(l, 1, s, rng), 0);  // restricted to the first id
}

// Probabilities 0.5, 0.3, 0.15, 0.05 (as logits), shuffled over ids.
struct FourWay {
  int ids[4] = {2, 0, 3, 1};  // ids[r] = the r-th most likely id
  float logits[4];
  FourWay() {
    const double p[4] = {0.5, 0.3, 0.15, 0.05};
    for (int r = 0; r < 4; r++) logits[ids[r]] = static_cast<float>(std::log(p[r]) + 1.25);
  }
  std::map<int, int> draw(const SamplingParams& s, int n, uint64_t seed) const {
    Rng rng(seed);
    std::map<int, int> count;
    for (int i = 0; i < n; i++) count[choose_next_token(logits, 4, s, rng)]++;
    return count;
  }
};

TEST(ChooseToken, TopKAndTopPKeepTheMostLikelyIds) {
  FourWay f;
  const int n = 20000;
  // Bound (sampling, not rounding): a frequency of n draws of probability p lies within 4 binomial
  // standard deviations sqrt(p(1 − p)/n) of p but for a chance of 6e-5 (the seeds are fixed, so
  // each check passes or fails for good); the float probabilities' rounding is 1e-7 of that.
  auto sigmas4 = [n](double p) { return 4 * std::sqrt(p * (1 - p) / n); };
  SamplingParams s;
  auto all = f.draw(s, n, 1);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_NEAR(all[2] / double(n), 0.5, sigmas4(0.5));
  EXPECT_NEAR(all[1] / double(n), 0.05, sigmas4(0.05));
  s.top_k = 2;  // {2, 0} in proportion 0.5 : 0.3
  auto k2 = f.draw(s, n, 2);
  EXPECT_EQ(k2.size(), 2u);
  EXPECT_NEAR(k2[2] / double(n), 0.625, sigmas4(0.625));
  s.top_k = 0;
  s.top_p = 0.79f;  // 0.5 + 0.3 reaches 0.79: {2, 0}
  auto p8 = f.draw(s, n, 3);
  EXPECT_EQ(p8.size(), 2u);
  EXPECT_NEAR(p8[0] / double(n), 0.375, sigmas4(0.375));
  s.top_p = 0.81f;  // needs the third
  EXPECT_EQ(f.draw(s, n, 4).size(), 3u);
  s.top_p = 0.4f;  // the first alone reaches it
  EXPECT_EQ(f.draw(s, 200, 5), (std::map<int, int>{{2, 200}}));
  s.top_p = 1.0f;
  s.top_k = 1;
  EXPECT_EQ(f.draw(s, 200, 6), (std::map<int, int>{{2, 200}}));
  // Temperature flattens (T > 1) or sharpens (T < 1) the distribution.
  s.top_k = 0;
  s.temperature = 0.25f;  // p ∝ p^4: 0.0625 / (0.0625 + 0.0081 + ...) ≈ 0.88
  const double p4 = 0.0625 / (0.0625 + 0.0081 + 0.00050625 + 0.00000625);
  EXPECT_NEAR(f.draw(s, n, 7)[2] / double(n), p4, sigmas4(p4));
}

TEST(ChooseToken, BadValuesAreErrors) {
  SamplingParams s;
  s.temperature = -1;
  EXPECT_THROW(check_sampling_params(s), Error);
  s = {};
  s.top_k = -2;
  EXPECT_THROW(check_sampling_params(s), Error);
  s = {};
  s.top_p = 0.0f;
  EXPECT_THROW(check_sampling_params(s), Error);
  s.top_p = 1.5f;
  EXPECT_THROW(check_sampling_params(s), Error);
  s.top_p = NAN;
  EXPECT_THROW(check_sampling_params(s), Error);
  s = {};
  EXPECT_NO_THROW(check_sampling_params(s));
}

// ---- Hugging Face fixtures: transformers' greedy tokens -----------------------------------------

std::string hf_fixture_dir(const std::string& family) {
  for (std::string base : {"tests/fixtures/hf/", "../tests/fixtures/hf/"})
    if (std::filesystem::exists(base + family + "/fixture.json")) return base + family;
  return "";
}

class GenerateHf : public ::testing::TestWithParam<const char*> {};

TEST_P(GenerateHf, GreedyReproducesTransformersTokens) {
  const std::string dir = hf_fixture_dir(GetParam());
  ASSERT_FALSE(dir.empty()) << "run the tests from the project root (tests/fixtures/hf/" << GetParam()
                            << "/fixture.json not found)";
  std::ifstream in(dir + "/fixture.json");
  const nlohmann::json fx = nlohmann::json::parse(in);
  ASSERT_TRUE(fx.contains("generations") && !fx["generations"].empty());
  const HfModel hf = load_hf_model(dir);
  Model m(hf.desc, cpu_ops());
  ASSERT_EQ(m.table.numel, hf.params.size());
  std::copy(hf.params.begin(), hf.params.end(), m.params);
  if (std::string(GetParam()) == "llama") {  // exercises GQA
    EXPECT_LT(hf.desc.n_kv_head, hf.desc.n_head);
  }
  Generator cached(m), full(m, 0, false);
  SamplingParams greedy;
  greedy.greedy = true;
  for (const auto& g : fx["generations"]) {
    const std::vector<int32_t> prompt = g["prompt"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = g["greedy_20"].get<std::vector<int32_t>>();
    Rng rng(0);
    // Exact tokens: two forward_bounds (transformers' order, the cache's) move a logit of size
    // about 5 by at most 2·9.3e-5 (gpt2, K = 128; llama, K = 64: 2·4.4e-5), a top-1/top-2 gap by
    // twice that; the fixture's smallest gap on these steps (min_top2_margin: 7.4e-3 gpt2, 1.2e-2
    // llama) is 20 times more, so no argmax flips.
    EXPECT_EQ(generate(cached, prompt, static_cast<int>(want.size()), greedy, rng, 0, -1), want)
        << GetParam() << " prompt of " << prompt.size() << " tokens, KV cache";
    EXPECT_EQ(generate(full, prompt, static_cast<int>(want.size()), greedy, rng, 0, -1), want)
        << GetParam() << " prompt of " << prompt.size() << " tokens, full forward";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateHf, ::testing::Values("gpt2", "llama"),
                         [](const auto& info) { return std::string(info.param); });

// ---- errors -------------------------------------------------------------------------------------

TEST(GenerateErrors, BertIsRefusedWithAClearMessage) {
  const ModelDesc d = desc_of("bert", 1, 2, 16, 8, 30, {"model.num_labels=2"});
  Model m(d, cpu_ops());
  try {
    Generator g(m);
    FAIL() << "a bert model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2 or llama"), std::string::npos) << e.what();
  }
  EXPECT_NE(generation_unsupported_reason(m), "");
}

TEST(GenerateErrors, PromptTooLongAndBadIds) {
  const ModelDesc d = desc_of("gpt2", 1, 2, 16, 8, 30);
  Model m(d, cpu_ops());
  m.init_params(1);
  Generator g(m);
  SamplingParams s;
  Rng rng(1);
  std::vector<float> logits(30);
  try {
    generate(g, std::vector<int32_t>(8, 1), 5, s, rng, 0, -1);
    FAIL() << "a prompt as long as the context was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context is 8 positions"), std::string::npos) << e.what();
  }
  EXPECT_THROW(generate(g, std::vector<int32_t>(9, 1), 5, s, rng, 0, -1), Error);
  EXPECT_THROW(generate(g, {}, 5, s, rng, 0, -1), Error);
  EXPECT_EQ(generate(g, std::vector<int32_t>(7, 1), 5, s, rng, 0, -1).size(), 1u);
  const int32_t bad[] = {3, 30};
  g.reset();
  EXPECT_THROW(g.feed(bad, 2, logits.data()), Error);
  const int32_t neg = -1;
  EXPECT_THROW(g.feed(&neg, 1, logits.data()), Error);
  std::vector<int32_t> eight(8, 2);
  g.reset();
  g.feed(eight.data(), 8, logits.data());
  EXPECT_THROW(g.feed(eight.data(), 1, logits.data()), Error);  // the cache is full
}

TEST(GenerateErrors, NonFiniteWeightsAreRefusedNamingTheTensor) {
  for (const char* family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    const ModelDesc d = desc_of(family, 2, 2, 16, 8, 30);
    Model m(d, cpu_ops());
    m.init_params(3);
    EXPECT_EQ(nonfinite_tensor(m.table, m.params), "");
    const char* name = std::string(family) == "gpt2" ? "h.1.mlp.c_fc.weight" : "model.layers.1.self_attn.o_proj.weight";
    const ParamSlice* s = m.table.find(name);
    ASSERT_NE(s, nullptr);
    m.params[s->offset + 5] = NAN;
    m.params[s->offset + 9] = -INFINITY;
    const std::string want = std::string("tensor '") + name + "' holds 2 non-finite values of " +
                             std::to_string(s->numel) + " (the first, nan, at element 5)";
    EXPECT_EQ(nonfinite_tensor(m.table, m.params), want);
    for (bool cache : {true, false}) {
      try {
        Generator g(m, 0, cache);
        FAIL() << "weights with a NaN were accepted (kv_cache " << cache << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("the model's weights are not finite: " + want), std::string::npos)
            << e.what();
      }
    }
    m.params[s->offset + 5] = 0.0f;
    EXPECT_NE(nonfinite_tensor(m.table, m.params).find("1 non-finite value of"), std::string::npos);
    m.params[s->offset + 9] = 0.0f;
    EXPECT_EQ(nonfinite_tensor(m.table, m.params), "");
  }
}

// Finite weights whose forward overflows: every weight of the final norm at the largest float makes
// the normalised rows infinite, and the logits inf - inf = NaN. Greedy and sampled generation stop
// at the first step with an error naming it, before choosing a token.
TEST(GenerateErrors, NonFiniteLogitsStopGenerationNamingTheStep) {
  const ModelDesc d = desc_of("gpt2", 1, 2, 16, 12, 30);
  Model m(d, cpu_ops());
  m.init_params(5);
  const ParamSlice* s = m.table.find("ln_f.weight");
  ASSERT_NE(s, nullptr);
  std::fill(m.params + s->offset, m.params + s->offset + s->numel, 3.0e38f);
  ASSERT_EQ(nonfinite_tensor(m.table, m.params), "");
  for (bool greedy : {true, false}) {
    Generator g(m);
    SamplingParams sp;
    sp.greedy = greedy;
    Rng rng(2);
    int chosen = 0;
    try {
      generate(g, {1, 2, 3}, 5, sp, rng, 0, -1, [&](int32_t) { chosen++; });
      FAIL() << "generation from non-finite logits went on (greedy " << greedy << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the logits for new token 1 (position 3) are not finite"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(chosen, 0);
  }
}

}  // namespace
}  // namespace llmpi
