// The chunked LM head (model/transformer.h "Chunked LM head"): the rows go through the head in
// chunks of R rows, logits recomputed in backward, never all N x V of them stored.
//  - against one chunk of all N rows (the very ops of the unchunked head), for gpt2 (tied: the
//    head's gradient lands in wte) and llama (untied lm_head), fp32 and bf16 GEMMs, R = 1, 5, 7
//    (ragged: 64 = 9·7 + 1), 16 and 63. In exact arithmetic every row's loss and dxf are per-row
//    work, but not bit for bit here: OpenBLAS's sgemm computes an output row with another
//    micro-kernel (another FMA grouping of the C- or V-long dot product) depending on where the row
//    falls in the M blocking and the threads' split, so a row in a chunk of R rows can differ from
//    the same row among 64 by an ulp or two (measured, R = 1..63: row losses up to 1.9e-7
//    relative, 0 to 19 of 64 rows differing). Bounds: each row's logits are two orders of C-long dot
//    products, within 2 gamma_C of their magnitude of each other, which moves the row's loss by at
//    most twice that, beside the two cross-entropies' own rounding; each gradient tensor (the head
//    matrix's also a sum over chunks: the dW GEMM's reduction over rows split) within two
//    summation orders' bound of the magnitude of what it sums (in bf16, where a logits gradient
//    written in bf16 may round the other way, within that rounding's). A wrong chunk — a row
//    missed, counted twice or scaled wrongly — is off by O(1/64). The split backward is bit for bit (test_backward_split.cpp);
//  - the Activations allocate R rows of lm_logits_row_stride(V) for the logits, as the memory
//    estimate says, and all_logits asks for every row's (generation), which hold the unchunked
//    logits bit for bit;
//  - runtime.lm_head_chunk_rows is validated;
//  - the fused head (HeadMode::fused: each chunk's backward inside the forward, nothing
//    recomputed) equals forward + backward bit for bit — losses, every gradient — for every case
//    and chunk size, gpt2/llama/bert (bert's classifier head has nothing to fuse); micro-batches
//    may interleave (forward, forward, backward, backward); an input-only backward is refused;
//  - on a GPU (skipped without one): the CUDA chunked head against the CPU's, loss and gradients,
//    and the CUDA fused head against the CUDA recomputing one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/bf16.h"
#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "model_test_util.h"
#include "ref_transformer.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "model/memory_estimate.h"

using namespace llmpi;
using test::desc_of;
using test::gamma_n;
using test::kUnitBf16;
using test::kUnitFp32;
using test::RandomBatch;

namespace {

struct HeadCase {
  const char* name;
  const char* family;
  GemmPrecision precision;
};
std::ostream& operator<<(std::ostream& os, const HeadCase& c) { return os << c.name; }

const HeadCase kCases[] = {{"gpt2_tied_fp32", "gpt2", GemmPrecision::fp32},
                           {"gpt2_tied_bf16", "gpt2", GemmPrecision::bf16},
                           {"llama_untied_fp32", "llama", GemmPrecision::fp32},
                           {"llama_untied_bf16", "llama", GemmPrecision::bf16}};

constexpr int kB = 4, kT = 16, kN = kB * kT;

ModelDesc head_desc(const HeadCase& c, int chunk_rows) {
  ModelDesc d = desc_of(c.family, 2, 2, 32, kT, 97);
  d.init_std = 0.2;  // logits far from uniform, so the gradient is not tiny
  d.lm_head_chunk_rows = chunk_rows;
  return d;
}

struct HeadRun {
  float loss = 0;
  std::vector<float> row_losses, grads, logits;
  size_t act_bytes = 0;
  int lm_rows = 0;
  std::vector<ParamSlice> slices;
  std::vector<double> logit_mag;  // per row: max_j Σ_c |xf_c W_jc|, the magnitude of its logits' sums
};

// fused: HeadMode::fused (the head's backward inside the forward), else HeadMode::train.
HeadRun run_head(const HeadCase& c, int chunk_rows, const Ops& ops = cpu_ops(), bool fused = false) {
  const ModelDesc d = head_desc(c, chunk_rows);
  RandomBatch rb(d, kB, kT, 17);
  Model m(d, ops, ModelPart::whole(), c.precision);
  m.init_params(3);
  m.zero_grads();
  Activations a;
  HeadRun r;
  if (fused) {
    a.allocate(m, kB, kT);
    r.loss = m.forward(a, rb.b, HeadMode::fused);
    EXPECT_EQ(a.head_pass.mode, HeadMode::fused);
    r.row_losses.resize(kN);
    ops.copy_to_host(r.row_losses.data(), a.losses, kN * sizeof(float));
  } else {
    r.loss = m.forward(a, rb.b, HeadMode::train);
    r.row_losses = a.losses_host;
  }
  if (&ops == &cpu_ops()) {  // the logits' magnitudes, from the final norm's output (fp32 or bf16)
    const int C = d.d_model;
    const ParamSlice* W = nullptr;
    for (const ParamSlice& s : m.table.slices)
      if (d.tie_embeddings ? s.role == kTokEmb : s.role == kLmHead) W = &s;
    for (int n = 0; n < kN; n++) {
      double most = 0.0;
      for (int j = 0; j < d.vocab_size; j++) {
        double acc = 0.0;
        for (int c = 0; c < C; c++) {
          const size_t e = static_cast<size_t>(n) * C + c;
          const double x = a.final_norm ? a.final_norm[e] : bf16_bits_to_float(a.final_norm_bf16[e]);
          acc += std::fabs(x * m.params[W->offset + static_cast<size_t>(j) * C + c]);
        }
        most = std::max(most, acc);
      }
      r.logit_mag.push_back(most);
    }
  }
  m.backward(a);
  r.grads = m.grads_host();
  r.act_bytes = a.bytes();
  r.lm_rows = a.lm_rows;
  r.slices = m.table.slices;
  return r;
}

// The head matrix's role: wte when tied, else lm_head.
bool is_head_matrix(const ModelDesc& d, const ParamSlice& s) {
  return d.tie_embeddings ? s.role == kTokEmb : s.role == kLmHead;
}

double rel_diff(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

class ChunkedLmHead : public ::testing::TestWithParam<HeadCase> {};

}  // namespace

TEST_P(ChunkedLmHead, EqualsOneChunkOfAllRows) {
  const HeadCase& c = GetParam();
  const HeadRun whole = run_head(c, kN);
  EXPECT_EQ(whole.lm_rows, kN);
  // The default (0: a 256 MiB budget) is one chunk at this size: the same bits (Exact: the same calls).
  const HeadRun dflt = run_head(c, 0);
  EXPECT_EQ(dflt.lm_rows, kN);
  EXPECT_EQ(dflt.grads, whole.grads);
  const ModelDesc d = head_desc(c, kN);
  // Bounds (see the top): a row's loss within 2 (2 gamma_C M) + 2 e_xent of the other, M its
  // logits' magnitude and e_xent = gamma_V + u (6 + 6 M + 4 ln V) a bound on the cross-entropy's
  // own rounding of logits within M of 0 (test_cpu_ops.cpp xent_err: the sum of V exps, logf, the
  // max's and the target's subtractions); the mean loss within their mean and its own sum's
  // gamma_N; each gradient tensor within 2 gamma_K of its magnitude (K the step's longest sum), in
  // bf16 within 2 u_bf = 2^-7 of it (the head's logits gradient rounded to bf16, so each of its
  // values may round to the other neighbour: a 2u_bf change of each term of dxf's and dW's sums).
  const double u = kUnitFp32, V = d.vocab_size, C = d.d_model;
  std::vector<double> row_bound(kN);
  double mean_bound = 0.0;
  for (int i = 0; i < kN; i++) {
    const double M = whole.logit_mag[i], e_xent = gamma_n(V) + u * (6.0 + 6.0 * M + 4.0 * std::log(V));
    row_bound[i] = 4.0 * gamma_n(C) * M + 2.0 * e_xent;
    mean_bound += row_bound[i] / kN;
  }
  mean_bound += 2.0 * gamma_n(kN) * whole.loss;
  Model mm(d, cpu_ops(), ModelPart::whole(), c.precision);
  mm.init_params(3);
  const RandomBatch rb(d, kB, kT, 17);
  const std::vector<double> mag = test::gradient_magnitude(mm, rb.b, kB, kT);
  const double grad_bound = c.precision == GemmPrecision::bf16 ? 2.0 * kUnitBf16 : 2.0 * gamma_n(test::longest_sum(d, kB, kT));
  for (int R : {1, 5, 7, 16, 63}) {
    SCOPED_TRACE("chunk rows " + std::to_string(R));
    const HeadRun ch = run_head(c, R);
    EXPECT_EQ(ch.lm_rows, R);
    ASSERT_EQ(ch.row_losses.size(), (size_t)kN);
    EXPECT_TRUE(test::within_bound(ch.row_losses, test::to_double(whole.row_losses), row_bound, "row losses"));
    EXPECT_LE(std::fabs(ch.loss - whole.loss), mean_bound) << ch.loss << " vs " << whole.loss;
    bool head_seen = false;
    for (const ParamSlice& s : ch.slices) head_seen |= is_head_matrix(d, s);
    EXPECT_TRUE(test::gradients_within(mm.table, ch.grads, whole.grads, mag, grad_bound,
                                       std::string(c.name) + " R=" + std::to_string(R)));
    EXPECT_TRUE(head_seen);
    // The logits buffer shrinks from N to R rows of the padded stride lm_logits_row_stride(V)
    // (V = 97: 128), and in bf16 so does the logits gradient's bf16 chunk (in floats, each tensor
    // 64-float aligned).
    auto aligned64 = [](size_t n) { return (n + 63) / 64 * 64; };
    const size_t ld = (size_t)lm_logits_row_stride(d.vocab_size);
    const size_t a16 = aligned64((size_t)R * ld);
    const size_t w16 = (size_t)kN * ld;
    auto grad16 = [&](size_t rows) {
      return c.precision == GemmPrecision::bf16 ? aligned64((rows * ld + 1) / 2) : 0;
    };
    EXPECT_EQ(whole.act_bytes - ch.act_bytes, (w16 - a16 + grad16(kN) - grad16(R)) * sizeof(float));
    EXPECT_EQ(ch.act_bytes + kN * sizeof(float), activation_bytes(head_desc(c, R), kB, kT, c.precision))
        << "the estimate (which adds the host loss row) differs from the allocation";
  }
  bool any = false;
  for (float g : whole.grads) any |= g != 0.0f;
  EXPECT_TRUE(any);
}

INSTANTIATE_TEST_SUITE_P(Families, ChunkedLmHead, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<HeadCase>& i) { return std::string(i.param.name); });

// The chunk count follows the byte budget, and is clamped to [1, N].
TEST(ChunkedLmHeadRows, FollowTheBudget) {
  ModelDesc d = desc_of("gpt2", 1, 2, 32, 8, 50257);
  EXPECT_EQ(lm_head_chunk_rows(d, 65536), (int)(kLmHeadChunkBytes / (4 * 50304)));  // rows padded to 50304
  EXPECT_EQ(lm_head_chunk_rows(d, 100), 100);
  d.lm_head_chunk_rows = 3;
  EXPECT_EQ(lm_head_chunk_rows(d, 100), 3);
  EXPECT_EQ(lm_head_chunk_rows(d, 2), 2);
  // Every part of a pipeline holding the head allocates the chunk, the others none.
  const ModelPart head_part{1, 1, false, true}, body{0, 1, true, false};
  d.lm_head_chunk_rows = 5;
  Model mh(d, cpu_ops(), head_part), mb(d, cpu_ops(), body);
  Activations ah(mh, 2, 8), ab(mb, 2, 8);
  EXPECT_EQ(ah.lm_rows, 5);
  EXPECT_EQ(ab.lm_rows, 0);
  // (the estimate also counts the host loss row, 16 floats)
  EXPECT_EQ(ah.bytes() + 16 * sizeof(float), activation_bytes(d, head_part, 2, 8));
  EXPECT_EQ(ab.bytes() + 16 * sizeof(float), activation_bytes(d, body, 2, 8));
}

// Generation reads every row's logits: all_logits makes one chunk of all rows, whose logits equal
// the last chunk's rows of a chunked forward (to an ulp or two: the GEMM on 1 row vs 16, above).
// Bound: each logit two orders of a C-long dot product, within 2 gamma_C of its magnitude
// Σ_c |xf_c W_jc| of the other; the loss as in EqualsOneChunkOfAllRows.
TEST(ChunkedLmHeadRows, AllLogitsKeepsEveryRow) {
  ModelDesc d = desc_of("gpt2", 1, 2, 32, 8, 53);
  d.lm_head_chunk_rows = 5;
  RandomBatch rb(d, 2, 8, 4);
  Model m(d, cpu_ops());
  m.init_params(9);
  Activations all, chunked;
  all.all_logits = true;
  const float l1 = m.forward(all, rb.b, HeadMode::eval), l2 = m.forward(chunked, rb.b, HeadMode::eval);
  const int C = d.d_model, V = d.vocab_size;
  const float* W = m.params + m.table.at("wte.weight").offset;
  std::vector<double> logit_bound(V);
  double loss_bound = 2.0 * gamma_n(16) * l1;
  for (int n = 0; n < 16; n++) {
    double M = 0.0;
    for (int j = 0; j < V; j++) {
      double acc = 0.0;
      for (int c = 0; c < C; c++) acc += std::fabs(static_cast<double>(all.final_norm[n * C + c]) * W[j * C + c]);
      M = std::max(M, acc);
      if (n == 15) logit_bound[j] = 2.0 * gamma_n(C) * acc;
    }
    loss_bound += (4.0 * gamma_n(C) * M + 2.0 * (gamma_n(V) + kUnitFp32 * (6.0 + 6.0 * M + 4.0 * std::log(V)))) / 16;
  }
  EXPECT_LE(std::fabs(l1 - l2), loss_bound);
  EXPECT_EQ(all.lm_rows, 16);
  EXPECT_EQ(chunked.lm_rows, 5);
  // 16 = 3·5 + 1: the last chunk is row 15 alone.
  EXPECT_TRUE(test::within_bound(chunked.logits, std::vector<double>(all.logits + 15 * 53, all.logits + 16 * 53).data(),
                                 logit_bound.data(), 53, "row 15's logits"));
  // not another row's (row 14 holds another token: its logits differ by their values, far beyond rounding)
  EXPECT_GT(rel_diff(chunked.logits, all.logits + 14 * 53, 53), 1e-2);
  EXPECT_THROW(m.predictions(chunked), Error);
  EXPECT_EQ(m.predictions(all).size(), 16u);
  // head_backward needs a forward with need_grad
  EXPECT_THROW(m.backward(chunked), Error);
}

TEST(ChunkedLmHeadRows, ConfigKeyIsValidated) {
  const Config c = parse_config("{}", "test", {"data.train=-", "runtime.lm_head_chunk_rows=12"});
  EXPECT_EQ(c.runtime.lm_head_chunk_rows, 12);
  try {
    parse_config("{}", "test", {"data.train=-", "runtime.lm_head_chunk_rows=-1"});
    ADD_FAILURE() << "a negative chunk row count was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runtime.lm_head_chunk_rows"), std::string::npos) << e.what();
  }
}

// The fused head (transformer.h "Fused LM head") runs lm_head_backward_chunks' ops in its order
// inside the forward: the same bits as the recomputing head, at every chunk size (one chunk: no
// recompute either way). Exact: the same ops on the same values in the same order.
TEST_P(ChunkedLmHead, FusedEqualsRecomputedBitForBit) {
  const HeadCase& c = GetParam();
  for (int R : {1, 7, 16, 63, kN}) {
    SCOPED_TRACE("chunk rows " + std::to_string(R));
    const HeadRun rec = run_head(c, R), fus = run_head(c, R, cpu_ops(), true);
    EXPECT_EQ(fus.loss, rec.loss);
    EXPECT_EQ(fus.row_losses, rec.row_losses);
    EXPECT_EQ(fus.grads, rec.grads);
    EXPECT_EQ(fus.act_bytes, rec.act_bytes);  // no memory of its own: d xf lives in backward scratch
  }
}

// A classifier (bert) has no LM head to fuse: HeadMode::fused is HeadMode::train (Exact: the
// same calls).
TEST(FusedLmHead, ClassifierHeadIsTheUnfusedForward) {
  ModelDesc d = desc_of("bert", 2, 2, 32, kT, 97);
  RandomBatch rb(d, kB, kT, 5);
  std::vector<float> g[2];
  float loss[2];
  for (int k = 0; k < 2; k++) {
    Model m(d, cpu_ops());
    m.init_params(3);
    m.zero_grads();
    Activations a(m, kB, kT);
    loss[k] = k ? m.forward(a, rb.b, HeadMode::fused) : m.forward(a, rb.b, HeadMode::train);
    EXPECT_NE(a.head_pass.mode, HeadMode::fused);
    m.backward(a);
    g[k] = m.grads_host();
  }
  EXPECT_EQ(loss[1], loss[0]);
  EXPECT_EQ(g[1], g[0]);
}

// The fused head's d xf waits in the Activations (tmp), so micro-batches may interleave, as a
// pipeline's F and B do: two training forwards, then the two backwards, add what forward +
// backward of each in turn adds with the recomputing head (the same order of additions into
// every tensor: llama's lm_head is its own; a tied wte held with the embedding would get the
// heads' and the embeddings' additions in another order — the pipeline's stages never hold both).
// An input-only backward after a fused forward (the head's dW is added already) is refused. Exact:
// the same ops, and the same additions into each tensor in the same order.
TEST(FusedLmHead, InterleavedMicroBatchesEqualTheRecomputingHead) {
  const ModelDesc d = head_desc(kCases[2], 7);  // llama, untied
  RandomBatch b0(d, kB, kT, 17), b1(d, kB, kT, 18);
  Model fused(d, cpu_ops()), rec(d, cpu_ops());
  for (Model* m : {&fused, &rec}) {
    m->init_params(3);
    m->zero_grads();
  }
  Activations f0(fused, kB, kT), f1(fused, kB, kT), r0(rec, kB, kT), r1(rec, kB, kT);
  const float lf0 = fused.forward(f0, b0.b, HeadMode::fused, 0.5f), lf1 = fused.forward(f1, b1.b, HeadMode::fused, 0.5f);
  fused.backward(f0);
  fused.backward(f1);
  const float lr0 = rec.forward(r0, b0.b, HeadMode::train, 0.5f), lr1 = rec.forward(r1, b1.b, HeadMode::train, 0.5f);
  rec.backward(r0);
  rec.backward(r1);
  EXPECT_EQ(lf0, lr0);
  EXPECT_EQ(lf1, lr1);
  EXPECT_EQ(fused.grads_host(), rec.grads_host());
  fused.forward(f0, b0.b, HeadMode::fused);
  fused.begin_backward(f0, BackwardMode::input_only);
  EXPECT_THROW(fused.head_backward(f0, {}), Error);
  // A later plain forward clears the fused state: its backward recomputes as usual.
  rec.forward(r0, b0.b, HeadMode::train);
  EXPECT_NE(r0.head_pass.mode, HeadMode::fused);
  rec.forward(r1, b0.b, HeadMode::fused);
  EXPECT_EQ(r1.head_pass.mode, HeadMode::fused);
  rec.forward(r1, b0.b, HeadMode::train);
  EXPECT_NE(r1.head_pass.mode, HeadMode::fused);
}

// Bound of a model step on the GPU against the CPU: cuBLAS and OpenBLAS (and every kernel against
// its CPU op) sum in other orders, so in fp32 every gradient tensor is within 2 gamma_K of the
// magnitude of what it sums, and the loss of the magnitudes it sums, its own and twice its logits'
// (loss_bound's form: the logits' rounding moves lse(z) - z_y) (K the step's longest sum; the
// kernels' expf and tanhf add a few u, far below it); in bf16 an order difference may flip a bf16
// rounding of a GEMM operand, a 2u_bf change of its products: 2u_bf = 2^-7 of the magnitudes.
double backend_bound(const HeadCase& c) {
  return c.precision == GemmPrecision::bf16 ? 2.0 * kUnitBf16 : 2.0 * gamma_n(test::longest_sum(head_desc(c, 7), kB, kT));
}

// The loss's: backend_bound of its own magnitude and twice its logits' (run_head's model and batch).
double backend_loss_bound(const HeadCase& c, double loss) {
  const ModelDesc d = head_desc(c, 7);
  Model m(d, cpu_ops(), ModelPart::whole(), c.precision);
  m.init_params(3);
  const RandomBatch rb(d, kB, kT, 17);
  const std::vector<double> P(m.params, m.params + m.table.numel);
  return backend_bound(c) * (std::fabs(loss) + 2.0 * test::RefTransformer{d, m.table}.logit_magnitude(P, rb.b));
}

// The CUDA backend runs the same chunked head: its loss and gradients against the CPU's, within
// backend_bound of the magnitudes.
TEST(ChunkedLmHeadCuda, MatchesCpu) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (const HeadCase& c : kCases) {
    SCOPED_TRACE(c.name);
    const HeadRun cpu = run_head(c, 7), gpu = run_head(c, 7, cuda_ops());
    const ModelDesc d = head_desc(c, 7);
    Model m(d, cpu_ops(), ModelPart::whole(), c.precision);
    m.init_params(3);
    const RandomBatch rb(d, kB, kT, 17);
    EXPECT_LE(std::fabs(gpu.loss - cpu.loss), backend_loss_bound(c, cpu.loss));
    EXPECT_TRUE(test::gradients_within(m.table, gpu.grads, cpu.grads, test::gradient_magnitude(m, rb.b, kB, kT),
                                       backend_bound(c), c.name));
  }
}

// On a GPU the fused head is the recomputing head's ops in its order: the same bits as the CUDA
// recomputing head (Exact: cuBLAS is deterministic for one shape on one stream), and within
// backend_bound of the CPU's fused head.
TEST(ChunkedLmHeadCuda, FusedEqualsRecomputed) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (const HeadCase& c : kCases) {
    SCOPED_TRACE(c.name);
    const HeadRun rec = run_head(c, 7, cuda_ops()), fus = run_head(c, 7, cuda_ops(), true);
    EXPECT_EQ(fus.loss, rec.loss);
    EXPECT_EQ(fus.row_losses, rec.row_losses);
    EXPECT_EQ(fus.grads, rec.grads);
    const HeadRun cpu = run_head(c, 7, cpu_ops(), true);
    EXPECT_LE(std::fabs(fus.loss - cpu.loss), backend_loss_bound(c, cpu.loss));
  }
}
