// Every family under MPI (-n 2): training on 2 ranks equals training on 1 rank with the same
// global batch (to the drift of another summation order over 10 steps, training_drift in
// mpi_test_data.h) for allreduce, gather_scatter and overlapped buckets; an interrupted and
// resumed run repeats the uninterrupted one bit for bit; a checkpoint of one family is refused by
// another; runtime.attention=fused trains like full. (gpt2 has the
// same checks in test_mpi_sync.cpp and test_mpi_checkpoint.cpp; these add llama, with grouped K/V
// heads, and bert on a classification file.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

// The family's tiny model on a file of its kind (made once per test, shared by the ranks).
struct FamilySetup {
  std::string family, train;
  std::vector<std::string> sets;
};

FamilySetup setup_family(const std::string& family, const std::string& dir) {
  FamilySetup f{family, "", {"model.family=" + family}};
  if (family == "bert") {
    f.train = make_pattern_examples(MPI_COMM_WORLD, dir, "cls.h5", 512, 32, 64, 31);
    // dropout off so that runs on different world sizes compute the same function
    f.sets.insert(f.sets.end(), {"model.dropout=0", "model.attn_dropout=0", "model.num_labels=2"});
  } else {
    f.train = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32);
    if (family == "llama") f.sets.insert(f.sets.end(), {"model.n_head=4", "model.n_kv_head=2"});
  }
  return f;
}

Config family_config(const FamilySetup& f, std::vector<std::string> extra) {
  std::vector<std::string> sets = f.sets;
  sets.insert(sets.end(), extra.begin(), extra.end());
  return tiny_config(f.train, sets);
}

void two_ranks_equal_one(const std::string& family) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  FamilySetup f = setup_family(family, dir);
  const TrainOptions quiet = quiet_options(false);
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  const Config ref = family_config(f, {"train.steps=10"});
  TrainResult one;
  Drift bound{};
  if (world_rank() == 0) {
    one = train(ref, solo, quiet, true);
    MPI_Comm_free(&solo);
    // Bound: one rank sums each gradient over the batch's 8 × 32 rows in one GEMM, two ranks over
    // 128 each and then add the halves: another order of the same sums, training_drift.
    bound = training_drift(ref, 0, 10, one.final_params);
  }
  struct Variant {
    const char* name;
    std::vector<std::string> sets;
  };
  const std::vector<Variant> variants = {
      {"allreduce", {"parallel.sync=allreduce"}},
      {"allreduce per tensor", {"parallel.sync=allreduce", "parallel.bucket_mb=0"}},
      {"gather_scatter", {"parallel.sync=gather_scatter"}},
      {"allreduce bucketed+overlap", {"parallel.sync=allreduce", "parallel.bucket_mb=0.02",
                                      "parallel.first_bucket_mb=0.005", "parallel.overlap=true"}},
  };
  for (auto& v : variants) {
    std::vector<std::string> sets = v.sets;
    sets.push_back("train.steps=10");
    TrainResult two = train(family_config(f, sets), MPI_COMM_WORLD, quiet, true);
    std::vector<float> p0 = two.final_params;
    MPI_Bcast(p0.data(), (int)p0.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    // Exact: every rank applies the same update to the same averaged gradient (one sum, g0 + g1).
    EXPECT_EQ(p0, two.final_params) << family << " " << v.name << ": ranks diverged";
    if (world_rank() == 0) {
      ASSERT_EQ(two.losses.size(), 10u);
      double worst = 0;
      for (int s = 0; s < 10; s++) {
        const double e = std::fabs(two.losses[s] - one.losses[s]) / one.losses[s];
        worst = std::max(worst, e);
        EXPECT_LT(e, bound.loss) << family << " " << v.name << " step " << s;
      }
      const double d = rel_diff(two.final_params, one.final_params);
      EXPECT_LT(d, bound.params) << family << " " << v.name;
      std::printf("%s %-28s losses within %.1e (bound %.1e), params %.1e (bound %.1e)\n", family.c_str(), v.name,
                  worst, bound.loss, d, bound.params);
    }
  }
  if (world_rank() == 0 && family != "bert") {
    EXPECT_LT(one.losses.back(), one.losses.front()) << family << ": no progress";  // (progress, not rounding)
  }
}

void resume_is_bit_identical(const std::string& family, std::vector<std::string> extra) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  FamilySetup f = setup_family(family, dir);
  // (bert keeps its dropout on here: the masks are keyed by (seed, step, rank, micro-batch, layer),
  // so a resumed run draws the same ones.)
  f.sets.insert(f.sets.end(), extra.begin(), extra.end());
  auto cfg = [&](const std::string& run) {
    return family_config(f, {"train.steps=8", "train.warmup_steps=2", "checkpoint.every=3", "run.dir=" + run});
  };
  TrainOptions o = quiet_options(true);
  TrainResult whole = train(cfg(dir + "/whole"), MPI_COMM_WORLD, o, true);
  TrainOptions cut = o;
  cut.preempt_after_step = 4;  // 5 steps done, between the step-3 and step-6 checkpoints
  TrainResult first = train(cfg(dir + "/cut"), MPI_COMM_WORLD, cut, true);
  ASSERT_TRUE(first.preempted);
  TrainOptions again = o;
  again.resume = "auto";
  TrainResult second = train(cfg(dir + "/cut"), MPI_COMM_WORLD, again, true);
  ASSERT_EQ(second.start_step, 5);
  std::vector<float> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  // Exact: the checkpoint holds the parameters, moments and step bit for bit, and the resumed run
  // repeats the same steps on the same samples (and dropout masks) in the same order.
  EXPECT_EQ(joined, whole.losses) << family << ": per-step losses must match bit for bit";
  EXPECT_EQ(second.final_params, whole.final_params) << family << ": final parameters must match bit for bit";

  // A checkpoint of this family is refused by another family, by name.
  const std::string other = family == "llama" ? "gpt2" : "llama";
  try {
    std::vector<std::string> sets = {"model.family=" + other, "train.steps=9", "run.dir=" + dir + "/cut"};
    if (family == "bert") sets.push_back("data.train=" + make_pattern_file(MPI_COMM_WORLD, dir, "lm.h5", 20000, 64, 5));
    TrainOptions r = again;
    train(tiny_config(f.train, sets), MPI_COMM_WORLD, r);
    ADD_FAILURE() << "a " << family << " checkpoint was loaded into " << other;
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a " + family + " model, but this configuration has model.family \"" +
                                         other + "\""),
              std::string::npos)
        << e.what();
  }
}

}  // namespace

TEST(MpiFamilies, LlamaTwoRanksEqualOneRank) { two_ranks_equal_one("llama"); }
TEST(MpiFamilies, BertTwoRanksEqualOneRank) { two_ranks_equal_one("bert"); }
TEST(MpiFamilies, LlamaResumeIsBitIdentical) { resume_is_bit_identical("llama", {}); }
TEST(MpiFamilies, BertResumeIsBitIdenticalWithDropout) {
  resume_is_bit_identical("bert", {"model.dropout=0.1", "model.attn_dropout=0.1"});
}

// runtime.attention=fused (flash_attention_*: lse per row, P recomputed in backward) trains like
// runtime.attention=full on 2 ranks, for every family (bert with its padding masks and attention
// dropout on): the same losses and final parameters to rounding (training_drift over 10 steps).
TEST(MpiFamilies, FusedAttentionTrainsLikeFullAttention) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  for (const std::string family : {"gpt2", "llama", "bert"}) {
    FamilySetup f = setup_family(family, dir);
    if (family == "bert") f.sets.insert(f.sets.end(), {"model.dropout=0.1", "model.attn_dropout=0.1"});
    TrainResult r[2];
    const char* impl[2] = {"full", "fused"};
    Config cfg[2];
    for (int k = 0; k < 2; k++) {
      cfg[k] = family_config(f, {"train.steps=10", std::string("runtime.attention=") + impl[k]});
      r[k] = train(cfg[k], MPI_COMM_WORLD, quiet_options(false), true);
    }
    if (world_rank() != 0) continue;
    ASSERT_EQ(r[1].losses.size(), 10u);
    // Bound: the fused kernel sums each row's keys in another order (online softmax, P recomputed),
    // from the first step on: training_drift (its sums over T keys are shorter than the rows').
    const Drift bound = training_drift(cfg[0], 0, 10, r[0].final_params);
    for (int s = 0; s < 10; s++)
      EXPECT_LT(std::fabs(r[1].losses[s] - r[0].losses[s]) / r[0].losses[s], bound.loss) << family << " step " << s;
    EXPECT_LT(rel_diff(r[1].final_params, r[0].final_params), bound.params) << family;
    std::printf("%s: full vs fused attention, last loss %.7f vs %.7f, params rel diff %.1e (bound %.1e)\n",
                family.c_str(), r[0].losses.back(), r[1].losses.back(), rel_diff(r[1].final_params, r[0].final_params),
                bound.params);
  }
}

// bert evaluates accuracy on a classification file, and a language-modelling file given to it is
// refused with the fix.
TEST(MpiFamilies, BertReportsAccuracyAndRefusesTokenFiles) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  FamilySetup f = setup_family("bert", dir);
  std::string val = make_pattern_examples(MPI_COMM_WORLD, dir, "val.h5", 128, 32, 64, 33);
  TrainResult r = train(family_config(f, {"data.val=" + val, "train.steps=60", "train.eval_every=30",
                                          "train.eval_batches=16", "train.lr=2e-3"}),
                        MPI_COMM_WORLD, quiet_options(false));
  ASSERT_EQ(r.val_accuracy.size(), 3u);
  for (double a : r.val_accuracy) EXPECT_TRUE(a >= 0 && a <= 1);
  // (Not a rounding bound: what the model learns. The label decides the tokens, 90% of them.)
  EXPECT_GT(r.val_accuracy.back(), 0.8) << "the label decides which half of the vocabulary the tokens come from";
  try {
    std::string lm = make_pattern_file(MPI_COMM_WORLD, dir, "lm.h5", 20000, 64, 5);
    train(tiny_config(lm, {"model.family=bert"}), MPI_COMM_WORLD, quiet_options(false));
    ADD_FAILURE() << "a token file was accepted for bert";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("is a language-modelling token file, but model.family bert"),
              std::string::npos)
        << e.what();
  }
}

// Fine-tuning as GLUE runs it: train.epochs with the last partial batch kept (70 examples, global
// batch 8: 9 steps per epoch, the last of 6), linear decay after a warm-up, an evaluation at every
// epoch end over the whole dev file (13 examples: partial batches, uneven across ranks, every
// example counted once). 2 ranks equal 1 rank, for each gradient method.
TEST(MpiFamilies, BertEpochsWithPartialBatchesTwoRanksEqualOneRank) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  FamilySetup f = setup_family("bert", dir);
  f.train = make_pattern_examples(MPI_COMM_WORLD, dir, "train70.h5", 70, 32, 64, 41);
  const std::string val = make_pattern_examples(MPI_COMM_WORLD, dir, "val13.h5", 13, 32, 64, 43);
  const std::vector<std::string> epochs = {"train.steps=0", "train.epochs=2", "train.drop_last=false",
                                           "train.lr_schedule=linear", "train.warmup_steps=2", "train.min_lr_ratio=0",
                                           "data.val=" + val, "train.eval_batches=0"};
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  const Config ref = family_config(f, epochs);
  TrainResult one;
  Drift bound{};
  if (world_rank() == 0) {
    one = train(ref, solo, quiet_options(false), true);
    // Bound: another order of each step's sums over the rows (one rank's batch of 8, two ranks' of
    // 4, the last of 6 as 3 + 3), over the 18 steps: training_drift. An evaluation is a forward of
    // the parameters of its step, so its loss drifts as a training step's does.
    bound = training_drift(ref, 0, 18, one.final_params, 0, 18);
    MPI_Comm_free(&solo);
    ASSERT_EQ(one.losses.size(), 18u) << "2 epochs of ceil(70 / 8) = 9 steps";
    EXPECT_EQ(one.eval_steps, (std::vector<int64_t>{0, 9, 18})) << "an evaluation at every epoch end";
    EXPECT_EQ(one.val_counted, (std::vector<int64_t>{13, 13, 13}));
    EXPECT_EQ(one.val_f1.size(), 3u);
  }
  for (const char* sync : {"parallel.sync=allreduce", "parallel.sync=gather_scatter"}) {
    std::vector<std::string> sets = epochs;
    sets.push_back(sync);
    TrainResult two = train(family_config(f, sets), MPI_COMM_WORLD, quiet_options(false), true);
    EXPECT_EQ(two.val_counted, (std::vector<int64_t>{13, 13, 13})) << sync;
    if (world_rank() != 0) continue;
    ASSERT_EQ(two.losses.size(), 18u);
    for (size_t s = 0; s < 18; s++)
      EXPECT_LT(std::fabs(two.losses[s] - one.losses[s]) / one.losses[s], bound.loss) << sync << " step " << s;
    EXPECT_LT(rel_diff(two.final_params, one.final_params), bound.params) << sync;
    ASSERT_EQ(two.val_losses.size(), 3u);
    for (size_t e = 0; e < 3; e++)
      EXPECT_LT(std::fabs(two.val_losses[e] - one.val_losses[e]) / one.val_losses[e], bound.loss)
          << sync << " eval " << e;
    std::printf("bert epochs %s: params rel diff %.1e (bound %.1e), last eval %.7f vs %.7f (bound %.1e)\n", sync,
                rel_diff(two.final_params, one.final_params), bound.params, two.val_losses.back(),
                one.val_losses.back(), bound.loss);
  }
}
