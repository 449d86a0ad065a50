// One training step of the engine (engine/engine.h): the schedule over the chunks, the tied sum,
// the gradient sync, the global norm and the update; and evaluation.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "backend/cuda_ops.h"
#include "runtime/large_count.h"
#include "engine/engine.h"
#include "metrics/trace.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "runtime/watchdog.h"

namespace llmpi {

Batch Engine::micro(const Batch& b, int first_row, int rows) const {
  Batch x = b;
  const size_t off = (size_t)first_row * b.T;
  x.B = rows;
  if (b.tokens) x.tokens = b.tokens + off;
  if (b.targets) x.targets = b.targets + off;
  if (b.token_types) x.token_types = b.token_types + off;
  if (b.attn_mask) x.attn_mask = b.attn_mask + off;
  if (b.labels) x.labels = b.labels + first_row;
  return x;
}

size_t Engine::grad_pages_peak() const {
  size_t peak = 0;
  for (const ModelChunk& ch : chunks) peak += ch.sync->grads_backed_peak();
  return peak;
}

size_t Engine::param_pages_peak() const {
  size_t peak = 0;
  for (const ModelChunk& ch : chunks) peak += ch.sync->params_backed_peak();
  return peak;
}

// The tied matrix's gradient summed over the embedding group (in place; staged through the host
// on a GPU): the two copies get the same gradient and stay bit-identical.
void Engine::sum_tied_gradients() {
  if (g.embedding == MPI_COMM_NULL) return;
  for (ModelChunk& ch : chunks) {
    if (!ch.tied) continue;
    const ParamSlice& w = ch.model->table.slices.back();
    float* grad = ch.model->grads + w.offset;
    if (!ops.on_gpu()) {
      large::allreduce(MPI_IN_PLACE, grad, w.numel, MPI_FLOAT, MPI_SUM, g.embedding);
      continue;
    }
    std::vector<float> host(w.numel);
    ops.copy_to_host(host.data(), grad, w.numel * sizeof(float));
    large::allreduce(MPI_IN_PLACE, host.data(), w.numel, MPI_FLOAT, MPI_SUM, g.embedding);
    ops.copy_to_device(grad, host.data(), w.numel * sizeof(float));
  }
}

namespace {

// The chunk's blocks, forward and backward. ZeRO-3: block by block, each gathered just before it
// runs (the next one's gather started meanwhile) and released after (comm/grad_sync.h). ZeRO-2 on
// a GPU: backward block by block, each block's gradient backed before it writes it.
void blocks_forward(ModelChunk& ch, Activations& x) {
  GradSync& s = *ch.sync;
  if (!s.opt.shard_params) return ch.model->blocks_forward(x, ch.part.l0, ch.part.l1);
  for (int l = ch.part.l0; l < ch.part.l1; l++) {
    s.need_layer(l);
    s.prefetch_layer(l + 1);
    ch.model->blocks_forward(x, l, l + 1);
    s.release_layer(l);
  }
}

void blocks_backward(ModelChunk& ch, Activations& x, const Model::ReadyFn& ready) {
  GradSync& s = *ch.sync;
  if (!s.opt.shard_params && !s.pages_grads()) return ch.model->blocks_backward(x, ch.part.l0, ch.part.l1, ready);
  for (int l = ch.part.l1 - 1; l >= ch.part.l0; l--) {
    s.need_layer(l);
    s.prefetch_layer(l - 1);
    s.grads_needed(l);
    ch.model->blocks_backward(x, l, l + 1, ready);
    s.release_layer(l);
  }
}

// One step's run of the schedule: which activation slot holds which (micro-batch, chunk), the
// messages in flight, the losses read so far.
struct ScheduleRun {
  Engine& e;
  const int64_t step;
  const Batch& batch;
  StepResult& r;
  std::vector<int> first;           // micro-batch m is rows [first[m], first[m + 1])
  std::vector<size_t> last_backward;  // per chunk: the action that hands buckets to the sync
  std::map<std::pair<int, int>, int> slot_of;         // (micro-batch, chunk) -> slot
  std::vector<std::vector<int>> free_slots;           // per chunk
  std::vector<std::vector<std::vector<int>>> sends;  // per chunk and slot: sends in flight (StageLink ids)
  std::map<std::pair<int, int>, int> recv_of;
  std::vector<float> losses;        // micro-batch m's mean loss, as its head computed it
  bool loss_at_forward = false;     // each head forward reads its loss (else: with the norm)

  ScheduleRun(Engine& e_, int64_t s, const Batch& b, StepResult& r_, int Mb, const std::vector<Action>& list)
      : e(e_), step(s), batch(b), r(r_), first(Mb + 1, 0), last_backward(e_.v, 0), free_slots(e_.v), sends(e_.v),
        losses(Mb, 0.0f) {
    for (int m = 0; m < Mb; m++) first[m + 1] = first[m] + batch.B / Mb + (m < batch.B % Mb ? 1 : 0);
    // A W reports every tensor without a weight gradient as final at once, so the last W must come
    // after the last BI.
    std::vector<size_t> last_input_backward(e.v, 0);
    for (size_t i = 0; i < list.size(); i++) {
      const ActionType t = list[i].type;
      if (t == ActionType::B || t == ActionType::W) last_backward[list[i].chunk] = i;
      if (t == ActionType::BI) last_input_backward[list[i].chunk] = i;
    }
    for (int c = 0; c < e.v; c++) {
      if (last_input_backward[c] > last_backward[c]) fail("internal: a schedule whose last W precedes its last BI");
      for (int i = (int)e.chunks[c].slots.size() - 1; i >= 0; i--) free_slots[c].push_back(i);
      sends[c].resize(e.chunks[c].slots.size());
    }
  }
  int rows(int mb) const { return first[mb + 1] - first[mb]; }

  // The activations of the action's micro-batch in its chunk: its slot, or a free slot whose sends
  // have completed, loaded with the micro-batch. Never waits for a send: above MPI's eager limit a
  // send completes only when its receiver posts the receive, which may sit behind a receive of
  // ours in the receiver's list (seen with interleaved, S = 2, M = 4, 16 KB messages). With no
  // such slot, one more is allocated; it stays for the next steps.
  Activations& acts(const Action& a) {
    auto it = slot_of.find({a.mb, a.chunk});
    if (it != slot_of.end()) return *e.chunks[a.chunk].slots[it->second];
    ModelChunk& chunk = e.chunks[a.chunk];
    std::vector<int>& free = free_slots[a.chunk];
    int slot = -1;
    for (size_t k = free.size(); k-- > 0 && slot < 0;) {
      std::vector<int>& q = sends[a.chunk][free[k]];
      bool done = true;
      for (int id : q) done = e.link->done(id) && done;
      if (!done) continue;
      q.clear();
      slot = free[k];
      free.erase(free.begin() + (long)k);
    }
    if (slot < 0) {
      chunk.slots.push_back(std::make_unique<Activations>(*chunk.model, e.micro_batch, e.T));
      if (e.kind == ScheduleKind::zb_h1) chunk.model->reserve_input_only(*chunk.slots.back());
      sends[a.chunk].emplace_back();
      slot = (int)chunk.slots.size() - 1;
    }
    slot_of[{a.mb, a.chunk}] = slot;
    Activations& x = *chunk.slots[slot];
    chunk.model->load_batch(x, e.micro(batch, first[a.mb], rows(a.mb)));
    x.dropout = DropoutContext{true, e.seed, step, e.g.dp_rank, a.mb};
    return x;
  }

  // RecvAct / RecvGrad post a receive straight into the micro-batch's activations; SendAct /
  // SendGrad a send from them (comm/stage_link.h: MPI, staged through the host, or NCCL). Tag =
  // (receiver's virtual stage, micro-batch, direction).
  void message(const Action& a) {
    ModelChunk& ch = e.chunks[a.chunk];
    Activations& x = acts(a);
    const bool grad = a.type == ActionType::RecvGrad || a.type == ActionType::SendGrad;
    const size_t n = e.hidden_floats();
    if (a.type == ActionType::RecvAct || a.type == ActionType::RecvGrad) {
      recv_of[{a.mb, a.chunk}] = e.link->post_recv(grad ? x.dresidual : x.input, n, a.peer, e.tag(ch.vstage, a.mb, grad));
      return;
    }
    const int id = e.link->post_send(grad ? x.dresidual : x.output(), n, a.peer, e.tag(ch.vstage + (grad ? -1 : 1), a.mb, grad));
    sends[a.chunk][slot_of.at({a.mb, a.chunk})].push_back(id);
    // After a whole backward the slot is already free (the send is waited for on reuse); a split
    // one (zb-h1) keeps it until W.
    if (grad && e.kind != ScheduleKind::zb_h1) slot_of.erase({a.mb, a.chunk});
  }

  // A compute waits only for its own receive.
  void wait_recv(const Action& a) {
    auto it = recv_of.find({a.mb, a.chunk});
    if (it == recv_of.end()) return;
    const double t0 = now_ms();
    e.link->wait(it->second);
    recv_of.erase(it);
    const double t1 = now_ms();
    r.wait_ms += t1 - t0;
    if (e.opt.tracer && e.opt.tracer->enabled && t1 - t0 > 0.01)
      e.opt.tracer->span("wait " + action_string(a), 0, t0, t1);
  }

  // F, B, BI or W of action i. The chunk's last backward hands finished gradient prefixes to its
  // sync (grads_ready(k), capped before a tied copy, which the tied sum finishes).
  void compute(const Action& a, size_t i) {
    ModelChunk& ch = e.chunks[a.chunk];
    Model& md = *ch.model;
    Model::ReadyFn ready;
    // (ZeRO-2/3 reducing each micro-batch: every backward hands them over, comm/grad_sync.h)
    const bool hands_over = i == last_backward[a.chunk] || ch.sync->reducing_micro_batches();
    if (hands_over) ready = [&ch](size_t k) { ch.sync->on_ready(std::min(k, ch.ready_cap)); };
    if (a.type == ActionType::W) {  // the weight gradients BI deferred; then the activations are free
      auto it = slot_of.find({a.mb, a.chunk});
      if (it == slot_of.end()) fail("internal: W of ", action_string(a), " without its activations");
      md.weight_backward(*ch.slots[it->second], ready);
      free_slots[a.chunk].push_back(it->second);
      slot_of.erase(it);
      return;
    }
    Activations& x = acts(a);
    wait_recv(a);
    if (a.type == ActionType::F) {
      ch.sync->grads_needed(-1);  // ZeRO-2 on a GPU: the fused head writes its gradient below
      if (ch.part.embedding) md.embed_forward(x);
      blocks_forward(ch, x);
      // The head fused (its backward inside F: transformer.h "Fused LM head"), but under zb-h1,
      // whose BI must leave the head's weight gradient to W. The loss gradient is scaled by the
      // micro-batch's share of the rows, so the gradients add up to the batch's mean.
      if (ch.part.head) {
        const HeadMode mode = e.kind != ScheduleKind::zb_h1 ? HeadMode::fused : HeadMode::train;
        md.head_forward(x, mode, (float)rows(a.mb) / (float)batch.B);
        if (loss_at_forward) losses[a.mb] = md.loss_of(md.read_scalars(x), x);
      }
      return;
    }
    // B, or BI: the input gradient only; the dense layers' weight gradients wait in x for W
    md.begin_backward(x, a.type == ActionType::BI ? BackwardMode::input_only : BackwardMode::whole);
    if (ch.part.head) md.head_backward(x, ready);
    blocks_backward(ch, x, ready);
    if (ch.part.embedding) md.embed_backward(x, ready);
    if (a.type == ActionType::B) {
      free_slots[a.chunk].push_back(slot_of.at({a.mb, a.chunk}));
      if (ch.vstage == 0) slot_of.erase({a.mb, a.chunk});  // no gradient to send
    }
    // Its buckets reduced before the next micro-batch's forward (its fused head) writes the buffer.
    if (i != last_backward[a.chunk] && ch.sync->reducing_micro_batches()) ch.sync->end_micro_batch();
  }

  // The sends still in flight, before their buffers are used again.
  void drain() {
    if (!recv_of.empty()) fail("internal: a receive was never waited for");
    if (e.link) e.link->drain();
    for (auto& chunk_sends : sends)
      for (std::vector<int>& q : chunk_sends) q.clear();
  }

  // This rank's mean loss over its rows: of equal micro-batches the mean of their means.
  double mean_loss() const {
    bool has_head = false;
    for (const ModelChunk& ch : e.chunks) has_head = has_head || ch.part.head;
    if (!has_head) return 0;
    const int Mb = (int)losses.size();
    bool equal = true;
    for (int m = 0; m < Mb; m++) equal = equal && rows(m) == rows(0);
    double sum = 0;
    for (int m = 0; m < Mb; m++) sum += equal ? (double)losses[m] : (double)losses[m] * rows(m);
    return equal ? sum / Mb : sum / batch.B;
  }
};

}  // namespace

std::optional<double> Engine::run_schedule(int64_t step, const Batch& batch, StepResult& r) {
  // A replica's short last step of an epoch may have fewer rows than micro-batches.
  const int Mb = S > 1 ? M : std::min(M, batch.B);
  if (S > 1 && batch.B != micro_batch * M) fail("internal: pipeline batch of ", batch.B, " rows, expected ", micro_batch * M);
  const std::vector<Action> list = Mb == M ? actions : schedule_for(Mb);
  ScheduleRun run(*this, step, batch, r, Mb, list);
  // One micro-batch on one stage reads its loss with the norm after the sync (the step's one
  // readback); otherwise each head forward reads its loss (and the target check) at once.
  run.loss_at_forward = Mb > 1 || S > 1;
  for (ModelChunk& ch : chunks) {
    if (!ch.sync->zero_pieces()) ch.model->zero_grads();  // (ZeRO-2/3: only the pieces are not zero)
    ch.sync->begin_step(Mb);
  }
  const bool traced = opt.tracer && opt.tracer->enabled;
  log_ = PhaseLog{};
  log_.marks = ops.on_gpu() && S == 1 && (int)list.size() + 2 <= kCudaMarks;
  log_.start_ms = now_ms();
  if (log_.marks) cuda_mark(0);
  for (size_t i = 0; i < list.size(); i++) {
    const Action& a = list[i];
    if (!a.is_compute()) {
      run.message(a);
      continue;
    }
    const double t0 = now_ms();
    run.compute(a, i);
    if (S > 1 && link->host_waits_before_send()) cuda_synchronize();  // complete before MPI reads device memory
    const double t1 = now_ms();
    log_.forward.push_back(a.type == ActionType::F);
    log_.begin_ms.push_back(t0);
    log_.end_ms.push_back(t1);
    if (log_.marks) cuda_mark((int)log_.end_ms.size());
    if (traced && !log_.marks) {
      const std::string name = S > 1 || Mb > 1 ? action_string(a) : a.type == ActionType::F ? "forward" : "backward";
      opt.tracer->span(name, 0, t0, t1, "{\"step\":" + std::to_string(step) + "}");
    }
    if (after_compute) after_compute(a);
  }
  run.drain();
  if (opt.watchdog) opt.watchdog->enter("gradient sync", step);
  sum_tied_gradients();
  for (ModelChunk& ch : chunks) ch.sync->finish();  // every rank holds the averaged gradient (ZeRO-1: its pieces)
  log_.sync_end_ms = now_ms();
  if (log_.marks) cuda_mark(log_.sync_mark = (int)log_.end_ms.size() + 1);
  if (run.loss_at_forward) return run.mean_loss();
  return std::nullopt;
}

StepResult Engine::step(int64_t step, const Batch& batch, double lr, const TrainConfig& tc) {
  StepResult r;
  step_ = step;
  if (opt.watchdog) opt.watchdog->enter("forward and backward", step);
  const std::optional<double> loss = run_schedule(step, batch, r);
  if (opt.watchdog) opt.watchdog->enter("gradient norm", step);
  // The global norm: each chunk's squares (the tied matrix once; ZeRO-1: this rank's pieces of the
  // averaged gradient) summed on the device into its first slot's scalars, read once.
  const bool zero = chunks.front().sync->opt.zero;
  for (ModelChunk& ch : chunks) {
    StepScalars* dev = ch.slots.front()->scalars;
    ops.zero(&dev->grad_sumsq, sizeof(double));
    for (const auto& [begin, end] : ch.norm_ranges) {
      if (zero) sum_squares_of_pieces_add(ops, &dev->grad_sumsq, ch.model->grads, ch.sync->shard, begin, end);
      else ops.sum_squares_add(&dev->grad_sumsq, ch.model->grads + begin, end - begin);
    }
  }
  // One rank updating the whole model from one micro-batch: the clip factor and the skip of a
  // non-finite step need no other rank, so the update decides them on the device from the step's
  // scalars and the host reads them once, after it (docs/DESIGN.md "Data flow of one step").
  ModelChunk& first = chunks.front();
  Activations& x0 = *first.slots.front();
  const bool on_device = !loss && S == 1 && g.world_size == 1 && !zero && !opt.host_clip;
  if (on_device) first.opt->step_on_device(first.model->params, first.model->grads, first.model->table, lr, tc,
                                            x0.scalars);
  double sumsq = 0;
  StepScalars sc0;
  for (ModelChunk& ch : chunks) {
    const StepScalars sc = ch.model->read_scalars(*ch.slots.front());  // the step's readback
    if (&ch == &first) sc0 = sc;
    sumsq += sc.grad_sumsq;
  }
  r.local_loss = loss ? (float)*loss : first.model->loss_of(sc0, x0);
  MPI_Comm norm_group = zero ? g.world : g.model;  // each piece of each stage's each shard once
  int group_size = 1;
  MPI_Comm_size(norm_group, &group_size);
  if (group_size > 1) MPI_Allreduce(MPI_IN_PLACE, &sumsq, 1, MPI_DOUBLE, MPI_SUM, norm_group);
  r.grad_norm = std::sqrt(sumsq);
  clip_scale = clip_factor(r.grad_norm, tc.grad_clip);
  // On the device path exactly the test the update made (the same values, the same function).
  r.updated = on_device;
  r.finite = on_device ? update_allowed(sc0) : std::isfinite((float)r.local_loss) && std::isfinite(r.grad_norm);
  return r;
}

void Engine::update(double lr, const TrainConfig& tc) {
  if (opt.watchdog) opt.watchdog->enter("optimizer", step_);
  for (ModelChunk& ch : chunks) {
    Model& md = *ch.model;
    if (!ch.sync->opt.zero) {
      ch.opt->step(md.params, md.grads, md.table, lr, tc, (float)clip_scale);
      continue;
    }
    ch.opt->begin_step();  // ZeRO-1: this rank's piece of each bucket, then the bucket all-gathered
    ch.sync->gather_params(md.params, [&](size_t b) {
      ch.opt->update_range(b, md.params, md.grads, md.table, lr, tc, (float)clip_scale);
    });
  }
}

void Engine::discard_device_update() {
  // The device skipped the update (parameters and moments untouched); its step must not count in
  // AdamW's bias correction, as a step the host never started does not.
  chunks.front().opt->unstep();
}

void Engine::end_step(int64_t step, StepResult& r) {
  if (ops.on_gpu()) cuda_synchronize();  // the step boundary
  for (size_t k = 0; k < log_.end_ms.size(); k++) {
    const double ms = log_.marks ? cuda_marks_ms((int)k, (int)k + 1) : log_.end_ms[k] - log_.begin_ms[k];
    (log_.forward[k] ? r.forward_ms : r.backward_ms) += ms;
  }
  r.sync_end_ms = log_.marks ? log_.start_ms + cuda_marks_ms(0, log_.sync_mark) : log_.sync_end_ms;
  if (log_.marks && opt.tracer && opt.tracer->enabled) {  // the compute spans, placed by the marks
    for (size_t k = 0; k < log_.end_ms.size(); k++) {
      const double b = log_.start_ms + cuda_marks_ms(0, (int)k), e = log_.start_ms + cuda_marks_ms(0, (int)k + 1);
      opt.tracer->span(log_.forward[k] ? "forward" : "backward", 0, b, e, "{\"step\":" + std::to_string(step) + "}");
    }
  }
  r.sync = SyncStats{};
  for (ModelChunk& ch : chunks) {
    ch.sync->average_params(ch.model->params, step);  // "weights" only, every average_every steps
    // the step's traffic: the gradient sync, ZeRO-1's all-gather, the parameter average
    r.sync.comm_ms += ch.sync->step.comm_ms;
    r.sync.exposed_comm_ms += ch.sync->step.exposed_comm_ms;
    r.sync.bytes_sent += ch.sync->step.bytes_sent;
    r.sync.bytes_received += ch.sync->step.bytes_received;
    r.sync.collectives += ch.sync->step.collectives;
  }
}

// ---- evaluation ----------------------------------------------------------------------------------

std::vector<int64_t> Engine::eval_rows(int64_t begin, int64_t rows) const {
  std::vector<int64_t> w;
  if (S > 1) {  // whole batches: each data-parallel replica its equal share, read by every stage
    const int64_t per = rows / g.dp;
    for (int64_t i = 0; i < per; i++) w.push_back(begin + (int64_t)g.dp_rank * per + i);
    return w;
  }
  // Shared out as evenly as it goes: the first rows mod DP replicas take one more.
  const int64_t base = rows / g.dp, extra = rows % g.dp;
  const int64_t mine = base + (g.dp_rank < extra ? 1 : 0);
  const int64_t first = begin + g.dp_rank * base + std::min<int64_t>(g.dp_rank, extra);
  for (int64_t i = 0; i < mine; i++) w.push_back(first + i);
  return w;
}

EvalSums Engine::evaluate(const Batch& batch) {
  EvalSums e = evaluate_here(batch);
  if (g.tp_rank != 0) e = EvalSums{};  // the tensor group's ranks computed the same: its first counts
  return e;
}

EvalSums Engine::evaluate_here(const Batch& batch) {
  EvalSums e;
  if (S == 1) {  // whole model: the rows in pieces of at most a slot's rows
    ModelChunk& ch = chunks.front();
    Activations& x = *ch.slots.front();
    for (int r0 = 0; r0 < batch.B; r0 += micro_batch) {
      const Batch b = micro(batch, r0, std::min(micro_batch, batch.B - r0));
      x.dropout = DropoutContext{};  // no dropout
      Model& md = *ch.model;
      md.load_batch(x, b);
      md.embed_forward(x);
      blocks_forward(ch, x);
      md.head_forward(x, HeadMode::eval);
      e.loss_sum += (double)md.read_loss(x) * (double)b.B;
      e.loss_weight += b.B;
      e.rows += b.B;
      if (desc.head == HeadKind::classifier) {
        const std::vector<int> pred = ch.model->predictions(x);
        for (int i = 0; i < b.B; i++) e.labels.push_back(b.labels[i]), e.predictions.push_back(pred[i]);
      }
    }
    return e;
  }
  // Along the pipeline, micro-batch by micro-batch (blocking messages in (micro-batch, virtual
  // stage) order); the last stage holds the loss: the replica's mean over its micro-batches.
  const size_t NC = hidden_floats();
  const int K = S * v;
  double loss_sum = 0;
  for (int m = 0; m < M; m++) {
    for (ModelChunk& ch : chunks) {
      Activations& x = *ch.slots[0];
      Model& md = *ch.model;
      const Batch mb = micro(batch, m * micro_batch, micro_batch);
      md.load_batch(x, mb);
      x.dropout = DropoutContext{};
      const int prev = (g.stage - 1 + S) % S, next = (g.stage + 1) % S;
      if (ch.vstage > 0) link->wait(link->post_recv(x.input, NC, prev, tag(ch.vstage, m, 0)));
      if (ch.part.embedding) md.embed_forward(x);
      blocks_forward(ch, x);
      if (ch.part.head) {
        md.head_forward(x, HeadMode::eval);
        loss_sum += md.read_loss(x);
        if (desc.head == HeadKind::classifier) {
          const std::vector<int> pred = md.predictions(x);
          for (int i = 0; i < micro_batch; i++) e.labels.push_back(mb.labels[i]), e.predictions.push_back(pred[i]);
        }
      }
      if (link->host_waits_before_send()) cuda_synchronize();
      // The send finished before the slot is loaded again (a blocking send; NCCL: the compute
      // stream waits for it)
      if (ch.vstage < K - 1) link->wait(link->post_send(x.output(), NC, next, tag(ch.vstage + 1, m, 0)));
    }
  }
  link->drain();
  if (g.last_stage()) e.loss_sum = loss_sum / M, e.loss_weight = 1, e.rows = batch.B;
  return e;
}

}  // namespace llmpi
