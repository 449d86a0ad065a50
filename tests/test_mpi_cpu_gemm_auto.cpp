// runtime.cpu_fp32_gemm / runtime.cpu_bf16_gemm "auto" in the trainer (train/setup.cpp), under MPI
// (-n 2), with stand-in timers (TrainOptions::time_cpu_gemms) whose times are fixed, so nothing
// depends on which engine is faster here:
//  - every rank times its own dense layers, and rank 0's times decide for every rank, whatever the
//    others measured; the engine is named in summary.json's "cpu_gemm" (the banner's line) with
//    the times, and recorded in config.json and the checkpoints as the key's value;
//  - a resumed run takes the engine its checkpoint records without timing again; an explicit
//    setting still wins; a fresh run without a timer does not time.
// Where oneDNN cannot run, "auto" has one candidate: nothing is timed and the fallback is kept.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/onednn_gemm.h"
#include "checkpoint/checkpoint.h"
#include "model/dense_layers.h"
#include "mpi_test_data.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Every rank's value of s, on every rank.
std::vector<std::string> all_ranks(const std::string& s) {
  const int n = world_size();
  std::vector<char> mine(32, 0), all(32 * static_cast<size_t>(n));
  s.copy(mine.data(), mine.size() - 1);
  MPI_Allgather(mine.data(), 32, MPI_CHAR, all.data(), 32, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int r = 0; r < n; r++) out.emplace_back(all.data() + 32 * r);
  return out;
}

// A stand-in timer: rank 0 measures `rank0`, every other rank the reverse; calls counted, the
// layers it was handed kept.
struct StandIn {
  CpuGemmTimes rank0;
  int calls = 0;
  std::vector<DenseShape> layers;
  explicit StandIn(CpuGemmTimes t) : rank0(t) {}
  TrainOptions options(bool write_run_dir, const std::string& resume = "", int64_t preempt = -1) {
    TrainOptions o = train_options(write_run_dir, resume, preempt);
    o.time_cpu_gemms = [this](GemmPrecision, const std::vector<DenseShape>& l) {
      calls++;
      layers = l;
      return world_rank() == 0 ? rank0 : CpuGemmTimes{rank0.fallback_s, rank0.onednn_s};
    };
    return o;
  }
};

bool same_layers(const std::vector<DenseShape>& a, const std::vector<DenseShape>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (a[i].rows != b[i].rows || a[i].in != b[i].in || a[i].out != b[i].out || a[i].count != b[i].count) return false;
  return true;
}

}  // namespace

TEST(MpiCpuGemmAuto, RankZerosTimesDecideForEveryRank) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 31);
  for (const std::string precision : {"fp32", "bf16"}) {
    const bool bf16 = precision == "bf16";
    const bool have = bf16 ? cpu::onednn_bf16_available() : cpu::onednn_fp32_available();
    int everywhere = have;
    MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    const std::string fallback = bf16 ? "emulate" : "openblas";
    const char* key = bf16 ? "cpu_bf16_gemm" : "cpu_fp32_gemm";
    for (const bool rank0_prefers_onednn : {true, false}) {
      const std::string run = dir + "/" + precision + (rank0_prefers_onednn ? "-onednn" : "-fallback");
      const Config cfg = tiny_config(tr, {"runtime.precision=" + precision, "train.steps=2", "run.dir=" + run});
      StandIn timer(rank0_prefers_onednn ? CpuGemmTimes{0.001, 0.003} : CpuGemmTimes{0.003, 0.001});
      const TrainResult res = train(cfg, MPI_COMM_WORLD, timer.options(true));
      const std::string want = everywhere && rank0_prefers_onednn ? "onednn" : fallback;
      const std::string what = precision + ", rank 0 measuring oneDNN " + (rank0_prefers_onednn ? "faster" : "slower");
      for (const std::string& e : all_ranks(res.cpu_gemm)) EXPECT_EQ(e, want) << what << ": every rank's engine";
      if (!everywhere) {
        EXPECT_EQ(timer.calls, 0) << what << ": one candidate, nothing timed";
        continue;
      }
      EXPECT_EQ(timer.calls, 1) << what;
      const ModelDesc d = model_desc_from_config(cfg.model, 64);
      EXPECT_TRUE(same_layers(timer.layers, dense_layers(d, ModelPart::whole(), 8 / world_size(), 32)))
          << what << ": the timer is handed this rank's dense layers";
      if (world_rank() != 0) continue;
      EXPECT_EQ(read_json(run + "/config.json")["runtime"][key], want) << what << ": recorded in config.json";
      const std::string line = read_json(run + "/summary.json")["cpu_gemm"];
      EXPECT_NE(line.find(std::string("runtime.") + key + " \"auto\" timed this run's GEMMs: onednn " +
                          (rank0_prefers_onednn ? "1 ms, " : "3 ms, ") + fallback +
                          (rank0_prefers_onednn ? " 3 ms per step" : " 1 ms per step")),
                std::string::npos)
          << what << ": the banner's line: " << line;
    }
  }
}

TEST(MpiCpuGemmAuto, AResumedRunKeepsTheEngineItsCheckpointRecords) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 32);
  int have = cpu::onednn_fp32_available();
  MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const std::string chosen = have ? "onednn" : "openblas";  // what a oneDNN-favouring timer gets
  const std::string run = dir + "/run";
  auto cfg = [&](int steps, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> sets = {"train.steps=" + std::to_string(steps), "checkpoint.every=3", "run.dir=" + run};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return tiny_config(tr, sets);
  };
  // Uninterrupted, and interrupted after 3 steps, with oneDNN timed the faster.
  StandIn faster_dnn({0.001, 0.003});
  const TrainResult whole = train(cfg(6, {"run.dir=" + dir + "/whole"}), MPI_COMM_WORLD, faster_dnn.options(true));
  const TrainResult first = train(cfg(6), MPI_COMM_WORLD, faster_dnn.options(true, "", 2));
  ASSERT_TRUE(first.preempted);
  EXPECT_EQ(first.cpu_gemm, chosen);
  if (world_rank() == 0) {
    const CheckpointInfo info = read_checkpoint_info(checkpoint_path(run + "/checkpoints", 3));
    EXPECT_EQ(nlohmann::json::parse(info.config_json)["runtime"]["cpu_fp32_gemm"], chosen)
        << "the checkpoint records the engine";
  }
  // Resumed where the timer would now pick OpenBLAS: the checkpoint's engine, not timed again.
  StandIn faster_blas({0.003, 0.001});
  const TrainResult second = train(cfg(6), MPI_COMM_WORLD, faster_blas.options(true, "auto"));
  ASSERT_EQ(second.start_step, 3);
  EXPECT_EQ(faster_blas.calls, 0) << "a resumed run does not time";
  for (const std::string& e : all_ranks(second.cpu_gemm)) EXPECT_EQ(e, chosen) << "every rank keeps the engine";
  std::vector<float> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  // Exact: the resumed run keeps the checkpoint's engine, so its GEMMs are the uninterrupted run's.
  EXPECT_EQ(joined, whole.losses) << "the resumed run continues the uninterrupted one bit for bit";
  if (world_rank() == 0) {
    EXPECT_EQ(read_json(run + "/config.json")["runtime"]["cpu_fp32_gemm"], chosen);
    const std::string line = read_json(run + "/summary.json")["cpu_gemm"];
    if (have) {
      EXPECT_NE(line.find("the checkpoint's engine, not timed again"), std::string::npos) << line;
    }
  }
  // An explicit setting wins over the checkpoint's engine (and is recorded in turn).
  StandIn again({0.001, 0.003});
  const TrainResult explicit_blas =
      train(cfg(8, {"runtime.cpu_fp32_gemm=openblas"}), MPI_COMM_WORLD, again.options(true, "auto"));
  EXPECT_EQ(again.calls, 0);
  for (const std::string& e : all_ranks(explicit_blas.cpu_gemm)) EXPECT_EQ(e, "openblas");
  if (world_rank() == 0) {
    EXPECT_EQ(read_json(run + "/config.json")["runtime"]["cpu_fp32_gemm"], "openblas");
  }
  // Without a timer (a library call that gives none) "auto" is not timed: OpenBLAS.
  const TrainResult untimed = train(cfg(2, {"run.dir=" + dir + "/untimed"}), MPI_COMM_WORLD, train_options(true));
  for (const std::string& e : all_ranks(untimed.cpu_gemm)) EXPECT_EQ(e, "openblas");
}
