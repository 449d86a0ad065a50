#include "plan/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "params/buckets.h"
#include "pipeline/stage_layers.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "model/memory_estimate.h"

namespace llmpi {

// ---- devices ---------------------------------------------------------------------------------------
// H100 SXM5 and H200 SXM: NVIDIA's data sheets (dense, without sparsity): 989 TFLOP/s bf16,
// 494.7 TF32, 67 FP32; H100 80 GB HBM3 at 3.35 TB/s, H200 141 GB HBM3e at 4.8 TB/s.
// cpu: one core of a 2-vCPU AMD EPYC VM: OpenBLAS sgemm on the gpt2 reference shapes with both cores
// busy, 89.5 GFLOP/s (bench/results/reference-cpu-2026-11-29.json, /gemm_gflops_per_rank, median of
// 3 rounds of `make bench`); its default MFU is the measured utilisation of that ceiling by the CPU
// trainer (94.0 % of the executed FLOPs, /rows/gpt2/utilisation_executed_flops, same run).
// Its memory bandwidth (embedding, optimizer) is an assumption: 10 GB/s per core, not measured.
const std::vector<DeviceSpec>& device_table() {
  static const std::vector<DeviceSpec> t = [] {
    DeviceSpec h100;
    h100.name = "h100";
    h100.gpu = true;
    h100.fp32 = 67e12, h100.tf32 = 494.7e12, h100.bf16 = 989e12;
    h100.memory_bytes = 80e9, h100.memory_bw = 3.35e12;
    h100.default_mfu = 0.40;
    h100.default_ranks_per_node = 8;
    h100.source = "NVIDIA H100 SXM5 data sheet (dense): 989 TFLOP/s bf16, 494.7 TF32, 67 FP32; 80 GB at 3.35 TB/s";
    DeviceSpec h200 = h100;
    h200.name = "h200";
    h200.memory_bytes = 141e9, h200.memory_bw = 4.8e12;
    h200.source = "NVIDIA H200 SXM data sheet (dense): H100's compute; 141 GB at 4.8 TB/s";
    DeviceSpec cpu;
    cpu.name = "cpu";
    cpu.gpu = false;
    cpu.fp32 = cpu.tf32 = cpu.bf16 = 89.5e9;  // per core; no bf16 or TF32 units used
    cpu.memory_bytes = 0;
    cpu.memory_bw = 10e9;
    cpu.default_mfu = 0.940;
    cpu.default_ranks_per_node = 0;  // 0 = every rank on this one node
    cpu.source = "a 2-vCPU AMD EPYC: sgemm 89.5 GFLOP/s per core (bench-sgemm_rate in `make bench`, "
                 "bench/results/reference-cpu-2026-11-29.json); MFU default 0.940 = the trainer's measured share of "
                 "it; memory bandwidth 10 GB/s per core assumed; on another CPU use --profile";
    return std::vector<DeviceSpec>{h100, h200, cpu};
  }();
  return t;
}

std::string device_names_list() {
  std::string s;
  for (const DeviceSpec& d : device_table()) s += (s.empty() ? "" : ", ") + d.name;
  return s;
}

DeviceSpec find_device(const std::string& name) {
  for (const DeviceSpec& d : device_table())
    if (d.name == name) return d;
  fail("unknown device '", name, "': use one of ", device_names_list());
}

static double device_peak(const DeviceSpec& d, GemmPrecision p, int cores) {
  const double per = p == GemmPrecision::fp32 ? d.fp32 : p == GemmPrecision::tf32 ? d.tf32 : d.bf16;
  return d.gpu ? per : per * std::max(1, cores);
}

// ---- costs ------------------------------------------------------------------------------------------

nlohmann::json LayerCosts::to_json() const {
  return {{"micro_batch", micro_batch}, {"seq_len", seq_len}, {"embed_f", embed_f}, {"embed_b", embed_b},
          {"block_f", block_f}, {"block_b", block_b}, {"block_bi", block_bi}, {"head_f", head_f},
          {"head_b", head_b}, {"head_bi", head_bi}, {"head_recompute", head_recompute},
          {"opt_per_param", opt_per_param}, {"source", source}};
}

LayerCosts LayerCosts::from_json(const nlohmann::json& j, const std::string& where) {
  LayerCosts c;
  auto num = [&](const char* k) {
    if (!j.is_object() || !j.contains(k) || !j[k].is_number() || j[k].get<double>() < 0)
      fail(where, ": '", k, "' is missing or not a number >= 0: write the profile with llmpi-plan --profile --profile-out");
    return j[k].get<double>();
  };
  c.micro_batch = (int)num("micro_batch");
  c.seq_len = (int)num("seq_len");
  if (c.micro_batch < 1 || c.seq_len < 1) fail(where, ": micro_batch and seq_len must be >= 1");
  c.embed_f = num("embed_f"), c.embed_b = num("embed_b");
  c.block_f = num("block_f"), c.block_b = num("block_b"), c.block_bi = num("block_bi");
  c.head_f = num("head_f"), c.head_b = num("head_b"), c.head_bi = num("head_bi");
  c.head_recompute = j.contains("head_recompute") ? num("head_recompute") : 0;  // absent in older profiles
  c.opt_per_param = num("opt_per_param");
  if (c.block_bi > c.block_b || c.head_bi > c.head_b) fail(where, ": an input-gradient backward exceeds the whole backward");
  if (c.head_recompute > c.head_bi) fail(where, ": head_recompute exceeds the head's input-gradient backward");
  c.source = j.contains("source") && j["source"].is_string() ? j["source"].get<std::string>() : where;
  return c;
}

LayerCosts LayerCosts::scaled_to(int mb) const {
  if (mb == micro_batch) return *this;
  LayerCosts c = *this;
  const double r = (double)mb / micro_batch;
  for (double* x :
       {&c.embed_f, &c.embed_b, &c.block_f, &c.block_b, &c.block_bi, &c.head_f, &c.head_b, &c.head_bi, &c.head_recompute})
    *x *= r;
  c.micro_batch = mb;
  c.source += " (scaled linearly from micro-batch " + std::to_string(micro_batch) + " to " + std::to_string(mb) + ")";
  return c;
}

LayerCosts LayerCosts::with_fused_head() const {
  LayerCosts k = *this;
  k.head_f += head_b - head_recompute;  // the head's backward runs in F, without the recompute
  k.head_b = k.head_bi = k.head_recompute = 0;
  return k;
}

double lm_head_recompute_share(const ModelDesc& d, int B, int T) {
  if (d.head != HeadKind::lm) return 0;
  const double chunks = std::ceil((double)B * T / lm_head_chunk_rows(d, B * T));
  return (chunks - 1) / chunks;
}

double block_recompute_cost(const ModelDesc& d, const LayerCosts& k, Recompute recompute) {
  if (recompute == Recompute::full) return k.block_f;
  if (recompute == Recompute::none || d.attention == AttentionImpl::fused) return 0;
  const ParamTable blk = build_param_table(d, ModelPart{0, 1, false, false});
  double dense = 0;  // dense weights of one block
  for (const ParamSlice& s : blk.slices)
    if (s.role == kQkvW || s.role == kAttnOutW || s.role == kFcW || s.role == kProjW) dense += (double)s.numel;
  const double attn = 4.0 * k.seq_len * d.d_model;  // per token, as costs_from_device counts it
  return k.block_f * attn / (2 * dense + attn);
}

LayerCosts costs_from_device(const ModelDesc& d, int B, int T, const DeviceSpec& dev, GemmPrecision p, double mfu,
                             int cores) {
  if (mfu <= 0) mfu = dev.default_mfu;
  const double rate = device_peak(dev, p, cores) * mfu;
  const double bw = dev.memory_bw * (dev.gpu ? 1 : std::max(1, cores));
  const double N = (double)B * T, C = d.d_model;
  const ParamTable blk = build_param_table(d, ModelPart{0, 1, false, false});
  double dense = 0;  // dense weights of one block
  for (const ParamSlice& s : blk.slices)
    if (s.role == kQkvW || s.role == kAttnOutW || s.role == kFcW || s.role == kProjW) dense += (double)s.numel;
  const double attn = 4.0 * T * C;  // scores and weighted values, per token, forward
  LayerCosts c;
  c.micro_batch = B, c.seq_len = T;
  c.block_f = N * (2 * dense + attn) / rate;
  c.block_b = 2 * c.block_f;
  c.block_bi = c.block_b - N * 2 * dense / rate;
  const double head = d.head == HeadKind::lm ? 2.0 * d.vocab_size * C : 2.0 * C * C + 2.0 * C * d.num_labels;
  const double head_rows = d.head == HeadKind::lm ? N : (double)B;
  c.head_f = head_rows * head / rate;
  // The chunked LM head recomputes every chunk's logits but the last in backward (transformer.h
  // "Chunked LM head"): (chunks - 1) / chunks of a forward more. (A zb-h1 weight pass recomputes
  // them once more, which W = head_b - head_bi leaves out: under 1/4 of the head's backward.)
  const double recompute = lm_head_recompute_share(d, B, T) * c.head_f;
  c.head_b = 2 * c.head_f + recompute;
  c.head_bi = c.head_f + recompute;
  c.head_recompute = recompute;
  const double elt = p == GemmPrecision::bf16 ? 2 : 4;
  c.embed_f = 3 * N * C * elt / bw;
  c.embed_b = 3 * N * C * elt / bw;
  c.opt_per_param = 28.0 / bw;
  char buf[200];
  std::snprintf(buf, sizeof buf, "device table %s %s: %.4g TFLOP/s peak x MFU %.3f (assumed)", dev.name.c_str(),
                gemm_precision_name(p), device_peak(dev, p, cores) / 1e12, mfu);
  c.source = buf;
  return c;
}

int lm_head_chunks(const ModelDesc& d, int N) {
  const int R = lm_head_chunk_rows(d, N);
  return (N + R - 1) / R;
}

LayerCosts add_costs(const LayerCosts& a, const LayerCosts& b) {
  LayerCosts k = a;
  k.embed_f += b.embed_f, k.embed_b += b.embed_b;
  k.block_f += b.block_f, k.block_b += b.block_b, k.block_bi += b.block_bi;
  k.head_f += b.head_f, k.head_b += b.head_b, k.head_bi += b.head_bi, k.head_recompute += b.head_recompute;
  k.opt_per_param += b.opt_per_param;
  return k;
}

LayerCosts tensor_parallel_costs(const ModelDesc& d, int B, int T, const Link& intra, Recompute recompute, bool bytes) {
  const int tp = d.tp;
  // One ring all-reduce of n floats: its time, or the bytes one rank sends in it.
  auto ar = [&](double floats) {
    return bytes ? 2.0 * (tp - 1) / tp * floats * 4 : collective_time(intra, CollOp::allreduce, tp, floats * 4);
  };
  LayerCosts k;
  k.micro_batch = B, k.seq_len = T;
  if (tp <= 1) return k;
  const int N = B * T;
  const double NC = (double)N * d.d_model;
  k.embed_f = ar(NC);
  k.block_f = 2 * ar(NC);  // after the attention output and the MLP's second projection
  k.block_b = k.block_bi = 2 * ar(NC);  // d of the QKV and the MLP's first projection inputs
  if (recompute == Recompute::full) k.block_b = k.block_bi = 4 * ar(NC);  // the block's forward again
  if (d.seq_shards()) {  // each all-reduce becomes a reduce-scatter + all-gather (the same volume);
    // backward gathers each branch's input again for its weight gradient: two all-gathers of N·C
    const double ag = bytes ? (double)(tp - 1) / tp * NC * 4 : collective_time(intra, CollOp::allgather, tp, NC * 4);
    k.block_b += 2 * ag, k.block_bi += 2 * ag;
  }
  if (d.head == HeadKind::lm) {
    const int R = lm_head_chunk_rows(d, N), chunks = lm_head_chunks(d, N);
    double all = 0, last = 0;  // the row statistics of every chunk: a max of rn floats, a sum of 2·rn
    for (int c = 0; c < chunks; c++) {
      const int rn = std::min(R, N - c * R);
      last = ar(rn) + ar(2.0 * rn);
      all += last;
    }
    k.head_f = all;
    k.head_recompute = all - last;  // backward recomputes every chunk but the last
    k.head_b = k.head_bi = k.head_recompute + ar(NC);  // and sums d xf
  }
  k.source = bytes ? "bytes sent per rank in the tensor-parallel all-reduces"
                   : "tensor-parallel all-reduces over " + intra.name;
  return k;
}

// ---- the pipeline with per-stage costs ---------------------------------------------------------------
PipelineSim simulate_pipeline(ScheduleKind kind, int S, int M, const std::vector<StageCost>& cost,
                              const std::vector<double>& msg_s) {
  const SimResult sim = simulate_schedule(kind, S, M, 1, cost, msg_s);
  PipelineSim r;
  r.completed = sim.completed;
  r.makespan = sim.makespan;
  r.end = sim.end;
  r.busy = sim.busy;
  r.last_grad_start.assign(S, 0), r.last_grad_len.assign(S, 0);
  for (const SimEvent& e : sim.events)  // events are in simulation order: the last B or W wins
    if (e.action.type == ActionType::B || e.action.type == ActionType::W)
      r.last_grad_start[e.stage] = e.start, r.last_grad_len[e.stage] = e.end - e.start;
  return r;
}

// ---- results ----------------------------------------------------------------------------------------

const MemoryRow* PlanResult::memory_row(const std::string& precision, const std::string& schedule, int zero,
                                        int stage) const {
  for (const MemoryRow& m : memory)
    if (m.precision == precision && m.schedule == schedule && m.zero == zero && m.stage == stage) return &m;
  return nullptr;
}
const TimeRow* PlanResult::time_row(const std::string& schedule, int zero) const {
  for (const TimeRow& t : time)
    if (t.schedule == schedule && t.zero == zero) return &t;
  return nullptr;
}

nlohmann::json PlanResult::to_json() const {
  nlohmann::json j;
  j["dp"] = dp;
  j["tp"] = tp;
  j["tp_costs"] = tp_costs.to_json();
  j["micro_batch"] = micro_batch;
  j["local_batch"] = local_batch;
  j["layer_counts"] = layer_counts;
  j["costs"] = costs.to_json();
  j["peak_flops_per_rank"] = peak_flops;
  j["mfu_assumed"] = mfu_assumed;
  j["flops_per_token"] = flops_per_token;
  j["single_rank_tokens_per_s"] = single_rank_tokens_per_s;
  j["oversubscription"] = oversubscription;
  j["p2p_message_bytes"] = p2p_message_bytes;
  j["p2p_s"] = p2p_s;
  j["dp_ranks_per_node"] = dp_ranks_per_node;
  j["notes"] = notes;
  for (const StageMemory& s : stages)
    j["stages"].push_back({{"stage", s.stage}, {"layers", {s.part.l0, s.part.l1}}, {"embedding", s.part.embedding},
                           {"head", s.part.head}, {"n_params", s.n_params}, {"shard_params", s.shard_params},
                           {"activation_slot_bytes_fp32", s.activation_slot}, {"kept_slot_bytes_fp32", s.kept_slot},
                           {"scratch_bytes_fp32", s.scratch}, {"activation_slot_bytes_bf16_built", s.activation_slot_bf16},
                           {"scratch_bytes_bf16_built", s.scratch_bf16}, {"weight_copy_bytes_bf16", s.weight_copy_bf16},
                           {"zero_recv_buffer_bytes", s.zero_recv_buffer},
                           {"gather_scatter_buffer_bytes", s.gather_scatter_buffers}});
  for (const MemoryRow& m : memory)
    j["memory"].push_back({{"precision", m.precision}, {"schedule", m.schedule}, {"zero", m.zero}, {"stage", m.stage},
                           {"slots", m.slots}, {"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer},
                           {"activations", m.activations}, {"scratch", m.scratch}, {"buffers", m.buffers},
                           {"total", m.total}});
  j["checkpoint"] = {{"state_bytes", checkpoint.state_bytes}, {"write_s", checkpoint.write_s},
                     {"staging_bytes_per_stage", checkpoint.staging}, {"resume_bytes_per_stage", checkpoint.resume},
                     {"every_to_hide", checkpoint.every_to_hide}, {"export_bytes", checkpoint.export_bytes}};
  for (const TimeRow& t : time)
    j["time"].push_back({{"schedule", t.schedule}, {"zero", t.zero}, {"compute_s", t.compute_s}, {"bubble_s", t.bubble_s},
                         {"sync_s", t.sync_s}, {"exposed_sync_s", t.exposed_sync_s}, {"optimizer_s", t.optimizer_s},
                         {"step_s", t.step_s}, {"tokens_per_s", t.tokens_per_s}, {"mfu", t.mfu},
                         {"efficiency", t.efficiency}, {"dp_bytes_sent_per_rank", t.bytes_per_rank},
                         {"tp_s", t.tp_s}, {"tp_bytes_sent_per_rank", t.tp_bytes_per_rank}});
  return j;
}

// ---- the plan ---------------------------------------------------------------------------------------

namespace {

bool is_head_role(int r) {
  return r == kFinalNormW || r == kFinalNormB || r == kLmHead || r == kPoolerW || r == kPoolerB || r == kClsW ||
         r == kClsB;
}

// For each bucket, the fraction of the stage's last backward after which it is final: the
// backward runs head, blocks l1-1 .. l0, embedding (the table's order); a tensor is final after its
// component, the embedding tables (and a tied copy, handed over last) at the very end.
std::vector<double> bucket_ready_fractions(const ParamTable& t, const std::vector<Bucket>& buckets, const ModelPart& part,
                                           int n_layer, const LayerCosts& c) {
  const int l1 = part.l1 < 0 ? n_layer : part.l1;
  const double head = part.head ? c.head_b : 0, emb = part.embedding ? c.embed_b : 0;
  const double total = head + (l1 - part.l0) * c.block_b + emb;
  auto ready = [&](const ParamSlice& s) {
    if (total <= 0) return 1.0;
    if (s.layer >= 0) return (head + (l1 - s.layer) * c.block_b) / total;
    if (is_head_role(s.role)) return head / total;
    return 1.0;
  };
  std::vector<double> f;
  for (const Bucket& b : buckets) {
    double r = 0;
    for (size_t i = b.first_slice; i <= b.last_slice; i++) r = std::max(r, ready(t.slices[i]));
    f.push_back(r);
  }
  return f;
}

}  // namespace

namespace {

// The share of bucket b's floats that lie outside the blocks (layer -1).
double outside_fraction(const ParamTable& t, const Bucket& b) {
  double out = 0;
  for (size_t i = b.first_slice; i <= b.last_slice; i++)
    if (t.slices[i].layer < 0) out += (double)t.slices[i].numel;
  return b.end > b.begin ? out / (double)(b.end - b.begin) : 0;
}

}  // namespace

PlanInputs plan_inputs_from_config(const Config& cfg, const ModelDesc& desc, int world) {
  PlanInputs in;
  in.desc = desc;
  in.seq_len = cfg.model.seq_len;
  in.global_batch = cfg.train.global_batch;
  in.world = world;
  in.pp = cfg.parallel.pp_stages;
  in.tp = cfg.parallel.tp;
  in.desc.sequence_parallel = cfg.parallel.sequence_parallel;
  in.microbatches = cfg.parallel.microbatches;
  in.stage_layers = cfg.parallel.stage_layers;
  in.zero = cfg.parallel.zero;
  in.zero_reduce_each_micro_batch = cfg.parallel.zero_reduce == ZeroReduce::micro_batch;
  in.schedule = cfg.parallel.schedule;
  in.sync = cfg.parallel.sync;
  in.grad_bf16 = cfg.parallel.grad_dtype == GradDtype::bf16;
  in.optimizer = cfg.train.optimizer;
  in.bucket_mb = cfg.parallel.bucket_mb;
  in.first_bucket_mb = cfg.parallel.first_bucket_mb;
  in.overlap = cfg.parallel.overlap;
  in.recompute = cfg.runtime.recompute;
  in.device = find_device("cpu");
  in.cores_per_rank = cfg.runtime.threads > 0 ? cfg.runtime.threads : 1;
  in.checkpoint_every = cfg.checkpoint.every;
  in.checkpoint_async = cfg.checkpoint.async;
  in.fabric.ranks_per_node = world;
  in.fabric.nics_per_node = 1;
  return in;
}

int data_parallel_replicas(const PlanInputs& in) {
  const int W = in.world, S = in.pp, TP = in.tp;
  if (W < 1) fail("--world must be >= 1");
  if (S < 1) fail("--pp must be >= 1");
  if (TP < 1) fail("--tp must be >= 1 (tensor-parallel ranks per group)");
  if (TP == 1 && W % S != 0)
    fail("the world size ", W, " is not divisible by the pipeline stages ", S, ": choose --world a multiple of --pp");
  if (W % ((long)S * TP) != 0)
    fail("the world size ", W, " is not divisible by pp ", S, " x tp ", TP, " = ", (long)S * TP,
         ": choose --world a multiple of ", (long)S * TP);
  return W / (S * TP);
}

PlanResult plan(const PlanInputs& in) {
  const ModelDesc& d = in.desc;
  const int W = in.world, S = in.pp, T = in.seq_len, G = in.global_batch, TP = in.tp;
  const int dp = data_parallel_replicas(in);
  if (const std::string e = recompute_schedule_error(in.recompute, in.schedule, S); !e.empty()) fail(e);
  if (T < 1 || T > d.max_seq_len) fail("model.seq_len ", T, " must be in [1, max_seq_len ", d.max_seq_len, "]");
  if (d.vocab_size < 1) fail("the model has no vocabulary size: set model.vocab_size or give --vocab N (or a data.train file)");
  PlanResult r;
  r.dp = dp;
  r.tp = TP;
  if (G % r.dp != 0)
    fail("train.global_batch ", G, " is not divisible by the ", r.dp, " data-parallel replicas (world ", W, " / pp ", S,
         TP > 1 ? " / tp " + std::to_string(TP) : std::string(), "): choose a global batch that is a multiple of ",
         r.dp);
  // Tensor parallelism: the memory is that of the last shard, which holds the most vocabulary rows
  // (tensor_shard refuses a tp that does not divide the heads or the MLP width, naming the key).
  const ModelDesc ds = TP > 1 ? tensor_shard(d, TP, TP - 1) : d;
  if (ds.seq_shards() && T % TP != 0)
    fail("model.seq_len ", T, " is not a multiple of --tp ", TP, ": parallel.sequence_parallel splits every "
         "sequence's rows over the group; choose a multiple of ", TP, " or set parallel.sequence_parallel false");
  r.local_batch = G / r.dp;
  // Micro-batches: a pipeline's, or without stages gradient accumulation's (one at a time).
  const int M = in.microbatches;
  if (M < 1) fail("--microbatches must be >= 1");
  if (r.local_batch % M != 0)
    fail("parallel.microbatches ", M, " does not divide the ", r.local_batch, " sequences each data-parallel replica "
         "gets per step (train.global_batch ", G, " / ", r.dp, " replicas): choose micro-batches dividing ",
         r.local_batch);
  r.micro_batch = r.local_batch / M;
  // ZeRO-2/3 with gradient accumulation: each micro-batch reduce-scattered (parallel.zero_reduce)
  const bool each_micro = in.zero_reduce_each_micro_batch && S == 1;
  token_rows_checked(r.micro_batch, T);  // (B·T below is an int: refused, naming the keys, beyond INT_MAX)
  const bool zb_possible = S > 1;
  if (in.sync == SyncMethod::weights)
    fail("parallel.sync 'weights' is not planned: use allreduce, gather_scatter or nccl (\"weights\" exchanges no "
         "gradients and does not combine with pipelines)");
  const bool adamw = in.optimizer == OptimizerKind::adamw;
  r.layer_counts = S > 1 ? split_layers(d, T, S, in.stage_layers) : std::vector<int>{d.n_layer};
  const bool gs = in.sync == SyncMethod::gather_scatter;
  if (gs && in.grad_bf16)
    fail("parallel.grad_dtype \"bf16\" is not implemented for parallel.sync \"gather_scatter\": use \"allreduce\" or \"nccl\"");
  const int rpn = std::max(1, in.fabric.ranks_per_node);
  if (TP > 1 && rpn % TP != 0)
    fail("--tp ", TP, " does not divide the ", rpn, " ranks per node (--gpus-per-node): a tensor-parallel group "
         "all-reduces every block's output and must lie inside one node; choose --tp dividing ", rpn);
  auto node_of = [&](long rank) { return rank / rpn; };
  // The world rank of data-parallel replica q, stage s, tensor-parallel rank 0 (runtime/parallel_groups.h).
  auto rank_of = [&](long q, int s) { return (q * S + s) * TP; };

  // ---- memory ----
  std::vector<ParamTable> tables;
  std::vector<std::vector<Bucket>> buckets;
  const double first_mb = in.overlap ? in.first_bucket_mb : in.bucket_mb;
  for (int s = 0; s < S; s++) {
    StageMemory sm;
    sm.stage = s;
    sm.part = S > 1 ? virtual_stage_part(r.layer_counts, s) : ModelPart::whole();
    tables.push_back(build_param_table(ds, sm.part));
    buckets.push_back(make_buckets(tables.back(), in.bucket_mb, first_mb));
    sm.n_params = (int64_t)tables.back().numel;
    size_t shard = 0, largest_piece = 0, largest_bucket = 0;
    for (const ShardPiece& p : shard_pieces(buckets.back(), r.dp, 0)) shard += p.end - p.begin;
    for (const Bucket& b : buckets.back()) {
      largest_piece = std::max(largest_piece, (b.end - b.begin + r.dp - 1) / r.dp);
      largest_bucket = std::max(largest_bucket, b.end - b.begin);
    }
    sm.shard_params = (int64_t)shard;
    {  // ZeRO-3: buckets cut at the blocks; the largest block's parameters
      const std::vector<Bucket> at_layers = make_buckets(tables.back(), in.bucket_mb, first_mb, true);
      const std::vector<ShardPiece> pieces = shard_pieces(at_layers, r.dp, 0);
      sm.zero3_param_floats = zero3_param_floats(tables.back(), at_layers, pieces, in.overlap, 4096 / sizeof(float));
      sm.zero3_grad_floats = zero2_grad_floats(at_layers, pieces, tables.back().numel, in.overlap, M, each_micro,
                                               sm.part.head && ds.head == HeadKind::lm && ds.tie_embeddings,
                                               4096 / sizeof(float));
      sm.device_zero3_param_floats = device_zero3_param_floats(tables.back(), at_layers, pieces,
                                                               kDeviceChunkBytes / sizeof(float));
      sm.device_zero3_grad_floats = device_zero2_grad_floats(tables.back(), at_layers, pieces, M, each_micro,
                                                             kDeviceChunkBytes / sizeof(float));
      std::map<int, int64_t> per_layer;
      for (const ParamSlice& sl : tables.back().slices)
        if (sl.layer >= 0) per_layer[sl.layer] += (int64_t)sl.numel;
      for (const auto& [l, n] : per_layer) sm.block_params = std::max(sm.block_params, n);
      sm.blocks = (int)per_layer.size();
    }
    // ZeRO-2: the gradient at its peak on the first replica's rank of the stage (CPU), or the
    // limit of its device pages (GPU, 2 MiB chunks)
    const std::vector<ShardPiece> first_pieces = shard_pieces(buckets.back(), r.dp, 0);
    sm.zero2_grad_floats = zero2_grad_floats(buckets.back(), first_pieces, tables.back().numel, in.overlap, M,
                                             each_micro, sm.part.head && ds.head == HeadKind::lm && ds.tie_embeddings,
                                             4096 / sizeof(float));
    sm.device_zero2_grad_floats = device_zero2_grad_floats(tables.back(), buckets.back(), first_pieces, M, each_micro,
                                                           kDeviceChunkBytes / sizeof(float));
    // ZeRO-1: the reduce-scatter's receive piece; with allreduce also the all-gather's padded
    // send piece and its W pieces (comm/grad_sync.cpp); with nccl the device buffer of W padded
    // pieces in fp32, and in bf16 for a bf16 gradient (comm/nccl.h)
    const double nccl_pad = (double)largest_piece * r.dp * (4 + (in.grad_bf16 ? 2 : 0));
    sm.zero_recv_buffer = r.dp <= 1 ? 0 : in.sync == SyncMethod::nccl ? nccl_pad : (double)largest_piece * 4 * (gs ? 1 : r.dp + 2);
    sm.gather_scatter_buffers = gs && r.dp > 1 ? 2.0 * r.dp * largest_bucket * 4 : 0;
    sm.activation_slot = (double)activation_bytes(ds, sm.part, r.micro_batch, T, GemmPrecision::fp32, in.recompute);
    sm.kept_slot = (double)kept_bytes(ds, sm.part, r.micro_batch, T);
    sm.scratch = (double)backward_scratch_bytes(ds, r.micro_batch, T);
    sm.activation_slot_bf16 =
        (double)activation_bytes(ds, sm.part, r.micro_batch, T, GemmPrecision::bf16, in.recompute);
    sm.scratch_bf16 =
        sm.scratch + (double)gemm_operand_scratch_bytes(ds, r.micro_batch, T, GemmPrecision::bf16, in.device.gpu);
    std::vector<size_t> copy_offsets;
    sm.weight_copy_bf16 = (double)aligned_copy_layout(tables.back(), &copy_offsets) * sizeof(uint16_t);
    r.stages.push_back(sm);
  }
  std::vector<std::string> schedules;
  if (S > 1) schedules = {"gpipe", "1f1b", "zb-h1"};
  else schedules = {"-"};
  if (S > 1 && in.recompute != Recompute::none) {  // zb-h1 refuses recomputation
    schedules.pop_back();
    r.notes.push_back(std::string("zb-h1 is not planned: it is not implemented with runtime.recompute \"") +
                      option_name(in.recompute) + "\"");
  } else if (S > 1 && ds.seq_shards()) {  // ... and sequence parallelism
    schedules.pop_back();
    r.notes.push_back("zb-h1 is not planned: it is not implemented with parallel.sequence_parallel");
  }
  if (S > 1 && in.schedule == ScheduleKind::interleaved)
    r.notes.push_back("the run's schedule 'interleaved' is not planned (gpipe, 1f1b and zb-h1 are)");
  std::map<std::string, std::vector<int>> slots;  // schedule → per stage
  for (const std::string& sch : schedules)
    for (int s = 0; s < S; s++)
      slots[sch].push_back(S > 1 ? std::max(1, activation_peak(build_schedule(parse_schedule_kind(sch), S, M, s), 1).total) : 1);
  const double ids_bytes = 4.0 * r.micro_batch * T * 4 + (d.head == HeadKind::lm ? (double)r.micro_batch * T : r.micro_batch) * 4;
  for (const char* prec : kMemoryPrecisions) {
    const bool bf = std::string(prec) == "bf16", built16 = std::string(prec) == "bf16-built";
    for (const std::string& sch : schedules)
      for (int z = 0; z <= 3; z++)
        for (int s = 0; s < S; s++) {
          const StageMemory& sm = r.stages[s];
          const bool sharded = z >= 1 && r.dp > 1;
          const double n = (double)sm.n_params, own = sharded ? (double)sm.shard_params : n;
          MemoryRow m;
          m.precision = prec, m.schedule = sch, m.zero = z, m.stage = s, m.slots = slots[sch][s];
          // bf16 projection: bf16 weights + fp32 master weights (sharded by ZeRO-1); as built: the
          // fp32 parameters (whole on every rank) + the bf16 weight copy
          m.params = bf ? 2 * n + 4 * own : built16 ? 4 * n + sm.weight_copy_bf16 : 4 * n;
          // ZeRO-2/3 hold only their pieces of the gradient (ZeRO-3: and of the blocks' parameters)
          // and what is in use: resident pages on the CPU, on a GPU device pages up to their limits
          const bool paged = z >= 2 && sharded, gpu = in.device.gpu;
          if (paged && z == 3 && !bf && !built16) m.params = 4 * (gpu ? sm.device_zero3_param_floats : sm.zero3_param_floats);
          m.grads = !paged ? 4 * n
                    : z == 3 ? 4 * (gpu ? sm.device_zero3_grad_floats : sm.zero3_grad_floats)
                             : 4 * (gpu ? sm.device_zero2_grad_floats : sm.zero2_grad_floats);
          m.optimizer = adamw ? 8 * own : 0;
          const double kept = sch == "zb-h1" ? sm.kept_slot : 0;
          const double slot = bf        ? (sm.activation_slot - ids_bytes) / 2 + ids_bytes + kept / 2
                              : built16 ? sm.activation_slot_bf16 + kept
                                        : sm.activation_slot + kept;
          m.activations = m.slots * slot;
          m.scratch = bf ? sm.scratch / 2 : built16 ? sm.scratch_bf16 : sm.scratch;
          m.buffers = (sharded ? sm.zero_recv_buffer : 0) + sm.gather_scatter_buffers;
          m.total = m.params + m.grads + m.optimizer + m.activations + m.scratch + m.buffers;
          r.memory.push_back(m);
        }
  }
  if (in.device.gpu && in.zero == 2)
    r.notes.push_back("ZeRO-2 on a GPU: its gradient rows are the limit of the backed device "
                      "pages (pieces, the tensors outside the blocks, three buckets)");
  if (in.device.gpu && in.zero == 3)
    r.notes.push_back("ZeRO-3 on a GPU: its parameter rows are the limit of the backed device "
                      "pages (pieces, the tensors outside the blocks, three blocks), its gradient rows ZeRO-2's");
  if (in.zero == 3)
    r.notes.push_back("ZeRO-3 runs with runtime.precision fp32 (its bf16 rows are not a layout llmpi-train runs)");
  if (!zb_possible)
    r.notes.push_back(M > 1 ? "pp = 1: one activation slot of a micro-batch of " + std::to_string(r.micro_batch) +
                                  " (gradient accumulation over " + std::to_string(M) + ")"
                            : std::string("pp = 1: one activation slot of the whole local batch (no micro-batches)"));

  // ---- time ----
  r.costs = in.have_profile ? in.profile.scaled_to(r.micro_batch)
                            : costs_from_device(d, r.micro_batch, T, in.device, in.precision, in.mfu, in.cores_per_rank);
  if (in.have_profile && in.profile.seq_len != T)
    fail("the profile was measured at seq_len ", in.profile.seq_len, " but the run has ", T,
         ": measure it again with --profile at this configuration");
  if (!in.device.gpu && in.node_cores > 0) {
    const int on_node = std::min(W, rpn);
    r.oversubscription = std::max(1.0, (double)on_node * std::max(1, in.cores_per_rank) / in.node_cores);
    if (r.oversubscription > 1) {
      LayerCosts& k = r.costs;
      for (double* x : {&k.embed_f, &k.embed_b, &k.block_f, &k.block_b, &k.block_bi, &k.head_f, &k.head_b, &k.head_bi,
                        &k.head_recompute, &k.opt_per_param})
        *x *= r.oversubscription;
      char buf[160];
      std::snprintf(buf, sizeof buf, "%d ranks x %d core(s) on a node of %d cores: compute slowed by %.2f (shared cores)",
                    on_node, std::max(1, in.cores_per_rank), in.node_cores, r.oversubscription);
      r.notes.push_back(buf);
      k.source += std::string(", x ") + std::to_string(r.oversubscription).substr(0, 4) + " for shared cores";
    }
  }
  if (in.recompute != Recompute::none) {
    const double extra = block_recompute_cost(d, r.costs, in.recompute);
    r.costs.block_b += extra;
    r.costs.block_bi += extra;
    r.notes.push_back(std::string("runtime.recompute \"") + option_name(in.recompute) +
                      "\": each block's backward recomputes " +
                      (in.recompute == Recompute::full ? "its forward" : "its pointwise outputs and norms"));
  }
  // The reference below (one rank, the whole model) takes the costs before tensor parallelism.
  const LayerCosts whole_costs = r.costs;
  LayerCosts tp_bytes;  // tp > 1: the bytes one rank sends in the all-reduces, laid out as the costs
  if (TP > 1) {
    r.tp_costs = tensor_parallel_costs(ds, r.micro_batch, T, in.fabric.intra, in.recompute, false);
    tp_bytes = tensor_parallel_costs(ds, r.micro_batch, T, in.fabric.intra, in.recompute, true);
    LayerCosts& k = r.costs;
    for (double* x : {&k.block_f, &k.block_b, &k.block_bi, &k.head_f, &k.head_b, &k.head_bi, &k.head_recompute})
      *x /= TP;
    k = add_costs(k, r.tp_costs);
    k.source += ", blocks and head / tp " + std::to_string(TP) + " + their all-reduces over " + in.fabric.intra.name;
    const int chunks = d.head == HeadKind::lm ? lm_head_chunks(ds, r.micro_batch * T) : 0;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "tp %d: all-reduces of %.3g MB per micro-batch over %s, %d per block (%s), one for the embedding%s; "
                  "%s%s",
                  TP, (double)r.micro_batch * T * d.d_model * 4 / 1e6, in.fabric.intra.name.c_str(),
                  in.recompute == Recompute::full ? 6 : 4,
                  in.recompute == Recompute::full ? "2 forward, 2 recomputed, 2 backward" : "2 forward, 2 backward",
                  chunks > 0 ? " and one for the LM head's d xf" : "",
                  chunks > 0 ? ("the head's row statistics, 2 small ones for each of its " + std::to_string(chunks) +
                                " chunks (again for those recomputed in backward)").c_str()
                             : "",
                  in.device.gpu && in.sync != SyncMethod::nccl
                      ? " (with an MPI sync method the sums go through host memory: those copies are not counted)"
                      : "");
    r.notes.push_back(buf);
  }
  const LayerCosts& c = r.costs;
  // Every schedule but zb-h1 (and a run without stages) fuses the LM head: its backward runs in F,
  // without the recompute (model/transformer.h "Fused LM head").
  const LayerCosts cf = d.head == HeadKind::lm ? c.with_fused_head() : c;
  if (c.head_recompute > 0)
    r.notes.push_back(std::string("the LM head fused (its backward inside the forward: no logits recomputed)") +
                      (S > 1 ? " except under zb-h1" : ""));
  r.mfu_assumed = in.have_profile ? 0 : (in.mfu > 0 ? in.mfu : in.device.default_mfu);
  r.peak_flops = device_peak(in.device, in.precision, in.cores_per_rank);
  const ParamTable whole = build_param_table(d);
  r.flops_per_token = flops_per_token(d, whole.numel, T);
  auto stage_costs = [&](const LayerCosts& k) {
    std::vector<StageCost> sc(S);
    for (int s = 0; s < S; s++) {
      const ModelPart& p = r.stages[s].part;
      const int nb = (p.l1 < 0 ? d.n_layer : p.l1) - p.l0;
      sc[s].f = (p.embedding ? k.embed_f : 0) + nb * k.block_f + (p.head ? k.head_f : 0);
      sc[s].b = (p.embedding ? k.embed_b : 0) + nb * k.block_b + (p.head ? k.head_b : 0);
      sc[s].bi = nb * k.block_bi + (p.head ? k.head_bi : 0);  // the embedding's backward waits for W
    }
    return sc;
  };
  // Point-to-point messages: one hidden state (or its gradient) of the micro-batch.
  const double elt = in.precision == GemmPrecision::bf16 ? 2 : 4;
  r.p2p_message_bytes = (double)r.micro_batch * T * d.d_model * elt;
  Link inter = in.fabric.inter;
  inter.beta_s_per_byte *= in.fabric.inter_beta_scale();
  for (LinkPoint& pt : inter.points)
    for (OpFit& o : pt.ops) {
      const double sc = in.fabric.inter_beta_scale();
      o.b_s_per_byte *= sc, o.beta_s_per_byte *= sc, o.large_b_s_per_byte *= sc, o.large_beta_s_per_byte *= sc;
    }
  auto same_node_everywhere = [&](int sa, int sb) {
    for (int q = 0; q < r.dp; q++)
      if (node_of(rank_of(q, sa)) != node_of(rank_of(q, sb))) return false;
    return true;
  };
  for (int s = 0; s + 1 < S; s++) {
    const Link& l = same_node_everywhere(s, s + 1) ? in.fabric.intra : inter;
    double a, b;
    l.alpha_beta(CollOp::sendrecv, 2, &a, &b);
    r.p2p_s.push_back(p2p_time(r.p2p_message_bytes, a, b));
  }
  // The data-parallel group of stage s (and tensor-parallel rank t): ranks (q·S + s)·TP + t; how many
  // of them share stage s's node.
  for (int s = 0; s < S; s++) {
    int k = 0;
    for (int q = 0; q < r.dp; q++)
      if (node_of(rank_of(q, s)) == node_of(rank_of(0, s))) k++;
    r.dp_ranks_per_node.push_back(k);
  }
  const bool tied = S > 1 && d.head == HeadKind::lm && d.tie_embeddings;
  double tied_s = 0;
  if (tied) {
    const Link& l = same_node_everywhere(0, S - 1) ? in.fabric.intra : inter;
    tied_s = collective_time(l, CollOp::allreduce, 2, (double)ds.vocab_rows() * d.d_model * 4);  // (the shard's rows)
  }
  // The reference: one rank computing the whole global batch micro-batch by micro-batch.
  // (fused: no pipeline stages)
  const LayerCosts wf = d.head == HeadKind::lm ? whole_costs.with_fused_head() : whole_costs;
  const double per_mb = wf.embed_f + wf.embed_b + d.n_layer * (wf.block_f + wf.block_b) + wf.head_f + wf.head_b;
  const double opt_scale = adamw ? 1.0 : 12.0 / 28.0;  // SGD: reads p, g, writes p
  // (one rank alone has its cores to itself: undo the sharing)
  const double t1 = ((double)G / r.micro_batch * per_mb + c.opt_per_param * opt_scale * (double)whole.numel) / r.oversubscription;
  r.single_rank_tokens_per_s = (double)G * T / t1;

  for (const std::string& sch : schedules) {
    const ScheduleKind kind = S > 1 ? parse_schedule_kind(sch) : ScheduleKind::one_f_one_b;
    const LayerCosts& cs = kind == ScheduleKind::zb_h1 ? c : cf;
    const PipelineSim sim =
        simulate_pipeline(kind, S, M, stage_costs(cs), r.p2p_s.empty() ? std::vector<double>{0} : r.p2p_s);
    if (!sim.completed) fail("internal: the simulated ", sch, " pipeline did not complete");
    // the tensor-parallel all-reduces per stage and micro-batch (in the costs simulated), time and bytes
    auto as_scheduled = [&](const LayerCosts& k) {
      return stage_costs(kind != ScheduleKind::zb_h1 && d.head == HeadKind::lm ? k.with_fused_head() : k);
    };
    const std::vector<StageCost> tp_time = as_scheduled(r.tp_costs), tp_sent = as_scheduled(tp_bytes);
    for (int z = 0; z <= 3; z++) {  // (ZeRO-2 moves what ZeRO-1 does, at the same times, unless it
                                    // reduces each micro-batch: below)
      const bool sharded = z >= 1 && r.dp > 1;
      TimeRow best;
      best.schedule = sch, best.zero = z, best.step_s = -1;
      for (int s = 0; s < S; s++) {
        const std::vector<Bucket>& bk = buckets[s];
        const std::vector<double> frac = bucket_ready_fractions(tables[s], bk, r.stages[s].part, d.n_layer, cs);
        const int k = r.dp_ranks_per_node[s];
        double channel = 0, sync_total = 0, bytes = 0, rs_time = 0, rs_bytes = 0;
        std::vector<double> ag_i(bk.size(), 0);
        for (size_t i = 0; i < bk.size(); i++) {
          const double nbytes = (double)(bk[i].end - bk[i].begin) * 4;  // fp32 gradients (also with bf16)
          // the gradient on the wire: 2 bytes a float with parallel.grad_dtype "bf16" (the ZeRO-1
          // all-gather moves parameters: fp32)
          const double gbytes = in.grad_bf16 ? nbytes / 2 : nbytes;
          double t, t_ag = 0;
          if (gs) {
            const double g = group_collective_time(in.fabric, CollOp::allreduce, r.dp, k, nbytes, true);
            // ZeRO-1 through the root: gather + scatter of pieces, then gather of pieces + broadcast.
            t = sharded ? g * (1.0 + 1.0 / r.dp) / 2 : g;
            t_ag = sharded ? t : 0;
            bytes += r.dp > 1 ? (r.dp - 1) * nbytes : 0;
          } else if (sharded) {
            t = group_collective_time(in.fabric, CollOp::reduce_scatter, r.dp, k, gbytes);
            t_ag = group_collective_time(in.fabric, CollOp::allgather, r.dp, k, nbytes);
            bytes += (double)(r.dp - 1) / r.dp * (gbytes + nbytes);
          } else {
            t = group_collective_time(in.fabric, CollOp::allreduce, r.dp, k, gbytes);
            bytes += r.dp > 1 ? 2.0 * (r.dp - 1) / r.dp * gbytes : 0;
          }
          const double ready = in.overlap ? sim.last_grad_start[s] + sim.last_grad_len[s] * frac[i] : sim.end[s];
          channel = std::max(channel, ready) + t;
          sync_total += t + t_ag;
          rs_time += t;
          rs_bytes += gs ? (r.dp - 1) * nbytes / 2 : (double)(r.dp - 1) / r.dp * gbytes;
          // ZeRO-3 gathers after the update only what lies outside the blocks
          ag_i[i] = z == 3 ? t_ag * outside_fraction(tables[s], bk[i]) : t_ag;
        }
        double exposed = std::max(0.0, channel - sim.end[s]);
        // ZeRO-2/3 reducing each micro-batch: every earlier micro-batch's buckets reduce-scattered as
        // its backward finishes them, as the last one's are (the same exposed share each time)
        if (z >= 2 && sharded && each_micro && M > 1) {
          exposed *= M;
          sync_total += (M - 1) * rs_time;
          bytes += (M - 1) * rs_bytes;
        }
        if (tied && (s == 0 || s == S - 1)) exposed += tied_s, sync_total += tied_s;
        const double own = sharded ? (double)r.stages[s].shard_params : (double)r.stages[s].n_params;
        const double opt = c.opt_per_param * opt_scale * own;
        // ZeRO-1 (GradSync::gather_params): the rank updates its piece of bucket i, then bucket i is
        // all-gathered; with overlap the communication thread gathers bucket i while the piece of
        // bucket i+1 is updated, without it the two alternate.
        double tail = opt;
        if (sharded) {
          const std::vector<ShardPiece> pieces = shard_pieces(bk, r.dp, 0);
          double update_end = 0, gather_end = 0, serial = 0;
          for (size_t i = 0; i < bk.size(); i++) {
            const double u = c.opt_per_param * opt_scale * (double)(pieces[i].end - pieces[i].begin);
            update_end += u;
            gather_end = std::max(gather_end, update_end) + ag_i[i];
            serial += u + ag_i[i];
          }
          tail = in.overlap ? std::max(update_end, gather_end) : serial;
        }
        const double ag = tail - opt;  // the all-gather time the step waits for
        // ZeRO-3: each block gathered before its forward and its backward, every micro-batch; with
        // overlap the next block's gather runs during this block's compute (forward a third of it)
        double gathers = 0;
        if (z == 3 && sharded) {
          const int L = r.stages[s].blocks;
          const double block_bytes = 4.0 * (double)r.stages[s].block_params;
          const double t_blk = group_collective_time(in.fabric, CollOp::allgather, r.dp, k, block_bytes);
          const double per_block = L > 0 ? sim.busy[s] / (M * L) : 0;
          for (const double c_pass : {per_block / 3, 2 * per_block / 3})
            gathers += M * (in.overlap ? t_blk + (L - 1) * std::max(0.0, t_blk - c_pass) : L * t_blk);
          sync_total += 2.0 * M * L * t_blk;
          bytes += (2.0 * M - 1) * (double)(r.dp - 1) / r.dp * block_bytes * L;
        }
        const double step = sim.end[s] + exposed + tail + gathers;
        if (step > best.step_s) {
          best.step_s = step;
          best.compute_s = sim.busy[s];
          best.bubble_s = sim.end[s] - sim.busy[s];
          best.sync_s = sync_total;
          best.exposed_sync_s = exposed + ag + gathers;
          best.optimizer_s = opt;
          best.bytes_per_rank = bytes;
          best.tp_s = M * (tp_time[s].f + tp_time[s].b);
          best.tp_bytes_per_rank = M * (tp_sent[s].f + tp_sent[s].b);
        }
      }
      best.tokens_per_s = (double)G * T / best.step_s;
      best.mfu = best.tokens_per_s * r.flops_per_token / (W * r.peak_flops);
      best.efficiency = best.tokens_per_s / (W * r.single_rank_tokens_per_s);
      r.time.push_back(best);
    }
  }
  if (in.overlap)
    r.notes.push_back("overlap: buckets reduced on one channel as the stage's last backward finishes them "
                      "(communication assumed not to slow the computation)");
  if (r.p2p_s.size() && S > 1)
    r.notes.push_back(std::string("pipeline messages: a micro-batch's hidden state each way, alpha + n*beta per message") +
                      (in.device.gpu ? (in.sync == SyncMethod::nccl
                                            ? " (NCCL send/receive, a communicator per direction between stages)"
                                            : " (MPI through page-locked host buffers: their copies are not counted)")
                                     : ""));

  // ---- checkpoint ----
  {
    CheckpointPlan& cp = r.checkpoint;
    const ParamTable whole = build_param_table(d);
    const double n = (double)whole.numel;
    cp.state_bytes = 4 * n * (adamw ? 3 : 1);
    for (const ParamSlice& sl : whole.slices) cp.export_bytes = std::max(cp.export_bytes, 4.0 * (double)sl.numel);
    if (!(in.fs_bandwidth > 0)) fail("--fs-bandwidth must be > 0 (GB/s), got ", in.fs_bandwidth / 1e9);
    cp.write_s = cp.state_bytes / in.fs_bandwidth;
    const bool staged = in.checkpoint_async || in.device.gpu;
    const bool zero = in.zero && r.dp > 1;
    for (int s = 0; s < S; s++) {
      const ModelPart& part = r.stages[s].part;
      double most = 0, params = 0;
      for (int t = 0; t < TP; t++) {
        const ModelDesc dt = TP > 1 ? tensor_shard(d, TP, t) : d;
        const ParamTable table = build_param_table(dt, part);
        params = std::max(params, 4.0 * (double)table.numel);
        if (!staged) continue;
        const std::vector<Bucket> bk = make_buckets(table, in.bucket_mb, first_mb);
        // Replicas take turns over the tensors: the first min(dp, tensors) replicas hold every
        // distinct share (the others' are empty or the same as one of these).
        const int replicas = zero ? r.dp : std::min<int>(r.dp, (int)table.slices.size());
        for (int q = 0; q < replicas; q++) {
          const std::vector<ShardPiece> pieces = zero ? shard_pieces(bk, r.dp, q) : std::vector<ShardPiece>{};
          most = std::max(most, 4 * checkpoint_write_floats(dt, part, table, zero, pieces, adamw, false, r.dp, q, TP, t));
        }
      }
      cp.staging.push_back(most);
      cp.resume.push_back(params);
    }
    const TimeRow* t = r.time_row(S > 1 ? schedule_kind_name(in.schedule) : "-", in.zero);
    if (!t && !r.time.empty()) t = &r.time.front();
    if (t && t->step_s > 0 && staged)  // (held in an int: a billion steps at most)
      cp.every_to_hide = (int)std::clamp(std::ceil(cp.write_s / t->step_s), 1.0, 1e9);
  }
  return r;
}

}  // namespace llmpi
