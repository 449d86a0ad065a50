// ZeRO-1 (parallel.zero 1) under MPI. -n 2: with every MPI method that can express it, sharded
// training equals unsharded training (over 10 steps; see the bound there), each rank keeps half the
// AdamW state, the step moves the same bytes as an all-reduce; checkpoints hold the whole state,
// so a run resumes bit for bit on the same world size and continues on another one exactly as an
// unsharded checkpoint would. -n 4 (MpiN4Zero): 4 data-parallel ranks, and 2 replicas × 2
// pipeline stages.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

Config zero_config(const std::string& train, std::vector<std::string> extra) {
  extra.insert(extra.begin(), "train.steps=10");
  extra.insert(extra.begin(), "train.warmup_steps=2");
  return tiny_config(train, extra);
}

// The state a checkpoint file holds.
struct Saved {
  std::vector<float> params, m, v;
};
Saved read_saved(const std::string& path) {
  CheckpointInfo info = read_checkpoint_info(path);
  Saved s;
  s.params.resize(info.n), s.m.resize(info.n), s.v.resize(info.n);
  read_checkpoint_row(info, 0, s.params.data(), s.m.data(), s.v.data());
  return s;
}

}  // namespace

TEST(MpiZero, EqualsUnshardedWithEveryMpiMethod) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 31);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  struct Variant {
    const char* name;
    std::vector<std::string> sets;
  };
  // The tiny model has ~28k parameters (0.11 MB): bucket_mb 0.02 gives several buckets.
  const std::vector<Variant> variants = {
      {"allreduce, one bucket", {"parallel.sync=allreduce", "parallel.bucket_mb=1e9"}},
      {"allreduce, per tensor", {"parallel.sync=allreduce", "parallel.bucket_mb=0"}},
      {"allreduce, bucketed+overlap (polling)", {"parallel.sync=allreduce", "parallel.bucket_mb=0.02",
                                                 "parallel.first_bucket_mb=0.005", "parallel.overlap=true"}},
      {"allreduce, per tensor+overlap (blocking)", {"parallel.sync=allreduce", "parallel.bucket_mb=0",
                                                    "parallel.overlap=true", "parallel.poll_us=0"}},
      {"gather_scatter, bucketed", {"parallel.sync=gather_scatter", "parallel.bucket_mb=0.02"}},
      {"gather_scatter, bucketed+overlap", {"parallel.sync=gather_scatter", "parallel.bucket_mb=0.02",
                                            "parallel.first_bucket_mb=0.005", "parallel.overlap=true"}},
  };
  for (const Variant& v : variants) {
    auto sets0 = v.sets, sets1 = v.sets;
    sets0.push_back("parallel.zero=0");
    sets1.push_back("parallel.zero=1");
    const Config ref = zero_config(tr, sets0);
    const TrainResult a = train(ref, MPI_COMM_WORLD, quiet_options(false), true);
    const TrainResult b = train(zero_config(tr, sets1), MPI_COMM_WORLD, quiet_options(false), true);
    // After the all-gather every rank holds the same parameters, bit for bit.
    EXPECT_TRUE(same_on_every_rank(b.final_params, MPI_COMM_WORLD)) << v.name;
    // Bound: both average the same two halves (g0 + g1, one addition) and step each element alike;
    // only the clipping norm sums its squares in other groupings (each rank's pieces, then the
    // ranks'), in double: ~1e-12 apart, which rounds the fp32 clip factor the other way only where
    // the norm lies that close to a rounding boundary (a chance of ~1e-5 a step). After such a
    // step every sum rounds otherwise: training_drift.
    const Drift bound = training_drift(ref, 0, 10, a.final_params);
    const double d = rel_diff(b.final_params, a.final_params);
    EXPECT_LT(d, bound.params) << v.name;
    ASSERT_EQ(a.losses.size(), 10u);
    ASSERT_EQ(b.losses.size(), 10u);
    double worst_loss = 0;
    for (size_t s = 0; s < a.losses.size(); s++)
      worst_loss = std::max(worst_loss, std::fabs((double)b.losses[s] - a.losses[s]) / a.losses[s]);
    EXPECT_LT(worst_loss, bound.loss) << v.name;
    EXPECT_NE(a.final_params, std::vector<float>()) << v.name;
    // Optimizer state per rank: 2n unsharded; with zero 1 about 2n/W, exactly 2n over the ranks.
    EXPECT_EQ(a.optimizer_state_floats, 2 * a.n_params) << v.name;
    int64_t total = 0;
    MPI_Allreduce(&b.optimizer_state_floats, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(total, 2 * b.n_params) << v.name;
    EXPECT_LE(std::llabs(b.optimizer_state_floats - 2 * b.n_params / world), 2 * 64) << v.name;
    // Bytes: reduce-scatter + all-gather = an all-reduce's 2(W-1)/W·S (the bandwidth-optimal
    // methods); through rank 0 the others send S + their piece instead of S. Byte counts, integers
    // held exactly in a double: under -n 2 every tensor of this model has an even number of floats,
    // so every bucket does, and each side is exact (the 1-byte slack absorbs no rounding). Rank 1's
    // piece of a bucket of n floats is floor(n/2): within 2 bytes of its share of S/W where n is
    // odd, over at most 28 buckets (a bucket holds whole tensors), within the 64 × 4 bytes allowed.
    const double S = 4.0 * a.n_params;
    if (v.sets[0] == "parallel.sync=allreduce") {
      EXPECT_NEAR(a.bytes_sent_last_step, 2.0 * (world - 1) / world * S, 1.0) << v.name;
      EXPECT_NEAR(b.bytes_sent_last_step, a.bytes_sent_last_step, 1.0) << v.name;
    } else if (world_rank() != 0) {
      EXPECT_NEAR(a.bytes_sent_last_step, S, 1.0) << v.name;
      EXPECT_NEAR(b.bytes_sent_last_step, S + S / world, 64.0 * 4) << v.name;
    }
    if (world_rank() == 0)
      std::printf("%-42s zero 1 vs 0: params %.1e (bound %.1e), losses %.1e (bound %.1e); AdamW floats per rank "
                  "%lld vs %lld; bytes sent per step %.0f vs %.0f\n",
                  v.name, d, bound.params, worst_loss, bound.loss, (long long)b.optimizer_state_floats,
                  (long long)a.optimizer_state_floats,
                  b.bytes_sent_last_step, a.bytes_sent_last_step);
  }
}

// Same world size: an interrupted ZeRO-1 run resumes bit for bit (clipping on). Another world
// size: the file holds the whole state in the flat layout, so with clipping off (so that the
// reduction order of the norm does not matter) a ZeRO-1 checkpoint is bit-identical to an
// unsharded one at 2 ranks, and a run resumed from either on 1 rank — or from a 1-rank
// checkpoint on 2 ranks with ZeRO-1 — continues exactly as the unsharded run does.
TEST(MpiZero, CheckpointsHoldTheWholeStateAndResumeOnAnyWorldSize) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32);
  auto cfg = [&](const std::string& run, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"train.steps=12", "checkpoint.every=4", "run.dir=" + run, "parallel.bucket_mb=0.02"});
    return zero_config(tr, extra);
  };
  {  // Same world size, bit for bit.
    const TrainResult whole = train(cfg(dir + "/whole", {"parallel.zero=1"}), MPI_COMM_WORLD, train_options(true), true);
    const TrainResult first = train(cfg(dir + "/cut", {"parallel.zero=1"}), MPI_COMM_WORLD, train_options(true, "", 5), true);
    ASSERT_TRUE(first.preempted);
    const TrainResult second = train(cfg(dir + "/cut", {"parallel.zero=1"}), MPI_COMM_WORLD, train_options(true, "auto"), true);
    ASSERT_EQ(second.start_step, 6);
    std::vector<float> joined = first.losses;
    joined.insert(joined.end(), second.losses.begin(), second.losses.end());
    // Exact: the checkpoint holds the whole state bit for bit; the same steps follow in the same order.
    EXPECT_EQ(joined, whole.losses) << "per-step losses must match bit for bit";
    EXPECT_EQ(second.final_params, whole.final_params) << "final parameters must match bit for bit";
  }
  // Another world size. Clipping off: the norm's reduction order is then irrelevant. Exact below:
  // with 2 ranks the averaged gradient is g0 + g1 (one addition) halved with or without ZeRO-1,
  // each element's AdamW step is the same operations, and the checkpoints hold the same bits.
  const std::vector<std::string> noclip = {"train.grad_clip=0"};
  auto run_set = [&](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const TrainResult z0 = train(cfg(dir + "/z0", run_set(noclip, {"parallel.zero=0"})), MPI_COMM_WORLD, train_options(true), true);
  const TrainResult z1 = train(cfg(dir + "/z1", run_set(noclip, {"parallel.zero=1"})), MPI_COMM_WORLD, train_options(true), true);
  {
    const Saved a = read_saved(checkpoint_path(dir + "/z0/checkpoints", 8));
    const Saved b = read_saved(checkpoint_path(dir + "/z1/checkpoints", 8));
    EXPECT_EQ(a.params, b.params) << "2 ranks: a ZeRO-1 checkpoint equals an unsharded one";
    EXPECT_EQ(a.m, b.m);
    EXPECT_EQ(a.v, b.v);
    EXPECT_EQ(z0.final_params, z1.final_params);
  }
  MPI_Comm solo;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  if (world_rank() == 0) {
    // 2 ranks -> 1 rank: resumed from the step-8 checkpoint of either run.
    auto resume_on_one = [&](const std::string& from, const std::string& run, const std::string& zero) {
      TrainOptions o = train_options(true, checkpoint_path(from + "/checkpoints", 8));
      return train(cfg(run, run_set(noclip, {"parallel.zero=" + zero})), solo, o, true);
    };
    const TrainResult r0 = resume_on_one(dir + "/z0", dir + "/one-from-z0", "0");
    const TrainResult r1 = resume_on_one(dir + "/z1", dir + "/one-from-z1", "1");
    ASSERT_EQ(r0.start_step, 8);
    ASSERT_EQ(r1.start_step, 8);
    EXPECT_EQ(r1.losses, r0.losses) << "2 -> 1 rank: a ZeRO-1 checkpoint resumes as an unsharded one";
    EXPECT_EQ(r1.final_params, r0.final_params);
    // Bound: steps 8 to 11 on one rank sum in another order than on two.
    const Config one_cfg = cfg(dir + "/one-from-z1", run_set(noclip, {"parallel.zero=1"}));
    EXPECT_LT(rel_diff(r1.final_params, z1.final_params), training_drift(one_cfg, 8, 12, z1.final_params).params)
        << "and continues the 2-rank run";
    // 1 rank, for the next check: 8 steps with checkpoints.
    train(cfg(dir + "/solo", noclip), solo, train_options(true), false);
    MPI_Comm_free(&solo);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {  // 1 rank -> 2 ranks, with and without ZeRO-1: the same continuation, bit for bit.
    const std::string from = checkpoint_path(dir + "/solo/checkpoints", 8);
    const TrainResult a = train(cfg(dir + "/two-z0", run_set(noclip, {"parallel.zero=0"})), MPI_COMM_WORLD,
                                train_options(true, from), true);
    const TrainResult b = train(cfg(dir + "/two-z1", run_set(noclip, {"parallel.zero=1"})), MPI_COMM_WORLD,
                                train_options(true, from), true);
    ASSERT_EQ(b.start_step, 8);
    EXPECT_EQ(b.losses, a.losses) << "1 -> 2 ranks: ZeRO-1 continues exactly as unsharded training";
    EXPECT_EQ(b.final_params, a.final_params);
  }
}

// -n 4: four data-parallel ranks (quarters of the state), and 2 replicas × 2 pipeline stages
// (each stage's state halved over its replicas; the checkpoint gathers it by name and resumes
// bit for bit).
TEST(MpiN4Zero, FourRanksAndPipelineStages) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 4) << "run under mpiexec -n 4";
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 20000, 64, 33);
  auto run = [&](std::vector<std::string> sets, const std::string& zero, int steps) {
    sets.insert(sets.end(), {"parallel.zero=" + zero, "train.steps=" + std::to_string(steps), "parallel.bucket_mb=0.02"});
    return train(zero_config(tr, sets), MPI_COMM_WORLD, quiet_options(false), true);
  };
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"parallel.sync=allreduce", "parallel.overlap=true"},
        std::vector<std::string>{"parallel.sync=allreduce", "parallel.pp_stages=2", "parallel.microbatches=2"}}) {
    const TrainResult a = run(sets, "0", 5), b = run(sets, "1", 5);
    // Exact: each element is updated once, by the rank owning it, and all-gathered from there.
    EXPECT_TRUE(same_on_every_rank(b.final_params, MPI_COMM_WORLD)) << sets.back();
    // Bound: with 4 replicas the all-reduce and ZeRO-1's reduce-scatter may add the 4 gradients
    // in other orders, and the clipping norm sums its squares in other groupings: training_drift.
    std::vector<std::string> ref_sets = sets;
    ref_sets.insert(ref_sets.end(), {"parallel.zero=0", "train.steps=5", "parallel.bucket_mb=0.02"});
    const Drift bound = training_drift(zero_config(tr, ref_sets), 0, 5, a.final_params);
    EXPECT_LT(rel_diff(b.final_params, a.final_params), bound.params) << sets.back();
    for (size_t s = 0; s < a.losses.size(); s++)
      EXPECT_LT(std::fabs((double)b.losses[s] - a.losses[s]) / a.losses[s], bound.loss) << sets.back() << " step " << s;
    const int dp = sets.size() == 3 ? 2 : 4;
    int64_t total_a = 0, total_b = 0;
    MPI_Allreduce(&a.optimizer_state_floats, &total_a, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&b.optimizer_state_floats, &total_b, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(total_b * dp, total_a) << sets.back() << ": the state is divided by the data-parallel size";
    if (world_rank() == 0)
      std::printf("%s: zero 1 vs 0 params %.1e (bound %.1e); AdamW floats over the ranks %lld vs %lld (dp %d)\n",
                  sets.back().c_str(), rel_diff(b.final_params, a.final_params), bound.params, (long long)total_b,
                  (long long)total_a, dp);
  }
  // Pipeline + ZeRO-1 checkpoint: interrupted and resumed = uninterrupted, bit for bit.
  auto ck = [&](const std::string& run_dir) {
    return zero_config(tr, {"parallel.zero=1", "parallel.pp_stages=2", "parallel.microbatches=2", "train.steps=8",
                            "checkpoint.every=4", "run.dir=" + run_dir, "parallel.bucket_mb=0.02"});
  };
  const TrainResult whole = train(ck(dir + "/pp-whole"), MPI_COMM_WORLD, train_options(true), true);
  const TrainResult first = train(ck(dir + "/pp-cut"), MPI_COMM_WORLD, train_options(true, "", 4), true);
  ASSERT_TRUE(first.preempted);
  const TrainResult second = train(ck(dir + "/pp-cut"), MPI_COMM_WORLD, train_options(true, "auto"), true);
  ASSERT_EQ(second.start_step, 5);
  std::vector<float> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  // Exact: the checkpoint gathers the whole state by name, bit for bit; the same steps follow.
  EXPECT_EQ(joined, whole.losses);
  EXPECT_EQ(second.final_params, whole.final_params);
}
