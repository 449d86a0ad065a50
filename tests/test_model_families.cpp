// Whole-model checks of every family (gpt2, gpt2 with an untied head, llama, llama with grouped
// K/V heads, bert) on the CPU backend:
//  - the float forward loss equals the double-precision reference (tests/ref_transformer.h), and
//    EVERY parameter's analytic gradient equals central finite differences of that reference;
//  - loss at initialisation is within 0.1 of ln(vocab) (ln(num_labels) for bert);
//  - a tiny model overfits one batch;
//  - the model run as blocks [0, k) then [k, L), with the hidden state handed over, equals the
//    whole model: loss and every gradient bit-identical, parameters initialised identically
//    (Exact: the same ops in the same order, the tied embedding's additions included);
//  - grads_ready reports growing prefixes at slice boundaries, ending at the whole buffer;
//  - the table follows the description (names, fused parts, no biases for llama, GQA shapes).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>

#include "model_test_util.h"
#include "ref_transformer.h"
#include "runtime/error.h"

using namespace llmpi;
using test::desc_of;
using test::RandomBatch;

namespace {

struct FamilyCase {
  const char* name;
  const char* family;
  std::vector<std::string> extra;
};

std::ostream& operator<<(std::ostream& os, const FamilyCase& c) { return os << c.name; }

const FamilyCase kCases[] = {
    {"gpt2", "gpt2", {}},
    {"gpt2_untied", "gpt2", {"model.tie_embeddings=false"}},
    {"llama", "llama", {}},
    {"llama_gqa", "llama", {"model.n_kv_head=1"}},
    {"bert", "bert", {"model.num_labels=3"}},
};

class ModelFamily : public ::testing::TestWithParam<FamilyCase> {
 protected:
  ModelDesc desc(int L, int NH, int C, int T, int V) const {
    return desc_of(GetParam().family, L, NH, C, T, V, GetParam().extra);
  }
};

double ln_classes(const ModelDesc& d) { return std::log((double)(d.head == HeadKind::lm ? d.vocab_size : d.num_labels)); }

}  // namespace

TEST_P(ModelFamily, EveryGradientMatchesFiniteDifferences) {
  ModelDesc d = desc(2, 2, 8, 6, 11);
  d.init_std = 0.3;  // large init so every path carries signal
  const int B = 3, T = 6;
  Model m(d, cpu_ops());
  Activations acts(m, B, T);
  m.init_params(3);
  // Randomise norms and biases too, so their gradients are exercised off 0/1.
  Rng rng(11);
  for (size_t i = 0; i < m.table.numel; i++) m.params[i] += (float)(0.1 * rng.normal());
  RandomBatch rb(d, B, T, 5);
  m.zero_grads();
  const float loss = m.forward(acts, rb.b, HeadMode::train);
  m.backward(acts);

  const std::vector<float> grads = m.grads_host();
  std::vector<double> P(m.params, m.params + m.table.numel);
  test::RefTransformer ref{d, m.table};
  const double ref_loss = ref.loss(P, rb.b), K = test::longest_sum(d, B, T);
  // Bound: the loss within gamma_K of the magnitudes of what it sums (test::loss_bound).
  const double lb = test::loss_bound(ref_loss, ref.logit_magnitude(P, rb.b), K);
  EXPECT_LE(std::fabs(loss - ref_loss), lb) << loss << " vs " << ref_loss;

  // Bound: every gradient tensor within gamma_K of the magnitude of what it sums (the batch's
  // examples: test::gradient_magnitude; BERT's key bias, 0 in exact arithmetic, against its query
  // bias's) of the exact gradient, and the finite differences within their error estimate
  // (test::model_fd) of it.
  const std::vector<double> mag = test::gradient_magnitude(m, rb.b, B, T);
  const test::ModelFd fd = test::model_fd([&](const std::vector<double>& p) { return ref.loss(p, rb.b); }, P,
                                          lb / test::kUnitFp32);
  for (auto& sl : m.table.slices) {
    double err2 = 0, ref2 = 0, mag2 = 0, fd2 = 0;
    const size_t mo = test::magnitude_offset(m.table, sl);
    for (size_t i = 0; i < sl.numel; i++) {
      const size_t k = sl.offset + i;
      err2 += (grads[k] - fd.g[k]) * (grads[k] - fd.g[k]);
      ref2 += fd.g[k] * fd.g[k];
      mag2 += mag[mo + i] * mag[mo + i];
      fd2 += fd.err[k] * fd.err[k];
    }
    ASSERT_GT(ref2, 0) << sl.name << " has an all-zero gradient";
    EXPECT_LE(std::sqrt(err2), test::gamma_n(K) * std::sqrt(mag2) + std::sqrt(fd2)) << sl.name;
    if (std::getenv("LLMPI_PRINT_BOUNDS"))
      std::printf("  bound %-60s worst |error| / bound %.4g\n", sl.name.c_str(),
                  std::sqrt(err2) / (test::gamma_n(K) * std::sqrt(mag2) + std::sqrt(fd2)));
  }
}

TEST_P(ModelFamily, InitialLossIsLnClasses) {
  ModelDesc d = desc(2, 4, 64, 32, 512);
  Model m(d, cpu_ops());
  Activations acts(m, 8, 32);
  m.init_params(1);
  RandomBatch rb(d, 8, 32, 9);
  const float loss = m.forward(acts, rb.b, HeadMode::eval);
  // Bound (of the model, not of rounding): at init each logit sums C = 64 products of small random
  // weights and unit-size inputs (std σ ≈ init_std·√C ≈ 0.16), so the mean cross-entropy is ln K +
  // σ²/2 ± σ/√rows, within 0.03 of ln K (K the classes); 0.1 leaves 3x.
  EXPECT_NEAR(loss, ln_classes(d), 0.1);
}

// Ids are checked on the host before any op reads a table row with them (on a GPU an id out of
// range would be a silent wrong answer or a fault reported far away).
TEST_P(ModelFamily, OutOfRangeIdsAreErrorsBeforeAnyOp) {
  ModelDesc d = desc(1, 2, 16, 8, 32);
  Model m(d, cpu_ops());
  Activations acts(m, 2, 8);
  m.init_params(1);
  auto expect_error = [&](RandomBatch& rb, const char* what) {
    try {
      m.forward(acts, rb.b, HeadMode::eval);
      ADD_FAILURE() << "no error for a bad " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  {
    RandomBatch rb(d, 2, 8, 3);
    rb.tokens[5] = d.vocab_size;
    expect_error(rb, "token id 32 at position 5");
  }
  {
    RandomBatch rb(d, 2, 8, 3);
    rb.tokens[0] = -1;
    expect_error(rb, "token id -1 at position 0");
  }
  if (d.head == HeadKind::lm) {
    RandomBatch rb(d, 2, 8, 3);
    rb.targets[7] = d.vocab_size + 4;
    expect_error(rb, "target id");
  } else {
    RandomBatch rb(d, 2, 8, 3);
    rb.labels[1] = d.num_labels;
    expect_error(rb, "label");
    RandomBatch rt(d, 2, 8, 3);
    rt.types[2] = d.type_vocab_size;
    expect_error(rt, "token type");
  }
  RandomBatch ok(d, 2, 8, 3);
  EXPECT_TRUE(std::isfinite(m.forward(acts, ok.b, HeadMode::eval)));
}

TEST_P(ModelFamily, OverfitsOneBatch) {
  ModelDesc d = desc(2, 2, 32, 16, 64);
  const int B = 4, T = 16;
  Model m(d, cpu_ops());
  Activations acts(m, B, T);
  m.init_params(2);
  RandomBatch rb(d, B, T, 4);
  std::vector<float> mom(m.table.numel, 0.f), vel(m.table.numel, 0.f);
  float first = 0, loss = 0;
  for (int it = 1; it <= 300; it++) {
    m.zero_grads();
    loss = m.forward(acts, rb.b, HeadMode::train);
    if (it == 1) first = loss;
    m.backward(acts);
    cpu_ops().adamw_update(m.params, m.grads, mom.data(), vel.data(), m.table.numel, 3e-3f, 0.9f, 0.999f, 1e-8f,
                           0.0f, it);
  }
  // Bound: the initial loss as in InitialLossIsLnClasses (bert's 4 labelled rows sample it more
  // loosely: 0.15); the last is a check of learning, not of rounding: 0.1 is far below ln K.
  EXPECT_NEAR(first, ln_classes(d), 0.15);
  EXPECT_LT(loss, 0.1f) << "after 300 AdamW steps on one batch";
}

// Blocks [0, k) with the embedding on one Model, [k, L) with the head on another: the hidden state
// and its gradient are handed over by copy. A tied token embedding lives in both parts; its head
// gradient is handed to the first part before the embedding backward adds to it, which is the
// order the whole model accumulates in.
TEST_P(ModelFamily, SplitAtEveryLayerEqualsWholeModel) {
  ModelDesc d = desc(3, 2, 16, 8, 23);
  d.init_std = 0.2;
  const int B = 2, T = 8, L = d.n_layer;
  const size_t NC = (size_t)B * T * d.d_model;
  RandomBatch rb(d, B, T, 21);

  Model whole(d, cpu_ops());
  Activations aw(whole, B, T);
  whole.init_params(77);
  whole.zero_grads();
  const float loss_whole = whole.forward(aw, rb.b, HeadMode::train);
  whole.backward(aw);

  for (int k = 0; k <= L; k++) {
    SCOPED_TRACE("split at layer " + std::to_string(k));
    Model first(d, cpu_ops(), ModelPart{0, k, true, false}), second(d, cpu_ops(), ModelPart{k, L, false, true});
    Activations a1(first, B, T), a2(second, B, T);
    first.init_params(77);
    second.init_params(77);
    first.zero_grads();
    second.zero_grads();
    // forward: first part, hand over the hidden state, second part
    first.load_batch(a1, rb.b);
    first.embed_forward(a1);
    first.blocks_forward(a1, 0, k);
    second.load_batch(a2, rb.b);
    std::memcpy(a2.input, a1.output(), NC * sizeof(float));
    second.blocks_forward(a2, k, L);
    second.head_forward(a2, HeadMode::train);
    const float loss_split = second.read_loss(a2);
    EXPECT_EQ(loss_split, loss_whole);
    // backward: second part, hand over the gradient (and a tied embedding's), first part
    second.begin_backward();
    second.head_backward(a2, {});
    second.blocks_backward(a2, k, L, {});
    std::memcpy(a1.dresidual, a2.dresidual, NC * sizeof(float));
    const ParamSlice* tied2 = second.table.find(family_tensor_names(d.family, kTokEmb, -1)[0]);
    if (tied2) {
      const ParamSlice& tied1 = first.table.at(tied2->name);
      std::memcpy(first.grads + tied1.offset, second.grads + tied2->offset, tied2->numel * sizeof(float));
    }
    first.begin_backward();
    first.blocks_backward(a1, 0, k, {});
    first.embed_backward(a1, {});
    // every tensor: the same initial values and the same gradient as in the whole model
    size_t covered = 0;
    for (const ParamSlice& w : whole.table.slices) {
      const ParamSlice* s1 = first.table.find(w.name);
      const ParamSlice* s2 = second.table.find(w.name);
      ASSERT_TRUE(s1 || s2) << w.name << " is in neither part";
      const Model& owner = s1 ? first : second;
      const ParamSlice& s = s1 ? *s1 : *s2;
      ASSERT_EQ(s.numel, w.numel);
      EXPECT_EQ(std::memcmp(owner.params + s.offset, whole.params + w.offset, w.numel * sizeof(float)), 0)
          << w.name << " initialised differently";
      EXPECT_EQ(std::memcmp(owner.grads + s.offset, whole.grads + w.offset, w.numel * sizeof(float)), 0)
          << w.name << " has a different gradient";
      covered += w.numel;
    }
    EXPECT_EQ(covered, whole.table.numel);
  }
}

TEST_P(ModelFamily, GradsReadyReportsGrowingSliceBoundaries) {
  ModelDesc d = desc(3, 2, 8, 4, 11);
  Model m(d, cpu_ops());
  Activations acts(m, 2, 4);
  m.init_params(1);
  RandomBatch rb(d, 2, 4, 1);
  m.zero_grads();
  m.forward(acts, rb.b, HeadMode::train);
  std::vector<size_t> seen;
  m.backward(acts, [&](size_t k) { seen.push_back(k); });
  ASSERT_GE(seen.size(), (size_t)3 * d.n_layer);  // at least one point per block's branch
  for (size_t i = 1; i < seen.size(); i++) EXPECT_GT(seen[i], seen[i - 1]);
  EXPECT_EQ(seen.back(), m.table.numel);
  for (size_t k : seen) {
    bool boundary = false;
    for (size_t i = 0; i < m.table.slices.size(); i++) boundary |= m.table.end_of(i) == k;
    EXPECT_TRUE(boundary) << k << " is not the end of a tensor";
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, ModelFamily, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<FamilyCase>& i) { return std::string(i.param.name); });

TEST(FamilyTables, LlamaHasNoBiasesFusedPartsAndGqaShapes) {
  ModelDesc d = desc_of("llama", 2, 4, 32, 16, 100, {"model.n_kv_head=2", "model.ffn_dim=48"});
  ParamTable t = build_param_table(d);
  for (auto& s : t.slices) EXPECT_EQ(s.name.find("bias"), std::string::npos) << s.name;
  const auto& q = t.at("model.layers.1.self_attn.q_proj.weight");
  const auto& k = t.at("model.layers.1.self_attn.k_proj.weight");
  const auto& v = t.at("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int>{32, 32}));
  EXPECT_EQ(k.shape, (std::vector<int>{16, 32}));  // 2 kv heads of 8
  EXPECT_EQ(k.offset, q.offset + q.numel);           // fused: adjacent, q then k then v
  EXPECT_EQ(v.offset, k.offset + k.numel);
  const auto& gate = t.at("model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(t.at("model.layers.0.mlp.up_proj.weight").offset, gate.offset + gate.numel);
  EXPECT_EQ(gate.shape, (std::vector<int>{48, 32}));
  EXPECT_EQ(t.slices.front().name, "lm_head.weight");  // untied by default, finished first
  EXPECT_EQ(t.slices.back().name, "model.embed_tokens.weight");
  EXPECT_EQ(t.find("model.norm.weight")->init, InitKind::ones);
}

TEST(FamilyTables, BertIsPostNormWithPoolerAndClassifier) {
  ModelDesc d = desc_of("bert", 2, 2, 16, 8, 50, {"model.num_labels=3"});
  EXPECT_FALSE(d.pre_norm);
  EXPECT_FALSE(d.causal);
  EXPECT_DOUBLE_EQ(d.norm_eps, 1e-12);  // Exact: the configured value
  ParamTable t = build_param_table(d);
  EXPECT_EQ(t.slices.front().name, "classifier.weight");
  EXPECT_EQ(t.at("classifier.weight").shape, (std::vector<int>{3, 16}));
  EXPECT_EQ(t.slices.back().name, "bert.embeddings.word_embeddings.weight");
  // post-norm backward order inside a block: output.LayerNorm first, the q/k/v projection last
  EXPECT_LT(t.at("bert.encoder.layer.1.output.LayerNorm.weight").offset,
            t.at("bert.encoder.layer.1.output.dense.weight").offset);
  EXPECT_LT(t.at("bert.encoder.layer.1.attention.output.dense.weight").offset,
            t.at("bert.encoder.layer.1.attention.self.query.weight").offset);
  EXPECT_EQ(t.at("bert.embeddings.token_type_embeddings.weight").shape, (std::vector<int>{2, 16}));
}

TEST(FamilyTables, InitialValuesAreKeyedByNameNotPosition) {
  ModelDesc d = desc_of("gpt2", 4, 2, 16, 8, 30);
  ParamTable whole = build_param_table(d), part = build_param_table(d, ModelPart{2, 3, false, false});
  std::vector<float> vw(whole.numel), vp(part.numel);
  init_param_values(whole, 5, vw.data());
  init_param_values(part, 5, vp.data());
  for (auto& s : part.slices) {
    const ParamSlice& w = whole.at(s.name);
    EXPECT_EQ(std::memcmp(vp.data() + s.offset, vw.data() + w.offset, s.numel * sizeof(float)), 0) << s.name;
  }
  // ...and a different seed gives different values
  std::vector<float> other(whole.numel);
  init_param_values(whole, 6, other.data());
  EXPECT_NE(std::memcmp(other.data(), vw.data(), whole.numel * sizeof(float)), 0);
}

TEST(FamilyConfig, KeysOfAnotherFamilyAreErrors) {
  EXPECT_THROW(parse_config("{}", "t", {"data.train=x", "model.rope_theta=500"}), Error);
  try {
    parse_config("{}", "t", {"data.train=x", "model.family=bert", "model.n_kv_head=2"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not apply to model.family \"bert\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(desc_of("llama", 2, 4, 32, 16, 10, {"model.n_kv_head=3"}), Error);  // 3 does not divide 4
  EXPECT_THROW(parse_config("{}", "t", {"data.train=x", "model.family=t5"}), Error);
  Config c = parse_config("{}", "t", {"data.train=x", "model.family=llama"});
  EXPECT_FALSE(c.model.tie_embeddings);  // llama's default
  EXPECT_FALSE(c.resolved["model"].contains("num_labels"));  // only the family's keys are resolved
}
