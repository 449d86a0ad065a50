// What a run shows and records (train/run.h): evaluation, the start-up lines, the per-step lines
// and metrics.jsonl, summary.json and the closing line.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "backend/cpu/gemm_auto.h"
#include "backend/cuda_ops.h"
#include "runtime/large_count.h"
#include "metrics/classification_metrics.h"
#include "runtime/clock.h"
#include "runtime/host_memory.h"
#include "train/run.h"

namespace llmpi {

// The validation split in global batches of G, in file order: batch k is samples
// [kG, min(N, (k+1)G)). A replica shares each out as evenly as it goes (the first g mod DP
// replicas take one more), so a partial last batch is evaluated too and every sample counts exactly
// once; a pipeline evaluates whole batches only. train.eval_batches > 0 evaluates only the first
// that many batches. The loss is the mean over samples (per-sample losses are token means for the
// language models); a classifier also sums a confusion matrix over the ranks: accuracy, and for
// two labels F1 of label 1 and Matthews correlation (metrics/classification_metrics.h).
EvalResult evaluate(Run& r, int64_t step) {
  r.watchdog->enter("evaluation", step);
  const int G = r.cfg.train.global_batch;
  const int64_t N = r.val_data.n_samples;
  const int64_t whole = r.engine->pipelined() ? N / G : (N + G - 1) / G;
  const int64_t batches = r.cfg.train.eval_batches > 0 ? std::min<int64_t>(r.cfg.train.eval_batches, whole) : whole;
  const bool cls = r.engine->desc.head == HeadKind::classifier;
  ConfusionMatrix cm(cls ? r.engine->desc.num_labels : 0);
  double sums[3] = {0, 0, 0};  // loss sum, its weight, rows
  for (int64_t k = 0; k < batches; k++) {
    const std::vector<int64_t> rows = r.engine->eval_rows(k * G, std::min<int64_t>(G, N - k * G));
    if (rows.empty()) continue;
    const EvalSums e = r.engine->evaluate(r.val_data.read(rows));
    sums[0] += e.loss_sum;
    sums[1] += e.loss_weight;
    sums[2] += (double)e.rows;
    for (size_t i = 0; i < e.labels.size(); i++) cm.add(e.labels[i], e.predictions[i]);
  }
  MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, r.comm);
  if (cls)  // num_labels² cells
    MPI_Allreduce(MPI_IN_PLACE, cm.counts.data(), mpi_count(cm.counts.size(), "the confusion matrix"), MPI_DOUBLE,
                  MPI_SUM, r.comm);
  EvalResult e;
  e.loss = sums[1] > 0 ? (float)(sums[0] / sums[1]) : 0.0f;
  e.counted = (int64_t)sums[2];
  if (cls) {
    e.accuracy = cm.accuracy();
    if (cm.K == 2) e.f1 = cm.f1(1), e.mcc = cm.matthews();
  }
  return e;
}

std::vector<std::pair<std::string, double>> eval_scalars(const nlohmann::json& line) {
  std::vector<std::pair<std::string, double>> v;
  for (const char* k : {"val_loss", "accuracy", "f1", "mcc"})
    if (line.contains(k) && line[k].is_number()) v.emplace_back(std::string("eval/") + k, line[k].get<double>());
  return v;
}

void evaluate_and_log(Run& r, int64_t step, TrainResult& res, bool print) {
  if (!r.has_val) return;
  const EvalResult e = evaluate(r, step);
  res.eval_steps.push_back(step);
  res.val_losses.push_back(e.loss);
  res.val_counted.push_back(e.counted);
  if (e.accuracy >= 0) res.val_accuracy.push_back(e.accuracy);
  if (e.f1 >= 0) res.val_f1.push_back(e.f1), res.val_mcc.push_back(e.mcc);
  const double epoch = (double)step / (double)r.sampler->steps_per_epoch();
  nlohmann::json line = {{"step", step}, {"epoch", epoch}, {"val_loss", e.loss}, {"examples", e.counted}};
  if (e.accuracy >= 0) line["accuracy"] = e.accuracy;
  if (e.f1 >= 0) line["f1"] = e.f1, line["mcc"] = e.mcc;
  if (r.evals) r.evals->write(line);
  if (r.tensorboard) r.tensorboard->scalars(step, eval_scalars(line));
  if (!print) return;
  std::printf("eval  step %6lld (epoch %.2f) | val_loss %.4f", (long long)step, epoch, e.loss);
  if (e.accuracy >= 0) std::printf(" | accuracy %.4f", e.accuracy);
  if (e.f1 >= 0) std::printf(" | f1 %.4f | mcc %.4f", e.f1, e.mcc);
  std::printf(" | %lld %s\n", (long long)e.counted,
              r.engine->desc.head == HeadKind::classifier ? "examples" : "windows");
  std::fflush(stdout);
}

std::pair<std::string, std::string> cpu_gemm_engine(const Run& r) {
  if (r.on_gpu) return {"", ""};
  if (r.cfg.runtime.precision == GemmPrecision::bf16)
    return {cpu_bf16_gemm_name(cpu::cpu_bf16_gemm()), cpu::cpu_bf16_gemm_description()};
  return {cpu_fp32_gemm_name(cpu::cpu_fp32_gemm()), cpu::cpu_fp32_gemm_description()};
}

namespace {

void print_device_and_model(const Run& r, const TrainResult& res) {
  const ModelDesc& d = r.engine->desc;
  const GemmPrecision p = r.cfg.runtime.precision;
  std::printf("llmpi-train: %d rank%s × %d thread%s, device %s, %s attention, GEMMs %s%s\n", r.world,
              r.world > 1 ? "s" : "", r.threads, r.threads > 1 ? "s" : "",
              r.on_gpu ? ("cuda: " + cuda_device_name()).c_str() : "cpu", attention_impl_name(d.attention),
              gemm_precision_name(p),
              p == GemmPrecision::bf16 ? " (bf16 operands, fp32 accumulation; weights, gradients, optimizer and "
                                         "other ops fp32)"
              : p == GemmPrecision::tf32 ? " (TF32 tensor-op math)" : "");
  if (r.on_gpu) std::printf("CUDA paths: %s\n", cuda_paths_description().c_str());
  if (!r.on_gpu) std::printf("%s GEMMs: %s\n", gemm_precision_name(p), cpu_gemm_engine(r).second.c_str());
  std::printf("model %s: %d layers, %d heads%s, d_model %d, ffn %d, seq_len %d, vocab %d%s: %.2fM parameters, "
              "%.1f MFLOP/token (training)\n",
              family_name(d.family), d.n_layer, d.n_head,
              d.n_kv_head != d.n_head ? (" (" + std::to_string(d.n_kv_head) + " kv)").c_str() : "", d.d_model,
              d.ffn_dim, r.cfg.model.seq_len, d.vocab_size,
              d.head == HeadKind::classifier ? (", " + std::to_string(d.num_labels) + " labels").c_str() : "",
              res.n_params / 1e6, res.flops_per_token / 1e6);
}

void print_data_and_schedule(const Run& r) {
  const TrainConfig& tc = r.cfg.train;
  const int64_t n = r.train_data.n_samples;
  std::printf("data: %s: %lld %s (%lld steps/epoch at global batch %d = %d per rank%s)%s%s\n",
              r.cfg.data.train.c_str(), (long long)n,
              r.engine->desc.head == HeadKind::classifier ? "examples" : "windows",
              (long long)r.sampler->steps_per_epoch(), tc.global_batch, r.sampler->local_batch(),
              tc.drop_last ? (n % tc.global_batch ? ", last partial batch dropped" : "")
                           : (n % tc.global_batch ? ", last step partial" : ""),
              r.has_val ? "; val " : "", r.has_val ? r.cfg.data.val.c_str() : "");
  if (tc.batch_per_rank > 0)
    std::printf("batch: train.batch_per_rank %d × %d data-parallel replica%s = global batch %d (it grows with the "
                "world size)\n", tc.batch_per_rank, r.groups->dp, r.groups->dp > 1 ? "s" : "", tc.global_batch);
  if (tc.lr_scaling != LrScaling::none) {
    const int reference = tc.lr_reference_batch > 0 ? tc.lr_reference_batch : tc.batch_per_rank;
    std::printf("lr: train.lr %.3g × %.4g (train.lr_scaling %s: global batch %d / reference batch %d%s) = peak %.4g%s\n",
                r.cfg.resolved["train"]["lr"].get<double>(), tc.lr_factor, option_name(tc.lr_scaling), tc.global_batch,
                reference, tc.lr_scaling == LrScaling::sqrt ? ", square root" : "", tc.lr,
                tc.warmup_steps > 0 ? (", reached after " + std::to_string(tc.warmup_steps) + " warm-up steps").c_str()
                                    : "");
  }
  if (tc.epochs > 0)
    std::printf("schedule: %d epoch%s = %lld steps, lr %s from %.3g%s\n", tc.epochs, tc.epochs > 1 ? "s" : "",
                (long long)tc.steps, option_name(tc.lr_schedule), tc.lr,
                tc.warmup_steps > 0 ? (" after " + std::to_string(tc.warmup_steps) + " warm-up steps").c_str() : "");
}

void print_layout(const Run& r) {
  const Engine& e = *r.engine;
  if (r.groups->tp > 1) {
    const Model& m = *e.chunks.front().model;
    std::printf("tensor parallelism: %d ranks per layer (%d of %d heads, %d of %d key/value heads, %d of %d MLP "
                "channels, vocabulary rows [%d, %d) on rank 0), %zu of %zu parameters per rank; collectives %s\n",
                r.groups->tp, m.desc.heads(), m.desc.n_head, m.desc.kv_heads(), m.desc.n_kv_head, m.desc.ffn(),
                m.desc.ffn_dim, m.desc.vocab_begin(), m.desc.vocab_end(), m.table.numel, e.whole_table.numel,
                r.ops->on_gpu() ? (r.cfg.parallel.sync == SyncMethod::nccl ? "over NCCL" : "through host memory (MPI)")
                                : "over MPI");
  }
  if (e.pipelined()) {
    std::printf("pipeline: %d stages × %d data-parallel replicas, schedule %s, %d micro-batches of %d%s; "
                "gradient sync %s%s per stage\n", r.groups->pp, r.groups->dp, schedule_kind_name(e.kind),
                e.M, e.micro_batch, e.v > 1 ? (", " + std::to_string(e.v) + " chunks per stage").c_str() : "",
                option_name(r.cfg.parallel.sync),
                r.cfg.parallel.zero ? (" with ZeRO-" + std::to_string(r.cfg.parallel.zero)).c_str() : "");
    std::printf("pipeline messages: %s\n", link_way_name(e.link->way()));
    return;
  }
  if (e.M > 1)
    std::printf("gradient accumulation: %d micro-batches of %d per step, gradients synchronised once, during the "
                "last micro-batch's backward\n", e.M, e.micro_batch);
  const GradSync& g = *e.chunks.front().sync;
  const size_t numel = e.chunks.front().model->table.numel;  // (a tensor-parallel shard's)
  const std::string method_note =
      g.opt.method == SyncMethod::weights
          ? ", parameters every " + std::to_string(g.opt.average_every) + " step(s)"
      : g.opt.zero ? std::string(g.opt.shard_params ? ", ZeRO-3" : g.opt.shard_grads ? ", ZeRO-2" : ", ZeRO-1") +
                         ": gradients reduce-scattered, parameters all-gathered, AdamW state" +
                         (g.opt.shard_params  ? ", gradient and blocks' parameters"
                          : g.opt.shard_grads ? " and gradient"
                                              : "") +
                         " for " +
                         std::to_string(e.chunks.front().opt->n) + " of " + std::to_string(numel) + " values"
                   : "";
  std::printf("sync: %s of %zu %s values (%.1f MB) in %zu bucket%s (bucket_mb %g, first %g), overlap %s%s; "
              "rank 0 sends ~%.1f MB per %s (tensors per bucket: comm_plan.json)\n",
              sync_method_name(g.opt.method), numel, g.opt.bf16 ? "bf16" : "fp32", numel * g.grad_wire_bytes() / 1e6,
              g.buckets.size(), g.buckets.size() == 1 ? "" : "s", g.opt.bucket_mb, g.opt.first_bucket_mb,
              g.opt.overlap ? "on" : "off", method_note.c_str(), g.expected_bytes_per_pass(numel) / 1e6,
              g.opt.method == SyncMethod::weights ? "average" : "step");
}

}  // namespace

void print_start(const Run& r, const TrainOptions& o, const TrainResult& res) {
  if ((r.groups->pp > 1 || r.groups->tp > 1) && o.print) print_topology(*r.groups, r.engine->describe_layers());  // collective
  if (!o.print || r.rank != 0) return;
  for (const std::string& w : keys_without_effect(r.cfg)) std::fprintf(stderr, "llmpi-train: warning: %s\n", w.c_str());
  if (r.cfg.parallel.zero && r.groups->dp == 1)  // (the layout decides this one, not the configuration alone)
    std::fprintf(stderr, "llmpi-train: warning: 'parallel.zero' has no effect with one data-parallel replica (%d "
                 "ranks = %d pipeline stages x %d tensor-parallel ranks): ZeRO shards the optimizer state over "
                 "replicas; use more ranks, or fewer stages or tensor-parallel ranks\n",
                 r.world, r.groups->pp, r.groups->tp);
  const std::string blas = r.on_gpu ? "" : cpu::openblas_core_warning();
  if (!blas.empty()) std::fprintf(stderr, "llmpi-train: warning: %s\n", blas.c_str());
  const std::string kernels = r.on_gpu ? "" : cpu::openblas_kernels_note();
  if (!kernels.empty()) std::printf("%s\n", kernels.c_str());
  print_device_and_model(r, res);
  print_data_and_schedule(r);
  print_layout(r);
  std::printf("memory per rank (estimate): %s; %s\n", r.memory.describe().c_str(), r.memory_note.c_str());
  if (!r.resumed_from.empty())
    std::printf("resumed from %s at step %lld (lineage %s)\n", r.resumed_from.c_str(), (long long)r.start_step,
                r.lineage.c_str());
  if (!r.accepted_changes.empty())
    std::printf("resume: accepted changes (--resume-override): %s\n", describe_changes(r.accepted_changes).c_str());
  if (o.resume == "auto" && r.resumed_from.empty())
    std::printf("no checkpoint in %s: starting at step 0\n", r.ckpt_dir.c_str());
  if (o.write_run_dir && !o.dry_run) std::printf("run dir: %s\n", r.cfg.run.dir.c_str());
  if (o.dry_run)
    std::printf("dry run: configuration, data, world size%s are valid; %lld steps would run\n",
                r.resumed_from.empty() ? "" : " and checkpoint",
                (long long)std::max<int64_t>(0, r.cfg.train.steps - r.start_step));
  std::fflush(stdout);
}

void log_step(Run& r, const StepLog& s, const StepResult& st, const TrainResult& res, bool print) {
  const TrainConfig& tc = r.cfg.train;
  const bool last = s.step + 1 == tc.steps;
  const bool overridden = s.step == r.start_step && !r.accepted_changes.empty();  // logged with the first step
  // The first five steps are always shown (the losses of the first minibatches).
  if (!(s.step % tc.log_every == 0 || s.step < 5 || last || s.skipped || overridden)) return;
  std::vector<double> recent(res.step_ms.begin() + (res.step_ms.size() > 1 ? 1 : 0), res.step_ms.end());
  const double tok_s = s.tokens / (s.step_ms / 1000.0);
  const SyncStats& c = st.sync;
  if (r.metrics) {
    nlohmann::json line = {{"step", s.step}, {"epoch", r.sampler->epoch_of(s.step)}, {"loss", s.loss}, {"lr", s.lr},
                           {"tokens_per_s", tok_s}, {"step_ms", s.step_ms}, {"data_ms", s.data_ms},
                           {"forward_ms", st.forward_ms}, {"backward_ms", st.backward_ms}, {"comm_ms", c.comm_ms},
                           {"exposed_comm_ms", c.exposed_comm_ms}, {"optim_ms", s.optim_ms},
                           {"bytes_communicated", c.bytes_sent + c.bytes_received},
                           {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received},
                           {"collectives", c.collectives}, {"grad_norm", s.grad_norm}, {"skipped", s.skipped}};
    if (r.engine->pipelined()) line["pipeline_wait_ms"] = st.wait_ms;
    if (overridden)
      for (const ContractRow& row : r.accepted_changes)
        line["resume_overrides"].push_back({{"key", row.key}, {"checkpoint", row.was}, {"now", row.now}});
    r.metrics->write(line);
  }
  if (r.tensorboard)
    r.tensorboard->scalars(s.step, {{"train/loss", s.loss},
                                    {"train/learning_rate", s.lr},
                                    {"train/grad_norm", s.grad_norm},
                                    {"perf/tokens_per_s", tok_s},
                                    {"perf/step_ms", s.step_ms},
                                    {"perf/model_tflops_per_rank", tok_s * res.flops_per_token / r.world / 1e12},
                                    {"memory/peak_rss_mb", peak_rss_bytes() / 1e6}});
  if (!print) return;
  std::printf("step %6lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | %6.1f ms/step | ETA %s\n",
              (long long)s.step, (long long)tc.steps, s.loss, s.lr, tok_s, s.step_ms,
              format_duration(median(recent) / 1000.0 * (double)(tc.steps - s.step - 1)).c_str());
  std::fflush(stdout);
}

void finish_run(Run& r, TrainResult& res, const TrainOptions& o) {
  const TrainConfig& tc = r.cfg.train;
  const bool print = o.print && r.rank == 0;
  const double tokens_per_full_step = (double)tc.global_batch * r.cfg.model.seq_len;
  // The median step after the first (which allocates and warms up), when there is one.
  const std::vector<double> after_first(res.step_ms.begin() + (res.step_ms.size() > 1 ? 1 : 0), res.step_ms.end());
  const double median_step_ms = after_first.empty() ? 0 : median(after_first);
  if (res.step_ms.size() > 1) res.tokens_per_s_median = tokens_per_full_step / (median_step_ms / 1000.0);
  // Peak resident memory: every rank's, on rank 0 (what llmpi-plan predicts); the smallest and
  // largest are printed.
  res.peak_rss_bytes = peak_rss_bytes();
  std::vector<double> rss_all(r.world, res.peak_rss_bytes);
  if (r.world > 1) MPI_Gather(&res.peak_rss_bytes, 1, MPI_DOUBLE, rss_all.data(), 1, MPI_DOUBLE, 0, r.comm);
  const double rss_lo = *std::min_element(rss_all.begin(), rss_all.end());
  const double rss_hi = *std::max_element(rss_all.begin(), rss_all.end());
  if (r.rank == 0 && o.write_run_dir && !res.losses.empty()) {
    // summary.json: what a run measured, for tools (llmpi-plan's check compares its projection).
    const MemoryEstimate& m = r.memory;
    nlohmann::json cuda_paths_json = nlohmann::json::array();
    if (r.on_gpu)
      for (const CudaPath& c : cuda_paths())
        cuda_paths_json.push_back({{"name", c.name}, {"on", c.on}, {"why_off", c.why_off}});
    const nlohmann::json summary = {
        {"steps_run", res.losses.size()}, {"start_step", r.start_step}, {"median_step_ms", median_step_ms},
        {"tokens_per_s_median", res.tokens_per_s_median}, {"peak_rss_bytes_per_rank", rss_all},
        {"world_size", r.world}, {"n_params", res.n_params},
        {"gemm_precision", gemm_precision_name(r.cfg.runtime.precision)},
        {"cpu_gemm_engine", cpu_gemm_engine(r).first}, {"cpu_gemm", cpu_gemm_engine(r).second},
        {"openblas_core", r.on_gpu ? std::string() : std::string(openblas_get_corename())},
        {"microbatches", r.cfg.parallel.microbatches}, {"rss_before_model_bytes_rank0", r.rss_before_model},
        {"memory_estimate_bytes_rank0", m.host_bytes()},
        {"memory_estimate_rank0", {{"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer},
                                   {"activations", m.activations}, {"scratch", m.scratch},
                                   {"sync_buffers", m.sync_buffers}, {"nccl_buffers", m.nccl_buffers},
                                   {"checkpoint_staging", m.checkpoint_staging},
                                   {"data", m.data}}},
        {"checkpoints_written", !res.last_checkpoint.empty()},
        {"grad_device_pages_peak_bytes", r.engine->grad_pages_peak()},
        {"param_device_pages_peak_bytes", r.engine->param_pages_peak()},
        {"optimizer_state_floats_rank0", res.optimizer_state_floats},
        {"cuda_paths", cuda_paths_json}};
    write_file_atomic(r.cfg.run.dir + "/summary.json", summary.dump(1) + "\n");
  }
  if (print && !res.losses.empty() && !res.preempted) {
    const bool diverged = !res.val_losses.empty() && !std::isfinite(res.val_losses.back());
    std::printf("%s: %lld steps", diverged ? "failed" : "done", (long long)tc.steps);
    std::printf(", median %.0f tokens/s, train loss %.4f -> %.4f", res.tokens_per_s_median, res.losses.front(),
                res.losses.back());
    if (res.val_losses.size() >= 2) std::printf(", val loss %.4f -> %.4f", res.val_losses.front(), res.val_losses.back());
    if (res.skipped_steps) std::printf(", %lld non-finite steps skipped", (long long)res.skipped_steps);
    if (rss_hi > 0)
      std::printf(", peak RSS per rank %s%s", format_bytes(rss_lo).c_str(),
                  rss_hi > rss_lo * 1.005 ? (" – " + format_bytes(rss_hi)).c_str() : "");
    std::printf("\n");
    std::fflush(stdout);
  }
  if (o.write_run_dir && r.cfg.runtime.trace_steps > 0)
    r.tracer.write(r.cfg.run.dir + "/trace-rank" + std::to_string(r.rank) + ".json");
}

}  // namespace llmpi
