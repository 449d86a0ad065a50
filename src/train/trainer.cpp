#include "train/trainer.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "backend/ops.h"
#include "comm/grad_sync.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "metrics/metrics.h"
#include "metrics/trace.h"
#include "model/gpt2.h"
#include "optim/optimizer.h"
#include "runtime/mpi_env.h"

namespace llmpi {

namespace {

// mkdir -p
void make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); i++) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        fail("cannot create run directory '", path, "' (at '", cur, "'): ", std::strerror(errno),
             "; choose a writable run.dir");
    }
    if (i < path.size()) cur += path[i];
  }
}

int default_threads(int local_ranks) {
  cpu_set_t set;
  int cores = 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  return std::max(1, cores / std::max(1, local_ranks));
}

// Reads the windows a batch needs: inputs = tokens [w*T, w*T+T), targets shifted by one.
struct BatchReader {
  TokenReader file;
  int T;
  std::vector<int32_t> window, inputs, targets;
  void read(const std::vector<int64_t>& windows) {
    const size_t B = windows.size();
    inputs.resize(B * T);
    targets.resize(B * T);
    window.resize(T + 1);
    for (size_t b = 0; b < B; b++) {
      file.read(windows[b] * (int64_t)T, T + 1, window.data());
      std::copy(window.begin(), window.begin() + T, inputs.begin() + b * T);
      std::copy(window.begin() + 1, window.end(), targets.begin() + b * T);
    }
  }
};

// Everything a run holds, built by setup() on every rank.
struct Run {
  Config cfg;
  MPI_Comm comm;
  int rank = 0, world = 1, threads = 1;
  const Ops* ops = nullptr;
  BatchReader train_data, val_data;
  bool has_val = false;
  int64_t train_windows = 0, val_windows = 0;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Gpt2> model;
  std::unique_ptr<Optimizer> opt;
  Tracer tracer;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<JsonlWriter> metrics, evals;
};

// What the sync method exchanges, bucket by bucket: written once to run_dir/comm_plan.json.
nlohmann::json comm_plan(const Run& r) {
  const GradSync& g = *r.sync;
  const ParamTable& t = r.model->table;
  nlohmann::json buckets = nlohmann::json::array();
  for (const Bucket& b : g.buckets) {
    nlohmann::json tensors = nlohmann::json::array();
    for (size_t i = b.first_slice; i <= b.last_slice; i++)
      tensors.push_back({{"name", t.slices[i].name}, {"shape", t.slices[i].shape}, {"dtype", "float32"}});
    buckets.push_back({{"offset", b.begin}, {"floats", b.end - b.begin}, {"bytes", (b.end - b.begin) * 4},
                       {"tensors", tensors}});
  }
  return {{"method", sync_method_name(g.opt.method)}, {"world_size", r.world}, {"bucket_mb", g.opt.bucket_mb},
          {"first_bucket_mb", g.opt.first_bucket_mb}, {"overlap", g.opt.overlap}, {"poll_us", g.opt.poll_us},
          {"average_every", g.opt.average_every}, {"dtype", "float32"}, {"total_floats", t.numel},
          {"expected_bytes_sent_per_pass_rank0", g.expected_bytes_per_pass(t.numel)}, {"buckets", buckets}};
}

void setup(Run& r, const Config& cfg, MPI_Comm comm, const TrainOptions& o) {
  r.cfg = cfg;
  r.comm = comm;
  MPI_Comm_rank(comm, &r.rank);
  MPI_Comm_size(comm, &r.world);

  // Device: only the CPU backend exists in this build so far.
  if (cfg.runtime.device == "cuda")
    fail("runtime.device is \"cuda\" but this build has no CUDA backend yet; use \"cpu\" or \"auto\"");
  r.ops = &cpu_ops();

  // Threads per rank.
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, r.rank, MPI_INFO_NULL, &node);
  int local_size = 1;
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  r.threads = cfg.runtime.threads > 0 ? cfg.runtime.threads : default_threads(local_size);
  omp_set_num_threads(r.threads);
  openblas_set_num_threads(r.threads);

  // Data.
  const int T = cfg.model.seq_len;
  r.train_data.T = T;
  r.train_data.file.open(cfg.data.train);
  const int64_t file_vocab = r.train_data.file.info().vocab_size;
  int vocab = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : (int)file_vocab;
  if (file_vocab > vocab)
    fail("model.vocab_size is ", vocab, " but '", cfg.data.train, "' was tokenized with a vocabulary of ",
         file_vocab, ": set model.vocab_size >= ", file_vocab, " (or 0 to take it from the file)");
  r.train_windows = (r.train_data.file.n_tokens() - 1) / T;
  if (r.train_windows < 1)
    fail("model.seq_len (", T, ") is longer than the data in '", cfg.data.train, "' (",
         r.train_data.file.n_tokens(), " tokens): use a shorter seq_len or more data");
  r.sampler = std::make_unique<Sampler>(r.train_windows, cfg.train.global_batch, r.world, r.rank, cfg.train.seed);
  if (!cfg.data.val.empty()) {
    r.has_val = true;
    r.val_data.T = T;
    r.val_data.file.open(cfg.data.val);
    if (r.val_data.file.info().vocab_size > vocab)
      fail("'", cfg.data.val, "' has vocabulary ", r.val_data.file.info().vocab_size,
           " but the model has ", vocab, ": make train and val files with the same tokenizer");
    r.val_windows = (r.val_data.file.n_tokens() - 1) / T;
    if (r.val_windows < cfg.train.global_batch)
      fail("'", cfg.data.val, "' holds ", r.val_windows, " windows of seq_len+1 tokens, fewer than one global batch (",
           cfg.train.global_batch, "): use a larger validation split (llmpi-prep --val-fraction) or a smaller batch");
  }

  // Model and optimizer.
  ModelShape shape{cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model, T, vocab};
  r.model = std::make_unique<Gpt2>(shape, *r.ops);
  r.model->init_params(cfg.train.seed, cfg.model.init_std);
  r.opt = std::make_unique<Optimizer>(*r.ops, r.model->table.numel, cfg.train.optimizer);
  SyncOptions so;
  so.method = parse_sync_method(cfg.parallel.sync);
  so.bucket_mb = cfg.parallel.bucket_mb;
  so.first_bucket_mb = cfg.parallel.first_bucket_mb;
  so.overlap = cfg.parallel.overlap;
  so.poll_us = cfg.parallel.poll_us;
  so.average_every = cfg.parallel.average_every;
  r.tracer.rank = r.rank;
  r.sync = std::make_unique<GradSync>(so, comm, r.model->grads, r.model->table, &r.tracer);

  // Run directory (rank 0 writes).
  if (r.rank == 0 && o.write_run_dir) {
    make_dirs(cfg.run.dir);
    nlohmann::json resolved = cfg.resolved;
    resolved["model"]["vocab_size"] = vocab;
    write_file_atomic(cfg.run.dir + "/config.json", resolved.dump(2) + "\n");
    r.metrics = std::make_unique<JsonlWriter>(cfg.run.dir + "/metrics.jsonl");
    r.evals = std::make_unique<JsonlWriter>(cfg.run.dir + "/eval.jsonl");
    write_file_atomic(cfg.run.dir + "/comm_plan.json", comm_plan(r).dump(1) + "\n");
  }
}

// Mean loss over the validation batches, averaged over ranks.
float evaluate(Run& r) {
  const int G = r.cfg.train.global_batch, lb = G / r.world, T = r.cfg.model.seq_len;
  int64_t batches = std::min<int64_t>(r.cfg.train.eval_batches, r.val_windows / G);
  double sum = 0;
  for (int64_t k = 0; k < batches; k++) {
    std::vector<int64_t> w(lb);
    for (int i = 0; i < lb; i++) w[i] = k * G + (int64_t)r.rank * lb + i;
    r.val_data.read(w);
    sum += r.model->forward(r.val_data.inputs.data(), r.val_data.targets.data(), lb, T, false);
  }
  double total = 0;
  MPI_Allreduce(&sum, &total, 1, MPI_DOUBLE, MPI_SUM, r.comm);
  return (float)(total / ((double)batches * r.world));
}

}  // namespace

TrainResult train(const Config& cfg, MPI_Comm comm, const TrainOptions& o, bool return_params) {
  Run r;
  std::string err;
  try {
    setup(r, cfg, comm, o);
  } catch (const Error& e) {
    err = e.what();
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw StartupError(err);

  const TrainConfig& tc = cfg.train;
  const int T = cfg.model.seq_len, lb = r.sampler->local_batch();
  const bool print = o.print && r.rank == 0;
  Gpt2& model = *r.model;
  TrainResult res;
  res.n_params = (int64_t)model.table.numel;
  res.flops_per_token = gpt2_flops_per_token(model.shape, T);
  const double tokens_per_step = (double)tc.global_batch * T;

  if (print) {
    std::printf("llmpi-train: %d rank%s × %d thread%s, device cpu\n", r.world, r.world > 1 ? "s" : "",
                r.threads, r.threads > 1 ? "s" : "");
    std::printf("model gpt2: %d layers, %d heads, d_model %d, seq_len %d, vocab %d: %.2fM parameters, "
                "%.1f MFLOP/token (training)\n",
                cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model, T, model.shape.vocab_size,
                res.n_params / 1e6, res.flops_per_token / 1e6);
    std::printf("data: %s: %lld windows (%lld steps/epoch at global batch %d = %d per rank)%s%s\n",
                cfg.data.train.c_str(), (long long)r.train_windows, (long long)r.sampler->steps_per_epoch(),
                tc.global_batch, lb, r.has_val ? "; val " : "", r.has_val ? cfg.data.val.c_str() : "");
    const GradSync& g = *r.sync;
    std::printf("sync: %s of %zu fp32 values (%.1f MB) in %zu bucket%s (bucket_mb %g, first %g), overlap %s%s; "
                "rank 0 sends ~%.1f MB per %s (tensors per bucket: comm_plan.json)\n",
                sync_method_name(g.opt.method), model.table.numel, model.table.numel * 4 / 1e6, g.buckets.size(),
                g.buckets.size() == 1 ? "" : "s", g.opt.bucket_mb, g.opt.first_bucket_mb,
                g.opt.overlap ? "on" : "off",
                g.opt.method == SyncMethod::weights ? (", parameters every " + std::to_string(g.opt.average_every) +
                                                       " step(s)").c_str() : "",
                g.expected_bytes_per_pass(model.table.numel) / 1e6,
                g.opt.method == SyncMethod::weights ? "average" : "step");
    if (o.write_run_dir) std::printf("run dir: %s\n", cfg.run.dir.c_str());
    std::fflush(stdout);
  }

  auto do_eval = [&](int64_t step) {
    if (!r.has_val) return;
    float vl = evaluate(r);
    res.eval_steps.push_back(step);
    res.val_losses.push_back(vl);
    if (r.evals) r.evals->write({{"step", step}, {"val_loss", vl}});
    if (print) {
      std::printf("eval  step %6lld | val_loss %.4f\n", (long long)step, vl);
      std::fflush(stdout);
    }
  };
  do_eval(0);

  r.tracer.origin_ms = now_ms();
  for (int64_t step = 0; step < tc.steps; step++) {
    r.tracer.enabled = o.write_run_dir && step < cfg.runtime.trace_steps;
    const double t0 = now_ms();
    r.train_data.read(r.sampler->windows(step));
    const double t1 = now_ms();
    model.zero_grads();
    float local_loss = model.forward(r.train_data.inputs.data(), r.train_data.targets.data(), lb, T, true);
    const double t2 = now_ms();
    r.sync->begin_step();
    model.backward([&](size_t k) { r.sync->on_ready(k); });
    const double t3 = now_ms();
    r.sync->finish();  // gradient methods: every rank now holds the averaged gradient
    const double t4 = now_ms();
    float loss = local_loss;
    if (r.world > 1) {
      MPI_Allreduce(&local_loss, &loss, 1, MPI_FLOAT, MPI_SUM, comm);
      loss /= (float)r.world;
    }
    // With "weights" the gradient (and so its norm and clipping) is this rank's own.
    const double grad_norm = clip_grad_norm(*r.ops, model.grads, model.table.numel, tc.grad_clip);
    const double lr = lr_at(tc, step);
    r.opt->step(model.params, model.grads, model.table, lr, tc);
    const double t5 = now_ms();
    r.sync->average_params(model.params, step);  // "weights" only, every average_every steps
    const double t6 = now_ms();

    if (r.tracer.enabled) {
      const std::string args = "{\"step\":" + std::to_string(step) + "}";
      r.tracer.span("data", 0, t0, t1, args);
      r.tracer.span("forward", 0, t1, t2, args);
      r.tracer.span("backward", 0, t2, t3, args);
      r.tracer.span("optimizer", 0, t4, t5, args);
    }
    const double step_ms = t6 - t0;
    res.losses.push_back(loss);
    res.step_ms.push_back(step_ms);
    if (!std::isfinite(loss)) fail("training loss became ", loss, " at step ", step, ": lower train.lr or check the data");

    const bool last = step + 1 == tc.steps;
    if (step % tc.log_every == 0 || last) {
      std::vector<double> recent(res.step_ms.begin() + (res.step_ms.size() > 1 ? 1 : 0), res.step_ms.end());
      double med_ms = median(recent);
      double tok_s = tokens_per_step / (step_ms / 1000.0);
      const SyncStats& s = r.sync->step;
      if (r.metrics)
        r.metrics->write({{"step", step}, {"epoch", r.sampler->epoch_of(step)}, {"loss", loss}, {"lr", lr},
                          {"tokens_per_s", tok_s}, {"step_ms", step_ms}, {"data_ms", t1 - t0},
                          {"forward_ms", t2 - t1}, {"backward_ms", t3 - t2}, {"comm_ms", s.comm_ms},
                          {"exposed_comm_ms", s.exposed_comm_ms}, {"optim_ms", t5 - t4},
                          {"bytes_communicated", s.bytes_sent + s.bytes_received},
                          {"bytes_sent", s.bytes_sent}, {"bytes_received", s.bytes_received},
                          {"collectives", s.collectives}, {"grad_norm", grad_norm}});
      if (print) {
        std::printf("step %6lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | %6.1f ms/step | ETA %s\n",
                    (long long)step, (long long)tc.steps, loss, lr, tok_s, step_ms,
                    format_duration(med_ms / 1000.0 * (double)(tc.steps - step - 1)).c_str());
        std::fflush(stdout);
      }
    }
    if ((tc.eval_every > 0 && (step + 1) % tc.eval_every == 0) || last) do_eval(step + 1);
  }

  if (res.step_ms.size() > 1) {
    std::vector<double> after_first(res.step_ms.begin() + 1, res.step_ms.end());
    res.tokens_per_s_median = tokens_per_step / (median(after_first) / 1000.0);
  }
  if (print && tc.steps > 0) {
    std::printf("done: %lld steps, median %.0f tokens/s, train loss %.4f -> %.4f", (long long)tc.steps,
                res.tokens_per_s_median, res.losses.front(), res.losses.back());
    if (res.val_losses.size() >= 2)
      std::printf(", val loss %.4f -> %.4f", res.val_losses.front(), res.val_losses.back());
    std::printf("\n");
    std::fflush(stdout);
  }
  if (o.write_run_dir && cfg.runtime.trace_steps > 0)
    r.tracer.write(cfg.run.dir + "/trace-rank" + std::to_string(r.rank) + ".json");
  if (return_params) {
    res.final_params.resize(model.table.numel);
    r.ops->copy_to_host(res.final_params.data(), model.params, model.table.numel * sizeof(float));
  }
  return res;
}

}  // namespace llmpi
