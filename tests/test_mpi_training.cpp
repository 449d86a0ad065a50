// MPI integration tests (run by tools/run_tests.sh as `mpiexec -n 2 llmpi-tests --gtest_filter=X`,
// each with its own time limit).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

// 20 steps with evaluation every 10 and a line every 5.
Config run_config(const std::string& train, const std::string& val, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"data.val=" + val, "model.vocab_size=0", "train.steps=20", "train.warmup_steps=2",
                                   "train.eval_every=10", "train.eval_batches=2", "train.log_every=5"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return tiny_config(train, sets);
}

}  // namespace

TEST(MpiTraining, TwoRanksEqualOneRankForTwentySteps) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 2) << "run under mpiexec -n 2";
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string train_path = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 1);
  Config cfg = run_config(train_path, "");
  TrainOptions quiet = quiet_options(false);

  // Reference: rank 0 alone, same global batch. Bound: two ranks sum each step's gradients over the
  // batch's 8 × 32 rows in another order (128 each, then the halves added): training_drift.
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  TrainResult one;
  if (world_rank() == 0) {
    one = train(cfg, solo, quiet, true);
    MPI_Comm_free(&solo);
  }
  TrainResult two = train(cfg, MPI_COMM_WORLD, quiet, true);

  if (world_rank() == 0) {
    ASSERT_EQ(one.losses.size(), 20u);
    ASSERT_EQ(two.losses.size(), 20u);
    std::printf("first 5 losses  1 rank:");
    for (int i = 0; i < 5; i++) std::printf(" %.6f", one.losses[i]);
    std::printf("\nfirst 5 losses 2 ranks:");
    for (int i = 0; i < 5; i++) std::printf(" %.6f", two.losses[i]);
    std::printf("\n");
    const Drift bound = training_drift(cfg, 0, 20, one.final_params);
    for (int i = 0; i < 20; i++)
      EXPECT_LT(std::fabs(one.losses[i] - two.losses[i]) / std::fabs(one.losses[i]), bound.loss) << "step " << i;
    // Progress check (the equality above is the point): 20 steps lower the loss by ~10% here.
    EXPECT_LT(two.losses.back(), 0.95f * two.losses.front()) << "training should make progress";
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < one.final_params.size(); i++) {
      double d = (double)one.final_params[i] - two.final_params[i];
      d2 += d * d;
      r2 += (double)one.final_params[i] * one.final_params[i];
    }
    EXPECT_LT(std::sqrt(d2 / r2), bound.params) << "parameters after 20 steps";
    std::printf("params rel diff %.1e (bound %.1e)\n", std::sqrt(d2 / r2), bound.params);
  }
  // Every rank holds the same parameters after the run. Exact: each applies the same update to the
  // same averaged gradient.
  std::vector<float> p0 = two.final_params;
  MPI_Bcast(p0.data(), (int)p0.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(p0, two.final_params) << "ranks diverged";
}

TEST(MpiTraining, WritesRunDirectory) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 30000, 64, 2);
  std::string va = make_pattern_file(MPI_COMM_WORLD, dir, "val.h5", 5000, 64, 3);
  Config cfg = run_config(tr, va, {"run.dir=" + dir + "/run/a"});
  TrainResult res = train(cfg, MPI_COMM_WORLD, quiet_options(true));
  ASSERT_EQ(res.eval_steps, (std::vector<int64_t>{0, 10, 20}));
  EXPECT_LT(res.val_losses.back(), res.val_losses.front());  // (progress, not rounding)
  if (world_rank() == 0) {
    std::ifstream cf(dir + "/run/a/config.json");
    ASSERT_TRUE(cf.good());
    auto c = nlohmann::json::parse(cf);
    EXPECT_EQ(c["model"]["vocab_size"], 64);  // resolved from the file
    EXPECT_EQ(c["train"]["steps"], 20);
    std::ifstream mf(dir + "/run/a/metrics.jsonl");
    std::string line;
    std::vector<int64_t> steps;
    while (std::getline(mf, line)) {
      auto j = nlohmann::json::parse(line);
      for (const char* k : {"step", "epoch", "loss", "lr", "tokens_per_s", "step_ms", "data_ms", "forward_ms",
                            "backward_ms", "comm_ms", "exposed_comm_ms", "optim_ms", "bytes_communicated",
                            "grad_norm"})
        EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
      steps.push_back(j["step"]);
      // all-reduce of the fp32 gradient: 2(n-1)/n × bytes out and in. Exact: with n = 2 an integer
      // count of bytes, held exactly in a double.
      EXPECT_DOUBLE_EQ(j["bytes_communicated"].get<double>(), 2.0 * 2.0 * 0.5 * res.n_params * 4);
    }
    EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 10, 15, 19}));  // every log_every, the first five, the last
    std::ifstream ef(dir + "/run/a/eval.jsonl");
    int n_eval = 0;
    while (std::getline(ef, line)) {
      auto j = nlohmann::json::parse(line);
      EXPECT_TRUE(j.contains("step") && j.contains("val_loss"));
      n_eval++;
    }
    EXPECT_EQ(n_eval, 3);
  }
}

TEST(MpiTraining, CollectiveErrorsReachEveryRank) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 3000, 64, 4);
  auto expect_error = [&](Config cfg, const std::string& needle) {
    try {
      train(cfg, MPI_COMM_WORLD, quiet_options(false));
      ADD_FAILURE() << "no error for " << needle;
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(run_config(tr, "", {"train.global_batch=3"}), "not divisible by the number of ranks (2)");
  expect_error(run_config(dir + "/missing.h5", ""), "missing.h5");
  expect_error(run_config(tr, "", {"model.seq_len=5000"}), "longer than the data");
  expect_error(run_config(tr, "", {"model.vocab_size=32"}), "set model.vocab_size >= 64");
  expect_error(run_config(tr, "", {"runtime.device=cuda"}), "runtime.device is \"cuda\" but rank 0 has no usable GPU");
}
