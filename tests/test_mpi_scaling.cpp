// Weak scaling under mpiexec -n 4: train.batch_per_rank on 1, 2 and 4 ranks gives global batches
// of 1×, 2× and 4× the batch per rank; the ranks' shares of each step are disjoint and together
// the global batch a one-rank sampler gives (the same samples whatever the world size); and a run
// with train.lr_scaling linear is the same training as one rank with that global batch and the
// rate times the ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "mpi_test_data.h"
#include "runtime/config.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

TEST(MpiN4Scaling, BatchPerRankOnOneTwoAndFourRanks) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 4) << "run under mpiexec -n 4";
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const int64_t n_tokens = 20000;
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", n_tokens, 64, 38);
  const int per_rank = 2, steps = 3, seq_len = 32;  // tiny_config's seq_len
  const int64_t n_windows = (n_tokens - 1) / seq_len;  // data/sampler.h
  const TrainOptions quiet = quiet_options(false);
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  for (int W : {1, 2, 4}) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < W ? 0 : MPI_UNDEFINED, 0, &sub);
    if (sub == MPI_COMM_NULL) continue;
    const int G = per_rank * W;
    const Config weak = tiny_config(tr, {"train.batch_per_rank=" + std::to_string(per_rank), "train.lr_scaling=linear",
                                         "train.steps=" + std::to_string(steps)});
    const TrainResult res = train(weak, sub, quiet, true);
    EXPECT_EQ(res.global_batch, G) << W << " ranks";
    // Exact: the configured rate times G / per_rank = W, a power of two.
    EXPECT_DOUBLE_EQ(res.peak_lr, 1e-3 * W) << "linear: tiny_config's 1e-3 × " << G << " / " << per_rank;

    // The sampler the run resolved: each rank's share, gathered over the ranks, is G distinct
    // windows, the same as one rank's batch of G, and an epoch gives no window twice.
    Config resolved = weak;
    resolve_batch(resolved, W);
    ASSERT_EQ(resolved.train.global_batch, G);
    int rank = 0;
    MPI_Comm_rank(sub, &rank);
    Sampler mine(n_windows, G, W, rank, resolved.train.seed), one(n_windows, G, 1, 0, resolved.train.seed);
    ASSERT_EQ(mine.local_batch(), per_rank);
    std::set<int64_t> epoch;
    for (int64_t s = 0; s < mine.steps_per_epoch(); s++) {
      const std::vector<int64_t> w = mine.windows(s);
      std::vector<int64_t> all(G);
      MPI_Allgather(w.data(), per_rank, MPI_INT64_T, all.data(), per_rank, MPI_INT64_T, sub);
      ASSERT_EQ(all, one.windows(s)) << W << " ranks, step " << s;
      for (int64_t id : all) ASSERT_TRUE(epoch.insert(id).second) << "window " << id << " twice, " << W << " ranks";
    }
    EXPECT_EQ((int64_t)epoch.size(), n_windows / G * G);
    MPI_Comm_free(&sub);

    // The same training as one rank with global batch G and the rate × W (floating-point
    // summation order apart).
    if (world_rank() != 0) continue;
    const Config strong_cfg = tiny_config(tr, {"train.global_batch=" + std::to_string(G),
                                               "train.lr=" + std::to_string(1e-3 * W),
                                               "train.steps=" + std::to_string(steps)});
    const TrainResult strong = train(strong_cfg, solo, quiet, true);
    ASSERT_EQ(strong.global_batch, G);
    // Bound: W ranks sum each step's gradients over the G × 32 rows in another order than one.
    const Drift bound = training_drift(strong_cfg, 0, steps, strong.final_params);
    std::printf("%d ranks: params rel diff %.1e (bound %.1e)\n", W, rel_diff(res.final_params, strong.final_params),
                bound.params);
    EXPECT_LT(rel_diff(res.final_params, strong.final_params), bound.params) << W << " ranks";
    for (int s = 0; s < steps; s++)
      EXPECT_LT(std::fabs(res.losses[s] - strong.losses[s]) / strong.losses[s], bound.loss)
          << W << " ranks, step " << s;
  }
  if (solo != MPI_COMM_NULL) MPI_Comm_free(&solo);
}
