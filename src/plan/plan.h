// llmpi-plan's model: memory per rank, step time and scaling of a run before it is run
// (docs/PLAN.md says how each number is modelled and where it could be wrong).
//
// Memory, per pipeline stage (world = DP × PP × TP; every rank of a stage holds the same, up to a
// tensor-parallel shard's vocabulary rows: the last shard, the largest, is planned):
//   parameters, gradients   the stage's parameter table (build_param_table of its ModelPart, the
//                           parts split_layers / virtual_stage_part give, exactly as the pipeline
//                           builds them); pp = 1: the whole model. With tensor parallelism
//                           (tp = T > 1) the table of the shard (tensor_shard, model_desc.h)
//   optimizer               AdamW m and v: 2 floats per parameter; ZeRO-1: only the rank's shard
//                           (its piece of every bucket, comm/grad_sync.h shard_pieces; the largest
//                           shard, rank 0's, is reported)
//   activations             slots × activation_bytes(part, micro-batch, T), slots =
//                           activation_peak(build_schedule(...)) of the stage; zb-h1 adds each
//                           slot's kept output gradients (kept_bytes); pp = 1: one slot of the
//                           whole local batch (the trainer does not split it)
//                           (runtime.recompute: the recomputed tensors once per slot, not per
//                           layer; no zb-h1 rows then: it refuses recomputation)
//   scratch                 backward_scratch_bytes at the micro-batch
//   (tp > 1: activation_bytes, kept_bytes and the scratch of the shard: the heads, MLP channels and
//   vocabulary rows /T, the N·C tensors whole, or with sequence parallelism the residual stream's
//   N/T rows; estimate_memory counts the same)
//   sync buffers            ZeRO-1's reduce-scatter receive buffer (nccl: the device buffer of W padded
//                           pieces, comm/nccl.h); gather_scatter's root buffers
// Precision: fp32 is the code as built (those byte counts are exact). "bf16-built" is
// runtime.precision bf16 as built, counted as estimate_memory counts it: the fp32 parameters,
// gradients and moments plus the Model's bf16 weight copy, the Activations with the bf16 operands
// it keeps (norm outputs, the LM head's bf16 logits gradient; the rest fp32), the scratch with the
// GEMMs' bf16 operand copies (measured on an H100 for GPT-2 124M at B = 64: 42.10 GB peak against
// 40.22 GB counted, the rest the CUDA context). "bf16" is a PROJECTION of the design card's mixed
// precision: bf16 weights (2 B) + fp32 master weights (4 B, divided by DP with ZeRO-1 on a GPU) +
// fp32 gradients + fp32 AdamW moments, activations and scratch at 2 B per element (ids and the host
// loss row as they are) — what bf16 activations would need: 23.04 GB at that shape, 45% below the
// measured peak.
//
// Time, per step: the stages' compute (per micro-batch costs of the embedding, one block and the
// head, split into forward, input-gradient and weight-gradient backward) from a measured profile or
// from the device table (FLOPs / (peak × assumed MFU)); the pipeline simulated with those costs and
// the point-to-point activation messages (simulate_pipeline); the data-parallel sync per bucket
// with the α-β model of link_model.h (hidden behind the stage's last backward when
// parallel.overlap, as far as the buckets become ready); the tied-embedding gradient sum between
// the first and last stage; the optimizer over the rank's parameters (its shard with ZeRO-1); and
// ZeRO-1's parameter all-gather after it. Recomputation adds to every block's input-gradient
// backward: full one block forward, selective full attention's share of it (scores and weighted
// values, 4·T·C per token; the pointwise recomputes are memory traffic and left out).
//
// Tensor parallelism (tp = T > 1, model/transformer.h "Tensor parallelism"): the groups are T
// adjacent ranks (world rank = (dp_rank·S + stage)·T + tp_rank), inside one node (T must divide the
// ranks per node). The blocks' and the head's compute is divided by T (the embedding is not); each
// micro-batch adds the group's blocking all-reduces over the link inside a node, ring all-reduces
// (2(T−1)/T of the bytes sent per rank): per block two of N·C floats in forward and two in backward;
// the embedding one; the LM head per chunk a max of R floats and a sum of 2·R (again in backward
// for each chunk it recomputes) and one of N·C for d xf (N = micro-batch × seq_len); with
// runtime.recompute full each block's backward repeats its two forward ones. With sequence
// parallelism (desc.sequence_parallel) each of them is a reduce-scatter and an all-gather (the same
// volume; the embedding's is counted as an all-reduce) and each block's backward gathers its two
// branch inputs again: two all-gathers of N·C more; the memory is the shard's with N/T rows of the
// residual stream. On a GPU the code sums through the host (MPI): the copies are not counted.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/gemm_precision.h"
#include "model/model_desc.h"
#include "model/transformer.h"
#include "pipeline/schedule.h"
#include "plan/link_model.h"

namespace llmpi {

// ---- devices -----------------------------------------------------------------------------------------
struct DeviceSpec {
  std::string name;
  bool gpu = false;
  double fp32 = 0, tf32 = 0, bf16 = 0;  // dense peak FLOP/s per rank (cpu: per core, × cores per rank)
  double memory_bytes = 0;              // per rank (cpu: 0 = not checked)
  double memory_bw = 0;                 // bytes/s (the embedding and the optimizer are bandwidth-bound)
  double default_mfu = 0.4;             // assumed fraction of the peak the GEMM-bound work reaches
  int default_ranks_per_node = 8;
  std::string source;
};
const std::vector<DeviceSpec>& device_table();  // h100, h200, cpu
std::string device_names_list();
DeviceSpec find_device(const std::string& name);  // throws Error listing the valid names

// ---- compute costs -----------------------------------------------------------------------------------
// Seconds for one micro-batch of micro_batch × seq_len tokens. A block's (and the head's) backward
// b = bi (input gradient) + w (weight gradient).
struct LayerCosts {
  int micro_batch = 0, seq_len = 0;
  double embed_f = 0, embed_b = 0;
  double block_f = 0, block_b = 0, block_bi = 0;
  double head_f = 0, head_b = 0, head_bi = 0;
  // The part of head_b (and head_bi) that recomputes the chunked LM head's logits (model/
  // transformer.h "Chunked LM head"); a run without pipeline stages fuses the head ("Fused LM
  // head") and spends none of it.
  double head_recompute = 0;
  double opt_per_param = 0;  // one AdamW update of one parameter
  std::string source;        // "device table h100 bf16, MFU 0.40" or "measured ..."
  nlohmann::json to_json() const;
  static LayerCosts from_json(const nlohmann::json& j, const std::string& where);  // throws Error
  // The same costs at another micro-batch size (linear in the tokens: what the table model says;
  // a measured profile is scaled the same way and says so).
  LayerCosts scaled_to(int micro_batch) const;
  // The costs with the LM head fused: its backward, less the recompute, moved into head_f.
  LayerCosts with_fused_head() const;
};


// The chunked LM head's recompute in backward, as a share of the head's forward: (chunks - 1) /
// chunks for an LM head over B x T rows (model/transformer.h "Chunked LM head"), else 0.
double lm_head_recompute_share(const ModelDesc& d, int B, int T);

// FLOP counts behind the table model (per micro-batch of B × T tokens): a block's forward is
// 2 · (its dense weights) + 4 · T · C per token (scores and weighted values), its backward twice
// that, of which the weight gradients are 2 · (dense weights) per token; the LM head 2 · V · C per
// token forward. The embedding and the optimizer are memory traffic: 3 · N · C · 4 bytes each way;
// AdamW reads p, g, m, v and writes p, m, v (28 bytes per parameter).
LayerCosts costs_from_device(const ModelDesc& d, int micro_batch, int T, const DeviceSpec& dev, GemmPrecision p,
                             double mfu, int cores_per_rank);

// What recomputation adds to one block's backward, from the costs k: full one block forward,
// selective the attention's share of it with full attention (else 0), none 0.
double block_recompute_cost(const ModelDesc& d, const LayerCosts& k, Recompute recompute);

// The LM head's chunks over N rows (lm_head_chunk_rows).
int lm_head_chunks(const ModelDesc& d, int N);
// a + b, field by field (the seconds; a's micro-batch, sequence length and source).
LayerCosts add_costs(const LayerCosts& a, const LayerCosts& b);
// The tensor-parallel all-reduces of shard d (d.tp ranks; all zero when d.tp = 1) per micro-batch of
// B × T tokens, as LayerCosts: their seconds over `intra` (ring all-reduces, collective_time), or
// with bytes = true the bytes one rank sends in them, 2(tp−1)/tp of each buffer ("Tensor
// parallelism" above lists them; recompute full adds a block's two forward ones to its backward).
LayerCosts tensor_parallel_costs(const ModelDesc& d, int B, int T, const Link& intra, Recompute recompute, bool bytes);

// ---- the simulated pipeline ----------------------------------------------------------------------------
struct PipelineSim {
  bool completed = false;
  double makespan = 0;
  std::vector<double> end, busy;             // per stage: when its last compute ends, its compute time
  std::vector<double> last_grad_start, last_grad_len;  // per stage: the last B (or W) that makes gradients final
};
// simulate_schedule (pipeline/schedule.h) with per-stage costs (StageCost) and a message time: a
// message sent at t is received at t + msg_s[boundary] (boundary s: between stages s and s+1),
// and what the plan needs from it per stage.
PipelineSim simulate_pipeline(ScheduleKind kind, int S, int M, const std::vector<StageCost>& cost,
                              const std::vector<double>& msg_s);

// ---- the plan ---------------------------------------------------------------------------------------
struct PlanInputs {
  ModelDesc desc;
  int seq_len = 0, global_batch = 0;
  int world = 1, pp = 1, microbatches = 1;
  int tp = 1;                                    // tensor-parallel ranks per group (parallel.tp)
  std::vector<int> stage_layers;                 // empty = split_layers' balance
  int zero = 0;                                  // the run's choice, 0-3 (all are always planned)
  bool zero_reduce_each_micro_batch = true;      // parallel.zero_reduce "micro_batch" (ZeRO-2/3 rows)
  int64_t checkpoint_every = 0;                  // checkpoint.every (0: only on pre-emption)
  bool checkpoint_async = true;                  // checkpoint.async
  double fs_bandwidth = 1e9;                     // bytes/s the ranks write a checkpoint at, together
  ScheduleKind schedule = ScheduleKind::one_f_one_b;  // the run's choice (every schedule is planned)
  SyncMethod sync = SyncMethod::allreduce;       // allreduce | gather_scatter | nccl
  bool grad_bf16 = false;                        // parallel.grad_dtype "bf16": gradients exchanged in bf16
  OptimizerKind optimizer = OptimizerKind::adamw;
  double bucket_mb = 25, first_bucket_mb = 1;
  bool overlap = false;
  DeviceSpec device;
  GemmPrecision precision = GemmPrecision::fp32;  // for the time (memory is given for fp32 and bf16)
  Recompute recompute = Recompute::none;         // runtime.recompute (memory and time)
  double mfu = 0;                                // 0 = the device's default
  int cores_per_rank = 1;
  Fabric fabric;                                 // links and ranks per node
  int node_cores = 0;                            // cpu: cores of a node (0 = enough); more ranks × cores
                                                 // per rank than that share the cores: compute slows
                                                 // by the ratio
  bool have_profile = false;                     // use `profile` (scaled to the micro-batch) instead of the table
  LayerCosts profile;
};

struct StageMemory {  // one stage's rank
  int stage = 0;
  ModelPart part;
  int64_t n_params = 0, shard_params = 0;        // the stage's parameters; ZeRO-1: its largest shard
  double zero2_grad_floats = 0;                  // ZeRO-2: the gradient at its peak (params/buckets.h)
  double device_zero2_grad_floats = 0;           // ZeRO-2 on a GPU: the device pages' limit (params/buckets.h)
  double zero3_param_floats = 0, zero3_grad_floats = 0;  // ZeRO-3: the parameters and gradient at their peak
  double device_zero3_param_floats = 0, device_zero3_grad_floats = 0;  // ZeRO-3 on a GPU: the device pages' limits
  int64_t block_params = 0;                      // the largest block's parameters (ZeRO-3's gathers)
  int blocks = 0;                                // the blocks the stage holds
  double activation_slot = 0, kept_slot = 0, scratch = 0;   // fp32 bytes of one slot, zb-h1's kept, scratch
  // runtime.precision bf16 as built: one slot (Activations with its bf16 operands), the scratch
  // with the GEMMs' bf16 operand copies, and the Model's bf16 weight copy
  double activation_slot_bf16 = 0, scratch_bf16 = 0, weight_copy_bf16 = 0;
  double zero_recv_buffer = 0, gather_scatter_buffers = 0;  // fp32 bytes
};
// The precisions of the memory rows, in the order they are planned and printed (above).
inline constexpr const char* kMemoryPrecisions[] = {"fp32", "bf16-built", "bf16"};
struct MemoryRow {
  std::string precision, schedule;  // schedule "-" with pp = 1
  int zero = 0, stage = 0, slots = 0;
  double params = 0, grads = 0, optimizer = 0, activations = 0, scratch = 0, buffers = 0, total = 0;
};
struct TimeRow {
  std::string schedule;
  int zero = 0;
  double compute_s = 0;         // the busiest stage's compute (forward + backward of its micro-batches)
  double bubble_s = 0;          // pipeline idle time of that stage, message times included
  double sync_s = 0;            // data-parallel communication of the slowest stage, all of it
  double exposed_sync_s = 0;    // the part the step waits for (+ tied sum, + ZeRO-1 all-gather)
  double optimizer_s = 0;
  double step_s = 0, tokens_per_s = 0, mfu = 0, efficiency = 0;
  double bytes_per_rank = 0;    // data-parallel bytes one rank sends per step (the algorithm's)
  double tp_s = 0;              // the tensor-parallel all-reduces of the busiest stage (in compute_s)
  double tp_bytes_per_rank = 0; // bytes one rank sends in them per step
};
// A checkpoint of the planned run (checkpoint/sharded.h: one file, every rank writing its turn of
// the tensors; train/checkpointing.cpp): its size, its write at fs_bandwidth, and per stage the
// host staging its busiest rank keeps for it (checkpoint.async, or a GPU: the values it writes,
// model/memory_estimate.h checkpoint_write_floats; a synchronous save on the CPU keeps none). A
// resume reads one state of a rank's chunks at a time: params, the largest.
struct CheckpointPlan {
  double state_bytes = 0;                  // params, and AdamW's m and v, of the whole model
  double write_s = 0;                      // state_bytes / fs_bandwidth
  std::vector<double> staging;             // per stage, for the run's ZeRO stage
  std::vector<double> resume;              // per stage: the rank's params
  double export_bytes = 0;                 // llmpi-export: one tensor at a time, the largest
  int every_to_hide = 0;                   // with async: the fewest steps between checkpoints whose
                                           // time (the run's schedule and ZeRO stage) covers write_s
};

struct PlanResult {
  int dp = 1, tp = 1, micro_batch = 0, local_batch = 0;
  std::vector<int> layer_counts;
  std::vector<StageMemory> stages;
  std::vector<MemoryRow> memory;
  std::vector<TimeRow> time;
  CheckpointPlan checkpoint;
  LayerCosts costs;             // at the micro-batch (tp > 1: a shard's, its all-reduces included)
  LayerCosts tp_costs;          // tp > 1: the all-reduces' share of `costs` (no compute)
  double peak_flops = 0, mfu_assumed = 0, flops_per_token = 0;
  double single_rank_tokens_per_s = 0;   // the reference for the scaling efficiency
  double oversubscription = 1;          // cpu: compute costs multiplied by this (ranks sharing cores)
  double p2p_message_bytes = 0;
  std::vector<double> p2p_s;             // per stage boundary
  std::vector<int> dp_ranks_per_node;    // per stage: members of its DP group on one node
  std::vector<std::string> notes;
  nlohmann::json to_json() const;
  // The row for (precision, schedule, zero, stage), or null.
  const MemoryRow* memory_row(const std::string& precision, const std::string& schedule, int zero, int stage) const;
  const TimeRow* time_row(const std::string& schedule, int zero) const;
};

// The inputs a run's configuration gives (model, batch, parallel.*, optimizer, runtime.threads as
// cores per rank) for `world` ranks of the CPU device, all on one node; the caller sets the links
// (fabric.intra / inter) and, for a measured profile, `profile`. The global batch is
// cfg.train.global_batch: with train.batch_per_rank, resolve_batch (runtime/config.h) for the
// run's replicas first.
struct Config;
PlanInputs plan_inputs_from_config(const Config& cfg, const ModelDesc& desc, int world);

// The data-parallel replicas of the run: world / (pp × tp). Throws Error naming the flags when
// world, pp or tp is below 1 or pp × tp does not divide the world.
int data_parallel_replicas(const PlanInputs& in);

// Throws Error (one clear line naming the fix) on impossible inputs: world not divisible by pp × tp,
// tp not dividing the heads, key/value heads or MLP width, or exceeding the ranks per node,
// micro-batches not dividing the per-replica batch, more stages than layers, a micro-batch of more
// token rows than an int holds (token_rows_checked), a model beyond check_model_sizes' limits, ...
// Sizes are computed in 64 bits (byte counts in memory_estimate.h in 128, then refused beyond int64).
PlanResult plan(const PlanInputs& in);

}  // namespace llmpi
