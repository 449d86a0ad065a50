// llmpi-plan against a short measured run (-n 2, ZeRO-1, loopback): the plan's bytes for a rank
// within 10% of the peak RSS the run adds, and its step time within 25% of the measured median
// step, with the per-layer costs profiled in this process just before (both ranks profile at
// once, as they train at once) and the loopback link measured by bench-allreduce_bw
// (bench/results/links-2026-11-23.json). tools/plan_check.py makes the same comparison for more
// configurations, world sizes and simulated links (docs/SCALING.md "Checked against measurement").
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "mpi_test_data.h"
#include "plan/link_model.h"
#include "plan/plan.h"
#include "plan/profile.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

double status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      std::istringstream s(line.substr(std::string(key).size()));
      double kb = -1;
      s >> kb;
      return kb * 1024;
    }
  return -1;
}

}  // namespace

TEST(MpiPlanCheck, PlanMatchesAShortMeasuredRun) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer (make SAN=1) the RSS holds its shadow memory and redzones and "
                  "every op runs slower than the profile's: the plan is checked in the normal build";
#endif
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const int V = 64;
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 200000, V, 41);
  // About 3.2M parameters and 8 sequences of 128 tokens per rank: a step is a few hundred
  // milliseconds of GEMMs, and activations (not the libraries' buffers) dominate what the run adds.
  const Config cfg = tiny_config(tr, {"model.n_layer=4", "model.n_head=4", "model.d_model=256", "model.seq_len=128",
                                      "train.global_batch=16", "train.steps=8", "parallel.zero=1",
                                      "runtime.threads=1", "runtime.trace_steps=0"});
  const ModelDesc desc = model_desc_from_config(cfg.model, V);

  // The plan: costs profiled now, on every rank at once; the loopback link as measured.
  const std::string links_path = "bench/results/links-2026-11-23.json";
  std::ifstream probe(links_path);
  ASSERT_TRUE(probe.good()) << links_path << " not found: run the tests from the repository root";
  const LinkFile links = read_link_file(links_path);
  PlanInputs in = plan_inputs_from_config(cfg, desc, world);
  in.fabric.intra = find_link("loopback", &links);
  in.node_cores = (int)std::thread::hardware_concurrency();
  const int local = cfg.train.global_batch / world;
  in.profile = measure_profile(desc, local, cfg.model.seq_len, 5, 1);
  in.have_profile = true;
  const PlanResult plan_result = plan(in);
  const MemoryRow* mem = plan_result.memory_row("fp32", "-", 1, 0);
  const TimeRow* time = plan_result.time_row("-", 1);
  ASSERT_NE(mem, nullptr);
  ASSERT_NE(time, nullptr);

  // The run, from a reset peak RSS (Linux >= 4.0).
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    if (!clear.good()) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
  }
  const double before = status_bytes("VmRSS:");
  const TrainResult res = train(cfg, MPI_COMM_WORLD, quiet_options(false), false);
  const double grown = status_bytes("VmHWM:") - before;
  ASSERT_GT(before, 0);
  ASSERT_EQ(res.step_ms.size(), 8u);

  // Memory: what the run allocates (the plan's row, plus the host batch) vs the RSS it added.
  const double host_batch = estimate_memory(desc, local, cfg.model.seq_len, cfg, world, 0, false).data;
  const double predicted = mem->total + host_batch;
  const double mem_err = predicted / grown - 1;

  // Time: the median step after the first (which allocates and warms up).
  std::vector<double> steps(res.step_ms.begin() + 1, res.step_ms.end());
  std::sort(steps.begin(), steps.end());
  const double measured_s = steps[steps.size() / 2] / 1e3;
  const double time_err = time->step_s / measured_s - 1;

  double worst[2] = {std::fabs(mem_err), std::fabs(time_err)};
  MPI_Allreduce(MPI_IN_PLACE, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (world_rank() == 0)
    std::printf("plan vs measured (2 ranks, ZeRO-1, loopback): memory %.1f MB planned vs %.1f MB grown (%+.1f%%); "
                "step %.1f ms planned (compute %.1f, sync %.1f, optimizer %.1f) vs %.1f ms measured (%+.1f%%); "
                "worst over ranks %.1f%% / %.1f%%\n",
                predicted / 1e6, grown / 1e6, 100 * mem_err, 1e3 * time->step_s, 1e3 * time->compute_s,
                1e3 * time->exposed_sync_s, 1e3 * time->optimizer_s, 1e3 * measured_s, 100 * time_err,
                100 * worst[0], 100 * worst[1]);
  EXPECT_LT(worst[0], 0.10) << "the plan's memory is off by more than 10% of the peak RSS the run added";
  EXPECT_LT(worst[1], 0.25) << "the plan's step time is off by more than 25% of the measured median step";
}
