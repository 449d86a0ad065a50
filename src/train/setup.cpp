// A run's set-up, up to the first step (train/run.h start_run): each piece agreed between the
// ranks before the next can need a collective, so a problem on one rank never leaves another
// waiting.
#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/gemm_auto.h"
#include "backend/cuda_ops.h"
#include "data/dataset_identity.h"
#include "model/dense_layers.h"
#include "runtime/mpi_env.h"
#include "train/run.h"

namespace llmpi {

namespace {

int default_threads(int local_ranks) {
  cpu_set_t set;
  int cores = 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  return std::max(1, cores / std::max(1, local_ranks));
}

std::string absolute_path(const std::string& p) {
  char buf[4096];
  return realpath(p.c_str(), buf) ? std::string(buf) : p;
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

// The device: every rank learns whether every rank has a usable GPU before anyone can fail, so all
// ranks take the same decision (and none is left waiting in a collective). Returns the node-local
// rank count (threads per rank) and binds the GPU.
int choose_device(Run& r) {
  MPI_Comm node;
  MPI_Comm_split_type(r.comm, MPI_COMM_TYPE_SHARED, r.rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  r.node_ranks.resize((size_t)local_size);
  MPI_Allgather(&r.rank, 1, MPI_INT, r.node_ranks.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  std::string why;
  int have_gpu = cuda_available(&why) ? 1 : 0, all_gpu = have_gpu, first_without = r.world;
  int mine = have_gpu ? r.world : r.rank;
  MPI_Allreduce(&have_gpu, &all_gpu, 1, MPI_INT, MPI_MIN, r.comm);
  MPI_Allreduce(&mine, &first_without, 1, MPI_INT, MPI_MIN, r.comm);
  const DeviceChoice choice = r.cfg.runtime.device;
  const bool use_cuda = choice == DeviceChoice::cuda || (choice == DeviceChoice::automatic && all_gpu);
  if (use_cuda && !all_gpu)
    fail("runtime.device is \"cuda\" but rank ", first_without, " has no usable GPU",
         r.rank == first_without ? ": " + why : std::string(), "; use runtime.device \"cpu\" or \"auto\"");
  if (use_cuda) cuda_bind_device(local_rank);  // GPU = local rank mod device count
  r.ops = use_cuda ? &cuda_ops() : &cpu_ops();
  r.on_gpu = use_cuda;
  const std::string precision_error = precision_device_error(r.cfg.runtime.precision, choice, use_cuda);
  if (!precision_error.empty()) fail(precision_error);
  r.threads = r.cfg.runtime.threads > 0 ? r.cfg.runtime.threads : default_threads(local_size);
  // OpenBLAS's count is what the dense layers may use; they run their GEMMs on OpenMP's threads,
  // each an OpenBLAS call on one thread (backend/cpu/matmul.cpp), so the two pools never compete.
  omp_set_num_threads(r.threads);
  openblas_set_num_threads(r.threads);
  if (!use_cuda) {
    r.cpu_bf16_gemm.emplace(r.cfg.runtime.cpu_bf16_gemm);
    r.cpu_fp32_gemm.emplace(r.cfg.runtime.cpu_fp32_gemm);
  }
  return local_size;
}

// The data: the training split, its sampler, and the validation split; the model's vocabulary.
int open_data(Run& r) {
  const Config& cfg = r.cfg;
  const int T = cfg.model.seq_len;
  const bool cls = cfg.model.family == Family::bert;
  r.train_data.open(cfg.data.train, cfg.model.family, T);
  const int64_t file_vocab = r.train_data.vocab_size();
  const int vocab = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : (int)file_vocab;
  if (file_vocab > vocab)
    fail("model.vocab_size is ", vocab, " but '", cfg.data.train, "' was tokenized with a vocabulary of ",
         file_vocab, ": set model.vocab_size >= ", file_vocab, " (or 0 to take it from the file)");
  if (r.train_data.n_samples < 1)
    fail("model.seq_len (", T, ") is longer than the data in '", cfg.data.train, "': use a shorter seq_len or more data");
  if (cls && r.train_data.examples_file.info().num_labels > cfg.model.num_labels)
    fail("'", cfg.data.train, "' has ", r.train_data.examples_file.info().num_labels, " labels but model.num_labels is ",
         cfg.model.num_labels, ": set model.num_labels to ", r.train_data.examples_file.info().num_labels);
  // The data-parallel replicas share the batch; every stage of a pipeline reads its replica's rows.
  const bool split_batches = r.groups->pp > 1 || cfg.parallel.microbatches > 1;
  if (split_batches && !cfg.train.drop_last && r.groups->pp > 1)
    fail("train.drop_last=false (a shorter last step per epoch) does not work with pipeline stages, whose "
         "micro-batches split a full batch: set train.drop_last=true, or parallel.pp_stages=1");
  r.sampler = std::make_unique<Sampler>(r.train_data.n_samples, cfg.train.global_batch, r.groups->dp,
                                        r.groups->dp_rank, cfg.train.seed, cfg.train.drop_last);
  if (cfg.train.epochs > 0) {  // a run measured in epochs: the step count follows from the data
    r.cfg.train.steps = cfg.train.epochs * r.sampler->steps_per_epoch();
    r.cfg.resolved["train"]["steps"] = r.cfg.train.steps;
  }
  if (!cfg.data.val.empty()) {
    r.has_val = true;
    r.val_data.open(cfg.data.val, cfg.model.family, T);
    if (r.val_data.vocab_size() > vocab)
      fail("'", cfg.data.val, "' has vocabulary ", r.val_data.vocab_size(), " but the model has ", vocab,
           ": make train and val files with the same tokenizer");
    // A replica evaluates partial batches too (Engine::evaluate); a pipeline splits full ones.
    if (r.val_data.n_samples < (r.groups->pp > 1 ? cfg.train.global_batch : 1))
      fail("'", cfg.data.val, "' holds ", r.val_data.n_samples, cls ? " examples" : " windows of seq_len+1 tokens",
           ", fewer than one global batch (", cfg.train.global_batch,
           "): use a larger validation split (llmpi-prep --val-fraction) or a smaller batch");
  }
  // Dataset identity (data/dataset_identity.h): one tokenizer, no half-replaced llmpi-prep output.
  const DatasetIdentity train_id = r.train_data.identity();
  const DatasetIdentity val_id = r.has_val ? r.val_data.identity() : DatasetIdentity();
  for (const std::string& w : check_training_data(train_id, r.has_val ? &val_id : nullptr))
    if (r.rank == 0) std::fprintf(stderr, "llmpi-train: warning: %s\n", w.c_str());
  r.data_json = nlohmann::json{{"train", train_id.json()}, {"val", r.has_val ? val_id.json() : nlohmann::json()}}.dump();
  return vocab;
}

// This rank's memory estimate against what its node (and GPU) has; an Error, with the numbers and
// the largest global batch that would fit, when it cannot fit. Each rank of the node is counted at
// its own place in the layout: its pipeline stage's chunks and activation slots, its tensor shard,
// its data-parallel rank (ZeRO-1's shard, the gather buffers, its turn of a checkpoint's tensors).
// See model/memory_estimate.h. `desc`: the whole model (with sequence parallelism set).
void check_memory(Run& r, const ModelDesc& desc, int local_size) {
  const Config& c = r.cfg;
  const ParallelGroups& g = *r.groups;
  const int lb = r.sampler->local_batch(), T = c.model.seq_len, M = c.parallel.microbatches;
  using Place = ParallelGroups::Place;
  std::vector<Place> node;  // the places of the node's ranks
  for (int w : r.node_ranks) node.push_back(g.place_of(w));
  std::vector<RankChunks> stage_chunks;  // per stage
  std::vector<ModelDesc> shards;         // per tp_rank
  try {
    for (int s = 0; s < g.pp; s++) stage_chunks.push_back(rank_chunks(desc, c.parallel, T, s));
  } catch (const Error&) {
    return;  // a layout the engine refuses: it says why, naming the keys
  }
  for (int t = 0; t < g.tp; t++) shards.push_back(g.tp > 1 ? tensor_shard(desc, g.tp, t) : desc);
  auto estimate = [&](int b, const Place& p) {
    RankChunks rc = stage_chunks[(size_t)p.stage];
    rc.tp = g.tp, rc.tp_rank = p.tp_rank;
    return estimate_memory(shards[(size_t)p.tp_rank], b, T, c, g.dp, p.dp_rank, r.on_gpu, &rc);
  };
  const Place me = g.place_of(g.world_rank);
  r.memory = estimate(lb, me);
  auto node_need = [&](int b) {
    double sum = 0;
    for (const Place& p : node) sum += estimate(b, p).host_bytes();
    return sum;
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
    return gpu_free < 0 || estimate(b, me).device_bytes() + gpu_reserve <= gpu_free;
  };
  const std::string ranks = std::to_string(local_size) + " rank" + (local_size > 1 ? "s" : "");
  r.memory_note = "node: " + format_bytes(node_need(lb)) + " for " + ranks + " of " +
                  (host_avail >= 0 ? format_bytes(host_avail) + " available (" + source + ")" : std::string("unknown"));
  if (r.on_gpu) r.memory_note += "; GPU: " + format_bytes(gpu_free) + " free of " + format_bytes(gpu_total);
  if (!c.runtime.memory_check || fits(lb)) return;
  int best = 0;  // the largest local batch (a multiple of the micro-batches) that fits
  for (int lo = 1, hi = lb / M - 1; lo <= hi;) {
    const int mid = lo + (hi - lo) / 2;
    if (fits(mid * M)) best = mid * M, lo = mid + 1;
    else hi = mid - 1;
  }
  const bool gpu_short = r.on_gpu && estimate(lb, me).device_bytes() + gpu_reserve > gpu_free;
  const std::string where = gpu_short ? "the GPU has " + format_bytes(gpu_free) + " free"
                                      : "the node has " + format_bytes(host_avail) + " available (" + source +
                                            ") for " + ranks + " needing " + format_bytes(node_need(lb));
  const std::string largest = c.train.batch_per_rank > 0
                                  ? "train.batch_per_rank that fits is " + std::to_string(best)
                                  : "train.global_batch that fits is " + std::to_string(best * r.groups->dp) + " (" +
                                        std::to_string(best) + " per rank)";
  const std::string fix =
      best > 0 ? "the largest " + largest + "; or use more parallel.microbatches, a shorter model.seq_len or fewer "
                 "ranks per node"
               : "even one sequence per rank does not fit: the model itself (parameters, gradients and "
                 "optimizer state: " + format_bytes(r.memory.params + r.memory.grads + r.memory.optimizer) +
                     ") is too large here; use a smaller model, or fewer ranks per node";
  fail("this configuration needs about ", format_bytes(r.on_gpu ? r.memory.device_bytes() : r.memory.host_bytes()),
       " per rank (", r.memory.describe(), ") but ", where, ": ", fix,
       " (runtime.memory_check=false skips this check)");
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

// What the sync method exchanges, bucket by bucket: written once to run_dir/comm_plan.json.
nlohmann::json comm_plan(const Run& r) {
  const ModelChunk& ch = r.engine->chunks.front();
  const GradSync& g = *ch.sync;
  const ParamTable& t = ch.model->table;
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
          {"optimizer_state_floats_this_rank", r.engine->optimizer_state_floats()}, {"dtype", "float32"},
          {"grad_dtype", g.opt.bf16 ? "bf16" : "fp32"}, {"total_floats", t.numel},
          {"expected_bytes_sent_per_pass_rank0", g.expected_bytes_per_pass(t.numel)}, {"buckets", buckets}};
}

// The engine over this rank's part of the model, once the memory it needs is known to be there.
void build_engine(Run& r, int vocab, int local_size) {
  const Config& cfg = r.cfg;
  ModelDesc desc = model_desc_from_config(cfg.model, vocab);
  // how, not what: not in checkpoints
  desc.attention = resolve_attention(cfg.runtime.attention, r.ops->on_gpu(), desc.head_dim());
  desc.lm_head_chunk_rows = cfg.runtime.lm_head_chunk_rows;
  resolve_config(*r.cfg.resolved, desc);
  r.rss_before_model = peak_rss_bytes();  // libraries, MPI, open files: what no estimate counts
  // With tensor parallelism a rank holds a shard (refused here, naming the key, when the model does
  // not split so). With sequence parallelism its residual stream is N / tp rows.
  ModelDesc shard_of = desc;
  shard_of.sequence_parallel = r.groups->tp > 1 && cfg.parallel.sequence_parallel;
  check_memory(r, shard_of, local_size);
  r.tracer.rank = r.rank;
  r.watchdog = std::make_unique<Watchdog>(cfg.runtime.step_timeout_s);
  EngineOptions eo;
  eo.optimizer = cfg.train.optimizer;
  eo.local_batch = r.sampler->local_batch();
  eo.T = cfg.model.seq_len;
  eo.seed = cfg.train.seed;
  eo.precision = cfg.runtime.precision;
  eo.recompute = cfg.runtime.recompute;
  eo.tracer = &r.tracer;
  eo.watchdog = r.watchdog.get();
  try {
    r.engine = std::make_unique<Engine>(desc, *r.ops, *r.groups, cfg.parallel, sync_options(cfg.parallel), eo);
  } catch (const std::bad_alloc&) {
    fail("out of memory while allocating the model (estimated need per rank: ", r.memory.describe(), "; ",
         r.memory_note, "): use a smaller train.global_batch, model.seq_len or model, or fewer ranks per node");
  }
}

// The dense layers of one training step on this rank: every chunk's, on its micro-batches' rows.
std::vector<DenseShape> step_dense_layers(const Run& r) {
  const Engine& e = *r.engine;
  std::vector<DenseShape> layers;
  for (const ModelChunk& ch : e.chunks)
    for (DenseShape s : dense_layers(ch.model->desc, ch.model->part, e.micro_batch, e.T)) {
      s.count *= e.M;
      layers.push_back(s);
    }
  return layers;
}

// The engine of runtime.cpu_fp32_gemm or cpu_bf16_gemm (Engine), whichever the run's precision
// uses on the CPU; collective over r.comm, the same engine on every rank. An explicit setting
// stays as choose_device selected it, also over a resumed checkpoint's other engine (a warning).
// "auto" becomes: resumed, the engine the checkpoint records (one written before engines were
// recorded says "auto": what that was, untimed); fresh, the faster as o.time_cpu_gemms times
// them (backend/cpu/gemm_auto.h), rank 0's times deciding for every rank, or without it the
// untimed choice; the fallback wherever oneDNN cannot run on every rank. The engine in use is the
// key's value in the resolved configuration (config.json, checkpoints).
template <typename Engine>
void choose_cpu_engine(Run& r, const TrainOptions& o, Engine given, Engine fallback, Engine untimed) {
  const GemmPrecision prec = r.cfg.runtime.precision;
  const bool bf16 = prec == GemmPrecision::bf16;
  const char* key = bf16 ? "cpu_bf16_gemm" : "cpu_fp32_gemm";
  const std::string setting = std::string("runtime.") + key + " \"" + option_name(given) + "\"";
  const nlohmann::json& ck = r.resumed_runtime;
  Engine recorded = Engine::automatic;  // automatic: none recorded
  if (ck.is_object() && ck.contains(key) && ck[key].is_string()) parse_option(ck[key].get<std::string>(), &recorded);
  auto warn = [&](const std::string& w) {
    if (o.print && r.rank == 0) std::fprintf(stderr, "llmpi-train: warning: %s\n", w.c_str());
  };
  const std::string differ = "from here on its GEMMs sum in another order, so the run's bits differ from an "
                             "uninterrupted one's";
  if (given != Engine::automatic) {
    if (recorded != Engine::automatic && recorded != given)
      warn(setting + " replaces \"" + option_name(recorded) + "\", the engine of checkpoint '" + r.resumed_from +
           "': " + differ);
    return;
  }
  std::string missing;
  int have = (bf16 ? cpu::onednn_bf16_available(&missing) : cpu::onednn_fp32_available(&missing)) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, r.comm);
  if (missing.empty()) missing = "oneDNN cannot run on every rank";
  Engine engine = fallback;
  std::string why;
  if (!r.resumed_from.empty()) {
    engine = recorded != Engine::automatic ? recorded : have ? untimed : fallback;
    why = setting + (recorded != Engine::automatic
                         ? ": the checkpoint's engine, not timed again"
                         : ": not timed, as when the checkpoint was written (it records no engine)");
    if (engine == Engine::onednn && !have) {
      warn("the checkpoint's engine, onednn, cannot run here (" + missing + "): " + option_name(fallback) +
           " instead; " + differ);
      engine = fallback;
      why = setting + ": the checkpoint's onednn cannot run here";
    }
  } else if (!have) {
    why = setting + ": " + missing;
  } else if (!o.time_cpu_gemms) {
    engine = untimed;
    why = setting + ", not timed";
  } else {
    CpuGemmTimes t;
    std::string err;
    try {
      t = o.time_cpu_gemms(prec, step_dense_layers(r));  // every rank at once, as they will train
    } catch (const std::exception& e) {
      err = "timing the CPU's GEMM engines for " + setting + " failed: " + e.what() + "; set runtime." + key +
            " to \"onednn\" or \"" + option_name(fallback) + "\"";
    }
    err = agree_on_error(r.comm, err);
    if (!err.empty()) throw CollectiveError(err);
    double times[2] = {t.onednn_s, t.fallback_s};
    MPI_Bcast(times, 2, MPI_DOUBLE, 0, r.comm);  // rank 0's decide
    t.onednn_s = times[0], t.fallback_s = times[1];
    engine = cpu::auto_prefers_onednn(t) ? Engine::onednn : fallback;
    why = setting + " " + cpu::describe_gemm_times(prec, t);
  }
  cpu::select_cpu_gemm(engine, why);
  r.cfg.resolved["runtime"][key] = option_name(engine);
}

void choose_cpu_gemm(Run& r, const TrainOptions& o) {
  if (r.on_gpu) return;
  const RuntimeConfig& c = r.cfg.runtime;
  if (c.precision == GemmPrecision::bf16)
    choose_cpu_engine(r, o, c.cpu_bf16_gemm, CpuBf16Gemm::emulate, CpuBf16Gemm::onednn);
  else
    choose_cpu_engine(r, o, c.cpu_fp32_gemm, CpuFp32Gemm::openblas, cpu::cpu_fp32_gemm_for_auto());
}

// Rank 0 writes the run directory. A resumed run appends to the logs, minus what the interrupted
// run logged after its checkpoint.
void open_run_directory(Run& r, const TrainOptions& o) {
  if (r.rank != 0 || !o.write_run_dir || o.dry_run) return;
  const std::string& dir = r.cfg.run.dir;
  make_dirs(dir);
  write_file_atomic(dir + "/config.json", r.cfg.resolved->dump(2) + "\n");
  const bool append = r.start_step > 0;
  if (append) {
    trim_jsonl(dir + "/metrics.jsonl", [&](int64_t s) { return s < r.start_step; });
    trim_jsonl(dir + "/eval.jsonl", [&](int64_t s) { return s <= r.start_step; });
  }
  write_file_atomic(dir + "/lineage", r.lineage + "\n");  // whose checkpoints --resume auto takes
  r.metrics = std::make_unique<JsonlWriter>(dir + "/metrics.jsonl", append);
  r.evals = std::make_unique<JsonlWriter>(dir + "/eval.jsonl", append);
  if (r.cfg.metrics.tensorboard) {
    r.tensorboard = std::make_unique<TensorboardWriter>(dir, r.start_step);
    // TensorBoard drops the earlier files' events from start_step on; eval.jsonl keeps the
    // evaluation at start_step (the checkpoint's), which this run does not repeat: written again.
    if (append) {
      std::ifstream in(dir + "/eval.jsonl");
      std::string line;
      while (std::getline(in, line)) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.contains("step") || j["step"] != r.start_step) continue;
        r.tensorboard->scalars(r.start_step, eval_scalars(j));
      }
    }
  }
  std::remove((dir + "/PREEMPTED").c_str());
  if (!r.engine->pipelined()) write_file_atomic(dir + "/comm_plan.json", comm_plan(r).dump(1) + "\n");
  if (!o.init_from.empty())  // llmpi-export copies the tokenizer files from there
    write_file_atomic(dir + "/init_from.json", nlohmann::json{{"dir", absolute_path(o.init_from)}}.dump() + "\n");
}

// Everything a rank can fail at on its own, before the collective pieces.
void set_up_rank(Run& r, const TrainOptions& o, int* vocab, int* local_size) {
  resolve_batch(r.cfg, r.groups->dp);  // train.batch_per_rank and train.lr_scaling for this world size
  *local_size = choose_device(r);
  *vocab = open_data(r);
  build_engine(r, *vocab, *local_size);
}

}  // namespace

void start_run(Run& r, const Config& cfg, MPI_Comm comm, const TrainOptions& o) {
  r.cfg = cfg;
  r.comm = comm;
  MPI_Comm_rank(comm, &r.rank);
  MPI_Comm_size(comm, &r.world);
  std::string err;
  if (o.resume == "auto" && !o.write_run_dir) err = "--resume auto needs a run directory";
  if (!o.resume_overrides.empty() && o.resume.empty())
    err = "--resume-override accepts a change when resuming: use it together with --resume";
  if (o.overwrite && !o.resume.empty())
    err = "--overwrite starts a new run over an earlier one; with --resume the earlier run continues: use one of them";
  if (!err.empty()) throw CollectiveError(err);  // the same on every rank
  claim_run_directory(r, o);  // collective: agreed before anything else can fail
  try {  // collective; fails on every rank alike (runtime/parallel_groups.h)
    r.groups = std::make_unique<ParallelGroups>(comm, cfg.parallel.pp_stages,
                                                cfg.model.family != Family::bert && cfg.model.tie_embeddings,
                                                cfg.parallel.tp);
  } catch (const Error& e) {
    throw CollectiveError(e.what());
  }
  int vocab = 0, local_size = 1;
  try {
    set_up_rank(r, o, &vocab, &local_size);
  } catch (const Error& e) {
    err = e.what();
  } catch (const std::bad_alloc&) {
    err = "out of memory during start-up (estimated need per rank: " + r.memory.describe() + "; " + r.memory_note +
          "): use a smaller train.global_batch, model.seq_len or model, or fewer ranks per node";
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw CollectiveError(err);
  // Collective set-up that must wait until every rank got this far: the NCCL communicator, the
  // Hugging Face weights (every rank reads its tensors; any rank's error is every rank's).
  try {
    r.engine->connect();
    std::vector<std::string> notes;
    if (!o.init_from.empty()) r.engine->init_from_hf(o.init_from, &notes);
    if (r.rank == 0 && o.print)
      for (const std::string& n : notes) std::printf("init-from: %s\n", n.c_str());
  } catch (const Error& e) {
    throw CollectiveError(e.what());  // reported alike on every rank
  }
  // Resume: every rank reads its state (a shared file system, as for the data).
  r.ckpt_dir = cfg.run.dir + "/checkpoints";
  try {
    if (o.resume == "auto") resume_auto(r, o.resume_overrides);
    else if (!o.resume.empty()) resume_from(r, o.resume, o.resume_overrides);
  } catch (const Error& e) {
    err = e.what();
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw CollectiveError(err);
  choose_cpu_gemm(r, o);  // collective: after resume (a resumed run keeps its engine), before config.json
  r.saved_at = r.start_step;
  try {
    open_run_directory(r, o);
  } catch (const Error& e) {
    err = e.what();
  }
  err = agree_on_error(comm, err);
  if (!err.empty()) throw CollectiveError(err);
}

}  // namespace llmpi
