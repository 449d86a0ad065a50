// Issue 14 under MPI (-n 2): a run directory is never silently reused, the resume contract
// (global batch, seed, model) refuses a changed configuration unless overridden, a change of the
// world size with the same global batch resumes, and the checkpoint stores the resolved config.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;
namespace fs = std::filesystem;

namespace {

Config run_config(const std::string& train, const std::string& run_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"train.steps=8", "checkpoint.every=2", "checkpoint.keep=10", "run.dir=" + run_dir};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return tiny_config(train, sets);
}

TrainOptions opts(const std::string& resume = "", std::vector<std::string> overrides = {}, bool overwrite = false) {
  TrainOptions o = quiet_options(true);
  o.resume = resume;
  o.resume_overrides = overrides;
  o.overwrite = overwrite;
  return o;
}

std::string error_of(const Config& c, const TrainOptions& o, MPI_Comm comm = MPI_COMM_WORLD) {
  try {
    train(c, comm, o);
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

// Finding 1: a new run in a directory that holds one is refused, and --overwrite moves it aside.
TEST(MpiRunDir, NewRunOverAnEarlierOneIsRefusedOrMovedAside) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 31);
  const std::string run = dir + "/run";
  train(run_config(tr, run, {"train.steps=6"}), MPI_COMM_WORLD, opts());
  const std::string metrics_before = slurp(run + "/metrics.jsonl");
  const std::string e = error_of(run_config(tr, run, {"train.steps=2"}), opts());
  EXPECT_NE(e.find("run.dir '" + run + "' already holds a run (3 checkpoints (newest step 6), metrics.jsonl (6 lines)"),
            std::string::npos) << e;
  for (const char* way : {"--resume auto", "another run.dir", "--overwrite"})
    EXPECT_NE(e.find(way), std::string::npos) << way << ": " << e;
  if (world_rank() == 0) {
    EXPECT_EQ(slurp(run + "/metrics.jsonl"), metrics_before) << "the refused run must not touch the logs";
    EXPECT_TRUE(fs::exists(run + "/checkpoints/step-00000006.h5"));
  }
  // --overwrite: the earlier run's files move into previous-<date>/; the new run starts afresh.
  TrainResult fresh = train(run_config(tr, run, {"train.steps=2", "checkpoint.keep=1"}), MPI_COMM_WORLD,
                            opts("", {}, true));
  EXPECT_EQ(fresh.start_step, 0);
  if (world_rank() == 0) {
    std::vector<fs::path> aside;
    for (auto& p : fs::directory_iterator(run))
      if (p.path().filename().string().rfind("previous-", 0) == 0) aside.push_back(p.path());
    ASSERT_EQ(aside.size(), 1u);
    EXPECT_EQ(slurp((aside[0] / "metrics.jsonl").string()), metrics_before);
    for (int s : {2, 4, 6}) EXPECT_TRUE(fs::exists(aside[0] / "checkpoints" / ("step-0000000" + std::to_string(s) + ".h5")));
    EXPECT_EQ(jsonl(run + "/metrics.jsonl").size(), 2u);
    EXPECT_TRUE(fs::exists(run + "/checkpoints/step-00000002.h5")) << "the new run's checkpoint survives pruning";
    EXPECT_FALSE(fs::exists(run + "/LOCK")) << "the lock is released when the run ends";
  }
  // Resuming is always allowed, and a dry run over an earlier run is refused like a real start.
  EXPECT_EQ(error_of(run_config(tr, run, {"train.steps=3"}), opts("auto")), "");
  TrainOptions dry = opts();
  dry.dry_run = true;
  EXPECT_NE(error_of(run_config(tr, run), dry).find("already holds a run"), std::string::npos);
}

// Finding 1, pruning: checkpoint.keep removes only this run's lineage. A run resumed from a
// checkpoint of another run, into a directory holding an earlier run's newer checkpoints, used to
// delete every checkpoint it wrote (the earlier run's steps were higher).
TEST(MpiRunDir, PruningKeepsOtherLineages) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32);
  train(run_config(tr, dir + "/old", {"train.steps=10", "checkpoint.every=5"}), MPI_COMM_WORLD, opts());
  train(run_config(tr, dir + "/other", {"train.steps=2"}), MPI_COMM_WORLD, opts());
  // Continue "other" from its step-2 checkpoint inside "old", keeping 1 checkpoint.
  TrainResult r = train(run_config(tr, dir + "/old", {"train.steps=4", "checkpoint.keep=1"}), MPI_COMM_WORLD,
                        opts(dir + "/other/checkpoints/step-00000002.h5"));
  EXPECT_EQ(r.start_step, 2);
  if (world_rank() == 0) {
    EXPECT_TRUE(fs::exists(dir + "/old/checkpoints/step-00000004.h5")) << "this run's newest checkpoint";
    EXPECT_TRUE(fs::exists(dir + "/old/checkpoints/step-00000005.h5")) << "the earlier run's, untouched";
    EXPECT_TRUE(fs::exists(dir + "/old/checkpoints/step-00000010.h5")) << "the earlier run's, untouched";
    EXPECT_EQ(read_checkpoint_info(dir + "/old/checkpoints/step-00000004.h5").lineage,
              read_checkpoint_info(dir + "/other/checkpoints/step-00000002.h5").lineage)
        << "a resumed run continues its lineage";
    EXPECT_NE(read_checkpoint_info(dir + "/old/checkpoints/step-00000010.h5").lineage,
              read_checkpoint_info(dir + "/other/checkpoints/step-00000002.h5").lineage);
  }
}

// Finding 4: the resume contract.
TEST(MpiRunDir, ResumeRefusesChangedBatchOrSeedUnlessOverridden) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 33);
  const std::string run = dir + "/run";
  TrainOptions first = opts();
  first.preempt_after_step = 3;
  train(run_config(tr, run), MPI_COMM_WORLD, first);
  std::string e = error_of(run_config(tr, run, {"train.global_batch=16"}), opts("auto"));
  EXPECT_NE(e.find("was made for train.global_batch 8, but this configuration has 16"), std::string::npos) << e;
  EXPECT_NE(e.find("--resume-override train.global_batch"), std::string::npos) << e;
  e = error_of(run_config(tr, run, {"train.seed=7"}), opts("auto"));
  EXPECT_NE(e.find("was made for train.seed 1337, but this configuration has 7"), std::string::npos) << e;
  e = error_of(run_config(tr, run, {"train.seed=7", "train.global_batch=4"}), opts("auto", {"train.seed"}));
  EXPECT_NE(e.find("was made for train.global_batch 8, but this configuration has 4"), std::string::npos) << e;
  e = error_of(run_config(tr, run), opts("auto", {"train.lr"}));
  EXPECT_NE(e.find("--resume-override 'train.lr' names no key that resuming checks"), std::string::npos) << e;
  e = error_of(run_config(tr, run, {"model.n_layer=3"}), opts("auto"));
  EXPECT_NE(e.find("was made for model.n_layer 2, but this configuration has 3"), std::string::npos) << e;
  EXPECT_NE(error_of(run_config(tr, run), opts("", {"train.seed"})).find("use it together with --resume"),
            std::string::npos);
  // Accepted deliberately: recorded with the first step in metrics.jsonl.
  TrainResult r = train(run_config(tr, run, {"train.global_batch=16"}), MPI_COMM_WORLD,
                        opts("auto", {"train.global_batch"}));
  EXPECT_EQ(r.start_step, 4);
  EXPECT_EQ(r.losses.size(), 4u);
  if (world_rank() == 0) {
    std::vector<nlohmann::json> lines = jsonl(run + "/metrics.jsonl");
    ASSERT_EQ(lines.size(), 8u);
    EXPECT_FALSE(lines[3].contains("resume_overrides"));
    ASSERT_TRUE(lines[4].contains("resume_overrides")) << lines[4].dump();
    EXPECT_EQ(lines[4]["step"], 4);
    EXPECT_EQ(lines[4]["resume_overrides"],
              nlohmann::json::parse(R"([{"key": "train.global_batch", "checkpoint": 8, "now": 16}])"));
    // The new checkpoints record the new batch: resuming them needs no override.
    EXPECT_EQ(nlohmann::json::parse(read_checkpoint_info(run + "/checkpoints/step-00000008.h5").config_json)["train"]
                                   ["global_batch"], 16);
  }
}

// Changing the world size with the same global batch is not a contract change: 1 rank -> 2 ranks.
TEST(MpiRunDir, ResumeOnAnotherWorldSize) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 34);
  const std::string run = dir + "/run";
  MPI_Comm one;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &one);
  std::vector<float> uninterrupted;
  if (world_rank() == 0) {
    TrainOptions first = opts();
    first.preempt_after_step = 3;
    TrainResult a = train(run_config(tr, run), one, first);
    EXPECT_TRUE(a.preempted);
    uninterrupted = train(run_config(tr, dir + "/whole"), one, opts()).losses;
    MPI_Comm_free(&one);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const Config cfg = run_config(tr, run);
  TrainResult b = train(cfg, MPI_COMM_WORLD, opts("auto"));
  EXPECT_EQ(b.start_step, 4);
  ASSERT_EQ(b.losses.size(), 4u);
  if (world_rank() == 0) {
    // Bound: the same samples, steps 4 to 7 summed over two ranks' rows instead of one's:
    // training_drift's loss (no parameters returned here), relative.
    const double bound = training_drift(cfg, 4, 8, {}).loss;
    for (int i = 0; i < 4; i++)
      EXPECT_NEAR(b.losses[i], uninterrupted[4 + i], bound * uninterrupted[4 + i]) << "step " << 4 + i;
  }
}

// Finding 10: the checkpoint stores the resolved configuration, the one in config.json.
TEST(MpiRunDir, CheckpointStoresTheResolvedConfig) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 35);
  const std::string run = dir + "/run";
  train(run_config(tr, run, {"train.steps=2"}), MPI_COMM_WORLD, opts());
  if (world_rank() == 0) {
    const nlohmann::json stored =
        nlohmann::json::parse(read_checkpoint_info(run + "/checkpoints/step-00000002.h5").config_json);
    const nlohmann::json written = nlohmann::json::parse(slurp(run + "/config.json"));
    EXPECT_EQ(stored, written);
    EXPECT_EQ(stored["model"]["vocab_size"], 64) << "taken from the data, not 0";
    EXPECT_EQ(stored["model"]["ffn_dim"], 128) << "the family default, 4 x d_model";
    EXPECT_EQ(stored["model"]["max_seq_len"], 32);
  }
}

// --resume auto: rank 0 chooses, every rank loads that file from its own run directory. When one
// cannot (here: rank 1's run directory lacks the newest one, as a node with a stale view of a
// shared file system would), every rank fails with one message naming the rank and the file,
// instead of training on from two states. The same directories with the same files resume.
TEST(MpiRunDir, ResumeAutoFailsTogetherWhenARankCannotReadTheChosenCheckpoint) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 35);
  MPI_Comm one;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &one);
  if (world_rank() == 0) {
    TrainOptions first = opts();
    first.preempt_after_step = 5;  // checkpoints after steps 2, 4 and the pre-emption's 6
    EXPECT_TRUE(train(run_config(tr, dir + "/run0"), one, first).preempted);
    MPI_Comm_free(&one);
    fs::copy(dir + "/run0", dir + "/same", fs::copy_options::recursive);
    fs::copy(dir + "/run0", dir + "/stale", fs::copy_options::recursive);
    const std::vector<std::string> ckpts = checkpoints_newest_first(dir + "/stale/checkpoints");
    ASSERT_GE(ckpts.size(), 2u);
    fs::remove(ckpts.front());  // the newest one is missing on the "stale" node
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The run directory is one path on every rank in real use; here each rank is pointed at its own
  // copy so that the two can differ.
  const std::string mine = world_rank() == 0 ? "/run0" : "/stale";
  const std::string err = error_of(run_config(tr, dir + mine), opts("auto"));
  EXPECT_NE(err.find("--resume auto: rank 1 cannot resume from '" + dir + "/stale/checkpoints/step-00000006.h5', "
                     "the checkpoint rank 0 chose"), std::string::npos) << err;
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string agreeing = world_rank() == 0 ? "/run0" : "/same";
  // (no checkpoint: every rank writes its part into one file, which needs one run directory)
  TrainResult r = train(run_config(tr, dir + agreeing, {"checkpoint.every=0"}), MPI_COMM_WORLD, opts("auto"));
  EXPECT_EQ(r.start_step, 6);
}

// --resume auto takes the run's own lineage (run.dir/lineage): a newer checkpoint another run
// wrote into the directory is skipped with a warning, as pruning skips it.
TEST(MpiRunDir, ResumeAutoTakesTheRunsOwnLineage) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 36);
  TrainOptions first = opts();
  first.preempt_after_step = 3;  // checkpoints after steps 2 and the pre-emption's 4
  EXPECT_TRUE(train(run_config(tr, dir + "/run"), MPI_COMM_WORLD, first).preempted);
  train(run_config(tr, dir + "/other"), MPI_COMM_WORLD, opts());  // another lineage, up to step 8
  if (world_rank() == 0) {
    EXPECT_EQ(slurp(dir + "/run/lineage"), read_checkpoint_info(dir + "/run/checkpoints/step-00000004.h5").lineage + "\n");
    fs::copy(dir + "/other/checkpoints/step-00000008.h5", dir + "/run/checkpoints/step-00000008.h5");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  TrainResult r = train(run_config(tr, dir + "/run"), MPI_COMM_WORLD, opts("auto"));
  EXPECT_EQ(r.start_step, 4) << "the run's own newest checkpoint, not the other run's step 8";
}

