#include "train/trainer.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <sys/stat.h>

#include <cerrno>
#include <algorithm>
#include <filesystem>
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
#include "metrics/classification_metrics.h"
#include "metrics/metrics.h"
#include "metrics/trace.h"
#include "data/classification_file.h"
#include "data/dataset_identity.h"
#include "model/transformer.h"
#include "checkpoint/checkpoint.h"
#include "hf/hf_import.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_step.h"
#include "runtime/parallel_groups.h"
#include "runtime/mpi_env.h"
#include "runtime/signals.h"
#include "runtime/watchdog.h"
#include "train/memory_estimate.h"
#include "train/resume_contract.h"
#include "train/run_dir.h"

namespace llmpi {

namespace {

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
  DatasetIdentity identity() const {
    return classification ? dataset_identity(examples_file.info()) : dataset_identity(tokens_file.info());
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
  GemmPrecision precision = GemmPrecision::fp32;  // runtime.precision: the dense layers' GEMMs
  std::string ckpt_dir;
  int64_t start_step = 0;
  std::string resumed_from;  // checkpoint path, "" when starting fresh
  // Pipeline parallelism (parallel.pp_stages > 1): the topology and this rank's stage; then
  // model, acts, opt and sync are not used (pipeline/pipeline_step.h).
  std::unique_ptr<ParallelGroups> groups;
  std::unique_ptr<Pipeline> pipe;
  SyncStats pipe_sync;  // this step's data-parallel sync, summed over the stage's chunks
  std::string data_json;     // identity of the train and val files (stored in checkpoints)
  RunDirClaim claim;         // rank 0: run.dir's lock, held for the life of the run (train/run_dir.h)
  std::string lineage;       // this run's lineage id, kept across resumes (stored in checkpoints)
  std::vector<std::string> resume_overrides;  // --resume-override keys
  std::vector<ContractRow> accepted_changes;  // resume-contract changes they accepted (logged)
  bool node_has_rank0 = false;                // rank 0 runs on this rank's node
  MemoryEstimate memory;                      // this rank's estimate (train/memory_estimate.h)
  std::string memory_note;                    // what the node has, for the start-up lines
  double rss_before_model = -1;               // peak RSS before the model was allocated
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
  const ModelDesc& m = r.pipe ? r.pipe->desc : r.model->desc;
  const ParamTable& table = r.pipe ? r.pipe->whole_table : r.model->table;  // checkpoints hold the whole model
  if (info.desc.family != m.family)
    fail("checkpoint '", path, "' holds a ", family_name(info.desc.family), " model, but this configuration has "
         "model.family \"", family_name(m.family), "\": resume it with model.family \"",
         family_name(info.desc.family), "\", or start a new run.dir");
  // The model description, global batch, seed, ... (train/resume_contract.h); dropout and init_std may change.
  r.accepted_changes = check_resume_contract(info, resume_contract_rows(info, r.cfg, m, r.data_json), r.resume_overrides);
  if (info.param_table_json != param_table_json(table) || info.n != table.numel)
    fail("checkpoint '", path, "' holds a different parameter layout than this model; start a new run.dir");
  if (info.optimizer != r.cfg.train.optimizer)
    fail("checkpoint '", path, "' was made with train.optimizer \"", info.optimizer, "\", but this configuration has \"",
         r.cfg.train.optimizer, "\": use the same optimizer to resume");
  if (info.rows > 1 && (r.cfg.parallel.sync != "weights" || info.rows != r.world))
    fail("checkpoint '", path, "' holds the separate parameters of ", info.rows, " ranks (sync \"weights\"): resume it "
         "with parallel.sync \"weights\" on ", info.rows, " ranks");
  if (!info.checksummed && r.rank == 0)
    std::fprintf(stderr, "llmpi-train: warning: checkpoint '%s' has no checksums (an older llmpi wrote it); "
                 "it is loaded unverified\n", path.c_str());
  const size_t n = info.n;
  const bool sgd = r.cfg.train.optimizer == "sgd";
  std::vector<float> params(n), mom(sgd ? 0 : n), vel(sgd ? 0 : n);
  read_checkpoint_row(info, info.rows > 1 ? r.rank : 0, params.data(), sgd ? nullptr : mom.data(),
                      sgd ? nullptr : vel.data());
  if (r.pipe) {  // every stage takes its tensors by name
    r.pipe->load_whole(params.data(), sgd ? nullptr : mom.data(), sgd ? nullptr : vel.data(), info.optimizer_t);
  } else {
    r.ops->copy_to_device(r.model->params, params.data(), n * sizeof(float));
    r.opt->t = info.optimizer_t;
  }
  if (!sgd && !r.pipe) {  // with ZeRO-1 this rank's pieces only (the file holds the whole flat layout)
    const std::vector<float> m_mine = r.sync->pieces_of(mom.data()), v_mine = r.sync->pieces_of(vel.data());
    r.ops->copy_to_device(r.opt->m, m_mine.data(), r.opt->n * sizeof(float));
    r.ops->copy_to_device(r.opt->v, v_mine.data(), r.opt->n * sizeof(float));
  }
  r.start_step = info.step;
  r.resumed_from = path;
  if (!info.lineage.empty()) r.lineage = info.lineage;  // a resumed run continues its lineage
}

// --resume auto: the newest checkpoint that verifies. Damaged ones (unreadable, truncated, a
// checksum mismatch) are skipped with a warning saying why; any other refusal (another model,
// a changed contract) stops. Every rank takes the decision on its own: all read the same row (or,
// for per-rank rows, verify every row), so on a consistent file system they agree; whether they
// did is checked after set-up (check_same_checkpoint).
void resume_auto(Run& r) {
  std::string skipped;
  for (const std::string& path : checkpoints_newest_first(r.ckpt_dir)) {
    try {
      CheckpointInfo info = read_checkpoint_info(path);
      if (info.rows > 1) verify_checkpoint(info);
      resume_from(r, path);
      return;
    } catch (const CheckpointDamaged& e) {
      if (r.rank == 0)
        std::fprintf(stderr, "llmpi-train: warning: skipping checkpoint '%s': %s\n", path.c_str(), e.what());
      skipped += std::string(skipped.empty() ? "" : "; ") + e.what();
    }
  }
  if (!skipped.empty())
    fail("no checkpoint in '", r.ckpt_dir, "' can be resumed, every one is damaged (", skipped,
         "); start a new run.dir, or move the damaged files away to start this one afresh");
}

// After --resume auto: every rank must have resumed from the checkpoint rank 0 chose. A file
// system that shows the ranks different files (a node's stale cache, a copy still in progress, a
// checkpoint damaged for some readers only) would otherwise start them from different states and
// train on silently. Returns the error ("" when they agree); collective over r.comm.
std::string check_same_checkpoint(const Run& r) {
  // The checkpoint's file name (the folder is run.dir's, the same on every rank), "" for none.
  const std::string mine = r.resumed_from.empty() ? "" : std::filesystem::path(r.resumed_from).filename().string();
  std::string first = mine;
  int len = static_cast<int>(first.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, r.comm);
  first.resize(static_cast<size_t>(len));
  MPI_Bcast(first.data(), len, MPI_CHAR, 0, r.comm);
  if (first == mine) return "";
  auto name = [](const std::string& f) { return f.empty() ? std::string("none (a fresh start)") : "'" + f + "'"; };
  return "--resume auto: this rank resumed from " + name(mine) + " but rank 0 from " + name(first) +
         ": the ranks see different checkpoints in '" + r.ckpt_dir +
         "'; wait until every node sees the same files (or name one with --resume PATH) and start again";
}

// Write a checkpoint of the state after `steps_done` steps. Collective: with sync "weights" every
// rank's parameters are gathered into one file. Rank 0 writes; its success or failure is agreed
// so every rank continues or stops together. Returns the path.
std::string save_checkpoint(Run& r, int64_t steps_done) {
  const ParamTable& table = r.pipe ? r.pipe->whole_table : r.model->table;
  const size_t n = table.numel;
  const bool per_rank = !r.pipe && r.sync->opt.method == SyncMethod::weights && r.world > 1;
  const int rows = per_rank ? r.world : 1;
  CheckpointData d;
  CheckpointInfo& i = d.info;
  i.step = steps_done;
  i.optimizer_t = r.pipe ? r.pipe->optimizer_t() : r.opt->t;
  i.optimizer = r.cfg.train.optimizer;
  i.sync = r.cfg.parallel.sync;
  i.world_size = r.world;
  i.rows = rows;
  i.seed = r.cfg.train.seed;
  i.desc = r.pipe ? r.pipe->desc : r.model->desc;
  i.n = n;
  i.config_json = r.cfg.resolved.dump();
  i.param_table_json = param_table_json(table);
  i.data_json = r.data_json;
  i.lineage = r.lineage;
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
  if (r.pipe) {  // the whole model, gathered by name from the stages to rank 0
    d.params = r.pipe->gather_whole(0);
    if (r.cfg.train.optimizer != "sgd") d.m = r.pipe->gather_whole(1), d.v = r.pipe->gather_whole(2);
  } else {
    collect(r.model->params, d.params);
    if (!r.opt->sgd && r.sync->opt.zero) {  // ZeRO-1: every rank's pieces, assembled on rank 0
      std::vector<float> mine(r.opt->n);
      r.ops->copy_to_host(mine.data(), r.opt->m, mine.size() * sizeof(float));
      r.sync->gather_sharded(mine.data(), d.m);
      r.ops->copy_to_host(mine.data(), r.opt->v, mine.size() * sizeof(float));
      r.sync->gather_sharded(mine.data(), d.v);
    } else if (!r.opt->sgd) {
      collect(r.opt->m, d.m);
      collect(r.opt->v, d.v);
    }
  }
  const std::string path = checkpoint_path(r.ckpt_dir, steps_done);
  std::string err;
  if (r.rank == 0) {
    try {
      make_dirs(r.ckpt_dir);
      write_checkpoint(path, d);
      prune_checkpoints(r.ckpt_dir, r.cfg.checkpoint.keep, r.lineage);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  err = agree_on_error(r.comm, err);
  if (!err.empty()) throw CollectiveError(err);
  return path;
}

// --init-from: the parameters of a Hugging Face model directory (hf/hf_import.h); every rank
// reads the tensors it holds from the memory-mapped files (a pipeline stage its own, by name).
// Rank 0 prints what was initialised instead (a BertModel's classifier) and what the files hold
// that the model does not use.
void init_from_hf(Run& r, const TrainOptions& o) {
  std::vector<std::string> notes;
  if (r.pipe) {
    r.pipe->init_from_hf(o.init_from, &notes);  // collective
  } else {
    std::vector<float> host(r.model->table.numel);
    load_hf_params(o.init_from, r.model->desc, r.model->table, r.cfg.train.seed, host.data(), &notes);
    r.ops->copy_to_device(r.model->params, host.data(), host.size() * sizeof(float));
  }
  if (r.rank == 0 && o.print)
    for (const std::string& n : notes) std::printf("init-from: %s\n", n.c_str());
}

std::string absolute_path(const std::string& p) {
  char buf[4096];
  return realpath(p.c_str(), buf) ? std::string(buf) : p;
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
                       {"wire_bytes", (b.end - b.begin) * g.grad_wire_bytes()}, {"tensors", tensors}});
  }
  return {{"method", sync_method_name(g.opt.method)}, {"world_size", r.world}, {"bucket_mb", g.opt.bucket_mb},
          {"first_bucket_mb", g.opt.first_bucket_mb}, {"overlap", g.opt.overlap}, {"poll_us", g.opt.poll_us},
          {"average_every", g.opt.average_every}, {"zero", g.opt.zero ? 1 : 0},
          {"optimizer_state_floats_this_rank", r.opt->sgd ? 0 : 2 * r.opt->n}, {"dtype", "float32"},
          {"grad_dtype", g.opt.bf16 ? "bf16" : "fp32"}, {"total_floats", t.numel},
          {"expected_bytes_sent_per_pass_rank0", g.expected_bytes_per_pass(t.numel)}, {"buckets", buckets}};
}

// The configuration as this run resolved it: the model.* values left to a default (vocab_size 0 =
// from the data; ffn_dim, max_seq_len, n_kv_head 0) replaced by what the model got. Written to
// config.json and stored in checkpoints, so both say the same.
void resolve_config(nlohmann::json& resolved, const ModelDesc& d) {
  nlohmann::json& m = resolved["model"];
  m["vocab_size"] = d.vocab_size;
  if (m.contains("ffn_dim")) m["ffn_dim"] = d.ffn_dim;
  if (m.contains("max_seq_len")) m["max_seq_len"] = d.max_seq_len;
  if (m.contains("n_kv_head")) m["n_kv_head"] = d.n_kv_head;
}

// Rank 0 takes run.dir (its lock; refuses to start a new run over an earlier one unless
// --overwrite) and draws the lineage id; every rank learns the outcome. See train/run_dir.h.
void claim_run_directory(Run& r, const TrainOptions& o) {
  std::string err;
  char lineage[17] = {0};
  if (r.rank == 0) {
    try {
      if (o.write_run_dir) r.claim = claim_run_dir(r.cfg.run.dir, !o.resume.empty(), o.overwrite, o.dry_run);
    } catch (const Error& e) {
      err = e.what();
    }
    std::snprintf(lineage, sizeof lineage, "%s", new_lineage_id().c_str());
    if (o.print)
      for (const std::string& note : r.claim.notes) std::fprintf(stderr, "llmpi-train: %s\n", note.c_str());
  }
  err = agree_on_error(r.comm, err);
  if (!err.empty()) throw CollectiveError(err);
  MPI_Bcast(lineage, sizeof lineage, MPI_CHAR, 0, r.comm);
  r.lineage = lineage;
}

// This rank's memory estimate against what its node (and GPU) has; an Error, with the numbers and
// the largest global batch that would fit, when it cannot fit. See train/memory_estimate.h.
void check_memory(Run& r, const ModelDesc& desc, int local_size) {
  const Config& c = r.cfg;
  const int lb = r.sampler->local_batch(), T = c.model.seq_len;
  auto estimate = [&](int b, int rank) { return estimate_memory(desc, b, T, c, r.world, rank, r.on_gpu); };
  r.memory = estimate(lb, r.rank);
  // The node runs local_size ranks of this configuration, one of them perhaps rank 0 (which
  // holds gather/checkpoint buffers the others do not).
  auto node_need = [&](int b) {
    const double other = estimate(b, r.world > 1 ? 1 : 0).host_bytes();
    return r.node_has_rank0 ? estimate(b, 0).host_bytes() + (local_size - 1) * other : local_size * other;
  };
  std::string source;
  const double host_avail = host_memory_available(&source);
  double gpu_free = -1, gpu_total = 0;
  if (r.on_gpu) {
    size_t f = 0, t = 0;
    cuda_mem_info(&f, &t);
    gpu_free = (double)f, gpu_total = (double)t;
  }
  const double gpu_reserve = 256e6;  // cuBLAS workspaces and kernels' own buffers (not estimated)
  auto fits = [&](int b) {
    if (host_avail >= 0 && node_need(b) > host_avail) return false;
    return gpu_free < 0 || estimate(b, r.rank).device_bytes() + gpu_reserve <= gpu_free;
  };
  r.memory_note = "node: " + format_bytes(node_need(lb)) + " for " + std::to_string(local_size) + " rank" +
                  (local_size > 1 ? "s" : "") + " of " +
                  (host_avail >= 0 ? format_bytes(host_avail) + " available (" + source + ")" : std::string("unknown"));
  if (r.on_gpu) r.memory_note += "; GPU: " + format_bytes(gpu_free) + " free of " + format_bytes(gpu_total);
  if (r.groups) {  // a pipeline stage holds only its layers: the whole-model estimate is an upper bound
    r.memory_note += " (whole model; with parallel.pp_stages > 1 each stage holds a part: not checked)";
    return;
  }
  if (!c.runtime.memory_check || fits(lb)) return;
  int best = 0;  // the largest local batch that fits (memory grows with the batch)
  for (int lo = 1, hi = lb - 1; lo <= hi;) {
    const int mid = lo + (hi - lo) / 2;
    if (fits(mid)) best = mid, lo = mid + 1;
    else hi = mid - 1;
  }
  const std::string where = r.on_gpu && estimate(lb, r.rank).device_bytes() + gpu_reserve > gpu_free
                                ? "the GPU has " + format_bytes(gpu_free) + " free"
                                : "the node has " + format_bytes(host_avail) + " available (" + source + ") for " +
                                      std::to_string(local_size) + " rank" + (local_size > 1 ? "s" : "") +
                                      " needing " + format_bytes(node_need(lb));
  const std::string fix =
      best > 0 ? "the largest train.global_batch that fits is " + std::to_string(best * r.world) + " (" +
                     std::to_string(best) + " per rank); or use a shorter model.seq_len or fewer ranks per node"
               : "even one sequence per rank does not fit: the model itself (parameters, gradients and optimizer "
                 "state: " + format_bytes(r.memory.params + r.memory.grads + r.memory.optimizer) +
                     ") is too large here; use a smaller model, or fewer ranks per node";
  fail("this configuration needs about ", format_bytes(r.on_gpu ? r.memory.device_bytes() : r.memory.host_bytes()),
       " per rank (", r.memory.describe(), ") but ", where, ": ", fix,
       " (runtime.memory_check=false skips this check)");
}

void setup(Run& r, const Config& cfg, MPI_Comm comm, const TrainOptions& o) {
  if (o.resume == "auto" && !o.write_run_dir) fail("--resume auto needs a run directory");
  r.cfg = cfg;
  r.comm = comm;
  MPI_Comm_rank(comm, &r.rank);
  MPI_Comm_size(comm, &r.world);
  if (!o.resume_overrides.empty() && o.resume.empty())
    fail("--resume-override accepts a change when resuming: use it together with --resume");
  if (o.overwrite && !o.resume.empty())
    fail("--overwrite starts a new run over an earlier one; with --resume the earlier run continues: use one of them");
  r.resume_overrides = o.resume_overrides;
  claim_run_directory(r, o);  // collective: agreed before anything else can fail
  if (cfg.parallel.pp_stages > 1)  // collective; fails on every rank alike (runtime/parallel_groups.h)
    r.groups = std::make_unique<ParallelGroups>(comm, cfg.parallel.pp_stages,
                                                cfg.model.family != "bert" && cfg.model.tie_embeddings);

  // Node-local rank and size: threads per rank, GPU binding.
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, r.rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1, lowest_rank = r.rank;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Allreduce(MPI_IN_PLACE, &lowest_rank, 1, MPI_INT, MPI_MIN, node);
  r.node_has_rank0 = lowest_rank == 0;
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
  parse_gemm_precision(cfg.runtime.precision, &r.precision);  // validated by parse_config
  if (r.precision == GemmPrecision::tf32 && !use_cuda)  // runtime.device "auto" without GPUs (same on every rank)
    fail("runtime.precision \"tf32\" is a CUDA tensor-core mode, but this run is on the CPU: use \"fp32\" or "
         "\"bf16\", or runtime.device \"cuda\" on GPUs");

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
  // With pipelines, the data-parallel replicas share the batch; every stage of one reads the same rows.
  if (r.groups && !cfg.train.drop_last)
    fail("train.drop_last=false (a shorter last step per epoch) does not work with pipeline stages, whose "
         "micro-batches split a full batch: set train.drop_last=true, or parallel.pp_stages=1");
  r.sampler = std::make_unique<Sampler>(r.train_windows, cfg.train.global_batch, r.groups ? r.groups->dp : r.world,
                                        r.groups ? r.groups->dp_rank : r.rank, cfg.train.seed, cfg.train.drop_last);
  if (cfg.train.epochs > 0) {  // a run measured in epochs: the step count follows from the data
    r.cfg.train.steps = cfg.train.epochs * r.sampler->steps_per_epoch();
    r.cfg.resolved["train"]["steps"] = r.cfg.train.steps;
  }
  if (!cfg.data.val.empty()) {
    r.has_val = true;
    r.val_data.open(cfg.data.val, cfg.model.family, cls, T);
    if (r.val_data.vocab_size() > vocab)
      fail("'", cfg.data.val, "' has vocabulary ", r.val_data.vocab_size(), " but the model has ", vocab,
           ": make train and val files with the same tokenizer");
    r.val_windows = r.val_data.n_samples;
    // Without pipelines an evaluation batch may be partial (evaluate()); a pipeline splits full ones.
    if (r.val_windows < (r.groups ? cfg.train.global_batch : 1))
      fail("'", cfg.data.val, "' holds ", r.val_windows, cls ? " examples" : " windows of seq_len+1 tokens",
           ", fewer than one global batch (", cfg.train.global_batch,
           "): use a larger validation split (llmpi-prep --val-fraction) or a smaller batch");
  }
  {  // Dataset identity (data/dataset_identity.h): one tokenizer, no half-replaced llmpi-prep output.
    const DatasetIdentity train_id = r.train_data.identity();
    const DatasetIdentity val_id = r.has_val ? r.val_data.identity() : DatasetIdentity();
    for (const std::string& w : check_training_data(train_id, r.has_val ? &val_id : nullptr))
      if (r.rank == 0) std::fprintf(stderr, "llmpi-train: warning: %s\n", w.c_str());
    r.data_json = nlohmann::json{{"train", train_id.json()}, {"val", r.has_val ? val_id.json() : nlohmann::json()}}.dump();
  }

  // Model and optimizer, once the memory they need is known to be there.
  ModelDesc desc = model_desc_from_config(cfg.model, vocab);
  // how, not what: not in checkpoints
  desc.attention = resolve_attention(cfg.runtime.attention, r.ops->on_gpu(), desc.head_dim());
  desc.lm_head_chunk_rows = cfg.runtime.lm_head_chunk_rows;
  resolve_config(r.cfg.resolved, desc);
  r.rss_before_model = peak_rss_bytes();  // libraries, MPI, open files: what no estimate counts
  check_memory(r, desc, local_size);
  try {
    if (!r.groups) {
      r.model = std::make_unique<Model>(desc, *r.ops, ModelPart::whole(), r.precision);
      r.model->init_params(cfg.train.seed);
      if (!o.init_from.empty()) init_from_hf(r, o);
      r.acts = std::make_unique<Activations>(*r.model, r.sampler->local_batch(), T);
    }
  } catch (const std::bad_alloc&) {
    fail("out of memory while allocating the model (estimated need per rank: ", r.memory.describe(), "; ",
         r.memory_note, "): use a smaller train.global_batch, model.seq_len or model, or fewer ranks per node");
  }
  SyncOptions so;
  so.method = parse_sync_method(cfg.parallel.sync);
  so.bucket_mb = cfg.parallel.bucket_mb;
  so.first_bucket_mb = cfg.parallel.first_bucket_mb;
  so.overlap = cfg.parallel.overlap;
  so.poll_us = cfg.parallel.poll_us;
  so.average_every = cfg.parallel.average_every;
  so.zero = cfg.parallel.zero == 1;
  so.bf16 = cfg.parallel.grad_dtype == "bf16";
  r.tracer.rank = r.rank;
  if (r.groups)
    r.pipe = std::make_unique<Pipeline>(desc, *r.ops, *r.groups, cfg.parallel, so, cfg.train.optimizer,
                                        r.sampler->local_batch(), T, cfg.train.seed, &r.tracer, r.precision);
  else {
    r.sync = std::make_unique<GradSync>(so, comm, *r.ops, r.model->grads, r.model->table, &r.tracer);
    // With ZeRO-1 the optimizer keeps the moments of this rank's pieces only (comm/grad_sync.h).
    r.opt = std::make_unique<Optimizer>(*r.ops, r.model->table.numel, cfg.train.optimizer,
                                        so.zero ? r.sync->shard : std::vector<ShardPiece>{});
  }
  if (r.pipe && !o.init_from.empty()) init_from_hf(r, o);

  // Resume: every rank reads its state (a shared file system, as for the data).
  r.ckpt_dir = cfg.run.dir + "/checkpoints";
  if (!o.resume.empty()) {
    if (o.resume == "auto")
      resume_auto(r);
    else
      resume_from(r, o.resume);
  }
  r.watchdog = std::make_unique<Watchdog>(cfg.runtime.step_timeout_s);

  // Run directory (rank 0 writes). A resumed run appends to the logs, minus what the interrupted
  // run logged after its checkpoint.
  if (r.rank == 0 && o.write_run_dir && !o.dry_run) {
    make_dirs(cfg.run.dir);
    write_file_atomic(cfg.run.dir + "/config.json", r.cfg.resolved.dump(2) + "\n");
    const bool append = r.start_step > 0;
    if (append) {
      trim_jsonl(cfg.run.dir + "/metrics.jsonl", [&](int64_t s) { return s < r.start_step; });
      trim_jsonl(cfg.run.dir + "/eval.jsonl", [&](int64_t s) { return s <= r.start_step; });
    }
    r.metrics = std::make_unique<JsonlWriter>(cfg.run.dir + "/metrics.jsonl", append);
    r.evals = std::make_unique<JsonlWriter>(cfg.run.dir + "/eval.jsonl", append);
    std::remove((cfg.run.dir + "/PREEMPTED").c_str());
    if (!r.pipe) write_file_atomic(cfg.run.dir + "/comm_plan.json", comm_plan(r).dump(1) + "\n");
    if (!o.init_from.empty())  // llmpi-export copies the tokenizer files from there
      write_file_atomic(cfg.run.dir + "/init_from.json", nlohmann::json{{"dir", absolute_path(o.init_from)}}.dump() + "\n");
  }
}

// The validation split in global batches of G, in file order: batch k is samples
// [kG, min(N, (k+1)G)), shared out as evenly as it goes (the first g mod W ranks take one more), so
// a partial last batch is evaluated too and every sample counts exactly once over the ranks.
// train.eval_batches > 0 evaluates only the first that many batches. The loss is the mean over
// samples (per-sample losses are token means for the language models); a classifier also sums
// a confusion matrix over the ranks: accuracy, and for two labels F1 of label 1 and Matthews
// correlation (metrics/classification_metrics.h).
struct EvalResult {
  float loss = 0;
  double accuracy = -1;  // < 0: not a classifier
  double f1 = -1, mcc = -1;  // two-label classifiers only
  int64_t counted = 0;   // samples evaluated, over all ranks
};
EvalResult evaluate(Run& r, int64_t step) {
  r.watchdog->enter("evaluation", step);
  const int G = r.cfg.train.global_batch;
  const int64_t N = r.val_windows;
  if (r.pipe) {  // along the pipeline, in whole batches; the last stage holds the loss (pipeline/pipeline_step.h)
    const int64_t batches = r.cfg.train.eval_batches > 0 ? std::min<int64_t>(r.cfg.train.eval_batches, N / G) : N / G;
    const int dp = r.groups->dp, plb = G / dp;
    PipelineEval pe;
    for (int64_t k = 0; k < batches; k++) {
      std::vector<int64_t> w(plb);
      for (int i = 0; i < plb; i++) w[i] = k * G + (int64_t)r.groups->dp_rank * plb + i;
      r.pipe->evaluate(r.val_data.read(w), pe);
    }
    double sums[3] = {pe.loss_sum, pe.correct, pe.counted}, total[3];
    MPI_Allreduce(sums, total, 3, MPI_DOUBLE, MPI_SUM, r.comm);
    EvalResult e;
    e.loss = (float)(total[0] / ((double)batches * dp));
    e.counted = batches * G;
    if (r.pipe->desc.head == HeadKind::classifier) e.accuracy = total[2] > 0 ? total[1] / total[2] : 0.0;
    return e;
  }
  const int64_t all_batches = (N + G - 1) / G;
  const int64_t batches =
      r.cfg.train.eval_batches > 0 ? std::min<int64_t>(r.cfg.train.eval_batches, all_batches) : all_batches;
  const bool cls = r.model->desc.head == HeadKind::classifier;
  ConfusionMatrix cm(cls ? r.model->desc.num_labels : 0);
  double sums[2] = {0, 0};  // sum of per-sample losses, samples
  r.acts->dropout = DropoutContext{};  // no dropout
  for (int64_t k = 0; k < batches; k++) {
    const int64_t begin = k * G, g = std::min<int64_t>(G, N - begin);
    const int64_t base = g / r.world, extra = g % r.world;
    const int64_t mine = base + (r.rank < extra ? 1 : 0);
    const int64_t first = begin + r.rank * base + std::min<int64_t>(r.rank, extra);
    if (mine == 0) continue;
    std::vector<int64_t> w(mine);
    for (int64_t i = 0; i < mine; i++) w[i] = first + i;
    Batch b = r.val_data.read(w);
    sums[0] += (double)r.model->forward(*r.acts, b, false) * (double)mine;
    sums[1] += (double)mine;
    if (cls) {
      std::vector<int> pred = r.model->predictions(*r.acts);
      for (int64_t i = 0; i < mine; i++) cm.add(b.labels[i], pred[i]);
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, r.comm);
  if (cls) MPI_Allreduce(MPI_IN_PLACE, cm.counts.data(), (int)cm.counts.size(), MPI_DOUBLE, MPI_SUM, r.comm);
  EvalResult e;
  e.loss = sums[1] > 0 ? (float)(sums[0] / sums[1]) : 0.0f;
  e.counted = (int64_t)sums[1];
  if (cls) {
    e.accuracy = cm.accuracy();
    if (cm.K == 2) e.f1 = cm.f1(1), e.mcc = cm.matthews();
  }
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
  } catch (const std::bad_alloc&) {
    err = "out of memory during start-up (estimated need per rank: " + r.memory.describe() + "; " + r.memory_note +
          "): use a smaller train.global_batch, model.seq_len or model, or fewer ranks per node";
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw CollectiveError(err);
  if (o.resume == "auto") {
    err = agree_on_error(comm, check_same_checkpoint(r));
    if (!err.empty()) throw CollectiveError(err);
  }
  // Collective set-up that must wait until every rank got this far (the NCCL communicator).
  try {
    if (r.pipe)
      r.pipe->connect();
    else
      r.sync->connect();
  } catch (const Error& e) {
    throw CollectiveError(e.what());  // connect() reports the same error on every rank
  }

  const TrainConfig& tc = r.cfg.train;  // train.steps resolved (train.epochs)
  const int T = cfg.model.seq_len, lb = r.sampler->local_batch();
  const int64_t steps_per_epoch = r.sampler->steps_per_epoch();
  const bool print = o.print && r.rank == 0;
  const ModelDesc& desc = r.pipe ? r.pipe->desc : r.model->desc;
  const size_t numel = r.pipe ? r.pipe->whole_table.numel : r.model->table.numel;
  Watchdog& wd = *r.watchdog;
  TrainResult res;
  res.n_params = (int64_t)numel;
  if (r.pipe)
    for (const PipelineChunk& ch : r.pipe->chunks) res.optimizer_state_floats += ch.opt->sgd ? 0 : 2 * ch.opt->n;
  else
    res.optimizer_state_floats = r.opt->sgd ? 0 : 2 * (int64_t)r.opt->n;
  res.flops_per_token = flops_per_token(desc, numel, T);
  if (r.groups && o.print) print_topology(*r.groups, r.pipe->describe_layers());  // collective
  res.start_step = r.start_step;
  const double tokens_per_full_step = (double)tc.global_batch * T;

  if (print) {
    const bool gpu = r.ops->on_gpu();
    std::printf("llmpi-train: %d rank%s × %d thread%s, device %s, %s attention, GEMMs %s%s\n", r.world,
                r.world > 1 ? "s" : "", r.threads, r.threads > 1 ? "s" : "",
                gpu ? ("cuda: " + cuda_device_name()).c_str() : "cpu", attention_impl_name(desc.attention),
                gemm_precision_name(r.precision),
                r.precision == GemmPrecision::bf16 ? " (bf16 operands, fp32 accumulation; weights, gradients, "
                                                     "optimizer and other ops fp32)"
                : r.precision == GemmPrecision::tf32 ? " (TF32 tensor-op math)" : "");
    const ModelDesc& d = desc;
    std::printf("model %s: %d layers, %d heads%s, d_model %d, ffn %d, seq_len %d, vocab %d%s: %.2fM parameters, "
                "%.1f MFLOP/token (training)\n",
                family_name(d.family), d.n_layer, d.n_head,
                d.n_kv_head != d.n_head ? (" (" + std::to_string(d.n_kv_head) + " kv)").c_str() : "", d.d_model,
                d.ffn_dim, T, d.vocab_size,
                d.head == HeadKind::classifier ? (", " + std::to_string(d.num_labels) + " labels").c_str() : "",
                res.n_params / 1e6, res.flops_per_token / 1e6);
    std::printf("data: %s: %lld %s (%lld steps/epoch at global batch %d = %d per rank%s)%s%s\n",
                cfg.data.train.c_str(), (long long)r.train_windows, desc.head == HeadKind::classifier ? "examples" : "windows",
                (long long)steps_per_epoch, tc.global_batch, lb,
                tc.drop_last ? (r.train_windows % tc.global_batch ? ", last partial batch dropped" : "")
                             : (r.train_windows % tc.global_batch ? ", last step partial" : ""),
                r.has_val ? "; val " : "", r.has_val ? cfg.data.val.c_str() : "");
    if (tc.epochs > 0)
      std::printf("schedule: %d epoch%s = %lld steps, lr %s from %.3g%s\n", tc.epochs, tc.epochs > 1 ? "s" : "",
                  (long long)tc.steps, tc.lr_schedule.c_str(), tc.lr,
                  tc.warmup_steps > 0 ? (" after " + std::to_string(tc.warmup_steps) + " warm-up steps").c_str() : "");
    if (r.pipe) {
      std::printf("pipeline: %d stages × %d data-parallel replicas, schedule %s, %d micro-batches of %d%s; "
                  "gradient sync %s per stage\n", r.groups->pp, r.groups->dp, schedule_kind_name(r.pipe->kind),
                  r.pipe->M, r.pipe->micro_batch,
                  r.pipe->v > 1 ? (", " + std::to_string(r.pipe->v) + " chunks per stage").c_str() : "",
                  cfg.parallel.sync.c_str());
    } else {
      const GradSync& g = *r.sync;
      std::printf("sync: %s of %zu %s values (%.1f MB) in %zu bucket%s (bucket_mb %g, first %g), overlap %s%s; "
                  "rank 0 sends ~%.1f MB per %s (tensors per bucket: comm_plan.json)\n",
                  sync_method_name(g.opt.method), numel, g.opt.bf16 ? "bf16" : "fp32",
                  numel * g.grad_wire_bytes() / 1e6, g.buckets.size(),
                  g.buckets.size() == 1 ? "" : "s", g.opt.bucket_mb, g.opt.first_bucket_mb,
                  g.opt.overlap ? "on" : "off",
                  g.opt.method == SyncMethod::weights ? (", parameters every " + std::to_string(g.opt.average_every) +
                                                         " step(s)").c_str()
                  : g.opt.zero ? (", ZeRO-1: gradients reduce-scattered, parameters all-gathered, AdamW state for " +
                                  std::to_string(r.opt->n) + " of " + std::to_string(numel) + " values").c_str()
                               : "",
                  g.expected_bytes_per_pass(numel) / 1e6,
                  g.opt.method == SyncMethod::weights ? "average" : "step");
    }
    std::printf("memory per rank (estimate): %s; %s\n", r.memory.describe().c_str(), r.memory_note.c_str());
    if (!r.resumed_from.empty())
      std::printf("resumed from %s at step %lld (lineage %s)\n", r.resumed_from.c_str(), (long long)r.start_step,
                  r.lineage.c_str());
    if (!r.accepted_changes.empty())
      std::printf("resume: accepted changes (--resume-override): %s\n", describe_changes(r.accepted_changes).c_str());
    if (o.resume == "auto" && r.resumed_from.empty())
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
    res.val_counted.push_back(e.counted);
    if (e.accuracy >= 0) res.val_accuracy.push_back(e.accuracy);
    if (e.f1 >= 0) res.val_f1.push_back(e.f1), res.val_mcc.push_back(e.mcc);
    const double epoch = (double)step / (double)steps_per_epoch;
    if (r.evals) {
      nlohmann::json line = {{"step", step}, {"epoch", epoch}, {"val_loss", e.loss}, {"examples", e.counted}};
      if (e.accuracy >= 0) line["accuracy"] = e.accuracy;
      if (e.f1 >= 0) line["f1"] = e.f1, line["mcc"] = e.mcc;
      r.evals->write(line);
    }
    if (print) {
      std::printf("eval  step %6lld (epoch %.2f) | val_loss %.4f", (long long)step, epoch, e.loss);
      if (e.accuracy >= 0) std::printf(" | accuracy %.4f", e.accuracy);
      if (e.f1 >= 0) std::printf(" | f1 %.4f | mcc %.4f", e.f1, e.mcc);
      std::printf(" | %lld %s\n", (long long)e.counted, desc.head == HeadKind::classifier ? "examples" : "windows");
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
  // One rank updating the whole buffer: the clip factor and the skip of a non-finite step need no
  // other rank, so the optimizer decides them on the device from the step's scalars and the host
  // reads them once, after it (docs/GPU.md "A step without host synchronisation").
  const bool clip_on_device = !r.pipe && r.world == 1 && !r.sync->opt.zero && !o.host_clip;
  r.tracer.origin_ms = now_ms();
  for (int64_t step = r.start_step; step < tc.steps; step++) {
    r.tracer.enabled = o.write_run_dir && step - r.start_step < cfg.runtime.trace_steps;
    const double t0 = now_ms();
    wd.enter("data", step);
    const Batch batch = r.train_data.read(r.sampler->windows(step));
    const double t1 = now_ms();
    float local_loss = 0;
    float clip = 1.0f;  // the single-model path's clip factor, folded into the optimizer
    double t2, t3, t4, grad_norm;
    const double lr = lr_at(tc, step);
    bool stepped_on_device = false;  // the optimizer is queued already and decided the skip itself
    bool finite = true;              // this rank's loss and gradient norm are finite
    if (r.pipe) {  // the schedule's forwards and backwards, the tied sum, the data-parallel sync
      wd.enter("pipeline forward/backward", step);
      const PipelineStepStats ps = r.pipe->forward_backward(step, batch);
      local_loss = (float)ps.local_loss;  // 0 except on the last stage (the loss reduction divides by dp)
      r.pipe_sync = ps.sync;
      // Forwards and backwards interleave: forward_ms holds the whole schedule, backward_ms the tied sum.
      t4 = now_ms(), t3 = t4 - ps.sync_ms, t2 = t3 - ps.tied_ms;
      wd.enter("optimizer", step);
      grad_norm = r.pipe->clip_grad_norm(tc.grad_clip);  // over every stage
      finite = std::isfinite(local_loss) && std::isfinite(grad_norm);
    } else {
      // No host wait inside the step on a GPU (docs/GPU.md "A step without host synchronisation"): the ops are
      // queued, the phases timed by stream marks, and the host reads the loss sum, the gradient's
      // sum of squares and the bad-target flag once: on one rank after the optimizer, which computed
      // the clip factor and the non-finite skip from them on the device; otherwise after the
      // gradient sync, the clip factor then folded into the optimizer.
      wd.enter("forward", step);
      Model& model = *r.model;
      model.zero_grads();
      r.acts->dropout = DropoutContext{true, tc.seed, step, r.rank, 0};
      if (r.on_gpu) cuda_mark(0);
      model.train_forward_queued(*r.acts, batch);  // the LM head fused (transformer.h)
      if (r.on_gpu) cuda_mark(1);
      t2 = now_ms();
      wd.enter("backward", step);
      r.sync->begin_step();
      model.backward(*r.acts, [&](size_t k) { r.sync->on_ready(k); });
      if (r.on_gpu) cuda_mark(2);
      t3 = now_ms();
      wd.enter("gradient sync", step);
      r.sync->finish();  // gradient methods: every rank now holds the averaged gradient
      if (r.on_gpu) cuda_mark(3);
      t4 = now_ms();
      // With "weights" the gradient (and so its norm and clipping) is this rank's own.
      wd.enter("optimizer", step);
      StepScalars* dev = r.acts->scalars;
      r.ops->zero(&dev->grad_sumsq, sizeof(double));
      if (r.sync->opt.zero)  // ZeRO-1: each rank holds the averaged gradient in its pieces only
        sum_squares_of_pieces_add(*r.ops, &dev->grad_sumsq, model.grads, r.sync->shard, model.table.numel);
      else
        r.ops->sum_squares_add(&dev->grad_sumsq, model.grads, model.table.numel);
      if (clip_on_device) {
        r.opt->step_on_device(model.params, model.grads, model.table, lr, tc, dev);
        stepped_on_device = true;
      }
      const StepScalars sc = model.read_scalars(*r.acts);  // the step's one readback
      local_loss = model.loss_of(sc, *r.acts);
      double sumsq = sc.grad_sumsq;
      if (r.sync->opt.zero) MPI_Allreduce(&sc.grad_sumsq, &sumsq, 1, MPI_DOUBLE, MPI_SUM, comm);
      grad_norm = std::sqrt(sumsq);
      clip = clip_factor(grad_norm, tc.grad_clip);
      // On the device path exactly the test the update made (the same values, the same function).
      finite = stepped_on_device ? update_allowed(sc) : std::isfinite(local_loss) && std::isfinite(grad_norm);
    }
    // The global loss and whether any rank saw a non-finite loss or gradient norm, in one collective.
    double mine[2] = {local_loss, finite ? 0.0 : 1.0}, all[2];
    if (r.world > 1) {
      wd.enter("loss allreduce", step);
      MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_SUM, comm);
    } else {
      all[0] = mine[0], all[1] = mine[1];
    }
    const float loss = (float)(all[0] / (r.groups ? r.groups->dp : r.world));
    const bool nonfinite = all[1] > 0;
    if (nonfinite) {
      // The device skipped the update (parameters and moments untouched); its step must not count
      // in AdamW's bias correction, as a step the host never started does not.
      if (stepped_on_device) r.opt->unstep();
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
    } else if (!stepped_on_device) {
      wd.enter("optimizer", step);
      if (r.pipe)
        r.pipe->optimizer_step(lr, tc);
      else if (r.sync->opt.zero) {  // update this rank's piece of each bucket, all-gather the bucket
        r.opt->begin_step();
        r.sync->gather_params(r.model->params, [&](size_t b) {
          r.opt->update_range(b, r.model->params, r.model->grads, r.model->table, lr, tc, clip);
        });
      } else {
        r.opt->step(r.model->params, r.model->grads, r.model->table, lr, tc, clip);
      }
    }
    if (r.on_gpu) cuda_synchronize();  // the step boundary
    const double t5 = now_ms();
    if (r.on_gpu && !r.pipe) {  // the GPU's phase times, from the stream marks (mark 0 at host time t1)
      t2 = t1 + cuda_marks_ms(0, 1);
      t3 = t1 + cuda_marks_ms(0, 2);
      t4 = t1 + cuda_marks_ms(0, 3);
    }
    wd.enter("parameter averaging", step);
    if (r.sync) r.sync->average_params(r.model->params, step);  // "weights" only, every average_every steps
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
    const double tokens_per_step = r.pipe ? tokens_per_full_step : tokens_per_full_step * batch.B / lb;
    res.losses.push_back(loss);
    res.step_ms.push_back(step_ms);
    res.bytes_sent_last_step = (r.pipe ? r.pipe_sync : r.sync->step).bytes_sent;

    const bool last = step + 1 == tc.steps;
    const bool overridden = step == r.start_step && !r.accepted_changes.empty();  // logged with the first step
    // The first five steps are always shown (the losses of the first minibatches).
    if (step % tc.log_every == 0 || step < 5 || last || nonfinite || overridden) {
      std::vector<double> recent(res.step_ms.begin() + (res.step_ms.size() > 1 ? 1 : 0), res.step_ms.end());
      const double med_ms = median(recent);
      const double tok_s = tokens_per_step / (step_ms / 1000.0);
      const SyncStats& s = r.pipe ? r.pipe_sync : r.sync->step;
      if (r.metrics) {
        nlohmann::json line = {{"step", step}, {"epoch", r.sampler->epoch_of(step)}, {"loss", loss}, {"lr", lr},
                          {"tokens_per_s", tok_s}, {"step_ms", step_ms}, {"data_ms", t1 - t0},
                          {"forward_ms", t2 - t1}, {"backward_ms", t3 - t2}, {"comm_ms", s.comm_ms},
                          {"exposed_comm_ms", s.exposed_comm_ms}, {"optim_ms", t5 - t4},
                          {"bytes_communicated", s.bytes_sent + s.bytes_received},
                          {"bytes_sent", s.bytes_sent}, {"bytes_received", s.bytes_received},
                          {"collectives", s.collectives}, {"grad_norm", grad_norm}, {"skipped", nonfinite}};
        if (overridden)
          for (const ContractRow& c : r.accepted_changes)
            line["resume_overrides"].push_back({{"key", c.key}, {"checkpoint", c.was}, {"now", c.now}});
        r.metrics->write(line);
      }
      if (print) {
        std::printf("step %6lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | %6.1f ms/step | ETA %s\n",
                    (long long)step, (long long)tc.steps, loss, lr, tok_s, step_ms,
                    format_duration(med_ms / 1000.0 * (double)(tc.steps - step - 1)).c_str());
        std::fflush(stdout);
      }
    }
    const bool epoch_end = tc.epochs > 0 && (step + 1) % steps_per_epoch == 0;
    if ((tc.eval_every > 0 && (step + 1) % tc.eval_every == 0) || epoch_end || last) do_eval(step + 1);
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

  // The median step after the first (which allocates and warms up), when there is one.
  const std::vector<double> after_first(res.step_ms.begin() + (res.step_ms.size() > 1 ? 1 : 0), res.step_ms.end());
  const double median_step_ms = after_first.empty() ? 0 : median(after_first);
  if (res.step_ms.size() > 1) res.tokens_per_s_median = tokens_per_full_step / (median_step_ms / 1000.0);
  // Peak resident memory: every rank's, on rank 0 (what llmpi-plan predicts); the smallest and
  // largest are printed.
  res.peak_rss_bytes = peak_rss_bytes();
  std::vector<double> rss_all(r.world, res.peak_rss_bytes);
  if (r.world > 1)
    MPI_Gather(&res.peak_rss_bytes, 1, MPI_DOUBLE, rss_all.data(), 1, MPI_DOUBLE, 0, comm);
  const double rss_lo = *std::min_element(rss_all.begin(), rss_all.end());
  const double rss_hi = *std::max_element(rss_all.begin(), rss_all.end());
  if (r.rank == 0 && o.write_run_dir && !res.losses.empty()) {
    // summary.json: what a run measured, for tools (llmpi-plan's check compares its projection).
    const nlohmann::json summary = {{"steps_run", res.losses.size()}, {"start_step", r.start_step},
                                    {"median_step_ms", median_step_ms},
                                    {"tokens_per_s_median", res.tokens_per_s_median},
                                    {"peak_rss_bytes_per_rank", rss_all}, {"world_size", r.world},
                                    {"gemm_precision", gemm_precision_name(r.precision)},
                                    {"rss_before_model_bytes_rank0", r.rss_before_model},
                                    {"memory_estimate_bytes_rank0", r.memory.host_bytes()},
                                    {"memory_estimate_rank0", {{"params", r.memory.params}, {"grads", r.memory.grads},
                                                               {"optimizer", r.memory.optimizer},
                                                               {"activations", r.memory.activations},
                                                               {"scratch", r.memory.scratch},
                                                               {"sync_buffers", r.memory.sync_buffers},
                                                               {"checkpoint_staging", r.memory.checkpoint_staging},
                                                               {"data", r.memory.data}}},
                                    {"checkpoints_written", !res.last_checkpoint.empty()},
                                    {"optimizer_state_floats_rank0", res.optimizer_state_floats}};
    write_file_atomic(cfg.run.dir + "/summary.json", summary.dump(1) + "\n");
  }
  if (print && !res.losses.empty() && !res.preempted) {
    std::printf("done: %lld steps, median %.0f tokens/s, train loss %.4f -> %.4f", (long long)tc.steps,
                res.tokens_per_s_median, res.losses.front(), res.losses.back());
    if (res.val_losses.size() >= 2)
      std::printf(", val loss %.4f -> %.4f", res.val_losses.front(), res.val_losses.back());
    if (res.skipped_steps) std::printf(", %lld non-finite steps skipped", (long long)res.skipped_steps);
    if (rss_hi > 0)
      std::printf(", peak RSS per rank %s%s", format_bytes(rss_lo).c_str(),
                  rss_hi > rss_lo * 1.005 ? (" – " + format_bytes(rss_hi)).c_str() : "");
    std::printf("\n");
    std::fflush(stdout);
  }
  if (o.write_run_dir && cfg.runtime.trace_steps > 0)
    r.tracer.write(cfg.run.dir + "/trace-rank" + std::to_string(r.rank) + ".json");
  if (return_params) {
    if (r.pipe) {  // the whole model, by name, on every rank
      res.final_params = r.pipe->gather_whole(0);
      res.final_params.resize(numel);
      MPI_Bcast(res.final_params.data(), (int)numel, MPI_FLOAT, 0, comm);
    } else {
      res.final_params.resize(numel);
      r.ops->copy_to_host(res.final_params.data(), r.model->params, numel * sizeof(float));
    }
  }
  return res;
}

}  // namespace llmpi
