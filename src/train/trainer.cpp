// The training loop (train/trainer.h): one loop over the step engine (engine/engine.h), whatever
// the parallel layout. Set-up, checkpoints and reports live beside it (train/run.h).
#include "train/trainer.h"

#include <cmath>
#include <cstdio>

#include "backend/cuda_ops.h"
#include "optim/optimizer.h"
#include "runtime/clock.h"
#include "runtime/signals.h"
#include "train/run.h"

namespace llmpi {

namespace {

// What every rank agrees on after a step: the global loss and whether any rank's step was not finite.
struct StepAgreement {
  float loss = 0;
  bool nonfinite = false;
};

// One collective: the losses summed over the data-parallel replicas (a pipeline stage without the
// head adds 0) and the non-finite flags.
StepAgreement agree(Run& r, const StepResult& s, int64_t step) {
  // (a tensor-parallel group's ranks hold the same loss: its first rank counts it)
  const double loss = r.groups->tp_rank == 0 ? (float)s.local_loss : 0.0;
  double mine[2] = {loss, s.finite ? 0.0 : 1.0}, all[2] = {mine[0], mine[1]};
  if (r.world > 1) {
    r.watchdog->enter("loss allreduce", step);
    MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_SUM, r.comm);
  }
  return {(float)(all[0] / r.groups->dp), all[1] > 0};
}

// train.on_nonfinite: abort the run, or count a skipped step (its update is not applied) and stop
// the run when train.max_consecutive_skips steps in a row were skipped (it is diverging).
void handle_nonfinite(Run& r, int64_t step, float loss, const StepResult& s, TrainResult& res, bool print) {
  if (s.updated) r.engine->discard_device_update();
  const TrainConfig& tc = r.cfg.train;
  if (tc.on_nonfinite == OnNonfinite::abort)
    throw CollectiveError("non-finite loss or gradient norm at step " + std::to_string(step) + " (loss " +
                          std::to_string(loss) + ", grad norm " + std::to_string(s.grad_norm) +
                          "): lower train.lr, check the data, or set train.on_nonfinite=skip to skip such steps");
  res.skipped_steps++;
  if (++r.skipped_in_a_row >= tc.max_consecutive_skips)
    throw CollectiveError("train.on_nonfinite=skip: " + std::to_string(r.skipped_in_a_row) +
                          " steps in a row were not finite (steps " + std::to_string(step - r.skipped_in_a_row + 1) +
                          " to " + std::to_string(step) + ", " + std::to_string(res.skipped_steps) +
                          " in all): the run is diverging; lower train.lr or check the data (the limit is "
                          "train.max_consecutive_skips)");
  if (!print) return;
  std::printf("step %6lld: non-finite loss or gradient norm (loss %g, grad norm %g): update skipped "
              "(train.on_nonfinite=skip)\n", (long long)step, loss, s.grad_norm);
  std::fflush(stdout);
}

// The time finish_checkpoint took, in seconds: what the steps waited for a write still running.
double finish_and_time(Run& r) {
  const double t0 = now_ms();
  finish_checkpoint(r);
  return (now_ms() - t0) / 1e3;
}

void checkpoint(Run& r, int64_t steps_done, TrainResult& res, const TrainOptions& o, bool print) {
  if (!o.write_run_dir) return;
  r.watchdog->enter("checkpoint", steps_done);
  const std::string previous = r.pending ? r.pending->path : "";
  const double previous_s = finish_and_time(r);  // the one before: complete before the next begins
  const double t0 = now_ms();
  res.last_checkpoint = save_checkpoint(r, steps_done);
  const double waited_s = (now_ms() - t0) / 1e3;
  r.saved_at = steps_done;
  if (!print) return;
  // A write that outlasts checkpoint.every steps holds the next checkpoint's step back.
  if (!previous.empty() && previous_s >= 0.01)
    std::printf("checkpoint: %s was still being written: training waited %.2f s for it (the file system takes "
                "longer than checkpoint.every steps to write one)\n", previous.c_str(), previous_s);
  std::printf("checkpoint: %s (training waited %.2f s%s)\n", res.last_checkpoint.c_str(), waited_s,
              r.pending ? "; written behind the next steps" : "");
  std::fflush(stdout);
}

// Pre-emption: any rank that got the signal stops every rank at this step boundary, after a
// checkpoint of the state it stops in. Returns whether the run stops here.
bool preempted_here(Run& r, int64_t step, TrainResult& res, const TrainOptions& o, bool print) {
  r.watchdog->enter("pre-emption check", step);
  int stop_here = preemption_requested() || step == o.preempt_after_step, stop_any = stop_here;
  if (r.world > 1) MPI_Allreduce(&stop_here, &stop_any, 1, MPI_INT, MPI_MAX, r.comm);
  r.watchdog->enter(nullptr, step);
  if (!stop_any || step + 1 == r.cfg.train.steps) return false;
  if (r.saved_at != step + 1) checkpoint(r, step + 1, res, o, print);
  r.watchdog->enter("checkpoint", step + 1);
  finish_checkpoint(r);  // on disk before the job ends
  res.preempted = true;
  if (r.rank == 0 && o.write_run_dir)
    write_file_atomic(r.cfg.run.dir + "/PREEMPTED", "step " + std::to_string(step + 1) + "\ncheckpoint " +
                                                         res.last_checkpoint + "\n");
  if (print) {
    std::printf("llmpi-train: pre-empted at step %lld; checkpoint %s; resume with --resume auto\n",
                (long long)(step + 1), res.last_checkpoint.c_str());
    std::fflush(stdout);
  }
  return true;
}

// One step: batch → forward/backward → sync → clip → update → metrics.
void train_step(Run& r, int64_t step, TrainResult& res, const TrainOptions& o, bool print) {
  const TrainConfig& tc = r.cfg.train;
  r.tracer.enabled = o.write_run_dir && step - r.start_step < r.cfg.runtime.trace_steps;
  StepLog log;
  log.step = step;
  log.lr = lr_at(tc, step);
  const double t0 = now_ms();
  r.watchdog->enter("data", step);
  const Batch batch = r.train_data.read(r.sampler->windows(step));
  const double t1 = now_ms();
  StepResult s = r.engine->step(step, batch, log.lr, tc);  // forward, backward, sync, norm
  const StepAgreement a = agree(r, s, step);
  if (a.nonfinite) {
    handle_nonfinite(r, step, a.loss, s, res, print);
  } else {
    r.skipped_in_a_row = 0;
    if (!s.updated) r.engine->update(log.lr, tc);
  }
  r.engine->end_step(step, s);  // the device idle, the step's times final
  r.watchdog->enter(nullptr, step);
  const double t2 = now_ms();
  if (r.tracer.enabled) {
    const std::string args = "{\"step\":" + std::to_string(step) + "}";
    r.tracer.span("data", 0, t0, t1, args);
    r.tracer.span("optimizer", 0, s.sync_end_ms, t2, args);
  }
  log.loss = a.loss;
  log.skipped = a.nonfinite;
  log.grad_norm = s.grad_norm;
  log.data_ms = t1 - t0;
  log.optim_ms = t2 - s.sync_end_ms;
  log.step_ms = t2 - t0;
  log.tokens = (double)tc.global_batch * r.cfg.model.seq_len * batch.B / r.sampler->local_batch();
  res.losses.push_back(a.loss);
  res.step_ms.push_back(log.step_ms);
  res.bytes_sent_last_step = s.sync.bytes_sent;
  log_step(r, log, s, res, print);
}

}  // namespace

TrainResult train(const Config& cfg, MPI_Comm comm, const TrainOptions& o, bool return_params) {
  Run r;
  start_run(r, cfg, comm, o);
  const TrainConfig& tc = r.cfg.train;  // train.steps resolved (train.epochs)
  const bool print = o.print && r.rank == 0;
  TrainResult res;
  res.n_params = (int64_t)r.engine->whole_table.numel;
  res.optimizer_state_floats = r.engine->optimizer_state_floats();
  res.flops_per_token = flops_per_token(r.engine->desc, r.engine->whole_table.numel, cfg.model.seq_len);
  res.start_step = r.start_step;
  res.global_batch = tc.global_batch;
  res.peak_lr = tc.lr;
  res.cpu_gemm = cpu_gemm_engine(r).first;
  print_start(r, o, res);
  if (o.dry_run) return res;
  // Saves that stage their values (checkpoint.async, or a GPU) get their host memory now, so that
  // no checkpointing step waits for it to be allocated.
  if (o.write_run_dir && r.cfg.checkpoint.every > 0 && (checkpoints_behind(r) || r.on_gpu))
    r.staging.reserve(checkpoint_share_floats(r), r.on_gpu);
  if (r.start_step == 0) evaluate_and_log(r, 0, res, print);
  r.tracer.origin_ms = now_ms();
  for (int64_t step = r.start_step; step < tc.steps; step++) {
    train_step(r, step, res, o, print);
    const bool last = step + 1 == tc.steps;
    const bool epoch_end = tc.epochs > 0 && (step + 1) % r.sampler->steps_per_epoch() == 0;
    if ((tc.eval_every > 0 && (step + 1) % tc.eval_every == 0) || epoch_end || last)
      evaluate_and_log(r, step + 1, res, print);
    if (r.cfg.checkpoint.every > 0 && ((step + 1) % r.cfg.checkpoint.every == 0 || last))
      checkpoint(r, step + 1, res, o, print);
    if (preempted_here(r, step, res, o, print)) break;
  }
  r.watchdog->enter("checkpoint", tc.steps);
  if (r.pending) {  // the last one, on disk before the run reports
    const std::string last = r.pending->path;
    const double waited_s = finish_and_time(r);
    if (print) {
      std::printf("checkpoint: %s complete (the end of the run waited %.2f s for it)\n", last.c_str(), waited_s);
      std::fflush(stdout);
    }
  }
  finish_run(r, res, o);
  if (return_params) res.final_params = r.engine->whole_params_everywhere();
  // A run whose model ends with a non-finite validation loss did not succeed, whatever it skipped.
  if (!res.preempted && !res.val_losses.empty() && !std::isfinite(res.val_losses.back()))
    throw CollectiveError("the validation loss after step " + std::to_string(res.eval_steps.back()) + " is " +
                          std::to_string(res.val_losses.back()) + ": the model diverged (" +
                          std::to_string(res.skipped_steps) + " non-finite steps skipped); lower train.lr, or "
                          "resume from an earlier checkpoint with --resume");
  return res;
}

}  // namespace llmpi
