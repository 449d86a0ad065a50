// Checkpoint and resume under MPI (-n 2): an interrupted-and-resumed run repeats the uninterrupted
// one bit for bit; mismatched checkpoints are refused by name; non-finite steps abort or skip.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

Config ckpt_config(const std::string& train, const std::string& run_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"train.steps=12", "train.warmup_steps=3", "checkpoint.every=4", "run.dir=" + run_dir};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return tiny_config(train, sets);
}

}  // namespace

TEST(MpiCheckpoint, ResumeContinuesBitIdentically) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 21);
  for (std::string sync : {"allreduce", "weights"}) {
    std::vector<std::string> extra = {"parallel.sync=" + sync, "parallel.average_every=4"};
    TrainResult whole = train(ckpt_config(tr, dir + "/whole-" + sync, extra), MPI_COMM_WORLD, train_options(true), true);
    // Interrupted after step 5 (6 steps done; mid-way between the step-4 and step-8 checkpoints)...
    const std::string run = dir + "/cut-" + sync;
    TrainResult first = train(ckpt_config(tr, run, extra), MPI_COMM_WORLD, train_options(true, "", 5), true);
    ASSERT_TRUE(first.preempted);
    ASSERT_EQ(first.losses.size(), 6u);
    // ...and resumed from the newest checkpoint.
    TrainResult second = train(ckpt_config(tr, run, extra), MPI_COMM_WORLD, train_options(true, "auto"), true);
    ASSERT_EQ(second.start_step, 6) << sync;
    ASSERT_EQ(second.losses.size(), 6u);
    std::vector<float> joined = first.losses;
    joined.insert(joined.end(), second.losses.begin(), second.losses.end());
    // Exact: the checkpoint holds the parameters, moments and step bit for bit (with "weights", the
    // steps since the last average too), and the same steps follow on the same samples.
    EXPECT_EQ(joined, whole.losses) << sync << ": per-step losses must match bit for bit";
    EXPECT_EQ(second.final_params, whole.final_params) << sync << ": final parameters must match bit for bit";
    if (world_rank() == 0) {
      // metrics.jsonl holds every step exactly once, across the interruption.
      std::ifstream mf(run + "/metrics.jsonl");
      std::string line;
      std::vector<int64_t> steps;
      while (std::getline(mf, line)) steps.push_back(nlohmann::json::parse(line)["step"]);
      std::vector<int64_t> expect(12);
      for (int i = 0; i < 12; i++) expect[i] = i;
      EXPECT_EQ(steps, expect) << sync;
      std::ifstream pre(run + "/PREEMPTED");
      EXPECT_FALSE(pre.good()) << "the marker is removed once the run resumes";
    }
  }
}

TEST(MpiCheckpoint, RefusesMismatchedCheckpoints) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 22);
  const std::string run = dir + "/run";
  train(ckpt_config(tr, run, {"train.steps=4"}), MPI_COMM_WORLD, train_options(true));
  auto expect_error = [&](std::vector<std::string> extra, const std::string& needle) {
    try {
      train(ckpt_config(tr, run, extra), MPI_COMM_WORLD, train_options(true, "auto"));
      ADD_FAILURE() << "no error for " << needle;
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({"model.d_model=64"}, "was made for model.d_model 32, but this configuration has 64");
  expect_error({"model.n_layer=3"}, "model.n_layer 2, but this configuration has 3");
  expect_error({"train.optimizer=sgd"}, "train.optimizer \"adamw\"");
  // A file that is not a checkpoint, given by path.
  try {
    TrainOptions o = train_options(true, tr);
    train(ckpt_config(tr, run), MPI_COMM_WORLD, o);
    ADD_FAILURE() << "a token file was accepted as a checkpoint";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("is not an llmpi checkpoint"), std::string::npos) << e.what();
  }
  // The matching configuration resumes (nothing left to do at step 4 of 4, but it loads).
  TrainResult ok = train(ckpt_config(tr, run, {"train.steps=6"}), MPI_COMM_WORLD, train_options(true, "auto"));
  EXPECT_EQ(ok.start_step, 4);
  EXPECT_EQ(ok.losses.size(), 2u);
}

TEST(MpiCheckpoint, NonFiniteStepsAbortOrSkip) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 23);
  // Plain SGD with an absurd learning rate: the first update blows the parameters up.
  std::vector<std::string> blowup = {"train.optimizer=sgd", "train.lr=1e30", "train.grad_clip=0",
                                     "train.warmup_steps=0", "checkpoint.every=0", "train.steps=5"};
  try {
    train(ckpt_config(tr, dir + "/a", blowup), MPI_COMM_WORLD, train_options(false));
    ADD_FAILURE() << "no error with on_nonfinite=abort";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite loss or gradient norm at step"), std::string::npos) << e.what();
  }
  auto skip = blowup;
  skip.push_back("train.on_nonfinite=skip");
  TrainResult r = train(ckpt_config(tr, dir + "/b", skip), MPI_COMM_WORLD, train_options(false), true);
  EXPECT_EQ(r.losses.size(), 5u);
  EXPECT_GE(r.skipped_steps, 1);
  for (float p : r.final_params) ASSERT_TRUE(std::isfinite(p)) << "a skipped step must not touch the parameters";
}

// train.on_nonfinite=skip is bounded: train.max_consecutive_skips non-finite steps in a row stop the
// run on every rank, naming the steps and the key; and a run whose final validation loss is not
// finite fails (an error, not a closing line that reads as success).
TEST(MpiCheckpoint, SkippedStepsAreBoundedAndADivergedRunFails) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 23);
  const std::string va = make_pattern_file(MPI_COMM_WORLD, dir, "val.h5", 8000, 64, 24);
  // SGD with an absurd learning rate: the first update blows the parameters up, every later step
  // is non-finite (and skipped: the parameters stay as they are).
  const std::vector<std::string> blowup = {"train.optimizer=sgd", "train.lr=1e30", "train.grad_clip=0",
                                           "train.warmup_steps=0", "checkpoint.every=0", "train.steps=8",
                                           "train.on_nonfinite=skip"};
  auto sets = blowup;
  sets.push_back("train.max_consecutive_skips=3");
  try {
    train(ckpt_config(tr, dir + "/a", sets), MPI_COMM_WORLD, train_options(false));
    ADD_FAILURE() << "8 steps ran with 3 consecutive skips allowed";
  } catch (const CollectiveError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("3 steps in a row were not finite (steps 1 to 3"), std::string::npos) << m;
    EXPECT_NE(m.find("train.max_consecutive_skips"), std::string::npos) << m;
  }
  sets = blowup;
  sets.push_back("data.val=" + va);
  try {
    train(ckpt_config(tr, dir + "/b", sets), MPI_COMM_WORLD, train_options(false));
    ADD_FAILURE() << "a run ending with a non-finite validation loss succeeded";
  } catch (const CollectiveError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the validation loss after step 8 is"), std::string::npos) << m;
    EXPECT_NE(m.find("the model diverged (7 non-finite steps skipped)"), std::string::npos) << m;
  }
}

