// ZeRO-2 and ZeRO-3 (parallel.zero 2 and 3) under MPI. ZeRO-2 reduce-scatters the same buckets
// into the same pieces and updates them as ZeRO-1 does, releasing the rest of each bucket's
// gradient as soon as it is reduced; ZeRO-3 also gathers each block's parameters just before it runs
// and releases them after, so the forward and backward read ZeRO-1's parameters. Both must train
// bit for bit as ZeRO-1 with the same buckets (whose equality with unsharded training, within the
// bound of the sums' order, tests/test_mpi_zero.cpp asserts; it is checked here once per family
// too), for every family, with overlap, gradient accumulation, gather_scatter, tensor parallelism
// and pipeline stages; their checkpoints are ZeRO-1's, bit for bit. The gradient's and the
// parameters' resident pages are counted (mincore) against zero2_grad_floats and
// zero3_param_floats, and one step's peak RSS against the memory estimate at 1, 2 and 4 ranks.
//   -n 2: MpiZero2.*, MpiZero3.*     -n 4: MpiN4Zero2.*, MpiN4Zero3.*
#include <gtest/gtest.h>
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend/host_pages.h"
#include "checkpoint/checkpoint.h"
#include "comm/grad_sync.h"
#include "model/memory_estimate.h"
#include "model_test_util.h"
#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string describe(const std::string& family, const std::vector<std::string>& layout) {
  std::string what = family;
  for (const std::string& s : layout) what += " " + s.substr(s.find('.') + 1);
  return what;
}

// Each layout trained with zero 1 and zero `stage` (2 or 3) on every rank of the world: the same
// losses and the same final parameters, bit for bit (the same collectives over the same buckets,
// the same pieces updated by the same operations, the forward and backward reading the same
// parameters), every rank holding the same parameters, and the same validation losses (ZeRO-3's
// evaluation gathers the blocks as training does). ZeRO-3 cuts its buckets at the blocks, so its
// layouts here have one bucket per tensor (bucket_mb 0), the same cut as ZeRO-1's.
void stage_equals_zero1(const std::string& family, const std::vector<std::vector<std::string>>& layouts,
                        int stage = 2) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::vector<std::string> base = family_run_sets(family, dir);
  const std::string val = family == "bert" ? make_pattern_examples(MPI_COMM_WORLD, dir, "cls-val.h5", 64, 32, 64, 37)
                                           : make_pattern_file(MPI_COMM_WORLD, dir, "val.h5", 4000, 64, 33);
  base.insert(base.end(), {"data.val=" + val, "train.eval_every=5", "train.eval_batches=2"});
  for (const std::vector<std::string>& layout : layouts) {
    const std::string what = describe(family, layout);
    const TrainResult z1 = train(tiny_config_of(base, with(layout, {"parallel.zero=1"})), MPI_COMM_WORLD,
                                 quiet_options(false), true);
    const TrainResult z2 = train(tiny_config_of(base, with(layout, {"parallel.zero=" + std::to_string(stage)})),
                                 MPI_COMM_WORLD, quiet_options(false), true);
    ASSERT_EQ(z1.losses.size(), 10u) << what;
    EXPECT_EQ(z2.losses, z1.losses) << what;
    EXPECT_EQ(z2.final_params, z1.final_params) << what;
    ASSERT_FALSE(z1.val_losses.empty()) << what;
    EXPECT_EQ(z2.val_losses, z1.val_losses) << what;
    EXPECT_TRUE(same_on_every_rank(z2.final_params, MPI_COMM_WORLD)) << what;
    EXPECT_EQ(z2.optimizer_state_floats, z1.optimizer_state_floats) << what;
    if (stage == 2) {
      EXPECT_EQ(z2.bytes_sent_last_step, z1.bytes_sent_last_step) << what;  // the same collectives
    } else {
      EXPECT_GT(z2.bytes_sent_last_step, z1.bytes_sent_last_step) << what;
      const Config c = tiny_config_of(base, layout);
      if (c.parallel.sync == SyncMethod::allreduce && c.parallel.tp == 1 && c.parallel.pp_stages == 1) {
        // ZeRO-3 gathers every block before its forward and its backward, each micro-batch, and not
        // after the update: 2M - 1 more all-gathers of each block tensor (one bucket a tensor here),
        // each sending W - 1 pieces padded to ceil(n/W) floats. Byte counts: exact in a double.
        const int W = world_size(), M = c.parallel.microbatches;
        double extra = 0;
        for (const ParamSlice& sl : build_param_table(model_desc_from_config(c.model, 64)).slices)
          if (sl.layer >= 0) extra += (2.0 * M - 1) * (W - 1) * (double)((sl.numel + W - 1) / W) * 4;
        EXPECT_EQ(z2.bytes_sent_last_step, z1.bytes_sent_last_step + extra) << what;
      }
    }
    if (world_rank() == 0)
      std::printf("%-58s zero %d = zero 1 bit for bit: %s (loss %.6f -> %.6f)\n", what.c_str(), stage,
                  z2.losses == z1.losses && z2.final_params == z1.final_params ? "yes" : "NO", z2.losses.front(),
                  z2.losses.back());
  }
}

// Zero `stage` against unsharded training (zero 0) of a layout: within training_drift, the bound
// tests/test_mpi_zero.cpp derives for ZeRO-1 (the norm and, with more than 2 ranks, the gradients
// summed in other orders).
void stage_near_unsharded(const std::string& family, const std::vector<std::string>& layout, int stage = 2) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::vector<std::string> base = family_run_sets(family, dir);
  const Config ref = tiny_config_of(base, with(layout, {"parallel.zero=0"}));
  const TrainResult z0 = train(ref, MPI_COMM_WORLD, quiet_options(false), true);
  const TrainResult z2 = train(tiny_config_of(base, with(layout, {"parallel.zero=" + std::to_string(stage)})),
                               MPI_COMM_WORLD, quiet_options(false), true);
  const std::string what = describe(family, layout);
  const Drift bound = training_drift(ref, 0, ref.train.steps, z0.final_params);
  ASSERT_EQ(z2.losses.size(), z0.losses.size()) << what;
  double worst = 0;
  for (size_t s = 0; s < z0.losses.size(); s++)
    worst = std::max(worst, std::fabs((double)z2.losses[s] - z0.losses[s]) / z0.losses[s]);
  const double d = rel_diff(z2.final_params, z0.final_params);
  EXPECT_LT(worst, bound.loss) << what;
  EXPECT_LT(d, bound.params) << what;
  if (world_rank() == 0)
    std::printf("%-58s zero %d vs 0: params %.1e (bound %.1e), losses %.1e (bound %.1e)\n", what.c_str(), stage, d,
                bound.params, worst, bound.loss);
}

// 12 steps with a checkpoint every 4 (overlap on, `buckets` the bucket_mb line).
Config checkpoint_config(const std::vector<std::string>& base, const std::string& run, const std::string& buckets,
                         const std::string& zero) {
  return tiny_config_of(base, {"train.steps=12", "checkpoint.every=4", "run.dir=" + run, buckets,
                               "parallel.overlap=true", "parallel.zero=" + zero});
}

// Zero 1 and zero `stage` trained with checkpoints: the same losses and final parameters, and the
// same checkpoint files (parameters, m and v), bit for bit; then zero `stage` interrupted after
// step 5 and resumed from its step-4 checkpoint continues bit for bit. Returns the zero `stage`
// run (in dir/z<stage>).
TrainResult checkpoints_are_zero1s(const std::string& dir, const std::vector<std::string>& base,
                                   const std::string& buckets, int stage) {
  const std::string zs = std::to_string(stage);
  auto cfg = [&](const std::string& run, const std::string& zero) {
    return checkpoint_config(base, run, buckets, zero);
  };
  const TrainResult z1 = train(cfg(dir + "/z1", "1"), MPI_COMM_WORLD, train_options(true), true);
  const TrainResult z = train(cfg(dir + "/z" + zs, zs), MPI_COMM_WORLD, train_options(true), true);
  EXPECT_EQ(z.losses, z1.losses);
  EXPECT_EQ(z.final_params, z1.final_params);
  if (world_rank() == 0) {
    for (int64_t step : {4, 8, 12}) {
      CheckpointInfo a = read_checkpoint_info(checkpoint_path(dir + "/z1/checkpoints", step));
      CheckpointInfo b = read_checkpoint_info(checkpoint_path(dir + "/z" + zs + "/checkpoints", step));
      EXPECT_EQ(a.n, b.n);
      if (a.n != b.n) continue;
      std::vector<float> pa(a.n), ma(a.n), va(a.n), pb(b.n), mb(b.n), vb(b.n);
      read_checkpoint_row(a, 0, pa.data(), ma.data(), va.data());
      read_checkpoint_row(b, 0, pb.data(), mb.data(), vb.data());
      EXPECT_EQ(pb, pa) << "step " << step;
      EXPECT_EQ(mb, ma) << "step " << step;
      EXPECT_EQ(vb, va) << "step " << step;
    }
  }
  const TrainResult first = train(cfg(dir + "/cut", zs), MPI_COMM_WORLD, train_options(true, "", 5), true);
  EXPECT_TRUE(first.preempted);
  const TrainResult second = train(cfg(dir + "/cut", zs), MPI_COMM_WORLD, train_options(true, "auto"), true);
  EXPECT_EQ(second.start_step, 6);
  std::vector<float> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, z.losses) << "per-step losses must match bit for bit";
  EXPECT_EQ(second.final_params, z.final_params);
  return z;
}


// One backward simulated over a real table: every slice written in table order (with a value
// whose sum over any ranks in any order is exact: small integers), each finished prefix handed to
// the sync; the gradient's resident bytes watched all along. Afterwards this rank's pieces hold
// the exact mean and everything else is zero. With micro_batches > 1, reduced each micro-batch
// (parallel.zero_reduce "micro_batch"): micro-batch m adds (m + 1) times the values, and between
// micro-batches the whole buffer must be zero again, resident in the pieces and edges only; at the
// end the pieces hold the sum of the micro-batches' means.
void resident_only_in_pieces(bool overlap, int micro_batches = 1) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const ModelDesc d = test::desc_of("gpt2", 2, 4, 256, 64, 512);
  const ParamTable table = build_param_table(d);
  SyncOptions so;
  so.zero = so.shard_grads = true;
  so.bucket_mb = 1;
  so.first_bucket_mb = 0.25;
  so.overlap = overlap;
  so.reduce_each_micro_batch = micro_batches > 1;
  const int M = micro_batches;
  float* grads = static_cast<float*>(host_pages_alloc(table.numel * sizeof(float)));
  const double bytes = (double)table.numel * sizeof(float);
  {
    GradSync sync(so, MPI_COMM_WORLD, cpu_ops(), grads, table, nullptr);
    sync.connect();
    const double bound =
        4 * zero2_grad_floats(sync.buckets, sync.shard, table.numel, overlap, M, M > 1, false, 4096 / 4);
    double mine = 0;
    for (const ShardPiece& p : sync.shard) mine += (double)(p.end - p.begin);
    const double edges = 4.0 * 4096 * (double)sync.buckets.size();
    for (int step = 0; step < 2; step++) {
      host_pages_release(grads, table.numel * sizeof(float));  // what zero_grads does
      EXPECT_LE(host_pages_resident(grads, table.numel * sizeof(float)), 4096.0);  // (a last partial page, cleared)
      sync.begin_step(M);
      double peak = 0;
      for (int m = 0; m < M; m++) {
        for (const ParamSlice& s : table.slices) {  // (backward adds)
          for (size_t i = s.offset; i < s.offset + s.numel; i++) grads[i] += (float)((rank + 1) * (int)(i % 7 + 1) * (m + 1));
          sync.on_ready(s.offset + s.numel);
          peak = std::max(peak, host_pages_resident(grads, table.numel * sizeof(float)));
        }
        if (m + 1 == M) break;
        sync.end_micro_batch();
        // (the pieces are in the sum now: only the cleared edge pages stay)
        EXPECT_LE(host_pages_resident(grads, table.numel * sizeof(float)), edges) << "micro-batch " << m;
        size_t left = 0;
        for (size_t i = 0; i < table.numel; i++) left += grads[i] != 0.0f;
        EXPECT_EQ(left, 0u) << "micro-batch " << m << ": the buffer not zero again";
        // (reading mapped the zero page where nothing was: counted resident by mincore; unmapped again)
        host_pages_release(grads, table.numel * sizeof(float));
      }
      sync.finish();
      const double after = host_pages_resident(grads, table.numel * sizeof(float));
      // The pieces hold the mean of (r + 1)·c over the ranks, c = i mod 7 + 1: c·(W + 1)/2, exact
      // (integers summed, then halved or quartered), summed over the micro-batches' factors m + 1:
      // M (M + 1)/2 times it, exact too; the rest of every bucket was released: zero.
      size_t wrong = 0, not_zero = 0;
      size_t k = 0;
      const float factor = (float)(M * (M + 1) / 2);
      for (size_t i = 0; i < table.numel; i++) {
        while (k < sync.shard.size() && sync.shard[k].end <= i) k++;
        const bool in_piece = k < sync.shard.size() && sync.shard[k].begin <= i && i < sync.shard[k].end;
        if (in_piece) wrong += grads[i] != factor * (float)((i % 7 + 1) * (world + 1)) / 2.0f;
        else not_zero += grads[i] != 0.0f;
      }
      EXPECT_EQ(wrong, 0u) << "pieces holding other than the mean";
      EXPECT_EQ(not_zero, 0u) << "floats outside the pieces not released";
      // Resident: at the peak at most zero2_grad_floats; after the step the pieces and the edges.
      EXPECT_LE(peak, bound) << "overlap " << overlap;
      EXPECT_LE(after, 4 * mine + edges) << "overlap " << overlap;
      if (world > 1) {  // (at most half the gradient and three buckets of 1 MB)
        EXPECT_LT(peak, 0.5 * bytes + 4 * (3 * 262144.0) + edges) << "overlap " << overlap;
      }
      if (rank == 0 && step == 1)
        std::printf("ZeRO-2 over %d ranks, overlap %s, %d micro-batch(es): gradient %.1f MB, resident at most %.2f MB "
                    "(bound %.2f MB), %.2f MB after the step (pieces %.2f MB)\n", world, overlap ? "on" : "off", M,
                    bytes / 1e6, peak / 1e6, bound / 1e6, after / 1e6, 4 * mine / 1e6);
    }
  }
  host_pages_free(grads, table.numel * sizeof(float));
}

}  // namespace

TEST(MpiZero2, EqualsZero1BitForBitEveryFamily) {
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.bucket_mb=0.02"},
      {"parallel.bucket_mb=0.02", "parallel.first_bucket_mb=0.005", "parallel.overlap=true"},
      {"parallel.bucket_mb=0.02", "parallel.microbatches=2", "parallel.zero_reduce=step"},
      {"parallel.sync=gather_scatter", "parallel.bucket_mb=0.02", "parallel.overlap=true"},
      {"parallel.bucket_mb=0.02", "parallel.grad_dtype=bf16", "parallel.overlap=true"},
  };
  for (const char* family : {"gpt2", "llama", "bert"}) {
    stage_equals_zero1(family, layouts);
    stage_near_unsharded(family, layouts[1]);
  }
}

// Gradient accumulation reduced each micro-batch (parallel.zero_reduce "micro_batch", the default):
// the same sums in another order, so within training_drift of unsharded training (not ZeRO-1's
// bits), for every family, with and without overlap, ZeRO-2 and 3; and M - 1 more reduce-scatters
// of the whole gradient than zero_reduce "step" sends, whose bytes are exact at 2 ranks: (W - 1)/W
// of each bucket, summed, numel·4/2 per pass.
TEST(MpiZero2, EachMicroBatchReducedNearUnsharded) {
  ASSERT_EQ(world_size(), 2) << "run under mpiexec -n 2";
  for (const char* family : {"gpt2", "llama", "bert"})
    stage_near_unsharded(family, {"parallel.bucket_mb=0.02", "parallel.microbatches=2", "parallel.overlap=true"});
  stage_near_unsharded("llama", {"parallel.bucket_mb=0.02", "parallel.microbatches=4"});
  stage_near_unsharded("gpt2", {"parallel.bucket_mb=0", "parallel.microbatches=2", "parallel.overlap=true"}, 3);
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::vector<std::string> base = family_run_sets("gpt2", dir);
  const std::vector<std::string> layout = {"parallel.zero=2", "parallel.bucket_mb=0.02", "parallel.microbatches=2",
                                           "parallel.overlap=true"};
  const Config each = tiny_config_of(base, layout);
  ASSERT_EQ(each.parallel.zero_reduce, ZeroReduce::micro_batch) << "the default";
  const TrainResult per_micro = train(each, MPI_COMM_WORLD, quiet_options(false), true);
  const TrainResult per_step =
      train(tiny_config_of(base, with(layout, {"parallel.zero_reduce=step"})), MPI_COMM_WORLD, quiet_options(false), true);
  const double numel = (double)build_param_table(model_desc_from_config(each.model, 64)).numel;
  EXPECT_EQ(per_micro.bytes_sent_last_step, per_step.bytes_sent_last_step + (2 - 1) * numel * 4 / 2);
  EXPECT_NE(per_micro.final_params, per_step.final_params) << "the same bits: was each micro-batch reduced at all?";
}

// At 4 ranks each family against plain data parallelism, and the three 4-rank layouts (4 replicas;
// TP 2 or 2 stages under 2 replicas) against ZeRO-1 with a family each in turn: every family meets
// every 2-rank layout in MpiZero2.EqualsZero1BitForBitEveryFamily, and the layouts share the
// sharding code whatever the family.
TEST(MpiN4Zero2, EqualsZero1WithTensorParallelismAndPipelineStages) {
  ASSERT_EQ(world_size(), 4) << "run under mpiexec -n 4";
  stage_equals_zero1("gpt2", {{"parallel.bucket_mb=0.02", "parallel.overlap=true"}});
  stage_equals_zero1("llama", {{"parallel.tp=2", "parallel.bucket_mb=0.02"}});
  stage_equals_zero1("bert", {{"parallel.pp_stages=2", "parallel.microbatches=2", "parallel.bucket_mb=0.02"}});
  for (const char* family : {"gpt2", "llama", "bert"})
    stage_near_unsharded(family, {"parallel.bucket_mb=0.02", "parallel.overlap=true"});
}

// A ZeRO-2 checkpoint holds what a ZeRO-1 one does, bit for bit (so it resumes in every layout a
// ZeRO-1 one does: tests/test_mpi_zero.cpp), and an interrupted ZeRO-2 run resumes bit for bit.
TEST(MpiZero2, CheckpointsAreZero1sAndResumeBitForBit) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  checkpoints_are_zero1s(dir, family_run_sets("gpt2", dir), "parallel.bucket_mb=0.02", 2);
}

TEST(MpiZero2, GradientResidentOnlyInItsPieces) {
  resident_only_in_pieces(false);
  resident_only_in_pieces(true);
  resident_only_in_pieces(false, 3);
  resident_only_in_pieces(true, 3);
}
TEST(MpiN4Zero2, GradientResidentOnlyInItsPieces) {
  resident_only_in_pieces(false);
  resident_only_in_pieces(true);
  resident_only_in_pieces(true, 2);
}

namespace {

// One training run's peak RSS growth against the memory estimate, within 10%, on 1, 2 and 4 ranks
// of a model whose state dominates (12.6M parameters: 50 MB a buffer): what ZeRO-2 shards (the
// gradient, AdamW's moments) falls as 1/N. With micro_batches > 1: gradient accumulation, each
// micro-batch reduced (the default parallel.zero_reduce), so the gradient still falls as 1/N.
void peak_rss_falls_as_estimated(int stage, int micro_batches = 1) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer the RSS holds its shadow memory and redzones";
#endif
  ASSERT_EQ(world_size(), 4) << "run under mpiexec -n 4";
  const std::string zero = "parallel.zero=" + std::to_string(stage);
  mallopt(M_MMAP_THRESHOLD, 1 << 20);  // (large blocks unmapped when freed, as the estimate assumes)
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const int V = 64;
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 100000, V, 43);
  const std::vector<std::string> sets = {"model.n_layer=4", "model.n_head=4", "model.d_model=512", "model.seq_len=32",
                                         "train.global_batch=4", "train.steps=2", zero,
                                         "parallel.bucket_mb=2", "runtime.threads=1", "runtime.trace_steps=0"};
  std::vector<double> grads_of, params_of;
  for (int ranks : {1, 2, 4}) {
    const Config cfg = tiny_config(tr, with(sets, {"train.global_batch=" + std::to_string(ranks * micro_batches),
                                                   "parallel.microbatches=" + std::to_string(micro_batches)}));
    const ModelDesc desc = model_desc_from_config(cfg.model, V);
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, 0, &sub);
    if (sub != MPI_COMM_NULL) {
      int rank = 0;
      MPI_Comm_rank(sub, &rank);
      Config warm = cfg;  // (one step: the libraries' one-time buffers, resident before the peak)
      warm.train.steps = 1;
      train(warm, sub, quiet_options(false), false);
      {
        std::ofstream clear("/proc/self/clear_refs");
        clear << "5";
      }
      const double before = status_bytes("VmRSS:");
      const TrainResult res = train(cfg, sub, quiet_options(false), false);
      const double grown = status_bytes("VmHWM:") - before;
      ASSERT_EQ(res.step_ms.size(), 2u);
      const MemoryEstimate e = estimate_memory(desc, cfg.train.global_batch / ranks, cfg.model.seq_len, cfg, ranks,
                                               rank, false);
      const double predicted = e.params + e.grads + e.optimizer + e.activations + e.scratch + e.sync_buffers + e.data;
      double worst = std::fabs(predicted / grown - 1);
      MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, sub);
      if (rank == 0) {
        grads_of.push_back(e.grads);
        params_of.push_back(e.params);
        std::printf("ZeRO-%d on %d rank(s), %d micro-batch(es): estimate %.1f MB (params %.1f, grads %.1f, AdamW %.1f, "
                    "activations %.1f), peak RSS growth %.1f MB; worst rank %.1f%%\n", stage, ranks, micro_batches,
                    predicted / 1e6, e.params / 1e6,
                    e.grads / 1e6, e.optimizer / 1e6, e.activations / 1e6, grown / 1e6, 100 * worst);
      }
      // (Not a rounding bound: the estimate's model of the memory against the pages the run touched.)
      EXPECT_LT(worst, 0.10) << ranks << " ranks";
      MPI_Comm_free(&sub);
    }
    sleeping_barrier(MPI_COMM_WORLD);  // (the ranks left out wait without taking a core)
  }
  if (world_rank() == 0) {
    ASSERT_EQ(grads_of.size(), 3u);
    // The gradient's share: whole on one rank, about its half and quarter (plus the window of
    // 2 MB buckets and their edge pages) on two and four.
    EXPECT_LT(grads_of[1], 0.6 * grads_of[0]);
    EXPECT_LT(grads_of[2], 0.35 * grads_of[0]);
    // ZeRO-3: the parameters too, but for the embeddings and head (whole) and one block whole
    // (4 blocks of 3.1M parameters: 1/4 of the blocks at 4 ranks is one block's worth, so half)
    if (stage == 3) {
      EXPECT_LT(params_of[1], 0.8 * params_of[0]);
      EXPECT_LT(params_of[2], 0.55 * params_of[0]);
    }
  }
}

}  // namespace

TEST(MpiN4Zero2, PeakRssFallsAsEstimated) { peak_rss_falls_as_estimated(2); }
TEST(MpiN4Zero2, PeakRssFallsAsEstimatedWithAccumulation) { peak_rss_falls_as_estimated(2, 2); }

// ---- ZeRO-3 ----------------------------------------------------------------------------------------

TEST(MpiZero3, EqualsZero1BitForBitEveryFamily) {
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.bucket_mb=0"},
      {"parallel.bucket_mb=0", "parallel.overlap=true"},
      {"parallel.bucket_mb=0", "parallel.microbatches=2", "parallel.zero_reduce=step"},
      {"parallel.sync=gather_scatter", "parallel.bucket_mb=0", "parallel.overlap=true"},
      {"parallel.bucket_mb=0", "parallel.overlap=true", "runtime.recompute=full"},
      {"parallel.bucket_mb=0", "parallel.grad_dtype=bf16"},
  };
  for (const char* family : {"gpt2", "llama", "bert"}) {
    stage_equals_zero1(family, layouts, 3);
    // (buckets of several tensors, cut at the blocks: other sums than ZeRO-1's, the same bound)
    stage_near_unsharded(family, {"parallel.bucket_mb=0.02", "parallel.overlap=true"}, 3);
  }
}

// As MpiN4Zero2's: each family against plain data parallelism, the layouts a family each in turn
// (a different pairing from ZeRO-2's).
TEST(MpiN4Zero3, EqualsZero1WithTensorParallelismAndPipelineStages) {
  ASSERT_EQ(world_size(), 4) << "run under mpiexec -n 4";
  stage_equals_zero1("llama", {{"parallel.bucket_mb=0", "parallel.overlap=true"}}, 3);
  stage_equals_zero1("bert", {{"parallel.tp=2", "parallel.bucket_mb=0"}}, 3);
  stage_equals_zero1("gpt2", {{"parallel.pp_stages=2", "parallel.microbatches=2", "parallel.bucket_mb=0"}}, 3);
  for (const char* family : {"gpt2", "llama", "bert"})
    stage_near_unsharded(family, {"parallel.bucket_mb=0.02", "parallel.overlap=true"}, 3);
}

// A ZeRO-3 checkpoint holds what a ZeRO-1 one does, bit for bit: each rank writes its pieces of the
// blocks' parameters, the tensors outside the blocks by turns; an interrupted ZeRO-3 run resumes
// bit for bit; the ZeRO-3 file resumed with zero 0 continues as the ZeRO-1 file does.
TEST(MpiZero3, CheckpointsAreZero1sAndResumeBitForBit) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::vector<std::string> base = family_run_sets("llama", dir);
  const TrainResult z3 = checkpoints_are_zero1s(dir, base, "parallel.bucket_mb=0", 3);
  auto cfg = [&](const std::string& run, const std::string& zero) {
    return checkpoint_config(base, run, "parallel.bucket_mb=0", zero);
  };
  // Another layout: the step-8 files of ZeRO-1 and ZeRO-3 resumed with zero 0 (and with zero 3
  // from ZeRO-1's) continue alike.
  auto resumed = [&](const std::string& from, const std::string& run, const std::string& zero) {
    return train(cfg(run, zero), MPI_COMM_WORLD, train_options(true, checkpoint_path(from + "/checkpoints", 8)), true);
  };
  const TrainResult from1 = resumed(dir + "/z1", dir + "/from-z1", "0");
  const TrainResult from3 = resumed(dir + "/z3", dir + "/from-z3", "0");
  const TrainResult into3 = resumed(dir + "/z1", dir + "/into-z3", "3");
  ASSERT_EQ(from3.start_step, 8);
  EXPECT_EQ(from3.losses, from1.losses);
  EXPECT_EQ(from3.final_params, from1.final_params);
  EXPECT_EQ(into3.losses, std::vector<float>(z3.losses.begin() + 8, z3.losses.end()));
  EXPECT_EQ(into3.final_params, z3.final_params);
}

// Refused where the blocks' parameters would not stay in pieces: bf16 weight copies, zb-h1's
// deferred weight gradients.
TEST(MpiZero3, RefusesWhatItCannotShard) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::vector<std::string> base = family_run_sets("gpt2", dir);
  auto refused = [&](const std::vector<std::string>& sets, const std::string& needle) {
    try {
      train(tiny_config_of(base, with(sets, {"parallel.zero=3"})), MPI_COMM_WORLD, quiet_options(false));
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const CollectiveError& e) {  // (the same error on every rank)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused({"runtime.precision=bf16"}, "runtime.precision \"bf16\"");
  refused({"parallel.pp_stages=2", "parallel.microbatches=2", "parallel.schedule=zb-h1"}, "zb-h1");
}

namespace {

// ZeRO-3's gathers over a real table: every rank writes the same parameters, keeps only its pieces
// of the blocks (release_layers), changes its pieces as an update would, and each block gathered
// (need_layer, with or without prefetching) holds every owner's new values; resident: the tensors
// outside the blocks, the pieces, and the blocks whole at the time.
void blocks_gathered_from_their_owners(bool overlap) {
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const ModelDesc d = test::desc_of("gpt2", 4, 4, 256, 64, 512);
  const ParamTable table = build_param_table(d);
  SyncOptions so;
  so.zero = so.shard_grads = so.shard_params = true;
  so.bucket_mb = 0.5;
  so.first_bucket_mb = 0.25;
  so.overlap = overlap;
  const size_t bytes = table.numel * sizeof(float);
  float* params = static_cast<float*>(host_pages_alloc(bytes));
  float* grads = static_cast<float*>(host_pages_alloc(bytes));
  {
    GradSync sync(so, MPI_COMM_WORLD, cpu_ops(), grads, table, nullptr);
    sync.connect();
    sync.params = params;
    for (size_t i = 0; i < table.numel; i++) params[i] = (float)(i % 11);
    sync.release_layers();
    const double bound = 4 * zero3_param_floats(table, sync.buckets, sync.shard, overlap, 4096 / 4);
    const double pieces_only = 4 * zero3_param_floats(table, sync.buckets, sync.shard, false, 4096 / 4);
    const double resident = host_pages_resident(params, bytes);
    // at most the pieces, the tensors outside the blocks and the edges: the bound less one block
    EXPECT_LT(resident, pieces_only) << "after release_layers";
    // an update: each rank adds 100 to its own pieces (the only values it owns)
    for (const ShardPiece& p : sync.shard)
      for (size_t i = p.begin; i < p.end; i++) params[i] += 100.0f;
    double peak = 0;
    size_t wrong = 0;
    for (int l = 0; l < d.n_layer; l++) {
      sync.need_layer(l);
      sync.prefetch_layer(l + 1);
      for (const ParamSlice& s : table.slices) {
        if (s.layer != l) continue;
        for (size_t i = s.offset; i < s.offset + s.numel; i++) wrong += params[i] != (float)(i % 11) + 100.0f;
      }
      peak = std::max(peak, host_pages_resident(params, bytes));
      sync.release_layer(l);
    }
    sync.need_layer(d.n_layer - 1);  // (drains a prefetch left in flight, had there been one)
    sync.release_layer(d.n_layer - 1);
    EXPECT_EQ(wrong, 0u) << "gathered blocks holding other than their owners' values";
    EXPECT_LE(peak, bound) << "overlap " << overlap;
    EXPECT_LT(peak, 0.8 * (double)bytes) << "overlap " << overlap;
    if (rank == 0)
      std::printf("ZeRO-3 over %d ranks, overlap %s: parameters %.1f MB, resident %.2f MB between blocks, at most "
                  "%.2f MB (bound %.2f MB)\n", world, overlap ? "on" : "off", bytes / 1e6, resident / 1e6, peak / 1e6,
                  bound / 1e6);
  }
  host_pages_free(params, bytes);
  host_pages_free(grads, bytes);
}

}  // namespace

TEST(MpiZero3, BlocksGatheredFromTheirOwners) {
  blocks_gathered_from_their_owners(false);
  blocks_gathered_from_their_owners(true);
}
TEST(MpiN4Zero3, BlocksGatheredFromTheirOwners) {
  blocks_gathered_from_their_owners(false);
  blocks_gathered_from_their_owners(true);
}
TEST(MpiN4Zero3, PeakRssFallsAsEstimated) { peak_rss_falls_as_estimated(3); }
