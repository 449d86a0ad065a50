// Checkpoints of a run and resuming from them (train/run.h). A checkpoint holds every tensor of the
// whole model by name (checkpoint/sharded.h), written by the ranks that hold it and read by the
// ranks that need it, so it resumes with another world size, pipeline, tensor parallelism or
// ZeRO-1, and no rank ever holds more than its own state.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/cuda_ops.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/sharded.h"
#include "runtime/large_count.h"
#include "runtime/mpi_env.h"
#include "train/run.h"

namespace llmpi {

namespace {

// What one rank found trying to resume from a checkpoint: "" or its error, and whether the file
// is damaged (CheckpointDamaged: --resume auto skips it).
struct Attempt {
  std::string err;
  bool damaged = false;
};

// Every rank on its own, no collective call: checks that the checkpoint belongs to this model and
// configuration, verifies this rank's share of its checksums (CheckpointReader::verify_share) and
// reads exactly what this rank holds (Engine::state_ranges), whatever layout wrote it.
Attempt try_resume(Run& r, const std::string& path, const std::vector<std::string>& overrides) {
  try {
    const CheckpointInfo info = read_checkpoint_info(path);
    Engine& e = *r.engine;
    const ModelDesc& m = e.desc;
    const ParamTable& table = e.whole_table;  // checkpoints hold the whole model
    if (info.desc.family != m.family)
      fail("checkpoint '", path, "' holds a ", family_name(info.desc.family), " model, but this configuration has "
           "model.family \"", family_name(m.family), "\": resume it with model.family \"",
           family_name(info.desc.family), "\", or start a new run.dir");
    // The model description, global batch, seed, ... (train/resume_contract.h); dropout and init_std may change.
    r.accepted_changes = check_resume_contract(info, resume_contract_rows(info, r.cfg, m, r.data_json), overrides);
    if (info.param_table_json != param_table_json(table) || info.n != table.numel)
      fail("checkpoint '", path, "' holds a different parameter layout than this model; start a new run.dir");
    const std::string optimizer = option_name(r.cfg.train.optimizer);
    if (info.optimizer != optimizer)
      fail("checkpoint '", path, "' was made with train.optimizer \"", info.optimizer, "\", but this configuration has \"",
           optimizer, "\": use the same optimizer to resume");
    if (info.rows > 1 && (r.cfg.parallel.sync != SyncMethod::weights || info.rows != r.groups->dp))
      fail("checkpoint '", path, "' holds the separate parameters of ", info.rows, " ranks (sync \"weights\"): resume it "
           "with parallel.sync \"weights\" on ", info.rows, " ranks");
    if (!info.checksummed && r.rank == 0)
      std::fprintf(stderr, "llmpi-train: warning: checkpoint '%s' has no checksums (an older llmpi wrote it); "
                   "it is loaded unverified\n", path.c_str());
    const CheckpointReader reader(info);
    const int groups = r.cfg.train.optimizer == OptimizerKind::sgd ? 1 : 3;
    reader.verify_share(groups, r.rank, r.world);  // the other ranks verify the rest
    const int64_t replica = info.rows > 1 ? r.groups->dp_rank : 0;
    for (int which = 0; which < groups; which++) {
      std::vector<std::vector<float>> host(e.chunks.size());
      for (size_t c = 0; c < e.chunks.size(); c++)
        if (!e.state_in_place(c, which))
          host[c].resize(which == 0 ? e.chunks[c].model->table.numel : e.chunks[c].opt->n);
      for (const Engine::StateRange& sr : e.state_ranges(which, false, false)) {
        float* in_place = e.state_in_place(sr.chunk, which);
        float* at = (in_place ? in_place : host[sr.chunk].data()) + sr.at;
        for (const TensorRect& rect : slice_rects(e.chunks[sr.chunk].model->table.slices[sr.slice], sr.lo, sr.hi)) {
          reader.read(which, (size_t)sr.tensor, replica, rect, at);
          at += rect.numel();
        }
      }
      for (size_t c = 0; c < e.chunks.size(); c++)
        if (!e.state_in_place(c, which)) e.set_state(c, which, host[c].data());
    }
    for (ModelChunk& ch : e.chunks) ch.opt->t = info.optimizer_t;
    r.start_step = info.step;
    r.resumed_from = path;
    // The engines it ran (runtime.cpu_*_gemm, resolved): a resumed "auto" keeps them (train/setup.cpp).
    const nlohmann::json stored = nlohmann::json::parse(info.config_json, nullptr, false);
    r.resumed_runtime = stored.is_object() && stored.contains("runtime") ? stored["runtime"] : nlohmann::json();
    if (!info.lineage.empty()) r.lineage = info.lineage;  // a resumed run continues its lineage
  } catch (const CheckpointDamaged& e) {
    return {e.what(), true};
  } catch (const Error& e) {
    return {e.what(), false};
  }
  return {};
}

// Every rank's attempt agreed: "" when all succeeded, else the lowest failing rank's error, and
// whether any rank found the file damaged. Collective over r.comm.
Attempt agree(Run& r, const Attempt& mine) {
  Attempt all{agree_on_error(r.comm, mine.err), false};
  int damaged = mine.damaged;
  MPI_Allreduce(MPI_IN_PLACE, &damaged, 1, MPI_INT, MPI_MAX, r.comm);
  all.damaged = damaged != 0;
  return all;
}

// The lineage run.dir's last run recorded (run.dir/lineage), "" when none was.
std::string recorded_lineage(const std::string& dir) {
  std::ifstream in(dir + "/lineage");
  std::string id;
  in >> id;
  return id;
}

}  // namespace

void resume_from(Run& r, const std::string& path, const std::vector<std::string>& overrides) {
  const Attempt a = agree(r, try_resume(r, path, overrides));
  if (a.damaged) throw CheckpointDamaged(a.err);
  if (!a.err.empty()) fail(a.err);
}

// Rank 0 lists the run's checkpoints, newest first; every rank then tries each from its own view
// of run.dir (a node-local copy, a lagging parallel file system). A file another run wrote (by its
// lineage, as rank 0 reads it) or that any rank finds damaged is skipped with a warning; any other
// refusal stops every rank, naming the rank that could not read the file.
void resume_auto(Run& r, const std::vector<std::string>& overrides) {
  std::string names;  // file names, one per line
  if (r.rank == 0)
    for (const std::string& path : checkpoints_newest_first(r.ckpt_dir))
      names += std::filesystem::path(path).filename().string() + "\n";
  int len = mpi_count(names.size(), "the names of the run's checkpoints");
  MPI_Bcast(&len, 1, MPI_INT, 0, r.comm);
  names.resize((size_t)len);
  MPI_Bcast(names.data(), len, MPI_CHAR, 0, r.comm);
  const std::string lineage = r.rank == 0 ? recorded_lineage(r.cfg.run.dir) : "";
  std::string skipped;
  for (size_t b = 0, e; b < names.size(); b = e + 1) {
    e = names.find('\n', b);
    const std::string path = r.ckpt_dir + "/" + names.substr(b, e - b);
    int other_run = 0;
    if (r.rank == 0) {
      try {
        const CheckpointInfo info = read_checkpoint_info(path);
        if (!lineage.empty() && !info.lineage.empty() && info.lineage != lineage) {
          other_run = 1;
          std::fprintf(stderr, "llmpi-train: warning: skipping checkpoint '%s': another run wrote it (lineage %s; "
                       "this run's is %s)\n", path.c_str(), info.lineage.c_str(), lineage.c_str());
        }
      } catch (const Error&) {  // damaged or unreadable: the attempt below says so on every rank
      }
    }
    MPI_Bcast(&other_run, 1, MPI_INT, 0, r.comm);
    if (other_run) continue;
    // A file rank 0 reads but another rank cannot open is not damaged: that rank's view of
    // run.dir differs (a stale node), and every rank stops, naming it.
    bool opened = true;
    try {
      read_checkpoint_info(path);
    } catch (const Error&) {
      opened = false;
    }
    int rank0_opened = opened;
    MPI_Bcast(&rank0_opened, 1, MPI_INT, 0, r.comm);
    Attempt mine = try_resume(r, path, overrides);
    if (rank0_opened && !opened) mine.damaged = false;
    if (r.rank != 0 && !mine.err.empty() && !mine.damaged)
      mine.err = "--resume auto: rank " + std::to_string(r.rank) + " cannot resume from '" + path +
                 "', the checkpoint rank 0 chose (" + mine.err + "): wait until every node sees the same files in " +
                 "run.dir, or name one with --resume PATH";
    const Attempt a = agree(r, mine);
    if (a.err.empty()) return;
    if (!a.damaged) fail(a.err);
    if (r.rank == 0)
      std::fprintf(stderr, "llmpi-train: warning: skipping checkpoint '%s': %s\n", path.c_str(), a.err.c_str());
    skipped += std::string(skipped.empty() ? "" : "; ") + a.err;
  }
  if (!skipped.empty())
    fail("no checkpoint in '", r.ckpt_dir, "' can be resumed, every one is damaged (", skipped,
         "); start a new run.dir, or move the damaged files away to start this one afresh");
}

// ---- saving ---------------------------------------------------------------------------------------

namespace {

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, (size_t)len);
}

}  // namespace

void finish_checkpoint(Run& r) {
  if (!r.pending) return;
  PendingCheckpoint& p = *r.pending;
  if (p.writer.joinable()) p.writer.join();
  std::string err = agree_on_error(r.comm, p.error);
  if (err.empty() && r.rank == 0) {
    h5::TmpFileGuard guard{p.tmp};
    try {
      h5::commit_tmp_file(p.tmp, p.path, guard);
      prune_checkpoints(r.ckpt_dir, r.cfg.checkpoint.keep, r.lineage);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  if (!err.empty() && r.rank == 0) std::remove(p.tmp.c_str());
  r.pending.reset();
  err = agree_on_error(r.comm, err);
  if (!err.empty()) throw CollectiveError(err);
}

namespace {

// The file of a save: the checksums, its creation by rank 0 and its opening through MPI-IO,
// collective over p.comm. Returns "" or an error that is the same on every rank, and then leaves
// no file open and no file behind.
std::string open_file(PendingCheckpoint& p, const ParamTable& whole, int groups) {
  rect_crcs(p.writes);
  try {
    p.offsets = create_sharded_file(p.comm, p.tmp, p.info, whole, groups, p.writes);
  } catch (const Error& e) {
    return e.what();  // agreed inside: the same on every rank, and no file left
  }
  const int rc = MPI_File_open(p.comm, p.tmp.c_str(), MPI_MODE_WRONLY, MPI_INFO_NULL, &p.fh);
  const std::string err = agree_on_error(
      p.comm, rc == MPI_SUCCESS ? "" : "cannot open '" + p.tmp + "' for writing (" + mpi_error_text(rc) + ")");
  if (!err.empty()) {
    if (p.fh != MPI_FILE_NULL) MPI_File_close(&p.fh);
    int rank = 0;
    MPI_Comm_rank(p.comm, &rank);
    if (rank == 0) std::remove(p.tmp.c_str());
  }
  return err;
}

// This rank's values into the open file, then the file durable and closed; returns its error (""
// when none). The sync and close are collective over p.comm and made on every rank whatever its
// write did (the file is open on every rank or on none: its creation and opening agreed).
std::string write_values(PendingCheckpoint& p, const ParamTable& whole) {
  // LLMPI_CHECKPOINT_WRITE_DELAY_MS (a testing knob, tests/cli/checkpoint_async.sh): the write
  // starts that long after the file was created, so that a run can be killed during it.
  static const long delay_ms = [] {
    const char* v = std::getenv("LLMPI_CHECKPOINT_WRITE_DELAY_MS");
    return v ? std::max(0L, std::atol(v)) : 0L;
  }();
  if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  std::string err = write_rects(p.fh, whole, p.info.rows, p.offsets, p.writes, p.tmp);
  const int rc = MPI_File_sync(p.fh);  // durable before finish_checkpoint renames it into place
  if (rc != MPI_SUCCESS && err.empty()) err = "cannot sync '" + p.tmp + "' (" + mpi_error_text(rc) + "; disk full?)";
  MPI_File_close(&p.fh);
  return err;
}

}  // namespace

bool checkpoints_behind(const Run& r) {
  int level = 0;
  MPI_Query_thread(&level);
  return r.cfg.checkpoint.async && level == MPI_THREAD_MULTIPLE;
}

size_t checkpoint_share_floats(const Run& r) {
  const bool per_rank = r.cfg.parallel.sync == SyncMethod::weights && r.world > 1;
  const int groups = r.cfg.train.optimizer == OptimizerKind::sgd ? 1 : 3;
  size_t n = 0;
  for (int which = 0; which < groups; which++)
    for (const Engine::StateRange& sr : r.engine->state_ranges(which, true, per_rank)) n += sr.hi - sr.lo;
  return n;
}

float* CheckpointStaging::reserve(size_t n, bool pin) {
  if (n <= floats && pin == pinned) return data;
  release();
  const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
  data = static_cast<float*>(pin ? cuda_host_alloc(bytes) : std::malloc(bytes));
  if (!data) fail("out of memory allocating ", bytes, " bytes of host memory to stage a checkpoint");
  std::memset(data, 0, bytes);  // fault the pages in here, not in the copy a step waits for
  floats = n, pinned = pin;
  return data;
}

void CheckpointStaging::release() {
  if (pinned) cuda_host_free(data);
  else std::free(data);
  data = nullptr, floats = 0, pinned = false;
}

std::string save_checkpoint(Run& r, int64_t steps_done) {
  finish_checkpoint(r);  // the one before: a checkpoint exists only once complete
  Engine& e = *r.engine;
  const bool per_rank = r.cfg.parallel.sync == SyncMethod::weights && r.world > 1;
  const int groups = r.cfg.train.optimizer == OptimizerKind::sgd ? 1 : 3;
  auto p = std::make_unique<PendingCheckpoint>();
  CheckpointInfo& i = p->info;
  i.step = steps_done;
  i.optimizer_t = e.optimizer_t();
  i.optimizer = option_name(r.cfg.train.optimizer);
  i.sync = option_name(r.cfg.parallel.sync);
  i.world_size = r.world;
  i.rows = per_rank ? r.groups->dp : 1;
  i.seed = r.cfg.train.seed;
  i.desc = e.desc;
  i.n = e.whole_table.numel;
  i.version = 3;
  i.checksummed = true;
  i.config_json = r.cfg.resolved->dump();
  i.param_table_json = param_table_json(e.whole_table);
  i.data_json = r.data_json;
  i.lineage = r.lineage;
  p->path = checkpoint_path(r.ckpt_dir, steps_done);
  p->tmp = p->path + ".tmp";
  p->comm = r.groups->checkpoint;
  const bool behind = checkpoints_behind(r);
  // The values this rank writes and their rectangles. Written behind the steps, or from a GPU, they
  // are first copied to r.staging, range after range: that copy is all a checkpointing step waits
  // for with checkpoint.async. A synchronous save on the CPU writes from the engine's buffers.
  const bool stage = behind || r.on_gpu;
  float* staged = stage ? r.staging.reserve(checkpoint_share_floats(r), r.on_gpu) : nullptr;
  const int64_t replica = per_rank ? r.groups->dp_rank : 0;
  for (int which = 0; which < groups; which++) {
    for (const Engine::StateRange& sr : e.state_ranges(which, true, per_rank)) {
      const float* at = e.state_buffer(sr.chunk, which) + sr.at;
      if (stage) {
        r.ops->copy_to_host(staged, at, (sr.hi - sr.lo) * sizeof(float));
        at = staged;
        staged += sr.hi - sr.lo;
      }
      for (const TensorRect& rect : slice_rects(e.chunks[sr.chunk].model->table.slices[sr.slice], sr.lo, sr.hi)) {
        p->writes.push_back({which, sr.tensor, replica, rect, at, 0});
        at += rect.numel();
      }
    }
  }
  std::string err;
  // One file, written by every rank: run.dir must name the same directory everywhere.
  const uint64_t mine = std::hash<std::string>()(p->tmp);
  uint64_t lo = mine, hi = mine;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, r.comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, r.comm);
  if (lo != hi)
    throw CollectiveError("the ranks would write checkpoint " + std::to_string(steps_done) + " to different paths (this "
                          "rank: '" + p->path + "'): every rank writes its part of one file, so run.dir must be the "
                          "same directory on every rank, on a file system every node sees");
  if (r.rank == 0) {
    try {
      make_dirs(r.ckpt_dir);
    } catch (const Error& ex) {
      err = ex.what();
    }
  }
  err = agree_on_error(r.comm, err);
  if (!err.empty()) throw CollectiveError(err);
  r.pending = std::move(p);
  PendingCheckpoint* pc = r.pending.get();
  const ParamTable* whole = &e.whole_table;
  // The file's creation joins the writes behind the steps where HDF5 may be called from two
  // threads at once (the steps read the training data through it).
  const bool create_behind = behind && h5::library_threadsafe();
  if (!create_behind) pc->error = open_file(*pc, *whole, groups);
  auto job = [pc, whole, groups, create_behind] {
    if (create_behind) pc->error = open_file(*pc, *whole, groups);
    if (pc->error.empty()) pc->error = write_values(*pc, *whole);
  };
  if (behind) {
    pc->writer = std::thread(job);  // training goes on; finish_checkpoint waits for it
  } else {
    job();
    finish_checkpoint(r);
  }
  return checkpoint_path(r.ckpt_dir, steps_done);
}

}  // namespace llmpi
