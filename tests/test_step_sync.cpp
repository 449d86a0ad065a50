// A training step without host synchronisation, on the CPU backend (the oracle; the CUDA
// counterparts are in test_cuda_step_sync.cpp):
//   - softmax_xent_record: the same losses and gradients as softmax_xent, bad targets recorded
//     (first row wins, across calls) instead of thrown;
//   - sum_squares_add / sum_to_double: the same doubles as sum_squares / the host's row-order sum;
//   - adamw/sgd_update_segments with a clip factor: the same bits as scale() then the per-run
//     adamw_update / sgd_update the optimizer made before, gradients left unscaled;
//   - Model::forward_queued + read_scalars: forward()'s loss, bit for bit, in one readback, and the
//     bad-target error from the readback;
//   - the trainer's single-model step reads back exactly once per step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "grad_check.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "mpi_test_data.h"
#include "optim/optimizer.h"
#include "train/trainer.h"

using namespace llmpi;
using llmpi::test::random_floats;
using llmpi::test::random_ints;

namespace {

const Ops& ops() { return cpu_ops(); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST(StepSync, BadTargetKeyKeepsTheFirstRow) {
  EXPECT_GT(encode_bad_target(3, 7), encode_bad_target(5, 0)) << "an earlier row must give a larger key";
  EXPECT_GT(encode_bad_target(0, 2147483647), encode_bad_target(1, -1));
  EXPECT_NE(encode_bad_target(2147483647, -1), 0u) << "0 means no bad target";
  for (int row : {0, 1, 77, 2147483647})
    for (int32_t t : {-2147483647 - 1, -1, 0, 50257, 2147483647}) {
      EXPECT_EQ(bad_target_row(encode_bad_target(row, t)), row);
      EXPECT_EQ(bad_target_value(encode_bad_target(row, t)), t);
    }
}

TEST(StepSync, SoftmaxXentRecordEqualsSoftmaxXent) {
  const int N = 9, V = 1001;
  const auto z = random_floats((size_t)N * V, 11, -5.0f, 5.0f);
  const auto y = random_ints(N, 12, 0, V);
  for (float gs : {0.0f, 0.25f}) {
    std::vector<float> z1 = z, z2 = z, l1(N), l2(N);
    ops().softmax_xent(z1.data(), l1.data(), y.data(), N, V, gs);
    uint64_t bad = 0;
    ops().softmax_xent_record(z2.data(), V, l2.data(), y.data(), N, V, gs, &bad, 100);
    EXPECT_EQ(bad, 0u);
    // Exact: the recording variant runs softmax_xent's arithmetic on every good row
    EXPECT_TRUE(same_bits(l1, l2)) << "losses, grad_scale " << gs;
    EXPECT_TRUE(same_bits(z1, z2)) << "gradients, grad_scale " << gs;
  }
}

TEST(StepSync, SoftmaxXentRecordNotesTheFirstBadRowAcrossCalls) {
  const int N = 6, V = 10;
  const auto z = random_floats((size_t)N * V, 13);
  std::vector<int32_t> y = {1, 2, 3, 4, 5, 6};
  std::vector<float> zz = z, l(N);
  uint64_t bad = 0;
  // chunk 1 (rows 6..11): rows 6 + 4 = 10 and 6 + 2 bad
  y[2] = 10, y[4] = -3;
  ops().softmax_xent_record(zz.data(), V, l.data(), y.data(), N, V, 1.0f, &bad, 6);
  ASSERT_NE(bad, 0u);
  EXPECT_EQ(bad_target_row(bad), 8);
  EXPECT_EQ(bad_target_value(bad), 10);
  EXPECT_TRUE(std::isnan(l[2]) && std::isnan(l[4]));
  for (int n : {2, 4})  // Exact: untouched
    for (int j = 0; j < V; j++) EXPECT_EQ(zz[(size_t)n * V + j], z[(size_t)n * V + j]) << "bad row's logits untouched";
  // the good rows are what softmax_xent gives them (Exact: its arithmetic, row by row)
  std::vector<int32_t> yg = y;
  yg[2] = 0, yg[4] = 0;
  std::vector<float> zr = z, lr(N);
  ops().softmax_xent(zr.data(), lr.data(), yg.data(), N, V, 1.0f);
  for (int n : {0, 1, 3, 5}) {
    EXPECT_EQ(l[n], lr[n]) << n;
    for (int j = 0; j < V; j++) EXPECT_EQ(zz[(size_t)n * V + j], zr[(size_t)n * V + j]);
  }
  // chunk 0 (rows 0..5) reported later: its bad row 1 is the first
  std::vector<int32_t> y0 = {0, 99, 0, 0, 0, 0};
  zz = z;
  ops().softmax_xent_record(zz.data(), V, l.data(), y0.data(), N, V, 0.0f, &bad, 0);
  EXPECT_EQ(bad_target_row(bad), 1);
  EXPECT_EQ(bad_target_value(bad), 99);
  // a later chunk does not displace it
  ops().softmax_xent_record(zz.data(), V, l.data(), y.data(), N, V, 0.0f, &bad, 12);
  EXPECT_EQ(bad_target_row(bad), 1);
}

TEST(StepSync, SumSquaresAddAndSumToDoubleAreTheHostSums) {
  for (size_t n : {size_t(0), size_t(1), size_t(1000), size_t(3 * 65536 + 17)}) {
    const auto x = random_floats(n, 14, -3.0f, 3.0f);
    // Exact: sum_squares's double added once to acc; sum_to_double is that very loop.
    double acc = 0.0;
    ops().sum_squares_add(&acc, x.data(), n);
    EXPECT_TRUE(same_bits(acc, ops().sum_squares(x.data(), n))) << n;
    double acc2 = 1.5;
    ops().sum_squares_add(&acc2, x.data(), n);
    EXPECT_TRUE(same_bits(acc2, 1.5 + ops().sum_squares(x.data(), n))) << n;
    double s = -7.0, ref = 0.0;
    ops().sum_to_double(&s, x.data(), n);
    for (size_t i = 0; i < n; i++) ref += x[i];  // the loop the loss was summed with on the host
    EXPECT_TRUE(same_bits(s, ref)) << n;
  }
}

TEST(StepSync, UpdateSegmentsTileTheRangeByDecayRuns) {
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 64, 16, 300);
  const ParamTable t = build_param_table(d);
  for (auto [lo, hi] : {std::pair<size_t, size_t>{0, t.numel}, {1000, t.numel - 77}, {5, 6}, {t.numel, t.numel}}) {
    const auto segs = update_segments(t, lo, hi, 40);
    size_t at = lo;
    for (const UpdateSegment& s : segs) {
      EXPECT_EQ(s.offset, at);
      EXPECT_EQ(s.state_offset, 40 + (at - lo));
      EXPECT_GT(s.n, 0u);
      EXPECT_LE(s.n, kUpdateSegmentMax);
      for (const ParamSlice& sl : t.slices)  // every element has its slice's decay flag
        if (sl.offset < s.offset + s.n && s.offset < sl.offset + sl.numel) {
          EXPECT_EQ(s.decay != 0, sl.decay) << sl.name;
        }
      at += s.n;
    }
    EXPECT_EQ(at, hi) << "segments cover [" << lo << ", " << hi << ")";
  }
}

// The optimizer's arithmetic before the multi-tensor ops: grads scaled in place by the clip factor
// (when clipping), then one adamw_update / sgd_update per run of slices with the same decay flag.
void reference_update(bool sgd, float* p, float* g, float* m, float* v, const ParamTable& t, float clip, float lr,
                      const TrainConfig& tc, int step) {
  if (clip != 1.0f) ops().scale(g, clip, t.numel);
  size_t i = 0;
  while (i < t.slices.size()) {
    size_t j = i;
    while (j + 1 < t.slices.size() && t.slices[j + 1].decay == t.slices[i].decay) j++;
    const size_t off = t.slices[i].offset, end = t.slices[j].offset + t.slices[j].numel;
    const float wd = t.slices[i].decay ? (float)tc.weight_decay : 0.0f;
    if (sgd)
      ops().sgd_update(p + off, g + off, end - off, lr, wd);
    else
      ops().adamw_update(p + off, g + off, m + off, v + off, end - off, lr, (float)tc.beta1, (float)tc.beta2,
                         (float)tc.eps, wd, step);
    i = j + 1;
  }
}

TEST(StepSync, SegmentUpdatesWithFoldedClipEqualScaleThenUpdate) {
  // A model with a 4800 x 64 embedding: runs longer than one segment (65536).
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 64, 16, 4800);
  const ParamTable t = build_param_table(d);
  TrainConfig tc;
  tc.weight_decay = 0.1, tc.beta1 = 0.9, tc.beta2 = 0.95, tc.eps = 1e-8;  // (TrainConfig has no defaults)
  for (bool sgd : {false, true})
    for (float clip : {1.0f, 0.37f, 3.0e-3f}) {
      const auto p0 = random_floats(t.numel, 15);
      std::vector<float> pr = p0, pn = p0, mr(t.numel), vr(t.numel);
      Optimizer opt(ops(), t.numel, sgd ? OptimizerKind::sgd : OptimizerKind::adamw);
      for (int step = 1; step <= 3; step++) {
        const auto g = random_floats(t.numel, 16 + step, -2.0f, 2.0f);
        std::vector<float> gr = g, gn = g;
        reference_update(sgd, pr.data(), gr.data(), mr.data(), vr.data(), t, clip, 1e-2f, tc, step);
        opt.step(pn.data(), gn.data(), t, 1e-2, tc, clip);
        // Exact: the folded clip multiplies each gradient by the same float before the same update
        EXPECT_TRUE(same_bits(gn, g)) << "the gradients are read, not scaled in place";
        EXPECT_TRUE(same_bits(pn, pr)) << (sgd ? "sgd" : "adamw") << " clip " << clip << " step " << step;
        if (!sgd) {
          EXPECT_TRUE(same_bits(std::vector<float>(opt.m, opt.m + t.numel), mr)) << "m, clip " << clip;
          EXPECT_TRUE(same_bits(std::vector<float>(opt.v, opt.v + t.numel), vr)) << "v, clip " << clip;
        }
      }
    }
}

TEST(StepSync, ForwardQueuedReadsTheLossBackOnce) {
  for (const char* fam : {"gpt2", "bert"}) {
    const bool bert = std::string(fam) == "bert";  // a classifier head
    ModelDesc d = test::desc_of(fam, 2, 2, 32, 8, 50, bert ? std::vector<std::string>{"model.num_labels=3"}
                                                           : std::vector<std::string>{});
    d.lm_head_chunk_rows = 5;  // several chunks of the LM head
    Model m(d, ops());
    m.init_params(3);
    test::RandomBatch rb(d, 3, 8, 4);
    Activations a1, a2;
    const float want = m.forward(a1, rb.b, HeadMode::train);
    const uint64_t before = ops().readback_count();
    m.forward_queued(a2, rb.b, HeadMode::train);
    EXPECT_EQ(ops().readback_count(), before) << fam << ": forward_queued reads nothing back";
    const StepScalars s = m.read_scalars(a2);
    EXPECT_EQ(ops().readback_count(), before + 1) << fam;
    const float got = m.loss_of(s, a2);
    // Exact: the same forward, its loss sum read back instead of returned
    EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << fam << ": " << got << " vs " << want;
    EXPECT_EQ(s.bad_target, 0u);
  }
}

TEST(StepSync, ReadScalarsReportsABadTarget) {
  ModelDesc d = test::desc_of("gpt2", 1, 2, 32, 8, 50);
  d.lm_head_chunk_rows = 5;
  Model m(d, ops());
  m.init_params(3);
  test::RandomBatch rb(d, 2, 8, 5);
  Activations a;
  m.forward_queued(a, rb.b, HeadMode::train);
  // Past load_batch's host check: a target outside the vocabulary written straight into the
  // activations (as a caller that fills them itself could), then the head again.
  const int32_t bad = 57;
  ops().copy_to_device(a.targets + 11, &bad, sizeof bad);
  m.head_forward(a, HeadMode::train);
  try {
    m.read_scalars(a);
    ADD_FAILURE() << "no error for target 57 at row 11";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 57 at row 11 is outside the vocabulary [0, 50)"), std::string::npos)
        << e.what();
  }
  // The next forward clears the flag.
  m.forward_queued(a, rb.b, HeadMode::train);
  EXPECT_EQ(m.read_scalars(a).bad_target, 0u);
}

// The trainer's single-model step: exactly one readback per step (the loss, the gradient's sum of
// squares and the bad-target flag together), counted over the steps of two runs that differ only in
// their length (set-up and the end of a run are the same in both).
TEST(StepSync, TrainerReadsBackOncePerStep) {
  using namespace testing_support;
  const std::string dir = shared_temp_dir(MPI_COMM_SELF);
  const std::string tr = make_pattern_file(MPI_COMM_SELF, dir, "train.h5", 20000, 64, 7);
  for (const char* extra : {"train.grad_clip=1.0", "train.grad_clip=1e-3", "train.optimizer=sgd"}) {
    uint64_t per_run[2];
    for (int k = 0; k < 2; k++) {
      const Config cfg = tiny_config(tr, {"model.vocab_size=0", "train.steps=" + std::to_string(k ? 7 : 3), extra,
                                          "train.warmup_steps=1"});
      const uint64_t before = ops().readback_count();
      const TrainResult r = train(cfg, MPI_COMM_SELF, quiet_options(false));
      ASSERT_EQ(r.losses.size(), k ? 7u : 3u);
      per_run[k] = ops().readback_count() - before;
    }
    EXPECT_EQ(per_run[1] - per_run[0], 4u) << extra << ": readbacks per step != 1";
  }
}

// ---- the clip factor and the non-finite skip decided by the update itself (world size 1) ----

namespace {

// The step's scalars as the trainer's ops leave them: the loss sum, Σg² of the gradient.
StepScalars scalars_of(const std::vector<float>& g, double loss_sum = 123.25) {
  StepScalars s;
  s.loss_sum = loss_sum;
  s.grad_sumsq = ops().sum_squares(g.data(), g.size());
  return s;
}

}  // namespace

TEST(StepSync, ClipFactorIsOneDefinitionForHostAndDevice) {
  // clip_factor (the host's) and clip_factor_of (the kernels') agree, and the formula is the
  // documented one: max_norm/norm rounded once to float, only when clipping applies.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (double norm : {0.0, 1e-3, 0.5, 1.0, 1.0000001, 3.7, 1e30, inf, nan})
    for (double max_norm : {0.0, -1.0, 1e-3, 1.0, 2.5}) {
      // Exact: one definition, max_norm/norm in double rounded once to float
      const float got = clip_factor(norm, max_norm), kernels = clip_factor_of(norm, max_norm);
      EXPECT_EQ(std::memcmp(&got, &kernels, sizeof got), 0);
      const bool clips = max_norm > 0 && norm > max_norm && norm != inf && norm == norm;
      const float want = clips ? (float)(max_norm / norm) : 1.0f;
      EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << norm << " " << max_norm;
    }
  StepScalars s;
  s.grad_sumsq = 13.69;  // norm 3.7
  EXPECT_EQ(clip_factor_of(s, 1.0), clip_factor(std::sqrt(13.69), 1.0));  // Exact: the same sqrt and quotient
  EXPECT_LT(clip_factor_of(s, 1.0), 1.0f);
}

TEST(StepSync, UpdateAllowedOnlyForAFiniteStepWithGoodTargets) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  StepScalars s;
  s.loss_sum = 10.0, s.grad_sumsq = 4.0;
  EXPECT_TRUE(update_allowed(s));
  for (double bad : {inf, -inf, nan}) {
    StepScalars a = s, b = s;
    a.loss_sum = bad;
    b.grad_sumsq = bad;
    EXPECT_FALSE(update_allowed(a)) << "loss sum " << bad;
    EXPECT_FALSE(update_allowed(b)) << "sum of squares " << bad;
  }
  StepScalars c = s;
  c.bad_target = encode_bad_target(3, 99);
  EXPECT_FALSE(update_allowed(c));
}

// adamw/sgd_update_segments given the step's scalars (the device path) against the host path:
// clip_factor(sqrt(Σg²), max_norm) computed on the host and passed as grad_scale. Bit for bit, for
// clipping off (max_norm 0), inactive (max_norm above the norm) and active, with and without
// weight decay, over several steps (AdamW's moments carried).
TEST(StepSync, DeviceScalarUpdateEqualsHostClipFactor) {
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 64, 16, 4800);  // runs longer than one segment
  const ParamTable t = build_param_table(d);
  const size_t n = t.numel;
  const auto segs = update_segments(t, 0, n, 0);
  const int ns = (int)segs.size();
  for (bool sgd : {false, true})
    for (float wd : {0.0f, 0.1f})
      for (double max_norm : {0.0, 1e6, 1.0}) {
        const std::string what = std::string(sgd ? "sgd" : "adamw") + " wd " + std::to_string(wd) + " max_norm " +
                                 std::to_string(max_norm);
        const auto p0 = random_floats(n, 71);
        std::vector<float> ph = p0, pd = p0, mh(n), vh(n), md(n), vd(n);
        for (int step = 1; step <= 3; step++) {
          const auto g = random_floats(n, 72 + step, -2.0f, 2.0f);
          const StepScalars sc = scalars_of(g);
          const float clip = clip_factor(std::sqrt(sc.grad_sumsq), max_norm);
          if (max_norm == 1.0) {
            EXPECT_LT(clip, 1.0f) << "the clip must be active here";
          } else {
            EXPECT_EQ(clip, 1.0f);  // Exact: without clipping the factor is 1.0f itself
          }
          if (sgd) {
            ops().sgd_update_segments(ph.data(), g.data(), segs.data(), ns, clip, nullptr, 0.0, 1e-2f, wd);
            // grad_scale is ignored when the scalars are given: a wrong one must not matter
            ops().sgd_update_segments(pd.data(), g.data(), segs.data(), ns, 0.5f, &sc, max_norm, 1e-2f, wd);
          } else {
            ops().adamw_update_segments(ph.data(), g.data(), mh.data(), vh.data(), segs.data(), ns, clip, nullptr, 0.0,
                                        1e-2f, 0.9f, 0.95f, 1e-8f, wd, step);
            ops().adamw_update_segments(pd.data(), g.data(), md.data(), vd.data(), segs.data(), ns, 0.5f, &sc,
                                        max_norm, 1e-2f, 0.9f, 0.95f, 1e-8f, wd, step);
          }
          // Exact: the update computes the same clip factor from the same Σg², then the same update
          EXPECT_TRUE(same_bits(pd, ph)) << what << " step " << step;
          EXPECT_FALSE(same_bits(pd, p0)) << what << ": an update happened";
          if (!sgd) {
            EXPECT_TRUE(same_bits(md, mh)) << what << " m, step " << step;
            EXPECT_TRUE(same_bits(vd, vh)) << what << " v, step " << step;
          }
        }
      }
}

// A step whose loss sum or gradient sum of squares is not finite (or that recorded a bad target)
// leaves parameters and moments as they were, bit for bit — after real steps, so the moments are
// not zero.
TEST(StepSync, DeviceScalarUpdateSkipsANonFiniteStep) {
  const ModelDesc d = test::desc_of("gpt2", 1, 2, 32, 8, 300);
  const ParamTable t = build_param_table(d);
  const size_t n = t.numel;
  const auto segs = update_segments(t, 0, n, 0);
  const int ns = (int)segs.size();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (bool sgd : {false, true}) {
    std::vector<float> p = random_floats(n, 81), m(n), v(n);
    for (int step = 1; step <= 2; step++) {  // real steps first
      const auto g = random_floats(n, 82 + step, -1.0f, 1.0f);
      const StepScalars sc = scalars_of(g);
      if (sgd)
        ops().sgd_update_segments(p.data(), g.data(), segs.data(), ns, 1.0f, &sc, 1.0, 1e-2f, 0.1f);
      else
        ops().adamw_update_segments(p.data(), g.data(), m.data(), v.data(), segs.data(), ns, 1.0f, &sc, 1.0, 1e-2f,
                                    0.9f, 0.95f, 1e-8f, 0.1f, step);
    }
    auto g = random_floats(n, 90, -1.0f, 1.0f);
    g[n / 2] = std::numeric_limits<float>::quiet_NaN();  // as a gradient of a blown-up step would be
    std::vector<StepScalars> bad(6, scalars_of(random_floats(n, 91)));
    bad[0].grad_sumsq = nan, bad[1].grad_sumsq = inf, bad[2].loss_sum = nan, bad[3].loss_sum = inf,
    bad[4].loss_sum = -inf, bad[5].bad_target = encode_bad_target(0, -1);
    for (size_t k = 0; k < bad.size(); k++) {
      const std::vector<float> p0 = p, m0 = m, v0 = v;
      if (sgd)
        ops().sgd_update_segments(p.data(), g.data(), segs.data(), ns, 1.0f, &bad[k], 1.0, 1e-2f, 0.1f);
      else
        ops().adamw_update_segments(p.data(), g.data(), m.data(), v.data(), segs.data(), ns, 1.0f, &bad[k], 1.0,
                                    1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
      // Exact: a skipped step writes nothing
      EXPECT_TRUE(same_bits(p, p0)) << (sgd ? "sgd" : "adamw") << " case " << k << ": parameters written";
      EXPECT_TRUE(same_bits(m, m0)) << "case " << k << ": m written";
      EXPECT_TRUE(same_bits(v, v0)) << "case " << k << ": v written";
    }
    // The same gradient with finite scalars is applied (the skip above was the scalars' doing).
    const StepScalars ok = scalars_of(random_floats(n, 91));
    const std::vector<float> p0 = p;
    if (sgd)
      ops().sgd_update_segments(p.data(), g.data(), segs.data(), ns, 1.0f, &ok, 1.0, 1e-2f, 0.1f);
    else
      ops().adamw_update_segments(p.data(), g.data(), m.data(), v.data(), segs.data(), ns, 1.0f, &ok, 1.0, 1e-2f,
                                  0.9f, 0.95f, 1e-8f, 0.1f, 3);
    EXPECT_FALSE(same_bits(p, p0));
  }
}

// Optimizer::step_on_device is Optimizer::step with the host's clip factor; a step the device
// skipped, taken back with unstep, leaves t — and so the next step's bias correction — as if
// it had never been started (what the host path does: it never calls step on a skipped step).
TEST(StepSync, OptimizerStepOnDeviceAndUnstepKeepTheBiasCorrection) {
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 64, 16, 300);
  const ParamTable t = build_param_table(d);
  const size_t n = t.numel;
  TrainConfig tc;
  tc.weight_decay = 0.1, tc.beta1 = 0.9, tc.beta2 = 0.95, tc.eps = 1e-8;
  tc.grad_clip = 1.0;
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd}) {
    const auto p0 = random_floats(n, 101);
    std::vector<float> ph = p0, pd = p0, pn = p0;
    Optimizer host(ops(), n, kind), dev(ops(), n, kind), no_unstep(ops(), n, kind);
    const double inf = std::numeric_limits<double>::infinity();
    for (int s = 0; s < 5; s++) {
      const auto g = random_floats(n, 102 + s, -2.0f, 2.0f);
      StepScalars sc = scalars_of(g);
      const bool skipped = s == 1 || s == 2;  // two non-finite steps in a row
      if (skipped) sc.grad_sumsq = inf;
      // The host path: the clip factor from the read-back sum; a skipped step is never started.
      if (!skipped) host.step(ph.data(), g.data(), t, 1e-2, tc, clip_factor(std::sqrt(sc.grad_sumsq), tc.grad_clip));
      // The device path: the update decides; the host, reading the scalars afterwards, unsteps.
      dev.step_on_device(pd.data(), g.data(), t, 1e-2, tc, &sc);
      if (!update_allowed(sc)) dev.unstep();
      no_unstep.step_on_device(pn.data(), g.data(), t, 1e-2, tc, &sc);
      EXPECT_EQ(dev.t, host.t) << option_name(kind) << " step " << s;
      // Exact: the same clip factor and the same update on the same t
      EXPECT_TRUE(same_bits(pd, ph)) << option_name(kind) << " step " << s;
      if (kind == OptimizerKind::adamw) {
        EXPECT_TRUE(same_bits(std::vector<float>(dev.m, dev.m + n), std::vector<float>(host.m, host.m + n)));
        EXPECT_TRUE(same_bits(std::vector<float>(dev.v, dev.v + n), std::vector<float>(host.v, host.v + n)));
      }
    }
    EXPECT_EQ(host.t, 3);
    if (kind == OptimizerKind::adamw) {  // without unstep the bias correction of later steps differs
      EXPECT_FALSE(same_bits(pn, ph)) << "the check above could not fail";
    }
  }
  Optimizer o(ops(), 8, OptimizerKind::adamw);
  EXPECT_THROW(o.unstep(), Error) << "unstep before any step";
}

// The trainer at world size 1 takes the device path (the update decides clip and skip, one
// readback after it); TrainOptions::host_clip forces the host path (a readback before the
// optimizer, as with more ranks). Losses and final parameters must be the same bits, for AdamW
// with the clip active and inactive and for SGD.
TEST(StepSync, TrainerDeviceClipEqualsHostClip) {
  using namespace testing_support;
  const std::string dir = shared_temp_dir(MPI_COMM_SELF);
  const std::string tr = make_pattern_file(MPI_COMM_SELF, dir, "train.h5", 20000, 64, 7);
  for (const char* extra : {"train.grad_clip=1e-3", "train.grad_clip=100", "train.optimizer=sgd"}) {
    const Config cfg = tiny_config(tr, {"model.vocab_size=0", "train.steps=6", extra, "train.warmup_steps=1"});
    TrainOptions on_host = quiet_options(false);
    on_host.host_clip = true;
    const uint64_t r0 = ops().readback_count();
    const TrainResult dev = train(cfg, MPI_COMM_SELF, quiet_options(false), true);
    const uint64_t r1 = ops().readback_count();
    const TrainResult host = train(cfg, MPI_COMM_SELF, on_host, true);
    EXPECT_EQ(r1 - r0, ops().readback_count() - r1) << extra << ": both paths read back as often";
    ASSERT_EQ(dev.losses.size(), 6u);
    // Exact: both paths compute the same clip factor from the same sum, and the same updates
    EXPECT_TRUE(same_bits(dev.losses, host.losses)) << extra;
    EXPECT_TRUE(same_bits(dev.final_params, host.final_params)) << extra;
    EXPECT_EQ(dev.skipped_steps, 0);
  }
}

// A run that blows up (the MpiCheckpoint.NonFiniteStepsAbortOrSkip recipe, here at world size 1,
// so on the device path): on_nonfinite=abort stops with the same message and
// on_nonfinite=skip counts the skipped steps, leaves the parameters finite, and ends exactly as
// the host path does — SGD and AdamW.
TEST(StepSync, TrainerWorldOneSkipsOrAbortsANonFiniteStep) {
  using namespace testing_support;
  const std::string dir = shared_temp_dir(MPI_COMM_SELF);
  const std::string tr = make_pattern_file(MPI_COMM_SELF, dir, "train.h5", 20000, 64, 23);
  for (const char* opt : {"train.optimizer=sgd", "train.optimizer=adamw"}) {
    std::vector<std::string> blowup = {"model.vocab_size=0", opt, "train.lr=1e30", "train.grad_clip=0",
                                       "train.warmup_steps=0", "train.steps=5"};
    try {
      train(tiny_config(tr, blowup), MPI_COMM_SELF, quiet_options(false));
      ADD_FAILURE() << opt << ": no error with on_nonfinite=abort";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("non-finite loss or gradient norm at step 1"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("set train.on_nonfinite=skip"), std::string::npos) << e.what();
    }
    blowup.push_back("train.on_nonfinite=skip");
    const Config cfg = tiny_config(tr, blowup);
    TrainOptions on_host = quiet_options(false);
    on_host.host_clip = true;
    const TrainResult dev = train(cfg, MPI_COMM_SELF, quiet_options(false), true);
    const TrainResult host = train(cfg, MPI_COMM_SELF, on_host, true);
    ASSERT_EQ(dev.losses.size(), 5u);
    EXPECT_GE(dev.skipped_steps, 1) << opt;
    EXPECT_EQ(dev.skipped_steps, host.skipped_steps) << opt;
    EXPECT_TRUE(std::isfinite(dev.losses[0]));
    EXPECT_FALSE(std::isfinite(dev.losses[1])) << "step 1 runs on the blown-up parameters";
    for (float p : dev.final_params) ASSERT_TRUE(std::isfinite(p)) << "a skipped step must not touch the parameters";
    // Exact: as in TrainerDeviceClipEqualsHostClip
    EXPECT_TRUE(same_bits(dev.final_params, host.final_params)) << opt;
    EXPECT_TRUE(same_bits(dev.losses, host.losses)) << opt;  // NaN losses compared as bits
  }
}
