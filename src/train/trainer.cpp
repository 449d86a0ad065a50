#include "train/trainer.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>

#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "comm/grad_sync.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "metrics/metrics.h"
#include "metrics/trace.h"
#include "data/classification_file.h"
#include "model/transformer.h"
#include "checkpoint/checkpoint.h"
#include "optim/optimizer.h"
#include "runtime/mpi_env.h"
#include "runtime/signals.h"
#include "runtime/watchdog.h"

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

// One split of the data (train or val) and the batches read from it. Language modelling: sample
// w is the window of seq_len + 1 tokens at w * seq_len (inputs, and targets shifted by one).
// Classification (bert): sample i is example i of a classification file.
struct DataSplit {
  bool classification = false;
  int T = 0;
  TokenReader tokens_file;
  ClassificationReader examples_file;
  int64_t n_samples = 0;
  std::vector<int32_t> window, inputs, targets, types, mask, labels;
  ClassificationExamples ex;

  void open(const std::string& path, const std::string& family, bool cls, int seq_len) {
    classification = cls;
    T = seq_len;
    const std::string format = hdf5_format_of(path);
    if (cls) {
      if (format == kTokenFileFormat)
        fail("'", path, "' is a language-modelling token file, but model.family bert trains a classifier on a "
             "classification file (input_ids, token_type_ids, attention_mask, labels): make one with "
             "`llmpi-prep glue`, or choose model.family gpt2 or llama");
      examples_file.open(path);
      if (examples_file.info().seq_len != T)
        fail("'", path, "' holds sequences of ", examples_file.info().seq_len, " tokens but model.seq_len is ", T,
             ": set model.seq_len to ", examples_file.info().seq_len);
      n_samples = examples_file.info().n_examples;
    } else {
      if (format == "llmpi-classification")
        fail("'", path, "' is a classification file, but model.family ", "gpt2/llama", " trains a language model on "
             "a token file made by `llmpi-prep`: choose model.family bert, or give a token file");
      tokens_file.open(path);
      n_samples = (tokens_file.n_tokens() - 1) / T;
    }
  }
  int64_t vocab_size() const {
    return classification ? examples_file.info().vocab_size : tokens_file.info().vocab_size;
  }
  Batch read(const std::vector<int64_t>& ids) {
    const size_t B = ids.size();
    Batch b;
    b.B = static_cast<int>(B);
    b.T = T;
    if (classification) {
      examples_file.read(ids, ex);
      b.tokens = ex.input_ids.data();
      b.token_types = ex.token_type_ids.data();
      b.attn_mask = ex.attention_mask.data();
      b.labels = ex.labels.data();
      return b;
    }
    inputs.resize(B * T);
    targets.resize(B * T);
    window.resize(T + 1);
    for (size_t i = 0; i < B; i++) {
      tokens_file.read(ids[i] * (int64_t)T, T + 1, window.data());
      std::copy(window.begin(), window.begin() + T, inputs.begin() + i * T);
      std::copy(window.begin() + 1, window.end(), targets.begin() + i * T);
    }
    b.tokens = inputs.data();
    b.targets = targets.data();
    return b;
  }
};

// Everything a run holds, built by setup() on every rank.
struct Run {
  Config cfg;
  MPI_Comm comm;
  int rank = 0, world = 1, threads = 1;
  const Ops* ops = nullptr;
  DataSplit train_data, val_data;
  bool has_val = false;
  int64_t train_windows = 0, val_windows = 0;  // samples: windows (LM) or examples (classification)
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Model> model;
  std::unique_ptr<Activations> acts;
  std::unique_ptr<Optimizer> opt;
  Tracer tracer;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<JsonlWriter> metrics, evals;
  std::unique_ptr<Watchdog> watchdog;
  bool on_gpu = false;
  std::string ckpt_dir;
  int64_t start_step = 0;
  std::string resumed_from;  // checkpoint path, "" when starting fresh
};

// Keep only the lines of a JSON Lines file whose "step" passes `keep` (a resumed run drops what
// the interrupted run logged after its last checkpoint, so each step appears once).
void trim_jsonl(const std::string& path, const std::function<bool(int64_t)>& keep) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, out;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step") && keep(j["step"].get<int64_t>())) out += line + "\n";
  }
  write_file_atomic(path, out);
}

// Restore parameters, optimizer moments and the step from a checkpoint, after checking that it
// belongs to this model and configuration.
void resume_from(Run& r, const std::string& path) {
  CheckpointInfo info = read_checkpoint_info(path);
  const ModelDesc& m = r.model->desc;
  if (info.desc.family != m.family)
    fail("checkpoint '", path, "' holds a ", family_name(info.desc.family), " model, but this configuration has "
         "model.family \"", family_name(m.family), "\": resume it with model.family \"",
         family_name(info.desc.family), "\", or start a new run.dir");
  // Everything that shapes the parameters or the function must agree; dropout and init_std may change.
  nlohmann::json theirs = model_desc_json(info.desc), ours = model_desc_json(m);
  for (const char* k : {"init_std", "dropout", "attn_dropout"}) theirs.erase(k), ours.erase(k);
  std::string first, also;
  for (auto& [k, v] : ours.items()) {
    if (theirs[k] == v) continue;
    const std::string key = "model." + (k == "max_seq_len" ? std::string("seq_len") : k);
    if (first.empty())
      first = key + " " + theirs[k].dump() + ", but this configuration has " + v.dump();
    else
      also += (also.empty() ? "" : ", ") + key + " " + theirs[k].dump() + " vs " + v.dump();
  }
  if (!first.empty())
    fail("checkpoint '", path, "' was made for ", first, also.empty() ? "" : " (also: " + also + ")",
         ": resume with the configuration the checkpoint was made with (stored in it, and in the run's "
         "config.json), or start a new run.dir");
  if (info.param_table_json != param_table_json(r.model->table) || info.n != r.model->table.numel)
    fail("checkpoint '", path, "' holds a different parameter layout than this model; start a new run.dir");
  if (info.optimizer != r.cfg.train.optimizer)
    fail("checkpoint '", path, "' was made with train.optimizer \"", info.optimizer, "\", but this configuration has \"",
         r.cfg.train.optimizer, "\": use the same optimizer to resume");
  if (info.rows > 1 && (r.cfg.parallel.sync != "weights" || info.rows != r.world))
    fail("checkpoint '", path, "' holds the separate parameters of ", info.rows, " ranks (sync \"weights\"): resume it "
         "with parallel.sync \"weights\" on ", info.rows, " ranks");
  const size_t n = info.n;
  std::vector<float> params(n), mom(r.opt->sgd ? 0 : n), vel(r.opt->sgd ? 0 : n);
  read_checkpoint_row(info, info.rows > 1 ? r.rank : 0, params.data(), r.opt->sgd ? nullptr : mom.data(),
                      r.opt->sgd ? nullptr : vel.data());
  r.ops->copy_to_device(r.model->params, params.data(), n * sizeof(float));
  if (!r.opt->sgd) {
    r.ops->copy_to_device(r.opt->m, mom.data(), n * sizeof(float));
    r.ops->copy_to_device(r.opt->v, vel.data(), n * sizeof(float));
  }
  r.opt->t = info.optimizer_t;
  r.start_step = info.step;
  r.resumed_from = path;
}

// Write a checkpoint of the state after `steps_done` steps. Collective: with sync "weights" every
// rank's parameters are gathered into one file. Rank 0 writes; its success or failure is agreed
// so every rank continues or stops together. Returns the path.
std::string save_checkpoint(Run& r, int64_t steps_done) {
  const size_t n = r.model->table.numel;
  const bool per_rank = r.sync->opt.method == SyncMethod::weights && r.world > 1;
  const int rows = per_rank ? r.world : 1;
  CheckpointData d;
  CheckpointInfo& i = d.info;
  i.step = steps_done;
  i.optimizer_t = r.opt->t;
  i.optimizer = r.cfg.train.optimizer;
  i.sync = r.cfg.parallel.sync;
  i.world_size = r.world;
  i.rows = rows;
  i.seed = r.cfg.train.seed;
  i.desc = r.model->desc;
  i.n = n;
  i.config_json = r.cfg.resolved.dump();
  i.param_table_json = param_table_json(r.model->table);
  // Host copies of this rank's state, gathered to rank 0 when every rank's row is needed.
  auto collect = [&](const float* src, std::vector<float>& out) {
    std::vector<float> mine(n);
    r.ops->copy_to_host(mine.data(), src, n * sizeof(float));
    if (!per_rank) {
      out = std::move(mine);
      return;
    }
    if (r.rank == 0) out.resize(n * rows);
    MPI_Gather(mine.data(), (int)n, MPI_FLOAT, r.rank == 0 ? out.data() : nullptr, (int)n, MPI_FLOAT, 0, r.comm);
  };
  collect(r.model->params, d.params);
  if (!r.opt->sgd) {
    collect(r.opt->m, d.m);
    collect(r.opt->v, d.v);
  }
  const std::string path = checkpoint_path(r.ckpt_dir, steps_done);
  std::string err;
  if (r.rank == 0) {
    try {
      make_dirs(r.ckpt_dir);
      write_checkpoint(path, d);
      prune_checkpoints(r.ckpt_dir, r.cfg.checkpoint.keep);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  err = agree_on_error(r.comm, err);
  if (!err.empty()) throw CollectiveError(err);
  return path;
}

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
  if (o.resume == "auto" && !o.write_run_dir) fail("--resume auto needs a run directory");
  r.cfg = cfg;
  r.comm = comm;
  MPI_Comm_rank(comm, &r.rank);
  MPI_Comm_size(comm, &r.world);

  // Node-local rank and size: threads per rank, GPU binding.
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, r.rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  // Device. Every rank learns whether every rank has a usable GPU before anyone can fail, so all
  // ranks take the same decision (and none is left waiting in a collective).
  std::string why;
  int have_gpu = cuda_available(&why) ? 1 : 0, all_gpu = have_gpu, first_without = r.world;
  int mine = have_gpu ? r.world : r.rank;
  MPI_Allreduce(&have_gpu, &all_gpu, 1, MPI_INT, MPI_MIN, comm);
  MPI_Allreduce(&mine, &first_without, 1, MPI_INT, MPI_MIN, comm);
  const bool use_cuda = cfg.runtime.device == "cuda" || (cfg.runtime.device == "auto" && all_gpu);
  if (use_cuda && !all_gpu)
    fail("runtime.device is \"cuda\" but rank ", first_without, " has no usable GPU",
         r.rank == first_without ? ": " + why : std::string(), "; use runtime.device \"cpu\" or \"auto\"");
  if (use_cuda) {
    cuda_bind_device(local_rank);  // GPU = local rank mod device count
    r.ops = &cuda_ops();
    r.on_gpu = true;
  } else {
    r.ops = &cpu_ops();
  }

  r.threads = cfg.runtime.threads > 0 ? cfg.runtime.threads : default_threads(local_size);
  // OpenBLAS's count is what the dense layers may use; they run their GEMMs on OpenMP's threads,
  // each an OpenBLAS call on one thread (backend/cpu/matmul.cpp), so the two pools never compete.
  omp_set_num_threads(r.threads);
  openblas_set_num_threads(r.threads);

  // Data.
  const int T = cfg.model.seq_len;
  const bool cls = parse_family(cfg.model.family) == Family::bert;
  r.train_data.open(cfg.data.train, cfg.model.family, cls, T);
  const int64_t file_vocab = r.train_data.vocab_size();
  int vocab = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : (int)file_vocab;
  if (file_vocab > vocab)
    fail("model.vocab_size is ", vocab, " but '", cfg.data.train, "' was tokenized with a vocabulary of ",
         file_vocab, ": set model.vocab_size >= ", file_vocab, " (or 0 to take it from the file)");
  r.train_windows = r.train_data.n_samples;
  if (r.train_windows < 1)
    fail("model.seq_len (", T, ") is longer than the data in '", cfg.data.train, "': use a shorter seq_len or more data");
  if (cls && r.train_data.examples_file.info().num_labels > cfg.model.num_labels)
    fail("'", cfg.data.train, "' has ", r.train_data.examples_file.info().num_labels, " labels but model.num_labels is ",
         cfg.model.num_labels, ": set model.num_labels to ", r.train_data.examples_file.info().num_labels);
  r.sampler = std::make_unique<Sampler>(r.train_windows, cfg.train.global_batch, r.world, r.rank, cfg.train.seed);
  if (!cfg.data.val.empty()) {
    r.has_val = true;
    r.val_data.open(cfg.data.val, cfg.model.family, cls, T);
    if (r.val_data.vocab_size() > vocab)
      fail("'", cfg.data.val, "' has vocabulary ", r.val_data.vocab_size(), " but the model has ", vocab,
           ": make train and val files with the same tokenizer");
    r.val_windows = r.val_data.n_samples;
    if (r.val_windows < cfg.train.global_batch)
      fail("'", cfg.data.val, "' holds ", r.val_windows, cls ? " examples" : " windows of seq_len+1 tokens",
           ", fewer than one global batch (", cfg.train.global_batch,
           "): use a larger validation split (llmpi-prep --val-fraction) or a smaller batch");
  }

  // Model and optimizer.
  const ModelDesc desc = model_desc_from_config(cfg.model, vocab);
  r.model = std::make_unique<Model>(desc, *r.ops);
  r.model->init_params(cfg.train.seed);
  r.acts = std::make_unique<Activations>(*r.model, r.sampler->local_batch(), T);
  r.opt = std::make_unique<Optimizer>(*r.ops, r.model->table.numel, cfg.train.optimizer);
  SyncOptions so;
  so.method = parse_sync_method(cfg.parallel.sync);
  so.bucket_mb = cfg.parallel.bucket_mb;
  so.first_bucket_mb = cfg.parallel.first_bucket_mb;
  so.overlap = cfg.parallel.overlap;
  so.poll_us = cfg.parallel.poll_us;
  so.average_every = cfg.parallel.average_every;
  r.tracer.rank = r.rank;
  r.sync = std::make_unique<GradSync>(so, comm, *r.ops, r.model->grads, r.model->table, &r.tracer);

  // Resume: every rank reads its state (a shared file system, as for the data).
  r.ckpt_dir = cfg.run.dir + "/checkpoints";
  if (!o.resume.empty()) {
    const std::string path = o.resume == "auto" ? latest_checkpoint(r.ckpt_dir) : o.resume;
    if (!path.empty()) resume_from(r, path);
  }
  r.watchdog = std::make_unique<Watchdog>(cfg.runtime.step_timeout_s);

  // Run directory (rank 0 writes). A resumed run appends to the logs, minus what the interrupted
  // run logged after its checkpoint.
  if (r.rank == 0 && o.write_run_dir && !o.dry_run) {
    make_dirs(cfg.run.dir);
    nlohmann::json resolved = cfg.resolved;
    resolved["model"]["vocab_size"] = vocab;
    write_file_atomic(cfg.run.dir + "/config.json", resolved.dump(2) + "\n");
    const bool append = r.start_step > 0;
    if (append) {
      trim_jsonl(cfg.run.dir + "/metrics.jsonl", [&](int64_t s) { return s < r.start_step; });
      trim_jsonl(cfg.run.dir + "/eval.jsonl", [&](int64_t s) { return s <= r.start_step; });
    }
    r.metrics = std::make_unique<JsonlWriter>(cfg.run.dir + "/metrics.jsonl", append);
    r.evals = std::make_unique<JsonlWriter>(cfg.run.dir + "/eval.jsonl", append);
    std::remove((cfg.run.dir + "/PREEMPTED").c_str());
    write_file_atomic(cfg.run.dir + "/comm_plan.json", comm_plan(r).dump(1) + "\n");
  }
}

// Mean loss over the validation batches, averaged over ranks, and (classifier) the accuracy.
struct EvalResult {
  float loss = 0;
  double accuracy = -1;  // < 0: not a classifier
};
EvalResult evaluate(Run& r, int64_t step) {
  r.watchdog->enter("evaluation", step);
  const int G = r.cfg.train.global_batch, lb = G / r.world;
  int64_t batches = std::min<int64_t>(r.cfg.train.eval_batches, r.val_windows / G);
  const bool cls = r.model->desc.head == HeadKind::classifier;
  double sums[3] = {0, 0, 0};  // loss, correct, counted
  r.acts->dropout = DropoutContext{};  // no dropout
  for (int64_t k = 0; k < batches; k++) {
    std::vector<int64_t> w(lb);
    for (int i = 0; i < lb; i++) w[i] = k * G + (int64_t)r.rank * lb + i;
    Batch b = r.val_data.read(w);
    sums[0] += r.model->forward(*r.acts, b, false);
    if (cls) {
      std::vector<int> pred = r.model->predictions(*r.acts);
      for (int i = 0; i < lb; i++) sums[1] += pred[i] == b.labels[i];
      sums[2] += lb;
    }
  }
  double total[3];
  MPI_Allreduce(sums, total, 3, MPI_DOUBLE, MPI_SUM, r.comm);
  EvalResult e;
  e.loss = (float)(total[0] / ((double)batches * r.world));
  if (cls) e.accuracy = total[2] > 0 ? total[1] / total[2] : 0.0;
  return e;
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
  if (!err.empty()) throw CollectiveError(err);
  // Collective set-up that must wait until every rank got this far (the NCCL communicator).
  try {
    r.sync->connect();
  } catch (const Error& e) {
    throw CollectiveError(e.what());  // connect() reports the same error on every rank
  }

  const TrainConfig& tc = cfg.train;
  const int T = cfg.model.seq_len, lb = r.sampler->local_batch();
  const bool print = o.print && r.rank == 0;
  Model& model = *r.model;
  Watchdog& wd = *r.watchdog;
  TrainResult res;
  res.n_params = (int64_t)model.table.numel;
  res.flops_per_token = flops_per_token(model.desc, model.table.numel, T);
  res.start_step = r.start_step;
  const double tokens_per_step = (double)tc.global_batch * T;

  if (print) {
    const bool gpu = r.ops->on_gpu();
    std::printf("llmpi-train: %d rank%s × %d thread%s, device %s\n", r.world, r.world > 1 ? "s" : "", r.threads,
                r.threads > 1 ? "s" : "", gpu ? ("cuda: " + cuda_device_name()).c_str() : "cpu");
    const ModelDesc& d = model.desc;
    std::printf("model %s: %d layers, %d heads%s, d_model %d, ffn %d, seq_len %d, vocab %d%s: %.2fM parameters, "
                "%.1f MFLOP/token (training)\n",
                family_name(d.family), d.n_layer, d.n_head,
                d.n_kv_head != d.n_head ? (" (" + std::to_string(d.n_kv_head) + " kv)").c_str() : "", d.d_model,
                d.ffn_dim, T, d.vocab_size,
                d.head == HeadKind::classifier ? (", " + std::to_string(d.num_labels) + " labels").c_str() : "",
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
    if (!r.resumed_from.empty())
      std::printf("resumed from %s at step %lld\n", r.resumed_from.c_str(), (long long)r.start_step);
    else if (o.resume == "auto")
      std::printf("no checkpoint in %s: starting at step 0\n", r.ckpt_dir.c_str());
    if (o.write_run_dir && !o.dry_run) std::printf("run dir: %s\n", cfg.run.dir.c_str());
    std::fflush(stdout);
  }
  if (o.dry_run) {
    if (print) {
      std::printf("dry run: configuration, data, world size%s are valid; %lld steps would run\n",
                  r.resumed_from.empty() ? "" : " and checkpoint",
                  (long long)std::max<int64_t>(0, tc.steps - r.start_step));
      std::fflush(stdout);
    }
    return res;
  }

  auto do_eval = [&](int64_t step) {
    if (!r.has_val) return;
    EvalResult e = evaluate(r, step);
    res.eval_steps.push_back(step);
    res.val_losses.push_back(e.loss);
    if (e.accuracy >= 0) res.val_accuracy.push_back(e.accuracy);
    if (r.evals) {
      nlohmann::json line = {{"step", step}, {"val_loss", e.loss}};
      if (e.accuracy >= 0) line["accuracy"] = e.accuracy;
      r.evals->write(line);
    }
    if (print) {
      if (e.accuracy >= 0)
        std::printf("eval  step %6lld | val_loss %.4f | accuracy %.4f\n", (long long)step, e.loss, e.accuracy);
      else
        std::printf("eval  step %6lld | val_loss %.4f\n", (long long)step, e.loss);
      std::fflush(stdout);
    }
  };
  auto checkpoint = [&](int64_t steps_done) {
    if (!o.write_run_dir) return;
    wd.enter("checkpoint", steps_done);
    res.last_checkpoint = save_checkpoint(r, steps_done);
    if (print) {
      std::printf("checkpoint: %s\n", res.last_checkpoint.c_str());
      std::fflush(stdout);
    }
  };
  if (r.start_step == 0) do_eval(0);

  int64_t saved_at = r.start_step;  // the state after this many steps is on disk (or is the start)
  r.tracer.origin_ms = now_ms();
  for (int64_t step = r.start_step; step < tc.steps; step++) {
    r.tracer.enabled = o.write_run_dir && step - r.start_step < cfg.runtime.trace_steps;
    const double t0 = now_ms();
    wd.enter("data", step);
    const Batch batch = r.train_data.read(r.sampler->windows(step));
    const double t1 = now_ms();
    wd.enter("forward", step);
    model.zero_grads();
    r.acts->dropout = DropoutContext{true, tc.seed, step, r.rank, 0};
    float local_loss = model.forward(*r.acts, batch, true);
    const double t2 = now_ms();
    wd.enter("backward", step);
    r.sync->begin_step();
    model.backward(*r.acts, [&](size_t k) { r.sync->on_ready(k); });
    if (r.on_gpu) cuda_synchronize();  // so backward_ms is the GPU's time, not the launch time
    const double t3 = now_ms();
    wd.enter("gradient sync", step);
    r.sync->finish();  // gradient methods: every rank now holds the averaged gradient
    const double t4 = now_ms();
    // With "weights" the gradient (and so its norm and clipping) is this rank's own.
    wd.enter("optimizer", step);
    const double grad_norm = clip_grad_norm(*r.ops, model.grads, model.table.numel, tc.grad_clip);
    // The global loss and whether any rank saw a non-finite loss or gradient norm, in one collective.
    double mine[2] = {local_loss, std::isfinite(local_loss) && std::isfinite(grad_norm) ? 0.0 : 1.0}, all[2];
    if (r.world > 1) {
      wd.enter("loss allreduce", step);
      MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_SUM, comm);
    } else {
      all[0] = mine[0], all[1] = mine[1];
    }
    const float loss = (float)(all[0] / r.world);
    const bool nonfinite = all[1] > 0;
    const double lr = lr_at(tc, step);
    if (nonfinite) {
      if (tc.on_nonfinite == "abort")
        throw CollectiveError("non-finite loss or gradient norm at step " + std::to_string(step) + " (loss " +
                              std::to_string(loss) + ", grad norm " + std::to_string(grad_norm) +
                              "): lower train.lr, check the data, or set train.on_nonfinite=skip to skip such steps");
      res.skipped_steps++;
      if (print) {
        std::printf("step %6lld: non-finite loss or gradient norm (loss %g, grad norm %g): update skipped "
                    "(train.on_nonfinite=skip)\n", (long long)step, loss, grad_norm);
        std::fflush(stdout);
      }
    } else {
      wd.enter("optimizer", step);
      r.opt->step(model.params, model.grads, model.table, lr, tc);
    }
    if (r.on_gpu) cuda_synchronize();
    const double t5 = now_ms();
    wd.enter("parameter averaging", step);
    r.sync->average_params(model.params, step);  // "weights" only, every average_every steps
    const double t6 = now_ms();
    wd.enter(nullptr, step);

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

    const bool last = step + 1 == tc.steps;
    if (step % tc.log_every == 0 || last || nonfinite) {
      std::vector<double> recent(res.step_ms.begin() + (res.step_ms.size() > 1 ? 1 : 0), res.step_ms.end());
      const double med_ms = median(recent);
      const double tok_s = tokens_per_step / (step_ms / 1000.0);
      const SyncStats& s = r.sync->step;
      if (r.metrics)
        r.metrics->write({{"step", step}, {"epoch", r.sampler->epoch_of(step)}, {"loss", loss}, {"lr", lr},
                          {"tokens_per_s", tok_s}, {"step_ms", step_ms}, {"data_ms", t1 - t0},
                          {"forward_ms", t2 - t1}, {"backward_ms", t3 - t2}, {"comm_ms", s.comm_ms},
                          {"exposed_comm_ms", s.exposed_comm_ms}, {"optim_ms", t5 - t4},
                          {"bytes_communicated", s.bytes_sent + s.bytes_received},
                          {"bytes_sent", s.bytes_sent}, {"bytes_received", s.bytes_received},
                          {"collectives", s.collectives}, {"grad_norm", grad_norm}, {"skipped", nonfinite}});
      if (print) {
        std::printf("step %6lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | %6.1f ms/step | ETA %s\n",
                    (long long)step, (long long)tc.steps, loss, lr, tok_s, step_ms,
                    format_duration(med_ms / 1000.0 * (double)(tc.steps - step - 1)).c_str());
        std::fflush(stdout);
      }
    }
    if ((tc.eval_every > 0 && (step + 1) % tc.eval_every == 0) || last) do_eval(step + 1);
    if (cfg.checkpoint.every > 0 && ((step + 1) % cfg.checkpoint.every == 0 || last)) {
      checkpoint(step + 1);
      saved_at = step + 1;
    }

    // Pre-emption: any rank that got the signal stops every rank at this step boundary.
    wd.enter("pre-emption check", step);
    int stop_here = preemption_requested() || step == o.preempt_after_step, stop_any = stop_here;
    if (r.world > 1) MPI_Allreduce(&stop_here, &stop_any, 1, MPI_INT, MPI_MAX, comm);
    wd.enter(nullptr, step);
    if (stop_any && !last) {
      if (saved_at != step + 1) checkpoint(step + 1);
      res.preempted = true;
      if (r.rank == 0 && o.write_run_dir)
        write_file_atomic(cfg.run.dir + "/PREEMPTED", "step " + std::to_string(step + 1) + "\ncheckpoint " +
                                                          res.last_checkpoint + "\n");
      if (print) {
        std::printf("llmpi-train: pre-empted at step %lld; checkpoint %s; resume with --resume auto\n",
                    (long long)(step + 1), res.last_checkpoint.c_str());
        std::fflush(stdout);
      }
      break;
    }
  }

  if (res.step_ms.size() > 1) {
    std::vector<double> after_first(res.step_ms.begin() + 1, res.step_ms.end());
    res.tokens_per_s_median = tokens_per_step / (median(after_first) / 1000.0);
  }
  if (print && !res.losses.empty() && !res.preempted) {
    std::printf("done: %lld steps, median %.0f tokens/s, train loss %.4f -> %.4f", (long long)tc.steps,
                res.tokens_per_s_median, res.losses.front(), res.losses.back());
    if (res.val_losses.size() >= 2)
      std::printf(", val loss %.4f -> %.4f", res.val_losses.front(), res.val_losses.back());
    if (res.skipped_steps) std::printf(", %lld non-finite steps skipped", (long long)res.skipped_steps);
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
