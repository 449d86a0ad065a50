// Checkpoints of a run and resuming from them (train/run.h). A checkpoint holds the whole model by
// name in the flat layout, whatever the parallel layout that wrote it (engine/engine.h "state"),
// so it resumes with another world size, pipeline or ZeRO-1.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "comm/large_count.h"
#include "runtime/mpi_env.h"
#include "train/run.h"

namespace llmpi {

void resume_from(Run& r, const std::string& path, const std::vector<std::string>& overrides) {
  CheckpointInfo info = read_checkpoint_info(path);
  const ModelDesc& m = r.engine->desc;
  const ParamTable& table = r.engine->whole_table;  // checkpoints hold the whole model
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
  if (info.rows > 1 && (r.cfg.parallel.sync != SyncMethod::weights || info.rows != r.world))
    fail("checkpoint '", path, "' holds the separate parameters of ", info.rows, " ranks (sync \"weights\"): resume it "
         "with parallel.sync \"weights\" on ", info.rows, " ranks");
  if (!info.checksummed && r.rank == 0)
    std::fprintf(stderr, "llmpi-train: warning: checkpoint '%s' has no checksums (an older llmpi wrote it); "
                 "it is loaded unverified\n", path.c_str());
  const size_t n = info.n;
  const bool sgd = r.cfg.train.optimizer == OptimizerKind::sgd;
  std::vector<float> params(n), mom(sgd ? 0 : n), vel(sgd ? 0 : n);
  read_checkpoint_row(info, info.rows > 1 ? r.rank : 0, params.data(), sgd ? nullptr : mom.data(),
                      sgd ? nullptr : vel.data());
  // Every rank takes its tensors by name (ZeRO-1: its pieces of the moments).
  r.engine->load_whole(params.data(), sgd ? nullptr : mom.data(), sgd ? nullptr : vel.data(), info.optimizer_t);
  r.start_step = info.step;
  r.resumed_from = path;
  // The engines it ran (runtime.cpu_*_gemm, resolved): a resumed "auto" keeps them (train/setup.cpp).
  const nlohmann::json stored = nlohmann::json::parse(info.config_json, nullptr, false);
  r.resumed_runtime = stored.is_object() && stored.contains("runtime") ? stored["runtime"] : nlohmann::json();
  if (!info.lineage.empty()) r.lineage = info.lineage;  // a resumed run continues its lineage
}

namespace {

// The lineage run.dir's last run recorded (run.dir/lineage), "" when none was.
std::string recorded_lineage(const std::string& dir) {
  std::ifstream in(dir + "/lineage");
  std::string id;
  in >> id;
  return id;
}

// Rank 0's choice: the newest checkpoint of the run's lineage that reads and verifies (it is
// loaded; with per-rank rows every row is verified). Damaged ones are skipped with a warning
// saying why, as are checkpoints another run wrote into the directory; any other refusal (another
// model, a changed contract) stops. "" when there is none: a fresh start.
std::string choose_checkpoint(Run& r, const std::vector<std::string>& overrides) {
  const std::string lineage = recorded_lineage(r.cfg.run.dir);
  std::string skipped;
  for (const std::string& path : checkpoints_newest_first(r.ckpt_dir)) {
    try {
      const CheckpointInfo info = read_checkpoint_info(path);
      if (!lineage.empty() && !info.lineage.empty() && info.lineage != lineage) {
        std::fprintf(stderr, "llmpi-train: warning: skipping checkpoint '%s': another run wrote it (lineage %s; this "
                     "run's is %s)\n", path.c_str(), info.lineage.c_str(), lineage.c_str());
        continue;
      }
      if (info.rows > 1) verify_checkpoint(info);
      resume_from(r, path, overrides);  // reads and verifies what it loads
      return path;
    } catch (const CheckpointDamaged& e) {
      std::fprintf(stderr, "llmpi-train: warning: skipping checkpoint '%s': %s\n", path.c_str(), e.what());
      skipped += std::string(skipped.empty() ? "" : "; ") + e.what();
    }
  }
  if (!skipped.empty())
    fail("no checkpoint in '", r.ckpt_dir, "' can be resumed, every one is damaged (", skipped,
         "); start a new run.dir, or move the damaged files away to start this one afresh");
  return "";
}

}  // namespace

// Rank 0 chooses; every other rank then loads that file from its own view of run.dir (a
// node-local copy, a lagging parallel file system), and they start from it together or fail
// together, naming the rank that could not read or verify it.
void resume_auto(Run& r, const std::vector<std::string>& overrides) {
  std::string err, chosen;
  if (r.rank == 0) {
    try {
      const std::string path = choose_checkpoint(r, overrides);
      if (!path.empty()) chosen = std::filesystem::path(path).filename().string();
    } catch (const Error& e) {
      err = e.what();
    }
  }
  err = agree_on_error(r.comm, err);
  if (!err.empty()) fail(err);
  int len = mpi_count(chosen.size(), "the chosen checkpoint's name");  // a file name
  MPI_Bcast(&len, 1, MPI_INT, 0, r.comm);
  chosen.resize((size_t)len);
  MPI_Bcast(chosen.data(), len, MPI_CHAR, 0, r.comm);
  if (r.rank != 0 && !chosen.empty()) {
    const std::string path = r.ckpt_dir + "/" + chosen;
    try {
      resume_from(r, path, overrides);
    } catch (const Error& e) {
      err = "--resume auto: rank " + std::to_string(r.rank) + " cannot resume from '" + path +
            "', the checkpoint rank 0 chose (" + e.what() + "): wait until every node sees the same files in " +
            "run.dir, or name one with --resume PATH";
    }
  }
  err = agree_on_error(r.comm, err);
  if (!err.empty()) fail(err);
}

namespace {

// sync "weights" on several ranks: every rank's own parameters and moments, one row each,
// gathered on rank 0 (host copies; its whole flat buffer: a replica holds the whole model).
std::vector<float> per_rank_rows(Run& r, int which) {
  const ModelChunk& ch = r.engine->chunks.front();
  const size_t n = ch.model->table.numel;
  std::vector<float> mine(n), out(r.rank == 0 ? n * r.world : 0);
  r.ops->copy_to_host(mine.data(), which == 0 ? ch.model->params : which == 1 ? ch.opt->m : ch.opt->v,
                      n * sizeof(float));
  large::gather(mine.data(), n, MPI_FLOAT, r.rank == 0 ? out.data() : nullptr, 0, r.comm);
  return out;
}

}  // namespace

std::string save_checkpoint(Run& r, int64_t steps_done) {
  const Engine& e = *r.engine;
  const bool per_rank = r.cfg.parallel.sync == SyncMethod::weights && r.world > 1;
  const bool sgd = r.cfg.train.optimizer == OptimizerKind::sgd;
  CheckpointData d;
  CheckpointInfo& i = d.info;
  i.step = steps_done;
  i.optimizer_t = e.optimizer_t();
  i.optimizer = option_name(r.cfg.train.optimizer);
  i.sync = option_name(r.cfg.parallel.sync);
  i.world_size = r.world;
  i.rows = per_rank ? r.world : 1;
  i.seed = r.cfg.train.seed;
  i.desc = e.desc;
  i.n = e.whole_table.numel;
  i.config_json = r.cfg.resolved.dump();
  i.param_table_json = param_table_json(e.whole_table);
  i.data_json = r.data_json;
  i.lineage = r.lineage;
  // Host copies of the state, assembled on rank 0 (collective).
  auto state = [&](int which) { return per_rank ? per_rank_rows(r, which) : r.engine->gather_whole(which); };
  d.params = state(0);
  if (!sgd) d.m = state(1), d.v = state(2);
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

}  // namespace llmpi
