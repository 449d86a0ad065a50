// The step engine's set-up and state: chunks, slots, checkpoints by name, --init-from
// (engine/engine.h). The step itself is in engine/engine_step.cpp.
#include "engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <unordered_map>

#include "backend/cuda_ops.h"
#include "runtime/large_count.h"
#include "hf/hf_import.h"
#include "pipeline/stage_layers.h"
#include "runtime/error.h"
#include "comm/tensor_group.h"
#include "runtime/mpi_env.h"

namespace llmpi {

SyncOptions sync_options(const ParallelConfig& pc) {
  SyncOptions so;
  so.method = pc.sync;
  so.bucket_mb = pc.bucket_mb;
  so.first_bucket_mb = pc.first_bucket_mb;
  so.overlap = pc.overlap;
  so.poll_us = pc.poll_us;
  so.average_every = pc.average_every;
  so.zero = pc.zero >= 1;
  so.shard_grads = pc.zero >= 2;
  so.shard_params = pc.zero >= 3;
  so.bf16 = pc.grad_dtype == GradDtype::bf16;
  // (with pipeline stages the micro-batches are the pipeline's: the gradient is reduced once per step)
  so.reduce_each_micro_batch = so.shard_grads && pc.pp_stages == 1 && pc.zero_reduce == ZeroReduce::micro_batch;
  return so;
}

namespace {

// The layout's refusals, before anything is allocated.
void check_layout(const ParallelGroups& g, const ParallelConfig& pc, const SyncOptions& so,
                  int local_batch) {
  const int M = pc.microbatches;
  if (g.pp == 1) {
    if (local_batch % M != 0)
      fail("parallel.microbatches ", M, " does not divide the ", local_batch, " sequences each rank gets per step "
           "(train.global_batch / ranks): choose microbatches dividing ", local_batch);
    return;
  }
  check_schedule_params(pc.schedule, g.pp, M, pc.virtual_stages);
  if (so.method == SyncMethod::weights)
    fail("parallel.sync \"weights\" averages whole-model parameters and does not combine with pipeline stages: "
         "use \"allreduce\", \"gather_scatter\" or \"nccl\" with parallel.pp_stages > 1");
  if (local_batch % M != 0)
    fail("parallel.microbatches ", M, " does not divide the ", local_batch, " sequences each pipeline gets per step "
         "(train.global_batch / data-parallel replicas): choose microbatches dividing ", local_batch);
  if (2 * g.pp * pc.virtual_stages * M >= 32767)
    fail("parallel.microbatches ", M, " is too large for the message tags (", g.pp * pc.virtual_stages,
         " virtual stages): use fewer micro-batches");
}

}  // namespace

RankChunks rank_chunks(const std::vector<int>& layer_counts, ScheduleKind kind, int S, int M, int v, int stage) {
  RankChunks rc;
  rc.parts.clear(), rc.slots.clear();
  const ActivationPeak peak = activation_peak(build_schedule(kind, S, M, stage, v), v);
  for (int c = 0; c < v; c++) {
    rc.parts.push_back(S > 1 ? virtual_stage_part(layer_counts, virtual_stage(S, stage, c)) : ModelPart::whole());
    rc.slots.push_back(std::max(1, peak.per_chunk[c]));
  }
  rc.keeps_input_grads = kind == ScheduleKind::zb_h1;
  return rc;
}

RankChunks rank_chunks(const ModelDesc& d, const ParallelConfig& pc, int T, int stage) {
  const int S = pc.pp_stages, v = S > 1 ? pc.virtual_stages : 1;
  const ScheduleKind kind = S > 1 ? pc.schedule : ScheduleKind::one_f_one_b;
  const std::vector<int> counts = S > 1 ? split_layers(d, T, S * v, pc.stage_layers) : std::vector<int>{d.n_layer};
  return rank_chunks(counts, kind, S, pc.microbatches, v, stage);
}

Engine::Engine(const ModelDesc& d, const Ops& o, const ParallelGroups& groups, const ParallelConfig& pc,
               const SyncOptions& so, const EngineOptions& eo)
    : g(groups), ops(o), desc(d), kind(groups.pp > 1 ? pc.schedule : ScheduleKind::one_f_one_b), S(groups.pp),
      M(pc.microbatches), v(groups.pp > 1 ? pc.virtual_stages : 1), T(eo.T), seed(eo.seed), opt(eo) {
  check_layout(g, pc, so, eo.local_batch);
  if (so.shard_params && eo.precision == GemmPrecision::bf16)
    fail("parallel.zero 3 with runtime.precision \"bf16\": the bf16 copies of the weights would be whole on "
         "every rank; use precision \"fp32\", or parallel.zero 2");
  if (so.shard_params && g.pp > 1 && pc.schedule == ScheduleKind::zb_h1)
    fail("parallel.zero 3 with parallel.schedule \"zb-h1\" is not supported (its deferred weight gradients "
         "run outside the blocks' gathers); use schedule \"1f1b\", \"gpipe\" or \"interleaved\", or zero 2");
  const std::string recompute_error = recompute_schedule_error(eo.recompute, kind, S);
  if (!recompute_error.empty()) fail(recompute_error);
  micro_batch = eo.local_batch / M;
  layer_counts = S > 1 ? split_layers(d, T, S * v, pc.stage_layers) : std::vector<int>{d.n_layer};
  whole_table = build_param_table(d);
  actions = schedule_for(M);
  const RankChunks held = rank_chunks(layer_counts, kind, S, M, v, g.stage);
  const bool tied_lm = d.head == HeadKind::lm && d.tie_embeddings;
  chunks.resize(v);
  for (int c = 0; c < v; c++) {
    ModelChunk& ch = chunks[c];
    ch.vstage = virtual_stage(S, g.stage, c);
    ch.part = held.parts[c];
    ModelDesc md = g.tp > 1 ? tensor_shard(d, g.tp, g.tp_rank) : d;
    md.sequence_parallel = g.tp > 1 && pc.sequence_parallel;
    // ZeRO-2/3: the gradient (and with ZeRO-3 the blocks' parameters) resident only in this
    // rank's pieces and the buckets or blocks in use (comm/grad_sync.h). With one replica the
    // piece is the whole: plain buffers, zeroed in place.
    const PagedBuffers paged = !so.shard_grads || g.dp == 1 ? PagedBuffers::none
                               : !so.shard_params           ? PagedBuffers::grads
                                                            : PagedBuffers::grads_and_params;
    ch.model = std::make_unique<Model>(md, ops, ch.part, eo.precision, eo.recompute, paged);
    ch.part = ch.model->part;  // its block range resolved (ModelPart::whole() says "to the last")
    ch.sync = std::make_unique<GradSync>(so, g.data, ops, ch.model->grads, ch.model->table, eo.tracer);
    if (paged == PagedBuffers::grads_and_params && ops.on_gpu()) {  // ZeRO-3 on a GPU: the pieces written
      ch.sync->attach_params(ch.model->params);
      std::vector<float> host(ch.model->table.numel);
      init_param_values(ch.model->table, seed, host.data());
      ch.sync->load_params(host.data());
    } else {
      ch.model->init_params(seed);
      ch.sync->attach_params(ch.model->params);  // ZeRO-3: the blocks back to this rank's pieces
    }
    // ZeRO-1 over the stage's data-parallel group: the moments of this rank's pieces only.
    ch.opt = std::make_unique<Optimizer>(ops, ch.model->table.numel, eo.optimizer,
                                         so.zero ? ch.sync->shard : std::vector<ShardPiece>{});
    ch.tied = tied_lm && (ch.part.embedding != ch.part.head);
    ch.tied_copy = ch.tied && ch.part.head;
    ch.ready_cap = ch.model->table.numel;
    if (ch.tied) {
      const ParamSlice& last = ch.model->table.slices.back();
      if (last.role != kTokEmb) fail("internal: the tied token embedding is not the last tensor of a stage");
      ch.ready_cap = last.offset;
    }
    if (g.tp_rank == 0) {
      ch.norm_ranges = {{0, ch.counted()}};
    } else {
      for (const ParamSlice& s : ch.model->table.slices)
        if (s.sharded() && s.offset < ch.counted()) ch.norm_ranges.push_back({s.offset, s.offset + s.numel});
    }
    for (int i = 0; i < held.slots[c]; i++) {
      ch.slots.push_back(std::make_unique<Activations>(*ch.model, micro_batch, T));
      if (kind == ScheduleKind::zb_h1) ch.model->reserve_input_only(*ch.slots.back());  // counted up front
    }
  }
  sync_nccl_ = so.method == SyncMethod::nccl;
  if (S > 1)
    link = std::make_unique<StageLink>(ops, g.pipeline, so.method == SyncMethod::nccl, hidden_floats(), v > 1);
}

std::vector<Action> Engine::schedule_for(int micro_batches) const {
  return build_schedule(kind, S, micro_batches, g.stage, v);
}

void Engine::connect() {
  if (g.tp > 1) {  // the tensor group's collectives (an NCCL communicator with sync "nccl" on a GPU)
    const TensorGroup tg = make_tensor_group(ops, g.tensor, sync_nccl_);
    for (ModelChunk& ch : chunks) ch.model->tensor = tg;
  }
  for (ModelChunk& ch : chunks) ch.sync->connect();
  if (link) link->connect();  // after the data-parallel communicators, in the same order on every rank
}

int64_t Engine::optimizer_state_floats() const {
  int64_t n = 0;
  for (const ModelChunk& ch : chunks) n += ch.opt->sgd ? 0 : 2 * (int64_t)ch.opt->n;
  return n;
}

std::string Engine::describe_layers() const {
  std::string s;
  for (const ModelChunk& ch : chunks) {
    if (!s.empty()) s += "; ";
    s += "virtual stage " + std::to_string(ch.vstage) + ": layers [" + std::to_string(ch.part.l0) + "," +
         std::to_string(ch.part.l1) + ")";
    if (ch.part.embedding) s += " + embedding";
    if (ch.part.head) s += " + head";
    if (ch.tied_copy) s += " (tied copy of the token embedding)";
    char mb[32];
    std::snprintf(mb, sizeof mb, "%.2f", ch.slots.size() * ch.slots[0]->bytes() / 1e6);
    s += ", " + std::to_string(ch.slots.size()) + " activation slot" + (ch.slots.size() == 1 ? "" : "s") + " (" +
         mb + " MB)";
  }
  return s;
}

// ---- checkpoints ---------------------------------------------------------------------------------

std::vector<float> Engine::gather_whole(int which) {
  // ZeRO-1: a chunk's moments are first assembled from its data-parallel group on replica 0.
  // ZeRO-3: so are its parameters (its blocks are whole only while used).
  std::vector<std::vector<float>> assembled(chunks.size());
  for (size_t c = 0; c < chunks.size(); c++) {
    ModelChunk& ch = chunks[c];
    if (which == 0 ? !ch.sync->opt.shard_params : !ch.sync->opt.zero) continue;
    std::vector<float> mine;
    if (which == 0) {
      mine = ch.sync->pieces_to_host(ch.model->params);
    } else {
      mine.resize(ch.opt->n);
      ops.copy_to_host(mine.data(), which == 1 ? ch.opt->m : ch.opt->v, mine.size() * sizeof(float));
    }
    ch.sync->gather_sharded(mine.data(), assembled[c]);  // collective over the data-parallel group
  }
  // The chunk's values on the host, in its table's layout.
  auto host_copy = [&](size_t c, size_t n) {
    std::vector<float> host(n);
    if (!assembled[c].empty()) {
      std::copy(assembled[c].begin(), assembled[c].begin() + n, host.begin());
    } else {
      const ModelChunk& ch = chunks[c];
      ops.copy_to_host(host.data(), which == 0 ? ch.model->params : which == 1 ? ch.opt->m : ch.opt->v,
                       n * sizeof(float));
    }
    return host;
  };
  std::vector<float> whole;
  if (g.dp_rank != 0) return whole;
  // Each chunk's values in its part's whole layout (tensor parallelism: gathered on tp_rank 0).
  std::vector<std::vector<float>> part_values(chunks.size());
  for (size_t c = 0; c < chunks.size(); c++) part_values[c] = unshard(c, host_copy(c, chunks[c].model->table.numel));
  if (g.tp_rank != 0) return whole;
  if (g.stage != 0) {
    for (size_t c = 0; c < chunks.size(); c++) {
      std::vector<float>& host = part_values[c];
      if (chunks[c].tied_copy) host.resize(build_param_table(desc, chunks[c].part).slices.back().offset);  // not sent
      large::send_with_length(host.data(), host.size(), MPI_FLOAT, 0, 1000 + chunks[c].vstage, g.pipeline);
    }
    return whole;
  }
  std::unordered_map<std::string, size_t> offset_of;
  for (const ParamSlice& s : whole_table.slices) offset_of[s.name] = s.offset;
  whole.assign(whole_table.numel, 0.0f);
  for (int s = 0; s < S; s++) {
    for (int c = 0; c < v; c++) {
      const int k = virtual_stage(S, s, c);
      const ModelPart part = S > 1 ? virtual_stage_part(layer_counts, k) : ModelPart::whole();
      const ParamTable t = build_param_table(desc, part);
      std::vector<float> host;
      if (s == 0) {
        host = std::move(part_values[c]);
      } else {
        host.resize(large::recv_length(s, 1000 + k, g.pipeline));
        large::recv(host.data(), host.size(), MPI_FLOAT, s, 1000 + k, g.pipeline);
      }
      for (const ParamSlice& sl : t.slices) {
        if (sl.offset + sl.numel > host.size()) continue;  // a tied copy, not sent
        std::copy(host.begin() + sl.offset, host.begin() + sl.offset + sl.numel, whole.begin() + offset_of.at(sl.name));
      }
    }
  }
  return whole;
}

std::vector<float> Engine::unshard(size_t c, std::vector<float> mine) const {
  if (g.tp == 1) return mine;
  const ModelChunk& ch = chunks[c];
  // every rank's shard values to tp_rank 0 (the shards may differ in length: uneven vocabulary rows)
  // (every rank learns every length: large::gatherv's pieces follow from them)
  size_t n = mine.size();
  std::vector<size_t> lens(g.tp), offs(g.tp, 0);
  MPI_Allgather(&n, 1, mpi_size_type(), lens.data(), 1, mpi_size_type(), g.tensor);
  for (int r = 1; r < g.tp; r++) offs[r] = offs[r - 1] + lens[r - 1];
  std::vector<float> all(g.tp_rank == 0 ? offs[g.tp - 1] + lens[g.tp - 1] : 0);
  large::gatherv(mine.data(), lens, offs, MPI_FLOAT, all.data(), 0, g.tensor);
  if (g.tp_rank != 0) return {};
  const ParamTable part_table = build_param_table(desc, ch.part);
  std::unordered_map<std::string, size_t> offset_of;
  for (const ParamSlice& s : part_table.slices) offset_of[s.name] = s.offset;
  std::vector<float> out(part_table.numel);
  for (int r = 0; r < g.tp; r++) {
    const ParamTable t = build_param_table(tensor_shard(desc, g.tp, r), ch.part);  // rank r's layout
    for (const ParamSlice& s : t.slices) {
      const float* src = all.data() + offs[r] + s.offset;
      float* dst = out.data() + offset_of.at(s.name);
      if (s.sharded()) put_shard(s, src, dst);
      else if (r == 0) std::copy(src, src + s.numel, dst);  // the same on every rank: rank 0's
    }
  }
  return out;
}

std::vector<float> Engine::whole_params_everywhere() {
  std::vector<float> whole(whole_table.numel);
  // the chunk is the whole model, in the whole table's layout (ZeRO-3: but its blocks in pieces)
  if (S == 1 && g.tp == 1 && !chunks.front().sync->opt.shard_params) {
    ops.copy_to_host(whole.data(), chunks.front().model->params, whole.size() * sizeof(float));
    return whole;
  }
  whole = gather_whole(0);
  whole.resize(whole_table.numel);
  large::bcast(whole.data(), whole.size(), MPI_FLOAT, 0, g.world);
  return whole;
}

void Engine::load_whole(const float* params, const float* m, const float* vv, int64_t optimizer_t) {
  std::unordered_map<std::string, size_t> offset_of;
  for (const ParamSlice& s : whole_table.slices) offset_of[s.name] = s.offset;
  for (ModelChunk& ch : chunks) {
    const ParamTable& t = ch.model->table;
    std::vector<float> host(t.numel);
    auto load = [&](const float* src, float* dst) {
      for (const ParamSlice& sl : t.slices) {
        auto it = offset_of.find(sl.name);
        if (it == offset_of.end()) fail("internal: tensor ", sl.name, " is not in the whole model");
        if (sl.sharded()) take_shard(sl, src + it->second, host.data() + sl.offset);  // tensor parallelism
        else std::copy(src + it->second, src + it->second + sl.numel, host.begin() + sl.offset);
      }
      if (dst) ops.copy_to_device(dst, host.data(), host.size() * sizeof(float));
    };
    load(params, nullptr);
    ch.sync->load_params(host.data());  // (ZeRO-3: the blocks back to this rank's pieces)
    // The moments: the chunk's layout, or with ZeRO-1 this rank's pieces of it.
    auto load_state = [&](const float* src, float* dst) {
      if (!ch.sync->opt.zero) return load(src, dst);
      load(src, nullptr);
      const std::vector<float> mine = ch.sync->pieces_of(host.data());
      ops.copy_to_device(dst, mine.data(), mine.size() * sizeof(float));
    };
    if (m && ch.opt->m) load_state(m, ch.opt->m);
    if (vv && ch.opt->v) load_state(vv, ch.opt->v);
    ch.opt->t = optimizer_t;
  }
}

std::vector<Engine::StateRange> Engine::state_ranges(int which, bool writing, bool every_rank) const {
  std::vector<StateRange> out;
  for (size_t c = 0; c < chunks.size(); c++) {
    const ModelChunk& ch = chunks[c];
    const ParamTable& t = ch.model->table;
    const bool moment_pieces = which != 0 && ch.sync->opt.zero;  // the buffer holds this rank's pieces
    for (size_t i = 0; i < t.slices.size(); i++) {
      const ParamSlice& s = t.slices[i];
      const ParamSlice* w = whole_table.find(s.name);
      if (!w) fail("internal: tensor ", s.name, " is not in the whole model");
      const int tensor = (int)(w - whole_table.slices.data());
      const bool tied_copy = ch.tied_copy && i + 1 == t.slices.size();
      if (writing && tied_copy) continue;
      // ZeRO-3: a block's parameters are this rank's pieces of them, in the flat layout
      const bool param_pieces = which == 0 && ch.sync->opt.shard_params && s.layer >= 0 && g.dp > 1;
      const bool pieces = moment_pieces || param_pieces;
      if (writing && !writes_tensor(i, s.sharded(), pieces || every_rank, g.dp, g.dp_rank, g.tp, g.tp_rank)) continue;
      if (!pieces) {
        out.push_back({c, i, 0, s.numel, s.offset, tensor});
        continue;
      }
      size_t at = 0;  // this rank's pieces of the flat layout, one after the other in the buffer
      for (const ShardPiece& p : ch.sync->shard) {
        const size_t lo = std::max(p.begin, s.offset), hi = std::min(p.end, s.offset + s.numel);
        const size_t buffer_at = param_pieces ? lo : at + (lo - p.begin);  // (parameters: the flat layout)
        if (lo < hi) out.push_back({c, i, lo - s.offset, hi - s.offset, buffer_at, tensor});
        at += p.end - p.begin;
      }
    }
  }
  return out;
}

const float* Engine::state_buffer(size_t c, int which) const {
  const ModelChunk& ch = chunks[c];
  return which == 0 ? ch.model->params : which == 1 ? ch.opt->m : ch.opt->v;
}

void Engine::set_state(size_t c, int which, const float* host) {
  ModelChunk& ch = chunks[c];
  if (which == 0) return ch.sync->load_params(host);  // (ZeRO-3: the blocks back to this rank's pieces)
  ops.copy_to_device(which == 1 ? ch.opt->m : ch.opt->v, host, ch.opt->n * sizeof(float));
}

float* Engine::state_in_place(size_t c, int which) {
  ModelChunk& ch = chunks[c];
  return which == 0 && ch.sync->opt.shard_params && !ops.on_gpu() ? ch.model->params : nullptr;
}

void Engine::init_from_hf(const std::string& dir, std::vector<std::string>* notes) {
  std::vector<std::string> mine;
  std::string err;
  try {
    for (ModelChunk& ch : chunks) {
      const ParamTable& t = ch.model->table;
      std::vector<float> host(t.numel);
      if (g.tp == 1) {
        load_hf_params(dir, desc, t, seed, host.data(), &mine);
      } else {  // the part's whole tensors, then this rank's shards of them
        const ParamTable part_table = build_param_table(desc, ch.part);
        std::vector<float> part(part_table.numel);
        load_hf_params(dir, desc, part_table, seed, part.data(), &mine);
        for (const ParamSlice& s : t.slices) {
          const float* src = part.data() + part_table.at(s.name).offset;
          if (s.sharded()) take_shard(s, src, host.data() + s.offset);
          else std::copy(src, src + s.numel, host.begin() + s.offset);
        }
      }
      ch.sync->load_params(host.data());  // (ZeRO-3: the blocks back to this rank's pieces)
    }
  } catch (const Error& e) {
    err = e.what();
  }
  err = agree_on_error(g.world, err);
  if (!err.empty()) fail(err);  // the same error on every rank
  // The notes of the pipeline's stages, to its stage 0, one per line.
  std::string text;
  for (const std::string& n : mine) text += n + "\n";
  int len = mpi_count(text.size(), "--init-from's notes");  // a few lines per stage
  std::vector<int> lens(S), offs(S, 0);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, g.pipeline);
  for (int s = 1; s < S; s++) offs[s] = offs[s - 1] + lens[s - 1];
  std::string all(g.stage == 0 ? offs[S - 1] + lens[S - 1] : 0, '\0');
  MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, g.pipeline);
  if (!notes || g.world_rank != 0) return;
  std::set<std::string> seen;
  for (size_t b = 0, e; b < all.size(); b = e + 1) {
    e = all.find('\n', b);
    const std::string line = all.substr(b, e - b);
    if (seen.insert(line).second) notes->push_back(line);
  }
}

}  // namespace llmpi
