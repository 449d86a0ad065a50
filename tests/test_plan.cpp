// llmpi-plan's model (src/plan/): memory per stage against the code's own allocations and the
// start-up estimate, ZeRO-1's shard, activation slots per schedule, the α-β formulas, the measured
// links file, and the step time against the schedule simulation plus hand-computed sync terms.
// Serial and deterministic: no timing is measured here.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>

#include "comm/grad_sync.h"
#include "model_test_util.h"
#include "pipeline/stage_layers.h"
#include "plan/link_model.h"
#include "plan/plan.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "model/memory_estimate.h"

using namespace llmpi;

namespace {

std::string fixture(const std::string& rel) {
  for (std::string base : {"tests/fixtures/", "../tests/fixtures/"})
    if (std::ifstream(base + rel).good()) return base + rel;
  return "";
}

Link simple_link(const std::string& name, double alpha, double beta) {
  Link l;
  l.name = name;
  l.alpha_s = alpha;
  l.beta_s_per_byte = beta;
  return l;
}

// A plan of desc on one node of world ranks over one simple link.
PlanInputs inputs(const ModelDesc& d, int T, int G, int world, int pp, int M) {
  PlanInputs in;
  in.desc = d;
  in.seq_len = T;
  in.global_batch = G;
  in.world = world;
  in.pp = pp;
  in.microbatches = M;
  in.device = find_device("cpu");
  in.fabric.intra = in.fabric.inter = simple_link("test", 1e-5, 1e-9);
  in.fabric.ranks_per_node = world;
  return in;
}

// A synthetic profile: every cost given.
LayerCosts synthetic_costs(int mb, int T) {
  LayerCosts c;
  c.micro_batch = mb, c.seq_len = T;
  c.embed_f = 0, c.embed_b = 0;
  c.block_f = 1.0, c.block_b = 2.0, c.block_bi = 1.2;
  c.head_f = 0, c.head_b = 0, c.head_bi = 0;
  c.opt_per_param = 1e-6;
  c.source = "synthetic";
  return c;
}

size_t host_loss_row(const ModelDesc& d, int B, int T) { return (d.head == HeadKind::lm ? (size_t)B * T : B) * 4; }

// The planner's byte counts are integers held in doubles (below 2^53, or halves and quarters of
// them): their EXPECT_EQs below are exact. Its times are fp64 model arithmetic; where a check
// evaluates a formula in another order than the code (or a product folded into an FMA or not,
// -ffp-contract), each side is within gamma_n = n·u/(1 − n·u), u = 2^-53, of the exact value for
// n roundings along its deepest chain, relative to the sum of the magnitudes of its terms: the two
// differ by at most twice that.
double fp64_bound(int n, double magnitude) {
  const double u = 0x1p-53;
  return 2 * (n * u / (1 - n * u)) * std::fabs(magnitude);
}

}  // namespace

// pp = 1, ZeRO-0: the plan's per-rank bytes are estimate_memory's, for every family and both
// attention implementations (fused: lse per row instead of P, no T x T backward scratch).
TEST(PlanMemory, OneStageEqualsTheStartupEstimate) {
  for (const AttentionImpl att : {AttentionImpl::full, AttentionImpl::fused})
  for (const std::string fam : {"gpt2", "llama", "bert"}) {
    const int T = 12, world = 2, G = 6;
    ModelDesc d = test::desc_of(fam, 3, 2, 16, T, 37);
    d.attention = att;
    Config cfg = parse_config("{}", "test", {"data.train=-", "train.global_batch=6", "model.seq_len=12"});
    PlanInputs in = plan_inputs_from_config(cfg, d, world);  // the run's own configuration
    EXPECT_EQ(in.global_batch, G);
    EXPECT_EQ(in.pp, 1);
    in.fabric.intra = simple_link("test", 1e-5, 1e-9);
    const PlanResult r = plan(in);
    const MemoryEstimate e = estimate_memory(d, G / world, T, cfg, world, 0, false);
    const MemoryRow* m = r.memory_row("fp32", "-", 0, 0);
    ASSERT_TRUE(m) << fam;
    EXPECT_EQ(m->params, e.params) << fam;
    EXPECT_EQ(m->grads, e.grads) << fam;
    EXPECT_EQ(m->optimizer, e.optimizer) << fam;
    EXPECT_EQ(m->activations, e.activations) << fam;
    EXPECT_EQ(m->scratch, e.scratch) << fam;
    EXPECT_EQ(m->slots, 1);
    // ZeRO-1 the same way (the estimate counts the shard and the reduce-scatter receive buffer).
    cfg.parallel.zero = 1;
    const MemoryEstimate ez = estimate_memory(d, G / world, T, cfg, world, 0, false);
    const MemoryRow* mz = r.memory_row("fp32", "-", 1, 0);
    ASSERT_TRUE(mz);
    EXPECT_EQ(mz->optimizer, ez.optimizer) << fam;
    EXPECT_EQ(mz->buffers, ez.sync_buffers) << fam;
    // bf16 as built (runtime.precision bf16): the weight copy, the bf16 operands in the activations
    // and the GEMMs' operand scratch, as the start-up estimate counts them (CPU device: fp32 scratch
    // copies); larger than fp32 at this toy size, and not the projection.
    cfg.parallel.zero = 0;
    cfg.runtime.precision = GemmPrecision::bf16;
    const MemoryEstimate eb = estimate_memory(d, G / world, T, cfg, world, 0, false);
    const MemoryRow* mb = r.memory_row("bf16-built", "-", 0, 0);
    const MemoryRow* mp = r.memory_row("bf16", "-", 0, 0);
    ASSERT_TRUE(mb && mp) << fam;
    EXPECT_EQ(mb->params, eb.params) << fam;
    EXPECT_EQ(mb->grads, eb.grads) << fam;
    EXPECT_EQ(mb->optimizer, eb.optimizer) << fam;
    EXPECT_EQ(mb->activations, eb.activations) << fam;
    EXPECT_EQ(mb->scratch, eb.scratch) << fam;
    EXPECT_GT(mb->params, m->params) << fam << ": the bf16 weight copy";
    EXPECT_NE(mb->total, mp->total) << fam;
  }
}

// runtime.recompute: the plan's activations are the start-up estimate's (fp32 and bf16 as built),
// smaller for selective and smaller again for full; each block's backward grows by the recompute
// (full: one block forward; selective with full attention: the attention's share of it), so the
// step time grows; zb-h1, which refuses recomputation, is not planned with it.
TEST(PlanMemory, RecomputeShrinksActivationsAndAddsBackwardTime) {
  const int T = 12, world = 4, G = 8;
  const ModelDesc d = test::desc_of("gpt2", 4, 2, 16, T, 37);
  double act[3] = {}, step[3] = {};
  int i = 0;
  for (const std::string rc : {"none", "selective", "full"}) {
    Config cfg = parse_config("{}", "test", {"data.train=-", "train.global_batch=8", "model.seq_len=12",
                                             "runtime.recompute=" + rc});
    PlanInputs in = plan_inputs_from_config(cfg, d, world);
    in.pp = 2;
    in.microbatches = 2;
    in.fabric.intra = simple_link("test", 1e-5, 1e-9);
    const PlanResult r = plan(in);
    const MemoryRow* m = r.memory_row("fp32", "1f1b", 0, 1);
    const TimeRow* t = r.time_row("1f1b", 0);
    ASSERT_TRUE(m && t) << rc;
    // zb-h1 refuses recomputation: planned only without it
    EXPECT_EQ(r.memory_row("fp32", "zb-h1", 0, 1) != nullptr, rc == "none") << rc;
    EXPECT_EQ(r.time_row("zb-h1", 0) != nullptr, rc == "none") << rc;
    act[i] = m->activations / m->slots;
    step[i] = t->compute_s;
    EXPECT_EQ(act[i], (double)activation_bytes(d, r.stages[1].part, r.micro_batch, T, GemmPrecision::fp32,
                                               cfg.runtime.recompute))
        << rc;
    const MemoryRow* b = r.memory_row("bf16-built", "1f1b", 0, 1);
    ASSERT_TRUE(b) << rc;
    EXPECT_EQ(b->activations / b->slots, (double)activation_bytes(d, r.stages[1].part, r.micro_batch, T,
                                                                  GemmPrecision::bf16, cfg.runtime.recompute))
        << rc;
    // one stage (the start-up estimate's case): the same bytes as estimate_memory
    in.pp = 1;
    in.microbatches = 1;
    const PlanResult one = plan(in);
    const MemoryEstimate e = estimate_memory(d, G / world, T, cfg, world, 0, false);
    ASSERT_TRUE(one.memory_row("fp32", "-", 0, 0)) << rc;
    EXPECT_EQ(one.memory_row("fp32", "-", 0, 0)->activations, e.activations) << rc;
    i++;
  }
  EXPECT_GT(act[0], act[1]);
  EXPECT_GT(act[1], act[2]);
  // a zb-h1 plan with recomputation is refused, as the configuration refuses it
  Config cfg = parse_config("{}", "test", {"data.train=-", "train.global_batch=8", "model.seq_len=12",
                                           "runtime.recompute=full"});
  PlanInputs in = plan_inputs_from_config(cfg, d, world);
  in.pp = 2;
  in.schedule = ScheduleKind::zb_h1;
  EXPECT_THROW(plan(in), Error);
  EXPECT_LT(step[0], step[1]);  // full attention on the CPU: selective recomputes P
  EXPECT_LT(step[1], step[2]);
}

// Gradient accumulation (parallel.microbatches M, pp 1): the plan holds one micro-batch of
// activations, as the start-up estimate does, and the step's compute is M micro-batches' (the same
// FLOPs: within rounding of the one-batch plan's, the fixed per-micro-batch costs aside).
TEST(PlanMemory, GradientAccumulationHoldsOneMicroBatch) {
  const int T = 12, world = 2, G = 8, M = 4;
  const ModelDesc d = test::desc_of("gpt2", 3, 2, 16, T, 37);
  Config cfg = parse_config("{}", "test", {"data.train=-", "train.global_batch=8", "model.seq_len=12",
                                           "parallel.microbatches=4"});
  PlanInputs in = plan_inputs_from_config(cfg, d, world);
  EXPECT_EQ(in.microbatches, M);
  in.fabric.intra = simple_link("test", 1e-5, 1e-9);
  const PlanResult r = plan(in);
  EXPECT_EQ(r.micro_batch, G / world / M);
  const MemoryEstimate e = estimate_memory(d, G / world, T, cfg, world, 0, false);
  const MemoryRow* m = r.memory_row("fp32", "-", 0, 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->slots, 1);
  EXPECT_EQ(m->activations, e.activations);
  EXPECT_EQ(m->scratch, e.scratch);
  in.microbatches = 1;
  const PlanResult one = plan(in);
  const MemoryRow* m1 = one.memory_row("fp32", "-", 0, 0);
  ASSERT_TRUE(m1);
  EXPECT_LT(m->activations, m1->activations / 2);
  EXPECT_EQ(m->params + m->grads + m->optimizer, m1->params + m1->grads + m1->optimizer);
  const TimeRow* t = r.time_row("-", 0);
  const TimeRow* t1 = one.time_row("-", 0);
  ASSERT_TRUE(t && t1);
  // Bound: the device-table costs are linear in the rows (no fixed cost per micro-batch), so M
  // micro-batches of N/M rows and one of N differ by rounding only: each cost ≤ 10 roundings deep
  // (rate, quotient, the fused head's sums), the stage's F + B ≤ 6 more, the busy sum 2M more; the
  // fused head's b − recompute cancels at most half of what it sums (magnitude 2·compute_s).
  EXPECT_NEAR(t->compute_s, t1->compute_s, fp64_bound(16 + 2 * M, 2 * t1->compute_s));
}

// On a GPU device the bf16 rows as built count the GEMMs' operand scratch in bf16, as
// estimate_memory does with on_gpu (GPT-2 124M at B = 64 planned 42.08 GB for the 42.10 GB an
// H100 measured: bench/results/gpu-first-run-h100-2026-11-24.json).
TEST(PlanMemory, Bf16AsBuiltOnAGpuEqualsTheStartupEstimate) {
  const int T = 16, world = 1, G = 4;
  ModelDesc d = test::desc_of("gpt2", 2, 2, 32, T, 101);
  d.attention = AttentionImpl::fused;
  Config cfg = parse_config("{}", "test", {"data.train=-", "train.global_batch=4", "model.seq_len=16",
                                           "runtime.precision=bf16"});
  PlanInputs in = plan_inputs_from_config(cfg, d, world);
  in.device = find_device("h100");
  in.fabric.intra = simple_link("test", 1e-5, 1e-9);
  const PlanResult r = plan(in);
  const MemoryEstimate e = estimate_memory(d, G, T, cfg, world, 0, true);
  const MemoryRow* m = r.memory_row("bf16-built", "-", 0, 0);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->params, e.params);
  EXPECT_EQ(m->activations, e.activations);
  EXPECT_EQ(m->scratch, e.scratch);
  EXPECT_EQ(m->total, e.device_bytes());
}

// activation_bytes / kept_bytes of a part equal what Activations allocates for that part.
TEST(PlanMemory, PartActivationBytesEqualTheAllocations) {
  for (const AttentionImpl att : {AttentionImpl::full, AttentionImpl::fused})
  for (const std::string fam : {"gpt2", "llama", "bert"}) {
    const int B = 2, T = 8;
    ModelDesc d = test::desc_of(fam, 4, 2, 16, T, 37);
    d.attention = att;
    EXPECT_EQ(activation_bytes(d, ModelPart::whole(), B, T), activation_bytes(d, B, T)) << fam;
    for (const ModelPart p : {ModelPart{0, 1, true, false}, ModelPart{1, 3, false, false}, ModelPart{3, 4, false, true},
                              ModelPart{0, 0, true, false}, ModelPart::whole()}) {
      Model m(d, cpu_ops(), p);
      Activations a(m, B, T);
      EXPECT_EQ(a.bytes() + host_loss_row(d, B, T), activation_bytes(d, p, B, T)) << fam << " part " << p.l0;
      const size_t before = a.bytes();
      m.reserve_input_only(a);
      EXPECT_EQ(a.bytes() - before, kept_bytes(d, p, B, T)) << fam << " part " << p.l0;
    }
  }
}

// pp = 2: each stage's parameters are its chunk's table, built the way the pipeline builds it.
TEST(PlanMemory, StagesHoldTheirChunksParameters) {
  const int T = 8;
  const ModelDesc d = test::desc_of("gpt2", 5, 2, 16, T, 37);
  for (int S : {2, 3}) {
    PlanInputs in = inputs(d, T, 8, 2 * S, S, 2);  // 2 replicas x 4 sequences, two micro-batches of 2
    const PlanResult r = plan(in);
    const std::vector<int> counts = split_layers(d, T, S, {});
    ASSERT_EQ(r.layer_counts, counts);
    size_t sum = 0;
    for (int s = 0; s < S; s++) {
      const ModelPart p = virtual_stage_part(counts, s);
      Model m(d, cpu_ops(), p);  // the real model of the chunk
      const MemoryRow* row = r.memory_row("fp32", "1f1b", 0, s);
      ASSERT_TRUE(row);
      EXPECT_EQ(row->params, 4.0 * m.table.numel) << "stage " << s;
      EXPECT_EQ(row->grads, 4.0 * m.table.numel);
      EXPECT_EQ(row->optimizer, 8.0 * m.table.numel);
      EXPECT_EQ(r.stages[s].activation_slot, (double)activation_bytes(d, p, 2, T));
      sum += m.table.numel;
    }
    // The tied LM head's copy of the token embedding is the only tensor held twice.
    EXPECT_EQ(sum, build_param_table(d).numel + (size_t)d.vocab_size * d.d_model);
  }
}

// ZeRO-1: the optimizer holds 2 floats for each float of the rank's shard, about 1/DP of ZeRO-0's.
TEST(PlanMemory, ZeroOneShardsTheOptimizerState) {
  const int T = 8;
  const ModelDesc d = test::desc_of("llama", 4, 2, 32, T, 101);
  for (int dp : {2, 4, 8}) {
    PlanInputs in = inputs(d, T, 2 * dp * 2, 2 * dp, 2, 2);
    in.bucket_mb = 0.002;  // many buckets: the shard is a piece of each
    const PlanResult r = plan(in);
    for (int s = 0; s < 2; s++) {
      const ParamTable t = build_param_table(d, virtual_stage_part(r.layer_counts, s));
      size_t mine = 0;
      for (const ShardPiece& p : shard_pieces(make_buckets(t, in.bucket_mb, in.bucket_mb), dp, 0)) mine += p.end - p.begin;
      const MemoryRow* z0 = r.memory_row("fp32", "1f1b", 0, s);
      const MemoryRow* z1 = r.memory_row("fp32", "1f1b", 1, s);
      ASSERT_TRUE(z0 && z1);
      EXPECT_EQ(z1->optimizer, 2.0 * 4 * mine);
      // Bound (not rounding): each bucket's piece is the floor or ceiling of its n/dp floats
      // (ZeroShard.PiecesCoverEveryFloatOnce), so mine is within #buckets of numel/dp.
      const size_t nb = make_buckets(t, in.bucket_mb, in.bucket_mb).size();
      EXPECT_NEAR(z1->optimizer / z0->optimizer, 1.0 / dp, (double)nb / t.numel) << "dp " << dp;
      EXPECT_EQ(z1->params, z0->params);
      // bf16 projection: fp32 master weights sharded too, bf16 weights and fp32 grads whole.
      const MemoryRow* b1 = r.memory_row("bf16", "1f1b", 1, s);
      ASSERT_TRUE(b1);
      EXPECT_EQ(b1->params, 2.0 * t.numel + 4.0 * mine);
      EXPECT_EQ(b1->grads, 4.0 * t.numel);
    }
  }
}

// The checkpoint section: the file's bytes (params + m + v of the whole model) over the bandwidth;
// per stage the staging of its busiest rank, each rank's the start-up estimate's (RankChunks at
// its stage, tensor shard and replica: exact byte counts); a synchronous save on the CPU stages
// nothing; the fewest steps between checkpoints whose time covers the write.
TEST(PlanMemory, CheckpointStagingIsTheBusiestRanksEstimate) {
  const int T = 8;
  const ModelDesc d = test::desc_of("gpt2", 4, 2, 32, T, 101);
  for (const int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    PlanInputs in = inputs(d, T, 16, 8, 2, 2);  // 2 replicas × 2 stages × tp 2
    in.tp = 2;
    in.zero = zero;
    in.bucket_mb = 0.002;
    in.fs_bandwidth = 2e6;
    const PlanResult r = plan(in);
    const CheckpointPlan& cp = r.checkpoint;
    EXPECT_EQ(cp.state_bytes, 3 * 4.0 * build_param_table(d).numel);
    EXPECT_DOUBLE_EQ(cp.write_s, cp.state_bytes / 2e6);
    EXPECT_EQ(cp.export_bytes, 4.0 * (4 * 32) * 32);  // the MLP's 4C × C weight, the largest tensor
    Config cfg = parse_config("{}", "test", {"data.train=-", "checkpoint.every=1", "parallel.pp_stages=2",
                                              "parallel.tp=2", "parallel.microbatches=2", "parallel.bucket_mb=0.002",
                                              "parallel.first_bucket_mb=0.002", "parallel.zero=" + std::to_string(zero)});
    ASSERT_EQ(cp.staging.size(), 2u);
    for (int s = 0; s < 2; s++) {
      double most = 0;
      for (int t = 0; t < 2; t++)
        for (int q = 0; q < 2; q++) {
          RankChunks rc;
          rc.parts = {virtual_stage_part(r.layer_counts, s)};
          rc.tp = 2, rc.tp_rank = t;
          most = std::max(most, estimate_memory(tensor_shard(d, 2, t), 4, T, cfg, 2, q, false, &rc).checkpoint_save);
        }
      EXPECT_GT(most, 0);
      EXPECT_EQ(cp.staging[s], most) << "stage " << s;
    }
    const TimeRow* t = r.time_row("1f1b", zero);
    ASSERT_TRUE(t);
    EXPECT_EQ(cp.every_to_hide, std::max(1, (int)std::ceil(cp.write_s / t->step_s)));
    in.checkpoint_async = false;
    const PlanResult sync = plan(in);
    EXPECT_EQ(sync.checkpoint.staging, std::vector<double>(2, 0.0));
    EXPECT_EQ(sync.checkpoint.every_to_hide, 0);
  }
}

// ZeRO-1 over NCCL holds a device buffer of W pieces of the largest bucket's ceil(n/W) floats,
// padded (comm/nccl.h), plus their bf16 copy for a bf16 gradient; nothing without ZeRO-1.
TEST(PlanMemory, ZeroOneOverNcclCountsItsPaddedPieces) {
  const int T = 8, dp = 4;
  const ModelDesc d = test::desc_of("gpt2", 4, 2, 32, T, 101);
  for (bool bf16 : {false, true}) {
    PlanInputs in = inputs(d, T, 2 * dp * 2, 2 * dp, 2, 2);
    in.bucket_mb = 0.003;
    in.sync = SyncMethod::nccl;
    in.grad_bf16 = bf16;
    const PlanResult r = plan(in);
    for (int s = 0; s < 2; s++) {
      size_t largest = 0;
      const ParamTable t = build_param_table(d, virtual_stage_part(r.layer_counts, s));
      for (const Bucket& b : make_buckets(t, in.bucket_mb, in.bucket_mb)) largest = std::max(largest, b.end - b.begin);
      const double c = (double)((largest + dp - 1) / dp);
      const MemoryRow* z0 = r.memory_row("fp32", "1f1b", 0, s);
      const MemoryRow* z1 = r.memory_row("fp32", "1f1b", 1, s);
      ASSERT_TRUE(z0 && z1);
      EXPECT_EQ(z0->buffers, 0.0);
      EXPECT_EQ(z1->buffers, dp * c * (bf16 ? 6 : 4)) << (bf16 ? "bf16" : "fp32") << " stage " << s;
    }
  }
}

// parallel.zero_reduce "micro_batch" with gradient accumulation (M = 4): the ZeRO-2 and ZeRO-3 rows
// send M - 1 more reduce-scatters of the whole gradient than "step" ((W - 1)/W of 4n bytes each,
// exact at W = 4) and take longer; the gradient's memory stays at its one-micro-batch size where
// "step" holds it whole; rows 0 and 1 do not change.
TEST(PlanTime, ZeroReduceEachMicroBatch) {
  const int T = 8, M = 4;
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 256, T, 101);  // (1.6M floats: pages do not dominate)
  PlanInputs in = inputs(d, T, 16, 4, 1, M);
  in.bucket_mb = 1;
  in.zero_reduce_each_micro_batch = false;
  const PlanResult once = plan(in);
  in.zero_reduce_each_micro_batch = true;
  const PlanResult each = plan(in);
  const double n = (double)build_param_table(d).numel;
  ASSERT_EQ(once.time.size(), each.time.size());
  for (size_t i = 0; i < once.time.size(); i++) {
    const int z = once.time[i].zero;
    SCOPED_TRACE("zero " + std::to_string(z));
    if (z < 2) {
      EXPECT_EQ(each.time[i].bytes_per_rank, once.time[i].bytes_per_rank);
      EXPECT_EQ(each.time[i].step_s, once.time[i].step_s);
      continue;
    }
    EXPECT_EQ(each.time[i].bytes_per_rank, once.time[i].bytes_per_rank + (M - 1) * 0.75 * 4 * n);
    EXPECT_GT(each.time[i].step_s, once.time[i].step_s);
  }
  ASSERT_EQ(once.stages.size(), 1u);
  EXPECT_EQ(once.stages[0].zero2_grad_floats, n) << "reduced once a step: whole until the last micro-batch";
  EXPECT_LT(each.stages[0].zero2_grad_floats, 0.6 * n);  // (a quarter, one 1 MB bucket, edge pages)
  EXPECT_LT(each.stages[0].zero3_grad_floats, 0.6 * n);
}

// ZeRO-2 on a GPU (device pages in 2 MiB chunks): the gradient rows count the limit the sync keeps
// the backed pages under — this rank's pieces with their edge chunks and the tensors outside the
// blocks, plus three buckets — which at 8 ranks and 25 MB buckets is under 0.85 of GPT-2 124M's
// gradient (the tied token embedding, outside the blocks, is a third of it, and each 3 MB piece
// can touch two chunks more); reduced once a step with micro-batches, the whole gradient.
TEST(PlanMemory, Zero2OnAGpuCountsTheDevicePagesLimit) {
  const int T = 1024;
  const ModelDesc d = test::desc_of("gpt2", 12, 12, 768, T, 50257);
  PlanInputs in = inputs(d, T, 64, 8, 1, 1);
  in.device = find_device("h100");
  in.bucket_mb = 25;
  in.zero = 2;
  const ParamTable table = build_param_table(d);
  double outside = 0;
  for (const ParamSlice& sl : table.slices)
    if (sl.layer < 0) outside += (double)sl.numel;
  const double n = (double)table.numel;
  auto grads_row = [](const PlanResult& r, int zero) {
    for (const MemoryRow& m : r.memory)
      if (m.zero == zero && m.precision == "fp32" && m.stage == 0) return m.grads;
    return -1.0;
  };
  const PlanResult one = plan(in);
  EXPECT_EQ(grads_row(one, 1), 4 * n);
  const double z2 = grads_row(one, 2);
  EXPECT_GT(z2, 4 * (n / 8 + outside)) << "the pieces and the outside tensors at least";
  EXPECT_LT(z2, 0.85 * 4 * n);
  in.microbatches = 2;
  in.global_batch = 128;
  in.zero_reduce_each_micro_batch = false;
  EXPECT_GE(grads_row(plan(in), 2), 4 * n) << "reduced once a step: every chunk backed";
  in.zero_reduce_each_micro_batch = true;
  EXPECT_LT(grads_row(plan(in), 2), 4 * n) << "each micro-batch reduced: the limit and the pieces' sum";
}

// ZeRO-3 on a GPU: the parameter rows are the limit of the parameters' device pages — the tensors
// outside the blocks and this rank's pieces of the blocks', three blocks whole, the chunks at the
// pieces' ends (2 MiB each, about as much again as 25 MB buckets' pieces on 8 cards) — so for
// GPT-2 1.5B on 8 cards they fall to under half the whole, and the gradient
// rows are ZeRO-2's limit over the same buckets.
TEST(PlanMemory, Zero3OnAGpuCountsTheDevicePagesLimits) {
  const int T = 1024;
  const ModelDesc d = test::desc_of("gpt2", 48, 25, 1600, T, 50257);
  PlanInputs in = inputs(d, T, 64, 8, 1, 1);
  in.device = find_device("h100");
  in.bucket_mb = 25;
  in.zero = 3;
  const ParamTable table = build_param_table(d);
  double outside = 0, block = 0;
  for (const ParamSlice& sl : table.slices) {
    if (sl.layer < 0) outside += (double)sl.numel;
    if (sl.layer == 0) block += (double)sl.numel;
  }
  const double n = (double)table.numel, blocks = n - outside;
  const PlanResult r = plan(in);
  double params = -1, grads = -1, params1 = -1;
  for (const MemoryRow& m : r.memory) {
    if (m.precision != "fp32" || m.stage != 0) continue;
    if (m.zero == 3) params = m.params, grads = m.grads;
    if (m.zero == 1) params1 = m.params;
  }
  EXPECT_EQ(params1, 4 * n);
  EXPECT_GT(params, 4 * (outside + blocks / 8 + 3 * block)) << "the outside tensors, the pieces, three blocks";
  EXPECT_LT(params, 0.5 * 4 * n);
  EXPECT_GT(grads, 4 * blocks / 8);
  EXPECT_LT(grads, 0.5 * 4 * n);
}

// parallel.grad_dtype "bf16": the gradient exchange moves half the bytes, so an all-reduce step
// sends half (and takes less time), a ZeRO-1 or ZeRO-2 step three quarters (its all-gather moves
// fp32 parameters), a ZeRO-3 step only its reduce-scatter's half less (it also gathers the blocks'
// fp32 parameters for each forward and backward); gather_scatter is refused as the trainer
// refuses it.
TEST(PlanTime, Bf16GradientsHalveTheGradientBytes) {
  const int T = 8;
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 32, T, 101);
  PlanInputs in = inputs(d, T, 8, 4, 1, 1);
  const PlanResult f = plan(in);
  in.grad_bf16 = true;
  const PlanResult b = plan(in);
  ASSERT_EQ(f.time.size(), b.time.size());
  int rows = 0;
  for (size_t i = 0; i < f.time.size(); i++) {
    ASSERT_EQ(f.time[i].zero, b.time[i].zero);
    ASSERT_GT(f.time[i].bytes_per_rank, 0);
    // Exact: with dp 4 every term is a multiple of a quarter byte below 2^50, so each sum is exact.
    // (ZeRO-3: the reduce-scatter's 3/4 of 4n bytes, halved.)
    const double n = (double)build_param_table(d).numel;
    EXPECT_EQ(b.time[i].bytes_per_rank, f.time[i].zero == 3 ? f.time[i].bytes_per_rank - 0.5 * 0.75 * 4 * n
                                        : (f.time[i].zero ? 0.75 : 0.5) * f.time[i].bytes_per_rank);
    EXPECT_LT(b.time[i].sync_s, f.time[i].sync_s);
    rows++;
  }
  EXPECT_GT(rows, 0);
  in.sync = SyncMethod::gather_scatter;
  EXPECT_THROW(plan(in), Error);
}

// Activation slots per schedule are activation_peak's; zb-h1 adds the kept output gradients.
TEST(PlanMemory, SlotsPerScheduleAreTheActivationPeak) {
  const int T = 8;
  const ModelDesc d = test::desc_of("gpt2", 8, 2, 16, T, 37);
  for (int S : {2, 4})
    for (int M : {1, 4, 8}) {
      PlanInputs in = inputs(d, T, 2 * 8, 2 * S, S, M);
      const PlanResult r = plan(in);
      for (const char* sch : {"gpipe", "1f1b", "zb-h1"})
        for (int s = 0; s < S; s++) {
          const int peak = activation_peak(build_schedule(parse_schedule_kind(sch), S, M, s), 1).total;
          const MemoryRow* m = r.memory_row("fp32", sch, 0, s);
          ASSERT_TRUE(m);
          EXPECT_EQ(m->slots, std::max(1, peak)) << sch << " S " << S << " M " << M << " stage " << s;
          const double slot = r.stages[s].activation_slot + (std::string(sch) == "zb-h1" ? r.stages[s].kept_slot : 0);
          EXPECT_EQ(m->activations, m->slots * slot);
        }
    }
}

// ---- communication ----

TEST(PlanComm, AlphaBetaFormulasOnHandComputedCases) {
  const double a = 1e-5, b = 1e-9, S = 1e6;
  // Bound: the formulas against hand-folded constants (S·b written 1e-3): each side a sum of two
  // positive products, ≤ 4 roundings deep counting the decimal constants' own.
  EXPECT_NEAR(ring_allreduce_time(4, S, a, b), 2 * 3 * 1e-5 + 2.0 * 3 / 4 * 1e-3, fp64_bound(4, 1.56e-3));  // 1.56 ms
  EXPECT_NEAR(reduce_scatter_time(4, S, a, b), 3e-5 + 0.75e-3, fp64_bound(4, 0.78e-3));
  EXPECT_NEAR(allgather_time(4, S, a, b), 3e-5 + 0.75e-3, fp64_bound(4, 0.78e-3));
  EXPECT_NEAR(gather_scatter_time(4, S, a, b), 2 * 3 * (1e-5 + 1e-3), fp64_bound(4, 6.006e-3));
  EXPECT_NEAR(p2p_time(S, a, b), 1e-5 + 1e-3, fp64_bound(4, 1.01e-3));
  EXPECT_EQ(ring_allreduce_time(1, S, a, b), 0);  // Exact: one rank returns 0
  // Two levels: 8 ranks, 4 per node: reduce-scatter inside, all-reduce across 2 nodes on S/4,
  // all-gather inside.
  Fabric f;
  f.intra = simple_link("in", 1e-6, 1e-11);
  f.inter = simple_link("out", 1e-5, 1e-9);
  f.ranks_per_node = 4, f.nics_per_node = 4;
  const double hand = (3 * 1e-6 + 0.75 * S * 1e-11) + (2 * 1 * 1e-5 + 2.0 * 1 / 2 * (S / 4) * 1e-9) +
                      (3 * 1e-6 + 0.75 * S * 1e-11);
  // Bound: three positive α-β terms, each ≤ 3 roundings deep, summed in another grouping (2 more).
  EXPECT_NEAR(group_collective_time(f, CollOp::allreduce, 8, 4, S), hand, fp64_bound(5, hand));
  // Exact: one level of either link is the ring formula itself on the same α and β (the NIC's
  // factor is 1 here, and 4 below: a power of two, so 4·1e-9 is the double nearest 4e-9).
  EXPECT_EQ(group_collective_time(f, CollOp::allreduce, 4, 4, S), ring_allreduce_time(4, S, 1e-6, 1e-11));
  EXPECT_EQ(group_collective_time(f, CollOp::allreduce, 8, 1, S), ring_allreduce_time(8, S, 1e-5, 1e-9));
  // One NIC for 4 ranks: the inter-node β four times larger.
  f.nics_per_node = 1;
  EXPECT_EQ(group_collective_time(f, CollOp::allreduce, 8, 1, S), ring_allreduce_time(8, S, 1e-5, 4e-9));
  // ZeRO-1's reduce-scatter + all-gather move what one all-reduce moves.
  // Bound: the same four terms as hand's, grouped otherwise: ≤ 3 + 3 roundings deep.
  f.nics_per_node = 4;
  EXPECT_NEAR(group_collective_time(f, CollOp::reduce_scatter, 8, 4, S) + group_collective_time(f, CollOp::allgather, 8, 4, S),
              hand, fp64_bound(6, hand));
}

TEST(PlanComm, ReadsTheMeasuredLinksFile) {
  const std::string path = fixture("plan/links.json");
  ASSERT_FALSE(path.empty()) << "run the tests from the project root (tests/fixtures/plan/links.json not found)";
  const LinkFile f = read_link_file(path);
  EXPECT_EQ(f.date, "2026-11-23 (fixture)");
  ASSERT_EQ(f.links.size(), 2u);  // loopback (two world sizes) and netns-1gbit
  const Link lo = find_link("loopback", &f);
  ASSERT_TRUE(lo.measured);
  ASSERT_EQ(lo.points.size(), 2u);
  EXPECT_EQ(lo.points[0].world, 2);
  EXPECT_EQ(lo.points[1].world, 4);
  // Exact: the file's decimals parse to the doubles nearest them, as the literals compile.
  EXPECT_EQ(lo.alpha_s, 4e-6);  // the point-to-point's
  EXPECT_EQ(lo.beta_s_per_byte, 3e-10);
  // A measured world size: the fit itself.
  // Bound: a + b·n against the folded literal: 2 roundings each side (the code's may be one FMA).
  EXPECT_NEAR(collective_time(lo, CollOp::allreduce, 2, 1e6), 2e-5 + 5e-10 * 1e6, fp64_bound(2, 5.2e-4));
  EXPECT_NEAR(collective_time(lo, CollOp::allreduce, 4, 1e6), 7e-5 + 8e-10 * 1e6, fp64_bound(2, 8.7e-4));
  EXPECT_NEAR(collective_time(lo, CollOp::reduce_scatter, 2, 1e6), 1e-5 + 2.5e-10 * 1e6, fp64_bound(2, 2.6e-4));
  // Another world size: the formula with the nearest measured world's derived α-β.
  // Exact: the same ring formula on the same parsed α and β.
  EXPECT_EQ(collective_time(lo, CollOp::allreduce, 8, 1e6), ring_allreduce_time(8, 1e6, 1.1e-5, 5.4e-10));
  EXPECT_EQ(collective_time(lo, CollOp::reduce_scatter, 8, 1e6), reduce_scatter_time(8, 1e6, 1e-5, 5e-10));
  // shm is the loopback entry when the file has no shm of its own.
  const Link shm = find_link("shm", &f);
  EXPECT_EQ(shm.name, "shm");
  EXPECT_NEAR(collective_time(shm, CollOp::allreduce, 2, 1e6), 2e-5 + 5e-10 * 1e6, fp64_bound(2, 5.2e-4));  // (as above)
  const Link g1 = find_link("netns-1gbit", &f);
  EXPECT_EQ(g1.gbit_s(), 8e-9 / 8.6e-9);  // Exact: one correctly rounded quotient of the same doubles
  // Missing measured entries, unknown names and a missing file are clear errors.
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([&] { find_link("netns-10gbit", &f); }).find("has no entry"), std::string::npos);
  const std::string unknown = message([&] { find_link("carrier-pigeon", &f); });
  EXPECT_NE(unknown.find("ib-ndr"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("netns-1gbit"), std::string::npos) << unknown;
  EXPECT_NE(message([] { find_link("loopback", nullptr); }).find("--links"), std::string::npos);
  EXPECT_NE(message([] { read_link_file("/nonexistent/links.json"); }).find("bench-allreduce_bw"), std::string::npos);
  EXPECT_NE(message([] { parse_link_file(nlohmann::json::parse(R"({"links": [{"name": "x", "world": 2,
      "ops": {"allreduce": {"a_s": 1, "b_s_per_byte": "fast"}}}]})"), "bad.json"); }).find("b_s_per_byte"), std::string::npos);
  // A fit written as null (the bench could not make one) is an op not measured.
  EXPECT_EQ(g1.fit(CollOp::reduce_scatter, 2), nullptr);
  EXPECT_NE(g1.fit(CollOp::allreduce, 2), nullptr);
  // Nominal classes need no file.
  // Bound: 8e-9 / (8 / 400e9) is 400 after 3 roundings (the constant 8e-9, the two quotients):
  // one side only, within gamma_3·400.
  EXPECT_NEAR(find_link("ib-ndr", nullptr).gbit_s(), 400, fp64_bound(3, 400) / 2);
  // Exact: 8 / 3.6e12 and 1 / 450e9 are one rational number, each correctly rounded once.
  EXPECT_EQ(find_link("nvlink", nullptr).beta_s_per_byte, 1 / 450e9);
}

// ---- time ----

// With equal stage costs and no message time, simulate_pipeline is simulate_schedule.
TEST(PlanTime, SimulationEqualsTheScheduleSimulation) {
  for (const char* sch : {"gpipe", "1f1b", "zb-h1"})
    for (int S : {2, 4})
      for (int M : {1, 4, 8}) {
        const ScheduleKind k = parse_schedule_kind(sch);
        const PipelineSim p = simulate_pipeline(k, S, M, std::vector<StageCost>(S, {1.0, 2.5, 1.5}), std::vector<double>(S, 0));
        const SimResult q = simulate_schedule(k, S, M, 1, 1.0, 2.5, 1.5);
        ASSERT_TRUE(p.completed && q.completed);
        // Exact: the same simulation on the same costs (a 0 message adds nothing); every time is
        // a multiple of 0.5 besides, so any order of the sums is exact.
        EXPECT_EQ(p.makespan, q.makespan) << sch << " S " << S << " M " << M;
      }
  // A message time delays the dependent stage: with GPipe, S = 2, M = 1, f = 1, b = 2 and 0.5 s
  // per message the step is F0 1 + msg + F1 1 + B1 2 + msg + B0 2 = 7.
  const PipelineSim p = simulate_pipeline(ScheduleKind::gpipe, 2, 1, {{1, 2, 1}, {1, 2, 1}}, {0.5});
  EXPECT_EQ(p.makespan, 7.0);  // Exact: sums of multiples of 0.5
}

// Step time at pp = S with a synthetic profile = the schedule's makespan + the sync terms by hand.
TEST(PlanTime, PipelineStepIsMakespanPlusSyncByHand) {
  const int T = 8, S = 2, M = 4, world = 4, dp = 2, G = 16;
  const ModelDesc d = test::desc_of("gpt2", 4, 2, 16, T, 37);
  PlanInputs in = inputs(d, T, G, world, S, M);
  in.stage_layers = {2, 2};
  in.fabric.intra = simple_link("test", 1e-4, 1e-8);  // messages cost α + nβ too
  in.have_profile = true;
  in.profile = synthetic_costs(G / dp / M, T);
  const PlanResult r = plan(in);
  const LayerCosts& c = in.profile;
  const double msg = 1e-4 + (double)(G / dp / M) * T * d.d_model * 4 * 1e-8;
  EXPECT_NEAR(r.p2p_s.at(0), msg, fp64_bound(2, msg));  // Bound: a + n·b, 2 roundings (FMA or not)
  for (const char* sch : {"gpipe", "1f1b", "zb-h1"}) {
    const PipelineSim sim = simulate_pipeline(parse_schedule_kind(sch), S, M,
                                              std::vector<StageCost>(S, {2 * c.block_f, 2 * c.block_b, 2 * c.block_bi}), {msg});
    double expect = 0;
    size_t nb = 0;  // the most buckets of a stage
    for (int s = 0; s < S; s++) {
      const ParamTable t = build_param_table(d, virtual_stage_part({2, 2}, s));
      double sync = 0;
      const std::vector<Bucket> bk = make_buckets(t, in.bucket_mb, in.bucket_mb);
      nb = std::max(nb, bk.size());
      for (const Bucket& b : bk)
        sync += ring_allreduce_time(dp, 4.0 * (b.end - b.begin), 1e-4, 1e-8);
      const double tied = ring_allreduce_time(2, 4.0 * d.vocab_size * d.d_model, 1e-4, 1e-8);  // the tied wte sum
      expect = std::max(expect, sim.end[s] + sync + tied + c.opt_per_param * t.numel);
    }
    const TimeRow* row = r.time_row(sch, 0);
    ASSERT_TRUE(row);
    // Bound: positive times summed in other orders (the code's exposed sync is the channel's end
    // less the compute's, which rounds relative to the step): the simulation's chain of ≤ 3
    // actions per micro-batch on each stage and 2M messages (msg an ulp or two from the code's),
    // the buckets' and the tied sums, the optimizer, a few more for the max and the subtraction.
    const int n = 3 * M * S + 2 * M + (int)nb + 6;
    EXPECT_NEAR(row->step_s, expect, fp64_bound(n, expect)) << sch;
    // Bound: the step's relative bound, and one rounding of each quotient.
    EXPECT_NEAR(row->tokens_per_s, (double)G * T / expect, fp64_bound(n + 1, row->tokens_per_s));
  }
  // The equal-cost, zero-message case: exactly simulate_schedule's makespan.
  in.fabric.intra = simple_link("free", 0, 0);
  const PlanResult r0 = plan(in);
  for (const char* sch : {"gpipe", "1f1b", "zb-h1"}) {
    const SimResult q = simulate_schedule(parse_schedule_kind(sch), S, M, 1, 2 * c.block_f, 2 * c.block_b, 2 * c.block_bi);
    std::vector<double> end(S, 0);  // each stage's last compute
    for (const SimEvent& e : q.events) end[e.stage] = std::max(end[e.stage], e.end);
    double expect = 0;
    for (int s = 0; s < S; s++)
      expect = std::max(expect, end[s] + c.opt_per_param * build_param_table(d, virtual_stage_part({2, 2}, s)).numel);
    EXPECT_EQ(*std::max_element(end.begin(), end.end()), q.makespan);  // Exact: the makespan is that max
    const TimeRow* row = r0.time_row(sch, 0);
    ASSERT_TRUE(row);
    // Bound: the same simulation (free messages add 0), then end + optimizer, which either side
    // may fold into one FMA: 2 roundings.
    EXPECT_NEAR(row->step_s, expect, fp64_bound(2, expect)) << sch;
    EXPECT_EQ(row->sync_s, 0) << sch;  // Exact: nothing is sent
  }
}

// One rank: no communication, so the efficiency is exactly 1; overlap hides part of the sync and
// never exposes more than the whole sync.
TEST(PlanTime, EfficiencyAndOverlap) {
  const int T = 8;
  const ModelDesc d = test::desc_of("llama", 4, 2, 16, T, 37);
  PlanInputs one = inputs(d, T, 4, 1, 1, 1);
  one.have_profile = true;
  one.profile = synthetic_costs(4, T);
  const PlanResult r1 = plan(one);
  // Exact: the step and the one-rank reference add the same integer block costs and the same
  // optimizer product, then divide the same tokens by them.
  EXPECT_EQ(r1.time_row("-", 0)->efficiency, 1.0);
  EXPECT_EQ(r1.time_row("-", 0)->sync_s, 0);
  PlanInputs in = inputs(d, T, 8, 4, 1, 1);
  in.have_profile = true;
  in.profile = synthetic_costs(2, T);
  in.bucket_mb = 0.001;  // several buckets
  in.first_bucket_mb = 0.001;
  const PlanResult no = plan(in);
  const TimeRow* a = no.time_row("-", 0);
  // Bound: nothing overlaps, but the exposed sync is (end + each bucket's time, in turn) − end:
  // it rounds relative to the compute's end, not to the sync (n = the buckets + 1).
  const int nb = (int)make_buckets(build_param_table(d), in.bucket_mb, in.first_bucket_mb).size();
  EXPECT_NEAR(a->exposed_sync_s, a->sync_s, fp64_bound(nb + 1, a->compute_s + a->sync_s));
  in.overlap = true;
  const PlanResult ov = plan(in);
  const TimeRow* b = ov.time_row("-", 0);
  EXPECT_EQ(b->sync_s, a->sync_s);  // Exact: the same buckets' times summed in the same order
  EXPECT_LT(b->exposed_sync_s, a->exposed_sync_s);
  EXPECT_GT(b->exposed_sync_s, 0);  // the embedding's bucket is final only at the very end
  EXPECT_LT(a->efficiency, 1.0);
  EXPECT_GT(b->efficiency, a->efficiency);
}

// The LM head is fused (model/transformer.h "Fused LM head") without stages and under every
// schedule but zb-h1: the plan moves the head's backward, less its recompute, into the forward
// (LayerCosts::with_fused_head) and says so; zb-h1 keeps the recompute.
TEST(PlanTime, FusedLmHeadDropsTheRecomputeButUnderZbH1) {
  const int T = 8;
  const ModelDesc d = test::desc_of("gpt2", 4, 2, 16, T, 37);
  LayerCosts c = synthetic_costs(4, T);
  c.head_f = 1.0, c.head_b = 2.5, c.head_bi = 1.5, c.head_recompute = 0.5;
  const LayerCosts f = c.with_fused_head();
  EXPECT_EQ(f.head_f, 3.0);  // Exact: 1 + 2.5 − 0.5, sums of halves
  EXPECT_EQ(f.head_b, 0);
  EXPECT_EQ(f.head_bi, 0);
  EXPECT_EQ(f.head_recompute, 0);
  auto has_note = [](const PlanResult& r) {
    for (const std::string& n : r.notes)
      if (n.find("LM head fused") != std::string::npos) return true;
    return false;
  };
  auto plan_with = [](PlanInputs in, const LayerCosts& profile) {
    in.have_profile = true;
    in.profile = profile;
    return plan(in);
  };
  // One rank: the same step as a profile that had the head's whole work in its forward.
  const PlanResult r1 = plan_with(inputs(d, T, 4, 1, 1, 1), c), r0 = plan_with(inputs(d, T, 4, 1, 1, 1), f);
  EXPECT_TRUE(has_note(r1));
  // Exact (these three): fusing the fused costs again changes no value (it adds b − recompute = 0),
  // so both plans simulate the same costs.
  EXPECT_EQ(r1.time_row("-", 0)->step_s, r0.time_row("-", 0)->step_s);
  EXPECT_FALSE(has_note(r0));
  // Two stages: gpipe and 1f1b simulate the fused costs, zb-h1 the recomputing ones.
  const PlanResult r2 = plan_with(inputs(d, T, 8, 2, 2, 2), c), r2m = plan_with(inputs(d, T, 8, 2, 2, 2), f);
  EXPECT_TRUE(has_note(r2));
  EXPECT_EQ(r2.time_row("1f1b", 0)->step_s, r2m.time_row("1f1b", 0)->step_s);
  EXPECT_EQ(r2.time_row("gpipe", 0)->step_s, r2m.time_row("gpipe", 0)->step_s);
  EXPECT_GT(r2.time_row("zb-h1", 0)->step_s, r2m.time_row("zb-h1", 0)->step_s)
      << "zb-h1 recomputes the chunks: slower than with the recompute gone";
  // The field round-trips through a profile file, is optional there, and is checked.
  nlohmann::json j = c.to_json();
  EXPECT_EQ(LayerCosts::from_json(j, "t").head_recompute, 0.5);  // Exact: 0.5 round-trips through JSON
  j.erase("head_recompute");
  EXPECT_EQ(LayerCosts::from_json(j, "t").head_recompute, 0);
  j["head_recompute"] = 1.6;  // more than head_bi
  EXPECT_THROW(LayerCosts::from_json(j, "t"), Error);
  // The device-table costs carry it for a chunked head (GPT-2's vocabulary at B·T = 8192 rows).
  ModelDesc big = test::desc_of("gpt2", 2, 2, 16, 1024, 50257);
  const LayerCosts t = costs_from_device(big, 8, 1024, find_device("h100"), GemmPrecision::bf16, 0.4, 1);
  const double chunks = std::ceil(8.0 * 1024 / lm_head_chunk_rows(big, 8 * 1024));
  EXPECT_GT(chunks, 1);
  // Exact: the code's share · head_f, the same two operations on the same doubles.
  EXPECT_EQ(t.head_recompute, (chunks - 1) / chunks * t.head_f);
}

// ZeRO-1 without overlap: reduce-scatter every bucket after backward, then for every bucket update
// the rank's piece and all-gather the bucket (GradSync::gather_params), all in turn.
TEST(PlanTime, ZeroOneReduceScattersThenUpdatesAndGathersEachBucket) {
  const int T = 8, L = 4, world = 2;
  const ModelDesc d = test::desc_of("llama", L, 2, 32, T, 37);
  PlanInputs in = inputs(d, T, 4, world, 1, 1);
  in.bucket_mb = 0.004;
  in.have_profile = true;
  in.profile = synthetic_costs(2, T);
  const PlanResult r = plan(in);
  const ParamTable t = build_param_table(d);
  const std::vector<Bucket> bk = make_buckets(t, in.bucket_mb, in.bucket_mb);
  ASSERT_GT(bk.size(), 2u);
  const std::vector<ShardPiece> pieces = shard_pieces(bk, world, 0);
  const LayerCosts& c = in.profile;
  double rs = 0, tail = 0;
  for (size_t i = 0; i < bk.size(); i++) {
    const double bytes = 4.0 * (bk[i].end - bk[i].begin);
    rs += reduce_scatter_time(world, bytes, 1e-5, 1e-9);
    tail += c.opt_per_param * (pieces[i].end - pieces[i].begin) + allgather_time(world, bytes, 1e-5, 1e-9);
  }
  const double expect = L * (c.block_f + c.block_b) + rs + tail;
  const TimeRow* z1 = r.time_row("-", 1);
  ASSERT_TRUE(z1);
  // Bound: positive terms in another order (the code's exposed reduce-scatter is the channel's
  // end less the compute's, rounding relative to the step): 2 per bucket in each of the two
  // sums, each term ≤ 3 deep, the compute's 2L, and the max and subtraction.
  const int n = 4 * (int)bk.size() + 2 * L + 6;
  EXPECT_NEAR(z1->step_s, expect, fp64_bound(n, expect));
  // ZeRO-0: one all-reduce per bucket, then the whole optimizer.
  double ar = 0;
  for (const Bucket& b : bk) ar += ring_allreduce_time(world, 4.0 * (b.end - b.begin), 1e-5, 1e-9);
  const double expect0 = L * (c.block_f + c.block_b) + ar + c.opt_per_param * t.numel;
  EXPECT_NEAR(r.time_row("-", 0)->step_s, expect0, fp64_bound(n, expect0));  // (as above)
  // With overlap the gathers run behind the updates: never slower.
  in.overlap = true;
  in.first_bucket_mb = in.bucket_mb;
  EXPECT_LT(plan(in).time_row("-", 1)->step_s, expect);
}

// More ranks than cores on a CPU node: the compute of each rank slows by the ratio; one rank alone
// (the efficiency's reference) does not.
TEST(PlanTime, SharedCoresSlowTheComputeByTheRatio) {
  const int T = 8;
  const ModelDesc d = test::desc_of("gpt2", 2, 2, 16, T, 37);
  PlanInputs in = inputs(d, T, 8, 4, 1, 1);
  in.have_profile = true;
  in.profile = synthetic_costs(2, T);
  const PlanResult alone = plan(in);
  in.node_cores = 2;  // 4 ranks x 1 core on 2 cores
  const PlanResult shared = plan(in);
  // Exact: a factor of 2 scales every cost without rounding, so each sum is twice the other's,
  // and the one-rank reference divides it out again.
  EXPECT_EQ(shared.oversubscription, 2.0);
  EXPECT_EQ(shared.time_row("-", 0)->compute_s, 2 * alone.time_row("-", 0)->compute_s);
  EXPECT_EQ(shared.single_rank_tokens_per_s, alone.single_rank_tokens_per_s);
  in.node_cores = 4;
  EXPECT_EQ(plan(in).oversubscription, 1.0);
}

TEST(PlanInputsCheck, ImpossibleRunsAreRefusedWithTheFix) {
  const ModelDesc d = test::desc_of("gpt2", 4, 2, 16, 8, 37);
  auto message = [&](PlanInputs in) {
    try {
      plan(in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(inputs(d, 8, 16, 6, 4, 1)).find("not divisible by the pipeline stages"), std::string::npos);
  EXPECT_NE(message(inputs(d, 8, 16, 4, 2, 3)).find("does not divide"), std::string::npos);
  EXPECT_NE(message(inputs(d, 8, 15, 4, 2, 1)).find("global_batch"), std::string::npos);
  EXPECT_NE(message(inputs(d, 8, 16, 8, 8, 1)).find("fewer than"), std::string::npos);  // 4 layers, 8 stages
  try {
    find_device("tpu");
    ADD_FAILURE() << "an unknown device was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h100, h200, cpu"), std::string::npos) << e.what();
  }
}

// Sizes beyond what the code's integers hold are refused with one message naming the key and the
// limit, before anything is built: widths the kernels take as ints (the MLP of 4 x d_model, the QKV
// projection, SwiGLU's gate and up, a vocabulary whose padded logits row passes INT_MAX), a
// parameter count whose bytes leave int64, 2e9 layers, a micro-batch of more token rows than an int.
// A model of LLaMA 2 70B's shapes still plans, with positive and finite numbers.
TEST(PlanInputsCheck, SizesBeyondTheCodesIntegersAreRefusedNamingTheKey) {
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto desc_error = [&](const std::string& fam, int n_layer, int n_head, int d_model, int vocab,
                        const std::vector<std::string>& extra = {}) {
    return error_of([&] { test::desc_of(fam, n_layer, n_head, d_model, 8, vocab, extra); });
  };
  std::string e = desc_error("gpt2", 2, 1, 1500000000, 37);
  EXPECT_NE(e.find("'model.d_model' 1,500,000,000 makes the MLP 6,000,000,000 wide (4 x model.d_model), more than "
                   "2,147,483,647, the largest width the kernels take"),
            std::string::npos)
      << e;
  e = desc_error("gpt2", 2, 1, 800000000, 37, {"model.ffn_dim=64"});
  EXPECT_NE(e.find("'model.d_model' 800,000,000 makes the QKV projection 2,400,000,000 wide"), std::string::npos) << e;
  e = desc_error("llama", 2, 2, 64, 37, {"model.ffn_dim=1200000000"});
  EXPECT_NE(e.find("'model.ffn_dim' 1,200,000,000 makes the MLP's first projection 2,400,000,000 wide"),
            std::string::npos)
      << e;
  e = desc_error("gpt2", 2, 2, 16, 2147483647);
  EXPECT_NE(e.find("'model.vocab_size' 2,147,483,647 pads the LM head's rows of logits to 2,147,483,648 values, "
                   "more than 2,147,483,647"),
            std::string::npos)
      << e;
  e = desc_error("gpt2", 12, 1, 500000000, 37, {"model.ffn_dim=64"});
  EXPECT_NE(e.find("the model has about 1.2e+19 parameters (model.n_layer 12 blocks of"), std::string::npos) << e;
  EXPECT_NE(e.find("more than 7.21e+16 (2^56), the most whose byte counts 64-bit sizes hold"), std::string::npos) << e;
  e = desc_error("gpt2", 2000000000, 2, 16, 37);
  EXPECT_NE(e.find("'model.n_layer' must be in 1..10000"), std::string::npos) << e;
  // 65,536 sequences of 65,536 tokens in one micro-batch: 2^32 rows.
  const ModelDesc small = test::desc_of("gpt2", 2, 2, 16, 65536, 37);
  e = error_of([&] { plan(inputs(small, 65536, 65536, 1, 1, 1)); });
  EXPECT_NE(e.find("is 4294967296 token rows, more than 2147483647, the most the kernels take (an int): use more "
                   "parallel.microbatches"),
            std::string::npos)
      << e;
  EXPECT_NO_THROW(plan(inputs(small, 65536, 65536, 1, 1, 4)));  // four micro-batches of 2^30 rows
}

TEST(PlanMemory, A70BModelPlansWithPositiveNumbers) {
  const ModelDesc d = test::desc_of("llama", 80, 64, 8192, 4096, 32000, {"model.n_kv_head=8", "model.ffn_dim=28672"});
  const PlanResult r = plan(inputs(d, 4096, 1024, 64, 8, 16));
  int64_t params = 0;
  for (const StageMemory& s : r.stages) {
    EXPECT_GT(s.n_params, 0);
    params += s.n_params;
  }
  EXPECT_EQ(params, int64_t(build_param_table(d).numel));
  EXPECT_GT(params, int64_t(68e9));
  EXPECT_LT(params, int64_t(70e9));
  ASSERT_FALSE(r.memory.empty());
  for (const MemoryRow& m : r.memory) {
    for (const double v : {m.params, m.grads, m.activations, m.scratch, m.total}) {
      EXPECT_GT(v, 0) << m.precision << " " << m.schedule << " stage " << m.stage;
      EXPECT_TRUE(std::isfinite(v));
    }
    // Exact: integer byte counts (halves at most) below 2^53, summed in the code's order.
    EXPECT_EQ(m.grads, 4.0 * r.stages[m.stage].n_params);
    EXPECT_EQ(m.total, m.params + m.grads + m.optimizer + m.activations + m.scratch + m.buffers);
  }
  for (const TimeRow& t : r.time) EXPECT_GT(t.step_s, 0);
}

// A measured op with a large-message fit: collectives of at least min_bytes are timed with it,
// smaller ones with the all-size fit; the formulas at other world sizes take β from it.
TEST(PlanLinks, LargeMessageFitTakesOverAboveItsThreshold) {
  const nlohmann::json j = nlohmann::json::parse(R"({"date": "d", "links": [{"name": "slow", "world": 2,
    "ranks_per_node": 1, "ops": {"allreduce": {"a_s": 1e-5, "b_s_per_byte": 1e-9, "alpha_s": 5e-6,
    "beta_s_per_byte": 1e-9, "fit_large": {"a_s": 2e-3, "b_s_per_byte": 8e-9, "alpha_s": 1e-3,
    "beta_s_per_byte": 8e-9, "min_bytes": 4e6}}}}]})");
  const LinkFile f = parse_link_file(j, "inline");
  ASSERT_EQ(f.links.size(), 1u);
  const Link& l = f.links[0];
  // Bound: a + b·n against the folded literal: 2 roundings each side (the code's may be one FMA).
  EXPECT_NEAR(collective_time(l, CollOp::allreduce, 2, 1e6), 1e-5 + 1e-9 * 1e6, fp64_bound(2, 1.01e-3));
  EXPECT_NEAR(collective_time(l, CollOp::allreduce, 2, 1e7), 2e-3 + 8e-9 * 1e7, fp64_bound(2, 8.2e-2));
  double a = 0, b = 0;
  l.alpha_beta(CollOp::allreduce, 8, &a, &b);
  // Exact: the parsed decimals, the doubles nearest them
  EXPECT_EQ(a, 5e-6);  // latency from the small messages
  EXPECT_EQ(b, 8e-9);  // bandwidth from the large ones
}

// Tensor parallelism (tp = T): the plan's per-rank bytes are the start-up estimate's for the
// largest shard (the last: the most vocabulary rows), with ZeRO-1 over the data-parallel group of
// world / (pp × tp) ranks; at the same replicas (world = 2·T) they fall with T.
TEST(PlanMemory, TensorParallelIsTheShardsEstimate) {
  for (const std::string fam : {"gpt2", "llama", "bert"}) {
    const int T = 12, G = 8, dp = 2;
    const ModelDesc d = test::desc_of(fam, 2, 4, 32, T, 37);
    Config cfg = parse_config("{}", "test", {"data.train=-", "train.global_batch=8", "model.seq_len=12"});
    double previous = 0;
    for (const auto& [tp, sp] : std::vector<std::pair<int, bool>>{{1, false}, {2, false}, {4, false}, {4, true}}) {
      const std::string what = fam + " tp " + std::to_string(tp) + (sp ? " sp" : "");
      cfg.parallel.sequence_parallel = sp;
      PlanInputs in = plan_inputs_from_config(cfg, d, dp * tp);
      in.tp = tp;
      in.fabric.intra = simple_link("test", 1e-5, 1e-9);
      const PlanResult r = plan(in);
      EXPECT_EQ(r.dp, dp) << what;
      EXPECT_EQ(r.tp, tp) << what;
      ModelDesc whole = d;
      whole.sequence_parallel = sp;  // (the residual stream's N / tp rows on each rank)
      const ModelDesc shard = tp > 1 ? tensor_shard(whole, tp, tp - 1) : d;
      for (int z = 0; z <= 1; z++) {
        cfg.parallel.zero = z;
        const MemoryEstimate e = estimate_memory(shard, G / dp, T, cfg, dp, 0, false);
        const MemoryRow* m = r.memory_row("fp32", "-", z, 0);
        ASSERT_TRUE(m) << what;
        EXPECT_EQ(m->params, e.params) << what;
        EXPECT_EQ(m->grads, e.grads) << what;
        EXPECT_EQ(m->optimizer, e.optimizer) << what << " zero " << z;
        EXPECT_EQ(m->buffers, z == 1 ? e.sync_buffers : 0.0) << what << " zero " << z;
        EXPECT_EQ(m->activations, e.activations) << what;
        EXPECT_EQ(m->scratch, e.scratch) << what;
      }
      cfg.parallel.zero = 0;
      const double total = r.memory_row("fp32", "-", 0, 0)->total;
      if (tp > 1) {
        EXPECT_LT(total, previous) << what;
      }
      previous = total;
    }
  }
}

// The step time with tp = T: the blocks' and the head's compute divided by T plus the group's
// all-reduces over the link inside the node, counted by hand (per micro-batch: 4 per block and
// the embedding's and d xf's of N·C floats, and per LM head chunk a max of its rows and a sum of
// twice its rows; the fused head recomputes none); the bytes a rank sends are 2(T−1)/T of each.
TEST(PlanTime, TensorParallelAddsTheGroupsAllReduces) {
  const int T = 8, G = 4, tp = 2, L = 3, C = 32;
  ModelDesc d = test::desc_of("gpt2", L, 4, C, T, 37);
  d.lm_head_chunk_rows = 3;  // 32 rows: 11 chunks, the last of 2 rows
  const double alpha = 1e-4, beta = 1e-8;
  PlanInputs in = inputs(d, T, G, tp, 1, 2);  // one replica, two micro-batches of 2 sequences
  in.tp = tp;
  in.fabric.intra = simple_link("test", alpha, beta);
  in.have_profile = true;
  in.profile = synthetic_costs(G / 2, T);
  in.profile.head_f = 0.3, in.profile.head_b = 0.7, in.profile.head_bi = 0.5, in.profile.head_recompute = 0.2;
  const PlanResult r = plan(in);
  const int N = G / 2 * T;
  auto ar = [&](double floats) { return ring_allreduce_time(tp, 4 * floats, alpha, beta); };
  auto sent = [&](double floats) { return 2.0 * (tp - 1) / tp * 4 * floats; };
  double chunks_t = 0, chunks_b = 0;
  for (int r0 = 0; r0 < N; r0 += 3) {
    const int rn = std::min(3, N - r0);
    chunks_t += ar(rn) + ar(2 * rn);
    chunks_b += sent(rn) + sent(2 * rn);
  }
  const double nc = (double)N * C;
  // Exact: the code's own ring formula on the same values; halving and doubling are exact.
  EXPECT_EQ(r.tp_costs.block_f, 2 * ar(nc));
  EXPECT_EQ(r.costs.block_f, in.profile.block_f / tp + 2 * ar(nc));
  EXPECT_EQ(r.costs.block_bi, in.profile.block_bi / tp + 2 * ar(nc));
  EXPECT_EQ(r.costs.embed_f, ar(nc));
  // Bound: the same 2·chunks positive terms, the code adding each chunk's pair first, + 2.
  const int chunks = (N + 2) / 3;
  EXPECT_NEAR(r.costs.head_f, 0.3 / tp + chunks_t, fp64_bound(2 * chunks + 2, 0.3 / tp + chunks_t));
  const TimeRow* row = r.time_row("-", 0);
  ASSERT_TRUE(row);
  // per micro-batch (fused head: its chunks' statistics once, then d xf), two micro-batches
  const double per_mb = (4 * L + 2) * ar(nc) + chunks_t;
  // Bound: per_mb's positive terms in another grouping: the chunks' sum (2·chunks), the block
  // and head terms (≤ 4L + 4), the fused head's f + b − recompute (which cancels at most half).
  const int n = 2 * chunks + 4 * L + 8;
  EXPECT_NEAR(row->tp_s, 2 * per_mb, fp64_bound(n, 2 * 2 * per_mb));
  // Exact: with tp 2 every byte count is an integer below 2^53.
  EXPECT_EQ(row->tp_bytes_per_rank, 2 * ((4 * L + 2) * sent(nc) + chunks_b));
  // The compute of the step: the shard's, with the all-reduces inside it.
  const double compute = 2 * (L * (in.profile.block_f + in.profile.block_b) / tp + (0.3 + 0.7 - 0.2) / tp) + row->tp_s;
  // Bound: the tp sums as above and the busy sum of 2 micro-batches' F and B (2L + 6 more).
  EXPECT_NEAR(row->compute_s, compute, fp64_bound(n + 2 * L + 6, 2 * compute));
  // Full recomputation runs each block's forward again in backward, its two all-reduces with it;
  // selective recomputes no sum.
  // Exact (these three): the code's formulas on the same values (scaling by 2 and 4 is exact).
  in.recompute = Recompute::full;
  EXPECT_EQ(plan(in).tp_costs.block_b, 4 * ar(nc));
  in.recompute = Recompute::selective;
  EXPECT_EQ(plan(in).tp_costs.block_b, 2 * ar(nc));
  in.recompute = Recompute::none;
  // Sequence parallelism: the same volume in forward; backward gathers each branch's input again.
  in.desc.sequence_parallel = true;
  EXPECT_EQ(plan(in).tp_costs.block_b, 2 * ar(nc) + 2 * allgather_time(tp, 4 * nc, alpha, beta));
  in.desc.sequence_parallel = false;
  // The one-rank reference does not change with tp: the efficiency compares with the whole model.
  // Exact: it is computed from the costs before tensor parallelism, the same in both plans.
  PlanInputs in1 = in;
  in1.tp = 1, in1.world = 1;
  EXPECT_EQ(plan(in1).single_rank_tokens_per_s, r.single_rank_tokens_per_s);
}

// Impossible tensor-parallel runs: a world not divisible by pp × tp, a tp that does not divide the
// ranks per node (its group would span nodes) or the heads.
TEST(PlanInputsCheck, TensorParallelRunsAreRefusedWithTheFix) {
  const ModelDesc d = test::desc_of("gpt2", 4, 4, 16, 8, 37);
  auto message = [&](PlanInputs in, int tp) {
    in.tp = tp;
    try {
      plan(in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(inputs(d, 8, 16, 6, 2, 1), 2).find("not divisible by pp 2 x tp 2 = 4"), std::string::npos);
  PlanInputs spans = inputs(d, 8, 16, 8, 1, 1);
  spans.fabric.ranks_per_node = 2;
  EXPECT_NE(message(spans, 4).find("--tp 4 does not divide the 2 ranks per node"), std::string::npos);
  EXPECT_NE(message(inputs(d, 8, 16, 3, 1, 1), 3).find("does not divide model.n_head 4"), std::string::npos);
  EXPECT_EQ(message(inputs(d, 8, 16, 8, 2, 1), 2), "");
  // Sequence parallelism splits every sequence's rows: seq_len a multiple of tp; no zb-h1 with it.
  PlanInputs sp = inputs(d, 6, 16, 8, 2, 1);
  sp.desc.sequence_parallel = true;
  EXPECT_NE(message(sp, 4).find("model.seq_len 6 is not a multiple of --tp 4"), std::string::npos);
  sp.tp = 2;
  const PlanResult r = plan(sp);
  EXPECT_TRUE(r.time_row("1f1b", 0));
  EXPECT_FALSE(r.time_row("zb-h1", 0));
  EXPECT_FALSE(r.memory_row("fp32", "zb-h1", 0, 0));
}
