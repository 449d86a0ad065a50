// The split backward of zero-bubble pipelines (model/transformer.h "Split backward"):
//  - matmul_backward with the input gradient alone, then the weight and bias gradients alone,
//    adds the same bits as one call with all three (small and threaded shapes; Exact: the three
//    outputs are independent GEMM and column-sum calls, made alike either way);
//  - for every family (and with dropout, and with bf16 GEMMs), on the whole model and on block
//    ranges cut as pipeline stages: input-only backwards of two micro-batches, then their
//    weight_backward (in the zb-h1 order BI0 BI1 W0 W1), give bit for bit the hidden-state
//    gradients and the accumulated parameter gradients of two whole backwards (Exact: the same ops
//    on the same operands, and every tensor's additions in the same order);
//  - the weight work really is deferred: after an input-only backward every dense layer's weight
//    and bias gradient is untouched while the other tensors already have their gradient, and
//    weight_backward adds exactly the rest; only weight_backward reports gradients ready (growing
//    tensor boundaries up to the whole buffer), and misuse is refused.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/ops.h"
#include "model_test_util.h"
#include "runtime/error.h"
#include "runtime/rng.h"

using namespace llmpi;
using test::desc_of;
using test::RandomBatch;

namespace {

std::vector<float> random_vector(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = (float)(rng.uniform() * 2 - 1);
  return v;
}

struct SplitCase {
  const char* name;
  const char* family;
  std::vector<std::string> extra;
  GemmPrecision precision = GemmPrecision::fp32;  // the dense layers' GEMMs (runtime.precision)
  AttentionImpl attention = AttentionImpl::full;
  int head_chunk_rows = 0;  // the chunked LM head's rows per chunk (0: one chunk at these sizes)
};
std::ostream& operator<<(std::ostream& os, const SplitCase& c) { return os << c.name; }

const SplitCase kCases[] = {
    {"gpt2", "gpt2", {}},
    {"gpt2_untied_dropout", "gpt2", {"model.tie_embeddings=false", "model.dropout=0.1"}},
    {"gpt2_dropout", "gpt2", {"model.dropout=0.2"}},
    {"llama_gqa", "llama", {"model.n_kv_head=1"}},
    {"bert", "bert", {"model.num_labels=3"}},
    {"bert_dropout", "bert", {"model.num_labels=3", "model.dropout=0.1", "model.attn_dropout=0.1"}},
    // bf16 GEMMs: the deferred weight gradients round the same operands the whole backward does
    {"gpt2_bf16", "gpt2", {}, GemmPrecision::bf16},
    {"bert_bf16", "bert", {"model.num_labels=3"}, GemmPrecision::bf16},
    // fused attention (flash_attention_*): not a dense layer, so the split is unaffected
    {"gpt2_fused", "gpt2", {"model.dropout=0.2"}, GemmPrecision::fp32, AttentionImpl::fused},
    {"llama_gqa_fused", "llama", {"model.n_kv_head=1"}, GemmPrecision::fp32, AttentionImpl::fused},
    {"bert_dropout_fused", "bert", {"model.num_labels=3", "model.dropout=0.1", "model.attn_dropout=0.1"},
     GemmPrecision::fp32, AttentionImpl::fused},
    // the chunked LM head (16 rows in chunks of 3: ragged): weight_backward recomputes the logits
    {"gpt2_head_chunks", "gpt2", {}, GemmPrecision::fp32, AttentionImpl::full, 3},
    {"gpt2_untied_head_chunks_bf16", "gpt2", {"model.tie_embeddings=false"}, GemmPrecision::bf16, AttentionImpl::full, 3},
    {"llama_head_chunks_fused", "llama", {"model.n_kv_head=1"}, GemmPrecision::fp32, AttentionImpl::fused, 1},
};

class BackwardSplit : public ::testing::TestWithParam<SplitCase> {
 protected:
  ModelDesc desc() const {
    ModelDesc d = desc_of(GetParam().family, 3, 2, 16, 8, 29, GetParam().extra);
    d.init_std = 0.2;
    d.attention = GetParam().attention;
    d.lm_head_chunk_rows = GetParam().head_chunk_rows;
    return d;
  }
};

// One part of the model run twice side by side: `whole` with whole backwards, `split` with
// input-only backwards and weight_backward. Micro-batch m's hidden state (or gradient) coming
// from a neighbouring part is random, as in a pipeline stage.
struct PartPair {
  const ModelDesc& d;
  ModelPart part;
  int B, T;
  Model whole, split;
  std::vector<std::unique_ptr<Activations>> aw, as;  // per micro-batch
  std::vector<RandomBatch> batches;
  PartPair(const ModelDesc& d_, ModelPart p, int B_, int T_, int micro, GemmPrecision prec = GemmPrecision::fp32)
      : d(d_), part(p), B(B_), T(T_), whole(d_, cpu_ops(), p, prec), split(d_, cpu_ops(), p, prec) {
    whole.init_params(5);
    split.init_params(5);
    whole.zero_grads();
    split.zero_grads();
    const size_t NC = (size_t)B * T * d.d_model;
    batches.reserve(micro);
    for (int m = 0; m < micro; m++) {
      batches.emplace_back(d, B, T, 100 + m);
      aw.push_back(std::make_unique<Activations>(whole, B, T));
      as.push_back(std::make_unique<Activations>(split, B, T));
      whole.load_batch(*aw[m], batches[m].b);
      split.load_batch(*as[m], batches[m].b);
      aw[m]->dropout = as[m]->dropout = DropoutContext{true, 9, 3, 0, m};
      if (!part.embedding) {  // the hidden state from the previous stage
        const std::vector<float> x = random_vector(NC, 200 + m);
        std::memcpy(aw[m]->input, x.data(), NC * sizeof(float));
        std::memcpy(as[m]->input, x.data(), NC * sizeof(float));
      }
    }
  }
  void forward(Model& md, Activations& a, int micro) {
    if (part.embedding) md.embed_forward(a);
    md.blocks_forward(a, md.l0(), md.l1());  // the Model's range (part.l1 may be -1: every block)
    if (part.head) {
      md.head_forward(a, HeadMode::train, 1.0f / micro);
    } else {  // the gradient from the next stage
      const size_t NC = (size_t)B * T * d.d_model;
      const std::vector<float> g = random_vector(NC, 300 + a.dropout.micro_batch);
      std::memcpy(a.dresidual, g.data(), NC * sizeof(float));
    }
  }
  void backward(Model& md, Activations& a, BackwardMode mode, const Model::ReadyFn& ready = {}) {
    md.begin_backward(a, mode);
    if (part.head) md.head_backward(a, ready);
    md.blocks_backward(a, md.l0(), md.l1(), ready);
    if (part.embedding) md.embed_backward(a, ready);
  }
};

std::vector<ModelPart> parts_of(int L) {
  return {ModelPart::whole(), ModelPart{0, 1, true, false}, ModelPart{1, L, false, true}, ModelPart{1, 2, false, false}};
}

std::string part_name(const ModelPart& p) {
  return "blocks [" + std::to_string(p.l0) + "," + std::to_string(p.l1) + ")" + (p.embedding ? " + embedding" : "") +
         (p.head ? " + head" : "");
}

}  // namespace

TEST(MatmulBackwardSplit, InputThenWeightEqualsOneCall) {
  const Ops& o = cpu_ops();
  struct Shape { int N, C, OC; };
  for (Shape s : {Shape{7, 5, 3}, Shape{67, 45, 130}, Shape{256, 128, 384}}) {
    SCOPED_TRACE(std::to_string(s.N) + "x" + std::to_string(s.C) + "x" + std::to_string(s.OC));
    const std::vector<float> x = random_vector((size_t)s.N * s.C, 1), w = random_vector((size_t)s.OC * s.C, 2),
                             dout = random_vector((size_t)s.N * s.OC, 3);
    // gradients start non-zero: backward adds
    const std::vector<float> dx0 = random_vector((size_t)s.N * s.C, 4), dw0 = random_vector((size_t)s.OC * s.C, 5),
                             db0 = random_vector((size_t)s.OC, 6);
    std::vector<float> dx1 = dx0, dw1 = dw0, db1 = db0, dx2 = dx0, dw2 = dw0, db2 = db0;
    o.matmul_backward(dx1.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(), s.N, s.C, s.OC, GemmPrecision::fp32);
    o.matmul_backward(dx2.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), s.N, s.C, s.OC, GemmPrecision::fp32);  // inp unread
    EXPECT_EQ(dw2, dw0);
    EXPECT_EQ(db2, db0);
    o.matmul_backward(nullptr, dw2.data(), db2.data(), dout.data(), x.data(), nullptr, s.N, s.C, s.OC, GemmPrecision::fp32);  // weight unread
    EXPECT_EQ(dx1, dx2);
    EXPECT_EQ(dw1, dw2);
    EXPECT_EQ(db1, db2);
    EXPECT_NE(dw1, dw0);
  }
}

// BI0 BI1 W0 W1 equals B0 B1, bit for bit, on every part; between them the deferral is visible.
TEST_P(BackwardSplit, InputThenWeightEqualsWholeBackward) {
  const ModelDesc d = desc();
  const int B = 2, T = 8, micro = 2;
  for (const ModelPart& p : parts_of(d.n_layer)) {
    SCOPED_TRACE(part_name(p));
    PartPair pp(d, p, B, T, micro, GetParam().precision);
    const size_t NC = (size_t)B * T * d.d_model;
    for (int m = 0; m < micro; m++) {
      pp.forward(pp.whole, *pp.aw[m], micro);
      pp.forward(pp.split, *pp.as[m], micro);
    }
    // Micro-batch 0: whole backward against input-only backward.
    pp.backward(pp.whole, *pp.aw[0], BackwardMode::whole);
    int calls = 0;
    pp.backward(pp.split, *pp.as[0], BackwardMode::input_only, [&](size_t) { calls++; });
    EXPECT_EQ(calls, 0) << "an input-only backward reported gradients ready";
    EXPECT_EQ(std::memcmp(pp.aw[0]->dresidual, pp.as[0]->dresidual, NC * sizeof(float)), 0)
        << "the hidden-state gradient differs";
    EXPECT_TRUE(pp.as[0]->input_only.pending);
    EXPECT_FALSE(pp.as[0]->input_only.deferred.empty() && (p.head || p.l1 > p.l0));
    {
      const std::vector<float> gw = pp.whole.grads_host(), gs = pp.split.grads_host();
      for (const ParamSlice& s : pp.split.table.slices) {
        bool zero = true, same = true;
        for (size_t i = s.offset; i < s.offset + s.numel; i++) {
          zero &= gs[i] == 0.0f;
          same &= gs[i] == gw[i];
        }
        if (test::added_by_weight_pass(pp.split, s)) {
          EXPECT_TRUE(zero) << s.name << ": a weight gradient was computed before weight_backward";
        } else if (!(s.role == kTokEmb && p.head && d.head == HeadKind::lm && d.tie_embeddings)) {
          EXPECT_TRUE(same) << s.name << ": computed by the input-only backward, but differently";
        }
      }
    }
    // Micro-batch 1's input-only backward runs before micro-batch 0's weight gradient (zb-h1).
    pp.backward(pp.whole, *pp.aw[1], BackwardMode::whole);
    pp.backward(pp.split, *pp.as[1], BackwardMode::input_only);
    EXPECT_EQ(std::memcmp(pp.aw[1]->dresidual, pp.as[1]->dresidual, NC * sizeof(float)), 0);
    pp.split.weight_backward(*pp.as[0], {});
    EXPECT_FALSE(pp.as[0]->input_only.pending);
    std::vector<size_t> seen;
    pp.split.weight_backward(*pp.as[1], [&](size_t k) { seen.push_back(k); });
    // Every gradient now equals two whole backwards bit for bit.
    const std::vector<float> gw = pp.whole.grads_host(), gs = pp.split.grads_host();
    for (const ParamSlice& s : pp.split.table.slices)
      EXPECT_EQ(std::memcmp(gw.data() + s.offset, gs.data() + s.offset, s.numel * sizeof(float)), 0)
          << s.name << " has a different gradient";
    bool any = false;
    for (float g : gs) any |= g != 0.0f;
    EXPECT_TRUE(any);
    // The last weight_backward reports growing tensor boundaries up to the whole buffer.
    ASSERT_FALSE(seen.empty());
    for (size_t i = 1; i < seen.size(); i++) EXPECT_GT(seen[i], seen[i - 1]);
    EXPECT_EQ(seen.back(), pp.split.table.numel);
    for (size_t k : seen) {
      bool boundary = false;
      for (size_t i = 0; i < pp.split.table.slices.size(); i++) boundary |= pp.split.table.end_of(i) == k;
      EXPECT_TRUE(boundary) << k << " is not the end of a tensor";
    }
    // A part with dense layers reports more than once: the prefix grows as the layers land.
    if (p.l1 > p.l0) {
      EXPECT_GT(seen.size(), 1u);
    }
  }
}

// At a larger shape (B = 3, T = 67: many tokens, so the LM head's dW and the embedding's scatter
// meet in most rows of wte) the tied token embedding of a whole model still gets the same bits:
// the embedding's backward waits for weight_backward, after the head's dW, as in a whole backward.
// (With the embedding's gradient added in the input-only pass it differed by up to 3.7e-9.)
TEST(BackwardSplitTied, WholeModelSameBitsAtLargerShape) {
  for (AttentionImpl att : {AttentionImpl::full, AttentionImpl::fused}) {
    ModelDesc d = desc_of("gpt2", 2, 2, 16, 67, 29);
    d.init_std = 0.2;
    d.attention = att;
    const int B = 3, T = 67, micro = 2;
    PartPair pp(d, ModelPart::whole(), B, T, micro);
    for (int m = 0; m < micro; m++) {
      pp.forward(pp.whole, *pp.aw[m], micro);
      pp.forward(pp.split, *pp.as[m], micro);
    }
    for (int m = 0; m < micro; m++) {
      pp.backward(pp.whole, *pp.aw[m], BackwardMode::whole);
      pp.backward(pp.split, *pp.as[m], BackwardMode::input_only);
    }
    for (int m = 0; m < micro; m++) pp.split.weight_backward(*pp.as[m], {});
    const std::vector<float> gw = pp.whole.grads_host(), gs = pp.split.grads_host();
    for (const ParamSlice& s : pp.split.table.slices)
      EXPECT_EQ(std::memcmp(gw.data() + s.offset, gs.data() + s.offset, s.numel * sizeof(float)), 0)
          << s.name << " has a different gradient (attention " << (att == AttentionImpl::fused ? "fused" : "full") << ")";
  }
}

// weight_backward without an input-only backward, or a second input-only backward over the same
// activations before their weight_backward, is refused (an internal error, not silent garbage).
TEST_P(BackwardSplit, MisuseIsRefused) {
  const ModelDesc d = desc();
  PartPair pp(d, ModelPart::whole(), 2, 8, 1);
  pp.forward(pp.split, *pp.as[0], 1);
  EXPECT_THROW(pp.split.weight_backward(*pp.as[0], {}), Error);
  pp.backward(pp.split, *pp.as[0], BackwardMode::input_only);
  EXPECT_THROW(pp.split.begin_backward(*pp.as[0], BackwardMode::input_only), Error);
  pp.split.weight_backward(*pp.as[0], {});
  EXPECT_THROW(pp.split.weight_backward(*pp.as[0], {}), Error);
}

// The kept output gradients are allocated once per Activations and counted in its bytes.
TEST_P(BackwardSplit, KeptGradientsAreCounted) {
  const ModelDesc d = desc();
  Model m(d, cpu_ops());
  Activations a(m, 2, 8);
  const size_t before = a.bytes();
  m.reserve_input_only(a);
  EXPECT_EQ(a.input_only.kept_floats, m.kept_floats(2, 8));
  EXPECT_EQ(a.bytes(), before + m.kept_floats(2, 8) * sizeof(float));
  const size_t N = 16, C = d.d_model;
  EXPECT_GE(m.kept_floats(2, 8), d.n_layer * N * (2 * C + d.fc_dim() + d.qkv_dim()));
  m.reserve_input_only(a);
  EXPECT_EQ(a.bytes(), before + m.kept_floats(2, 8) * sizeof(float));
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, BackwardSplit, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<SplitCase>& i) { return std::string(i.param.name); });
