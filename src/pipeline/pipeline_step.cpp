#include "pipeline/pipeline_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "backend/cuda_ops.h"
#include "hf/hf_import.h"
#include "metrics/metrics.h"
#include "metrics/trace.h"
#include "runtime/error.h"
#include "runtime/mpi_env.h"

namespace llmpi {

// ---- layers per virtual stage -------------------------------------------------------------------

std::vector<int> split_layers(const ModelDesc& d, int T, int K, const std::vector<int>& explicit_counts) {
  if (!explicit_counts.empty()) {
    int sum = 0;
    for (int n : explicit_counts) sum += n;
    if ((int)explicit_counts.size() != K || sum != d.n_layer)
      fail("parallel.stage_layers lists ", explicit_counts.size(), " counts summing to ", sum, ", but the pipeline has ",
           K, " (virtual) stages and the model ", d.n_layer, " layers: give ", K, " counts summing to ", d.n_layer,
           ", or leave it empty to balance by cost");
    return explicit_counts;
  }
  if (d.n_layer < K)
    fail("the model has ", d.n_layer, " layers, fewer than the ", K, " (virtual) pipeline stages: use fewer "
         "parallel.pp_stages (or virtual_stages), or give parallel.stage_layers with zeros explicitly");
  // Forward FLOPs per token: a block 2·params + 4·T·C (scores and weighted values); the head its
  // matrix; the embedding a lookup (C).
  ModelPart block{0, 1, false, false};
  const double C = d.d_model;
  const double block_cost = 2.0 * build_param_table(d, block).numel + 4.0 * T * C;
  const double head_cost = d.head == HeadKind::lm ? 2.0 * d.vocab_size * C : 2.0 * C * C + 2.0 * C * d.num_labels;
  const double emb_cost = C;
  const int L = d.n_layer;
  // best[k][l]: the smallest possible maximum cost putting blocks [0, l) into virtual stages [0, k).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(K + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(K + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= K; k++) {
    for (int l = k; l <= L - (K - k); l++) {
      for (int p = k - 1; p < l; p++) {  // stage k-1 holds blocks [p, l)
        double c = (l - p) * block_cost + (k == 1 ? emb_cost : 0) + (k == K ? head_cost : 0);
        double m = std::max(best[k - 1][p], c);
        if (m < best[k][l]) best[k][l] = m, cut[k][l] = p;
      }
    }
  }
  std::vector<int> counts(K);
  for (int k = K, l = L; k >= 1; k--) {
    counts[k - 1] = l - cut[k][l];
    l = cut[k][l];
  }
  return counts;
}

ModelPart virtual_stage_part(const std::vector<int>& counts, int k) {
  ModelPart p;
  p.l0 = 0;
  for (int i = 0; i < k; i++) p.l0 += counts[i];
  p.l1 = p.l0 + counts[k];
  p.embedding = k == 0;
  p.head = k == (int)counts.size() - 1;
  return p;
}

// ---- set-up ---------------------------------------------------------------------------------------

Pipeline::Pipeline(const ModelDesc& d, const Ops& o, const ParallelGroups& groups, const ParallelConfig& pc,
                   const SyncOptions& so, const std::string& optimizer, int local_batch, int T_, uint64_t seed_,
                   Tracer* tr, GemmPrecision precision)
    : g(groups), ops(o), desc(d), kind(parse_schedule_kind(pc.schedule)), S(groups.pp), M(pc.microbatches),
      v(pc.virtual_stages), T(T_), seed(seed_), tracer(tr) {
  check_schedule_params(kind, S, M, v);
  if (ops.on_gpu())  // messages are sent from backend memory; device buffers would need CUDA-aware MPI or staging
    fail("parallel.pp_stages > 1 runs on the CPU backend only so far (activations are sent straight from backend "
         "memory): use runtime.device \"cpu\", or parallel.pp_stages 1 on GPUs");
  if (so.method == SyncMethod::weights)
    fail("parallel.sync \"weights\" averages whole-model parameters and does not combine with pipeline stages: "
         "use \"allreduce\", \"gather_scatter\" or \"nccl\" with parallel.pp_stages > 1");
  if (local_batch % M != 0)
    fail("parallel.microbatches ", M, " does not divide the ", local_batch, " sequences each pipeline gets per step "
         "(train.global_batch / data-parallel replicas): choose microbatches dividing ", local_batch);
  micro_batch = local_batch / M;
  if (2 * S * v * M >= 32767) fail("parallel.microbatches ", M, " is too large for the message tags (", S * v,
                                   " virtual stages): use fewer micro-batches");
  layer_counts = split_layers(d, T, S * v, pc.stage_layers);
  whole_table = build_param_table(d);
  actions = build_schedule(kind, S, M, g.stage, v);
  const ActivationPeak peak = activation_peak(actions, v);
  const bool tied_lm = d.head == HeadKind::lm && d.tie_embeddings;
  chunks.resize(v);
  for (int c = 0; c < v; c++) {
    PipelineChunk& ch = chunks[c];
    ch.vstage = virtual_stage(S, g.stage, c);
    ch.part = virtual_stage_part(layer_counts, ch.vstage);
    ch.model = std::make_unique<Model>(d, ops, ch.part, precision);
    ch.model->init_params(seed);
    ch.sync = std::make_unique<GradSync>(so, g.data, ops, ch.model->grads, ch.model->table, tracer);
    // ZeRO-1 over the stage's data-parallel group: the moments of this rank's pieces only.
    ch.opt = std::make_unique<Optimizer>(ops, ch.model->table.numel, optimizer,
                                         so.zero ? ch.sync->shard : std::vector<ShardPiece>{});
    ch.tied = tied_lm && (ch.part.embedding != ch.part.head);
    ch.tied_copy = ch.tied && ch.part.head;
    ch.ready_cap = ch.model->table.numel;
    if (ch.tied) {
      const ParamSlice& last = ch.model->table.slices.back();
      if (last.role != kTokEmb) fail("internal: the tied token embedding is not the last tensor of a stage");
      ch.ready_cap = last.offset;
    }
    for (int i = 0; i < std::max(1, peak.per_chunk[c]); i++) {
      ch.slots.push_back(std::make_unique<Activations>(*ch.model, micro_batch, T));
      if (kind == ScheduleKind::zb_h1) ch.model->reserve_input_only(*ch.slots.back());  // counted up front
    }
  }
}

void Pipeline::connect() {
  for (PipelineChunk& ch : chunks) ch.sync->connect();
}

size_t Pipeline::local_numel() const {
  size_t n = 0;
  for (const PipelineChunk& ch : chunks) n += ch.model->table.numel;
  return n;
}

std::string Pipeline::describe_layers() const {
  std::string s;
  for (const PipelineChunk& ch : chunks) {
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

Batch Pipeline::micro(const Batch& b, int m) const {
  Batch x = b;
  const size_t rows = (size_t)micro_batch, off = rows * m * b.T;
  x.B = micro_batch;
  if (b.tokens) x.tokens = b.tokens + off;
  if (b.targets) x.targets = b.targets + off;
  if (b.token_types) x.token_types = b.token_types + off;
  if (b.attn_mask) x.attn_mask = b.attn_mask + off;
  if (b.labels) x.labels = b.labels + rows * m;
  return x;
}

// ---- one training step ----------------------------------------------------------------------------

namespace {

// The tied matrix's gradient summed over the embedding group (in place; staged through the host
// on a GPU).
void sum_tied(const Ops& ops, float* grad, size_t n, MPI_Comm comm) {
  if (!ops.on_gpu()) {
    MPI_Allreduce(MPI_IN_PLACE, grad, (int)n, MPI_FLOAT, MPI_SUM, comm);
    return;
  }
  std::vector<float> host(n);
  ops.copy_to_host(host.data(), grad, n * sizeof(float));
  MPI_Allreduce(MPI_IN_PLACE, host.data(), (int)n, MPI_FLOAT, MPI_SUM, comm);
  ops.copy_to_device(grad, host.data(), n * sizeof(float));
}

}  // namespace

PipelineStepStats Pipeline::forward_backward(int64_t step, const Batch& batch) {
  if (batch.B != micro_batch * M) fail("internal: pipeline batch of ", batch.B, " rows, expected ", micro_batch * M);
  PipelineStepStats st;
  const size_t NC = (size_t)micro_batch * T * desc.d_model;
  const bool traced = tracer && tracer->enabled;
  for (PipelineChunk& ch : chunks) {
    ch.model->zero_grads();
    ch.sync->begin_step();
  }
  // The index of each chunk's last backward (B, or W when split): it hands gradient buckets to the
  // sync. A W reports every tensor without a weight gradient as final at once, so the last W must
  // come after the last BI.
  std::vector<size_t> last_backward(v, 0), last_input_backward(v, 0);
  for (size_t i = 0; i < actions.size(); i++) {
    const ActionType t = actions[i].type;
    if (t == ActionType::B || t == ActionType::W) last_backward[actions[i].chunk] = i;
    if (t == ActionType::BI) last_input_backward[actions[i].chunk] = i;
  }
  for (int c = 0; c < v; c++)
    if (last_input_backward[c] > last_backward[c]) fail("internal: a schedule whose last W precedes its last BI");

  // Activation slots: (micro-batch, chunk) -> slot; free slots per chunk; sends in flight per slot.
  std::map<std::pair<int, int>, int> slot_of;
  std::vector<std::vector<int>> free_slots(v);
  std::vector<std::vector<std::vector<MPI_Request>>> sends(v);
  for (int c = 0; c < v; c++) {
    for (int i = (int)chunks[c].slots.size() - 1; i >= 0; i--) free_slots[c].push_back(i);
    sends[c].resize(chunks[c].slots.size());
  }
  std::map<std::pair<int, int>, MPI_Request> recv_of;
  auto wait_sends = [&](int c, int slot) {
    std::vector<MPI_Request>& r = sends[c][slot];
    if (!r.empty()) MPI_Waitall((int)r.size(), r.data(), MPI_STATUSES_IGNORE);
    r.clear();
  };
  auto acts = [&](const Action& a) -> Activations& {
    auto it = slot_of.find({a.mb, a.chunk});
    if (it != slot_of.end()) return *chunks[a.chunk].slots[it->second];
    // A free slot whose sends have completed. Never wait for a send here: above MPI's eager limit
    // a send completes only when its receiver posts the receive, which may sit behind a receive
    // of ours in the receiver's list (seen with interleaved, S = 2, M = 4, 16 KB messages). With
    // no such slot, one more is allocated; it stays for the next steps.
    PipelineChunk& chunk = chunks[a.chunk];
    std::vector<int>& free = free_slots[a.chunk];
    int slot = -1;
    for (size_t k = free.size(); k-- > 0 && slot < 0;) {
      std::vector<MPI_Request>& r = sends[a.chunk][free[k]];
      int done = 1;
      if (!r.empty()) MPI_Testall((int)r.size(), r.data(), &done, MPI_STATUSES_IGNORE);
      if (!done) continue;
      r.clear();
      slot = free[k];
      free.erase(free.begin() + (long)k);
    }
    if (slot < 0) {
      chunk.slots.push_back(std::make_unique<Activations>(*chunk.model, micro_batch, T));
      if (kind == ScheduleKind::zb_h1) chunk.model->reserve_input_only(*chunk.slots.back());
      sends[a.chunk].emplace_back();
      slot = (int)chunk.slots.size() - 1;
    }
    slot_of[{a.mb, a.chunk}] = slot;
    Activations& x = *chunks[a.chunk].slots[slot];
    chunks[a.chunk].model->load_batch(x, micro(batch, a.mb));
    x.dropout = DropoutContext{true, seed, step, g.dp_rank, a.mb};
    return x;
  };
  auto release = [&](const Action& a) { free_slots[a.chunk].push_back(slot_of.at({a.mb, a.chunk})); };
  auto wait_recv = [&](const Action& a) {
    auto it = recv_of.find({a.mb, a.chunk});
    if (it == recv_of.end()) return;
    const double t0 = now_ms();
    MPI_Wait(&it->second, MPI_STATUS_IGNORE);
    recv_of.erase(it);
    const double t1 = now_ms();
    st.wait_ms += t1 - t0;
    if (traced && t1 - t0 > 0.01) tracer->span("wait " + action_string(a), 0, t0, t1);
  };
  double loss_sum = 0;
  for (size_t i = 0; i < actions.size(); i++) {
    const Action& a = actions[i];
    PipelineChunk& ch = chunks[a.chunk];
    Model& md = *ch.model;
    switch (a.type) {
      case ActionType::RecvAct:
      case ActionType::RecvGrad: {
        Activations& x = acts(a);
        const bool grad = a.type == ActionType::RecvGrad;
        MPI_Request req;
        MPI_Irecv(grad ? x.dresidual : x.input, (int)NC, MPI_FLOAT, a.peer, tag(ch.vstage, a.mb, grad), g.pipeline,
                  &req);
        recv_of[{a.mb, a.chunk}] = req;
        break;
      }
      case ActionType::SendAct:
      case ActionType::SendGrad: {
        Activations& x = acts(a);
        const bool grad = a.type == ActionType::SendGrad;
        MPI_Request req;
        if (ops.on_gpu()) cuda_synchronize();  // the buffer is complete before MPI reads it
        MPI_Isend(grad ? x.dresidual : x.output(), (int)NC, MPI_FLOAT, a.peer,
                  tag(ch.vstage + (grad ? -1 : 1), a.mb, grad), g.pipeline, &req);
        sends[a.chunk][slot_of.at({a.mb, a.chunk})].push_back(req);
        // After a whole backward the slot is already free (the send is waited for on reuse); a
        // split one (zb-h1) keeps it until W.
        if (grad && kind != ScheduleKind::zb_h1) slot_of.erase({a.mb, a.chunk});
        break;
      }
      case ActionType::F: {
        Activations& x = acts(a);
        wait_recv(a);
        const double t0 = now_ms();
        if (ch.part.embedding) md.embed_forward(x);
        md.blocks_forward(x, ch.part.l0, ch.part.l1);
        // The head fused (its backward inside F: transformer.h "Fused LM head"), but under zb-h1,
        // whose BI must leave the head's weight gradient to W.
        if (ch.part.head)
          loss_sum += kind == ScheduleKind::zb_h1 ? md.head_forward(x, true, 1.0f / M) : md.train_head_forward(x, 1.0f / M);
        if (ops.on_gpu()) cuda_synchronize();
        const double t1 = now_ms();
        st.compute_ms += t1 - t0;
        if (traced) tracer->span(action_string(a), 0, t0, t1, "{\"step\":" + std::to_string(step) + "}");
        break;
      }
      case ActionType::B:
      case ActionType::BI: {
        Activations& x = acts(a);
        wait_recv(a);
        const double t0 = now_ms();
        Model::ReadyFn ready;
        if (i == last_backward[a.chunk])
          ready = [&ch](size_t k) { ch.sync->on_ready(std::min(k, ch.ready_cap)); };
        // BI: the input gradient only; the dense layers' weight gradients wait in x for W.
        md.begin_backward(x, a.type == ActionType::BI ? BackwardMode::input_only : BackwardMode::whole);
        if (ch.part.head) md.head_backward(x, ready);
        md.blocks_backward(x, ch.part.l0, ch.part.l1, ready);
        if (ch.part.embedding) md.embed_backward(x, ready);
        if (ops.on_gpu()) cuda_synchronize();
        const double t1 = now_ms();
        st.compute_ms += t1 - t0;
        if (traced) tracer->span(action_string(a), 0, t0, t1, "{\"step\":" + std::to_string(step) + "}");
        if (a.type == ActionType::B) {
          release(a);
          if (ch.vstage == 0) slot_of.erase({a.mb, a.chunk});  // no gradient to send
        }
        break;
      }
      case ActionType::W: {
        // The weight gradients BI deferred; then the activations are free.
        auto it = slot_of.find({a.mb, a.chunk});
        if (it == slot_of.end()) fail("internal: W of ", action_string(a), " without its activations");
        const double t0 = now_ms();
        Model::ReadyFn ready;
        if (i == last_backward[a.chunk])
          ready = [&ch](size_t k) { ch.sync->on_ready(std::min(k, ch.ready_cap)); };
        md.weight_backward(*ch.slots[it->second], ready);
        if (ops.on_gpu()) cuda_synchronize();
        const double t1 = now_ms();
        st.compute_ms += t1 - t0;
        if (traced) tracer->span(action_string(a), 0, t0, t1, "{\"step\":" + std::to_string(step) + "}");
        free_slots[a.chunk].push_back(it->second);
        slot_of.erase(it);
        break;
      }
    }
    if (after_compute && a.is_compute()) after_compute(a);
  }
  for (int c = 0; c < v; c++)
    for (size_t s = 0; s < sends[c].size(); s++) wait_sends(c, (int)s);
  if (!recv_of.empty()) fail("internal: a receive was never waited for");
  st.local_loss = g.last_stage() ? loss_sum / M : 0.0;

  // Tied embedding: first and last stage hold the two copies; sum their gradients.
  const double t0 = now_ms();
  for (PipelineChunk& ch : chunks)
    if (ch.tied && g.embedding != MPI_COMM_NULL) {
      const ParamSlice& w = ch.model->table.slices.back();
      sum_tied(ops, ch.model->grads + w.offset, w.numel, g.embedding);
    }
  const double t1 = now_ms();
  st.tied_ms = t1 - t0;
  for (PipelineChunk& ch : chunks) {
    ch.sync->finish();
    st.sync.comm_ms += ch.sync->step.comm_ms;
    st.sync.exposed_comm_ms += ch.sync->step.exposed_comm_ms;
    st.sync.bytes_sent += ch.sync->step.bytes_sent;
    st.sync.bytes_received += ch.sync->step.bytes_received;
    st.sync.collectives += ch.sync->step.collectives;
  }
  st.sync_ms = now_ms() - t1;
  return st;
}

// With ZeRO-1 a rank holds the averaged gradient only in its pieces: the squares of the pieces are
// summed over every rank (each stage's data-parallel group covers the stage's chunks once).
double Pipeline::clip_grad_norm(double max_norm) {
  const bool zero = chunks.front().sync->opt.zero;
  double local = 0, total = 0;
  for (PipelineChunk& ch : chunks) {
    const size_t counted = ch.tied_copy ? ch.ready_cap : ch.model->table.numel;  // the tied matrix once
    local += zero ? sum_squares_of_pieces(ops, ch.model->grads, ch.sync->shard, counted)
                  : ops.sum_squares(ch.model->grads, counted);
  }
  MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, zero ? g.world : g.pipeline);
  const double norm = std::sqrt(total);
  clip_scale = clip_factor(norm, max_norm);  // applied by optimizer_step as it reads the gradients
  return norm;
}

void Pipeline::optimizer_step(double lr, const TrainConfig& tc) {
  for (PipelineChunk& ch : chunks) {
    if (!ch.sync->opt.zero) {
      ch.opt->step(ch.model->params, ch.model->grads, ch.model->table, lr, tc, clip_scale);
      continue;
    }
    ch.opt->begin_step();  // ZeRO-1: this rank's piece of each bucket, then the bucket all-gathered
    ch.sync->gather_params(ch.model->params, [&](size_t b) {
      ch.opt->update_range(b, ch.model->params, ch.model->grads, ch.model->table, lr, tc, clip_scale);
    });
  }
}

// ---- evaluation ----------------------------------------------------------------------------------

void Pipeline::evaluate(const Batch& batch, PipelineEval& e) {
  const size_t NC = (size_t)micro_batch * T * desc.d_model;
  const int K = S * v;
  double loss_sum = 0;
  for (int m = 0; m < M; m++) {
    for (PipelineChunk& ch : chunks) {
      Activations& x = *ch.slots[0];
      Model& md = *ch.model;
      const Batch mb = micro(batch, m);
      md.load_batch(x, mb);
      x.dropout = DropoutContext{};
      const int prev = (g.stage - 1 + S) % S, next = (g.stage + 1) % S;
      if (ch.vstage > 0)
        MPI_Recv(x.input, (int)NC, MPI_FLOAT, prev, tag(ch.vstage, m, 0), g.pipeline, MPI_STATUS_IGNORE);
      if (ch.part.embedding) md.embed_forward(x);
      md.blocks_forward(x, ch.part.l0, ch.part.l1);
      if (ch.part.head) {
        loss_sum += md.head_forward(x, false);
        if (desc.head == HeadKind::classifier) {
          std::vector<int> pred = md.predictions(x);
          for (int i = 0; i < micro_batch; i++) e.correct += pred[i] == mb.labels[i];
          e.counted += micro_batch;
        }
      }
      if (ops.on_gpu()) cuda_synchronize();
      if (ch.vstage < K - 1) MPI_Send(x.output(), (int)NC, MPI_FLOAT, next, tag(ch.vstage + 1, m, 0), g.pipeline);
    }
  }
  if (g.last_stage()) e.loss_sum += loss_sum / M;
}

// ---- checkpoints ---------------------------------------------------------------------------------

std::vector<float> Pipeline::gather_whole(int which) {
  // ZeRO-1: a chunk's moments are first assembled from its data-parallel group on replica 0.
  std::vector<std::vector<float>> assembled(chunks.size());
  for (size_t c = 0; which != 0 && c < chunks.size(); c++) {
    PipelineChunk& ch = chunks[c];
    if (!ch.sync->opt.zero) continue;
    std::vector<float> mine(ch.opt->n);
    ops.copy_to_host(mine.data(), which == 1 ? ch.opt->m : ch.opt->v, mine.size() * sizeof(float));
    ch.sync->gather_sharded(mine.data(), assembled[c]);  // collective over the data-parallel group
  }
  auto buffer = [&](PipelineChunk& ch) -> const float* {
    const size_t c = &ch - chunks.data();
    if (!assembled[c].empty()) return assembled[c].data();  // host memory (pipelines run on the CPU)
    return which == 0 ? ch.model->params : which == 1 ? ch.opt->m : ch.opt->v;
  };
  std::vector<float> whole;
  if (g.dp_rank != 0) return whole;
  std::unordered_map<std::string, size_t> offset_of;
  for (const ParamSlice& s : whole_table.slices) offset_of[s.name] = s.offset;
  if (g.stage != 0) {
    for (PipelineChunk& ch : chunks) {
      std::vector<float> host(ch.ready_cap);  // the tied copy (last) is the embedding's: not sent
      ops.copy_to_host(host.data(), buffer(ch), host.size() * sizeof(float));
      MPI_Send(host.data(), (int)host.size(), MPI_FLOAT, 0, 1000 + ch.vstage, g.pipeline);
    }
    return whole;
  }
  whole.assign(whole_table.numel, 0.0f);
  for (int s = 0; s < S; s++) {
    for (int c = 0; c < v; c++) {
      const int k = virtual_stage(S, s, c);
      const ParamTable t = build_param_table(desc, virtual_stage_part(layer_counts, k));
      std::vector<float> host;
      if (s == 0) {
        host.resize(t.numel);
        ops.copy_to_host(host.data(), buffer(chunks[c]), host.size() * sizeof(float));
      } else {
        int n = 0;
        MPI_Status status;
        MPI_Probe(s, 1000 + k, g.pipeline, &status);
        MPI_Get_count(&status, MPI_FLOAT, &n);
        host.resize(n);
        MPI_Recv(host.data(), n, MPI_FLOAT, s, 1000 + k, g.pipeline, MPI_STATUS_IGNORE);
      }
      for (const ParamSlice& sl : t.slices) {
        if (sl.offset + sl.numel > host.size()) continue;  // a tied copy, not sent
        std::copy(host.begin() + sl.offset, host.begin() + sl.offset + sl.numel, whole.begin() + offset_of.at(sl.name));
      }
    }
  }
  return whole;
}

void Pipeline::load_whole(const float* params, const float* m, const float* vv, int64_t optimizer_t) {
  std::unordered_map<std::string, size_t> offset_of;
  for (const ParamSlice& s : whole_table.slices) offset_of[s.name] = s.offset;
  for (PipelineChunk& ch : chunks) {
    const ParamTable& t = ch.model->table;
    std::vector<float> host(t.numel);
    auto load = [&](const float* src, float* dst) {
      for (const ParamSlice& sl : t.slices) {
        auto it = offset_of.find(sl.name);
        if (it == offset_of.end()) fail("internal: tensor ", sl.name, " is not in the whole model");
        std::copy(src + it->second, src + it->second + sl.numel, host.begin() + sl.offset);
      }
      if (dst) ops.copy_to_device(dst, host.data(), host.size() * sizeof(float));
    };
    load(params, ch.model->params);
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

void Pipeline::init_from_hf(const std::string& dir, std::vector<std::string>* notes) {
  std::vector<std::string> mine;
  std::string err;
  try {
    for (PipelineChunk& ch : chunks) {
      std::vector<float> host(ch.model->table.numel);
      load_hf_params(dir, desc, ch.model->table, seed, host.data(), &mine);
      ops.copy_to_device(ch.model->params, host.data(), host.size() * sizeof(float));
    }
  } catch (const Error& e) {
    err = e.what();
  }
  err = agree_on_error(g.world, err);
  if (!err.empty()) fail(err);  // the same error on every rank
  // The notes of the pipeline's stages, to its stage 0, one per line.
  std::string text;
  for (const std::string& n : mine) text += n + "\n";
  int len = (int)text.size();
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
