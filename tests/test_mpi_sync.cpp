// Gradient synchronisation backends under MPI (-n 2): every method that averages gradients gives
// the same parameters after 10 steps (bit for bit), equal to a 1-rank run (to the drift of another
// summation order, training_drift in mpi_test_data.h); "weights" with SGD and average_every 1
// equals gradient averaging; with average_every > 1 ranks drift apart between averages and agree
// right after one.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

Config sync_config(const std::string& train, std::vector<std::string> extra) {
  extra.insert(extra.begin(), "train.steps=10");
  return tiny_config(train, extra);
}

// max over ranks of the relative difference between this rank's params and rank 0's. Held to 0
// (exact) where the ranks apply the same update to the same averaged gradient or parameters: an
// all-reduce gives every rank the same bits, and so do the root's sums of gather_scatter.
double spread_across_ranks(const std::vector<float>& p) {
  std::vector<float> p0 = p;
  MPI_Bcast(p0.data(), (int)p0.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
  double mine = rel_diff(p, p0), most = 0;
  MPI_Allreduce(&mine, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return most;
}

const TrainOptions kQuiet = quiet_options(false);

}  // namespace

TEST(MpiSync, AllGradientMethodsAgreeWithEachOtherAndOneRank) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 11);

  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  const Config ref = sync_config(tr, {});
  TrainResult one;
  if (world_rank() == 0) {
    one = train(ref, solo, kQuiet, true);
    MPI_Comm_free(&solo);
  }
  struct Variant {
    const char* name;
    std::vector<std::string> sets;
  };
  // The tiny model has ~28k parameters (0.11 MB): bucket_mb 0.02 gives several buckets.
  std::vector<Variant> variants = {
      {"gather_scatter (one bucket)", {"parallel.sync=gather_scatter", "parallel.bucket_mb=1e9"}},
      {"gather_scatter bucketed+overlap", {"parallel.sync=gather_scatter", "parallel.bucket_mb=0.02",
                                           "parallel.first_bucket_mb=0.005", "parallel.overlap=true"}},
      {"allreduce per tensor", {"parallel.sync=allreduce", "parallel.bucket_mb=0"}},
      {"allreduce bucketed", {"parallel.sync=allreduce", "parallel.bucket_mb=0.02", "parallel.first_bucket_mb=0.005"}},
      {"allreduce bucketed+overlap (polling)", {"parallel.sync=allreduce", "parallel.bucket_mb=0.02",
                                                "parallel.first_bucket_mb=0.005", "parallel.overlap=true"}},
      {"allreduce per tensor+overlap (blocking)", {"parallel.sync=allreduce", "parallel.bucket_mb=0",
                                                   "parallel.overlap=true", "parallel.poll_us=0"}},
  };
  std::vector<TrainResult> results;
  for (auto& v : variants) results.push_back(train(sync_config(tr, v.sets), MPI_COMM_WORLD, kQuiet, true));

  for (size_t i = 0; i < variants.size(); i++)
    EXPECT_EQ(spread_across_ranks(results[i].final_params), 0.0) << variants[i].name << ": ranks disagree";
  if (world_rank() == 0) {
    // Bound against one rank: it sums each step's gradients over the batch's 8 × 32 rows in one
    // GEMM, two ranks over 128 each and then add the halves: training_drift. Exact between the
    // methods: with 2 ranks each adds an element's two halves once (g0 + g1, the same bits in
    // either order; gather_scatter's root from 0), halves it (exact), and the buckets, overlap and
    // polling change when, not what; the norm is taken over the same averaged gradient alike.
    const Drift bound = training_drift(ref, 0, 10, one.final_params);
    std::printf("first 5 losses:\n  %-42s", "1 rank");
    for (int s = 0; s < 5; s++) std::printf(" %.6f", one.losses[s]);
    std::printf("\n");
    for (size_t i = 0; i < variants.size(); i++) {
      std::printf("  %-42s", variants[i].name);
      for (int s = 0; s < 5; s++) std::printf(" %.6f", results[i].losses[s]);
      std::printf("   params vs 1 rank %.1e, vs %s %.1e\n", rel_diff(results[i].final_params, one.final_params),
                  variants[0].name, rel_diff(results[i].final_params, results[0].final_params));
      EXPECT_LT(rel_diff(results[i].final_params, one.final_params), bound.params) << variants[i].name;
      EXPECT_EQ(results[i].final_params, results[0].final_params) << variants[i].name;
      EXPECT_EQ(results[i].losses, results[0].losses) << variants[i].name;
      for (int s = 0; s < 10; s++)
        EXPECT_LT(std::fabs(results[i].losses[s] - one.losses[s]) / one.losses[s], bound.loss) << variants[i].name;
    }
  }
}

TEST(MpiSync, WeightsWithSgdEveryStepEqualsGradientAveraging) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 12);
  // SGD is linear in the gradient, so averaging parameters after each step equals stepping with
  // the averaged gradient. Clipping uses a norm, which is not linear: off for this comparison.
  std::vector<std::string> sgd = {"train.optimizer=sgd", "train.lr=0.5", "train.grad_clip=0", "train.weight_decay=0.1"};
  auto grads = sgd;
  grads.push_back("parallel.sync=allreduce");
  auto weights = sgd;
  weights.insert(weights.end(), {"parallel.sync=weights", "parallel.average_every=1"});
  const Config ref = sync_config(tr, grads);
  TrainResult a = train(ref, MPI_COMM_WORLD, kQuiet, true);
  TrainResult b = train(sync_config(tr, weights), MPI_COMM_WORLD, kQuiet, true);
  EXPECT_EQ(spread_across_ranks(b.final_params), 0.0);  // Exact: all ranks take the same average
  // Bound: p - lr·(g0 + g1)/2 against (p - lr·g0 + p - lr·g1)/2 (weight decay alike) rounds
  // differently, within 4 roundings of the parameter, 4·2^-24 of it a step; then the steps' sums
  // round differently too: sgd_training_drift.
  const double max_loss = *std::max_element(a.losses.begin(), a.losses.end());
  const double bound = 10 * 4 * kFp32Roundoff + sgd_training_drift(ref, 0, 10, a.final_params, max_loss).params;
  EXPECT_LT(rel_diff(b.final_params, a.final_params), bound);
  EXPECT_LT(a.losses.back(), a.losses.front()) << "SGD should make progress";  // (progress, not rounding)
  if (world_rank() == 0) {
    std::printf("weights vs gradient averaging (SGD): params differ by %.1e relative (bound %.1e); losses %.5f / "
                "%.5f\n", rel_diff(b.final_params, a.final_params), bound, a.losses.back(), b.losses.back());
  }
}

TEST(MpiSync, WeightsDriftBetweenAveragesAndAgreeAfter) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 13);
  auto cfg = [&](int steps) {
    return sync_config(tr, {"parallel.sync=weights", "parallel.average_every=3", "train.steps=" + std::to_string(steps)});
  };
  // After 6 steps the last step averaged (6 % 3 == 0); after 4 or 5 it did not.
  double at6 = spread_across_ranks(train(cfg(6), MPI_COMM_WORLD, kQuiet, true).final_params);
  double at4 = spread_across_ranks(train(cfg(4), MPI_COMM_WORLD, kQuiet, true).final_params);
  double at5 = spread_across_ranks(train(cfg(5), MPI_COMM_WORLD, kQuiet, true).final_params);
  EXPECT_EQ(at6, 0.0) << "ranks must agree right after an average";  // Exact: the same average everywhere
  // (Not rounding: a step on other data moves each parameter by ~lr, at least 1e-4 here, the
  // ranks then ~lr·sqrt(n) / |p| >= 1e-3 apart, a hundred times 1e-5.)
  EXPECT_GT(at4, 1e-5) << "ranks see different data and must drift apart between averages";
  EXPECT_GT(at5, at4) << "and drift further the longer they go";
}

TEST(MpiSync, AccountingAndTraceFiles) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 14);
  for (std::string method : {"allreduce", "gather_scatter"}) {
    std::string run = dir + "/run-" + method;
    Config c = sync_config(tr, {"parallel.sync=" + method, "parallel.bucket_mb=0.02", "parallel.overlap=true",
                                "run.dir=" + run, "train.steps=3", "runtime.trace_steps=2"});
    TrainResult res = train(c, MPI_COMM_WORLD, quiet_options(true));
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() != 0) continue;
    std::ifstream pf(run + "/comm_plan.json");
    ASSERT_TRUE(pf.good());
    auto plan = nlohmann::json::parse(pf);
    const size_t n_buckets = plan["buckets"].size();
    EXPECT_GT(n_buckets, 2u);
    size_t floats = 0;
    for (auto& b : plan["buckets"]) {
      floats += b["floats"].get<size_t>();
      EXPECT_GT(b["tensors"].size(), 0u);
      EXPECT_EQ(b["tensors"][0]["dtype"], "float32");
    }
    EXPECT_EQ(floats, (size_t)res.n_params);
    const double B = 4.0 * res.n_params;  // gradient bytes
    std::ifstream mf(run + "/metrics.jsonl");
    std::string line;
    int lines = 0;
    while (std::getline(mf, line)) {
      auto j = nlohmann::json::parse(line);
      lines++;
      // Exact: byte counts are integers, held exactly in a double.
      if (method == "allreduce") {  // 2(W-1)/W · B each way, one collective per bucket
        EXPECT_DOUBLE_EQ(j["bytes_sent"].get<double>(), B);
        EXPECT_EQ(j["collectives"], (int)n_buckets);
      } else {  // root: (W-1)·B gathered in, (W-1)·B scattered out; 2 collectives per bucket
        EXPECT_DOUBLE_EQ(j["bytes_sent"].get<double>(), B);
        EXPECT_DOUBLE_EQ(j["bytes_received"].get<double>(), B);
        EXPECT_EQ(j["collectives"], 2 * (int)n_buckets);
      }
      EXPECT_GT(j["comm_ms"].get<double>(), 0);
      EXPECT_GE(j["exposed_comm_ms"].get<double>(), 0);
    }
    EXPECT_EQ(lines, 3);
    for (int r = 0; r < 2; r++) {
      std::ifstream tf(run + "/trace-rank" + std::to_string(r) + ".json");
      ASSERT_TRUE(tf.good()) << "trace of rank " << r;
      auto t = nlohmann::json::parse(tf);
      int buckets = 0, backward = 0;
      for (auto& e : t["traceEvents"]) {
        if (e["ph"] != "X") continue;
        std::string name = e["name"];
        if (name.find(" bucket ") != std::string::npos) {
          buckets++;
          EXPECT_EQ(e["tid"], 1) << "bucket spans belong on the communication track";
        }
        if (name == "backward") backward++;
      }
      EXPECT_EQ(buckets, 2 * (int)n_buckets) << "2 traced steps";
      EXPECT_EQ(backward, 2);
    }
  }
}

// Under mpiexec -n 4 (the runner starts MpiN4* tests so; 4 ranks on a 2-core machine are slow,
// so this stays small): 4-rank training with gather_scatter and bucketed overlapped allreduce
// equals 1-rank training with the same global batch.
TEST(MpiN4Sync, FourRanksEqualOneRank) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 4) << "run under mpiexec -n 4";
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 20000, 64, 15);
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  const Config ref = sync_config(tr, {"train.steps=5"});
  TrainResult one;
  // Bound: 4 ranks sum each step's gradients over the rows in another order than one rank.
  Drift bound{};
  if (world_rank() == 0) {
    one = train(ref, solo, kQuiet, true);
    MPI_Comm_free(&solo);
    bound = training_drift(ref, 0, 5, one.final_params);
  }
  for (std::vector<std::string> v : {std::vector<std::string>{"parallel.sync=gather_scatter"},
                                     {"parallel.sync=allreduce", "parallel.bucket_mb=0.02", "parallel.overlap=true"}}) {
    v.push_back("train.steps=5");
    TrainResult four = train(sync_config(tr, v), MPI_COMM_WORLD, kQuiet, true);
    EXPECT_EQ(spread_across_ranks(four.final_params), 0.0) << v[0];
    if (world_rank() == 0) {
      std::printf("%s, 4 ranks: params rel diff %.1e (bound %.1e)\n", v[0].c_str(),
                  rel_diff(four.final_params, one.final_params), bound.params);
      EXPECT_LT(rel_diff(four.final_params, one.final_params), bound.params) << v[0];
      for (int s = 0; s < 5; s++)
        EXPECT_LT(std::fabs(four.losses[s] - one.losses[s]) / one.losses[s], bound.loss) << v[0] << " step " << s;
    }
  }
}
