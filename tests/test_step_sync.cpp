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
    ops().softmax_xent_record(z2.data(), l2.data(), y.data(), N, V, gs, &bad, 100);
    EXPECT_EQ(bad, 0u);
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
  ops().softmax_xent_record(zz.data(), l.data(), y.data(), N, V, 1.0f, &bad, 6);
  ASSERT_NE(bad, 0u);
  EXPECT_EQ(bad_target_row(bad), 8);
  EXPECT_EQ(bad_target_value(bad), 10);
  EXPECT_TRUE(std::isnan(l[2]) && std::isnan(l[4]));
  for (int n : {2, 4})
    for (int j = 0; j < V; j++) EXPECT_EQ(zz[(size_t)n * V + j], z[(size_t)n * V + j]) << "bad row's logits untouched";
  // the good rows are what softmax_xent gives them
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
  ops().softmax_xent_record(zz.data(), l.data(), y0.data(), N, V, 0.0f, &bad, 0);
  EXPECT_EQ(bad_target_row(bad), 1);
  EXPECT_EQ(bad_target_value(bad), 99);
  // a later chunk does not displace it
  ops().softmax_xent_record(zz.data(), l.data(), y.data(), N, V, 0.0f, &bad, 12);
  EXPECT_EQ(bad_target_row(bad), 1);
}

TEST(StepSync, SumSquaresAddAndSumToDoubleAreTheHostSums) {
  for (size_t n : {size_t(0), size_t(1), size_t(1000), size_t(3 * 65536 + 17)}) {
    const auto x = random_floats(n, 14, -3.0f, 3.0f);
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
  tc.weight_decay = 0.1;
  for (bool sgd : {false, true})
    for (float clip : {1.0f, 0.37f, 3.0e-3f}) {
      const auto p0 = random_floats(t.numel, 15);
      std::vector<float> pr = p0, pn = p0, mr(t.numel), vr(t.numel);
      Optimizer opt(ops(), t.numel, sgd ? "sgd" : "adamw");
      for (int step = 1; step <= 3; step++) {
        const auto g = random_floats(t.numel, 16 + step, -2.0f, 2.0f);
        std::vector<float> gr = g, gn = g;
        reference_update(sgd, pr.data(), gr.data(), mr.data(), vr.data(), t, clip, 1e-2f, tc, step);
        opt.step(pn.data(), gn.data(), t, 1e-2, tc, clip);
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
    const float want = m.forward(a1, rb.b, true);
    const uint64_t before = ops().readback_count();
    m.forward_queued(a2, rb.b, true);
    EXPECT_EQ(ops().readback_count(), before) << fam << ": forward_queued reads nothing back";
    const StepScalars s = m.read_scalars(a2);
    EXPECT_EQ(ops().readback_count(), before + 1) << fam;
    const float got = m.loss_of(s, a2);
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
  m.forward_queued(a, rb.b, true);
  // Past load_batch's host check: a target outside the vocabulary written straight into the
  // activations (as a caller that fills them itself could), then the head again.
  const int32_t bad = 57;
  ops().copy_to_device(a.targets + 11, &bad, sizeof bad);
  m.head_forward_queued(a, true);
  try {
    m.read_scalars(a);
    ADD_FAILURE() << "no error for target 57 at row 11";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 57 at row 11 is outside the vocabulary [0, 50)"), std::string::npos)
        << e.what();
  }
  // The next forward clears the flag.
  m.forward_queued(a, rb.b, true);
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
