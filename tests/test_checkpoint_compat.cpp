// A gpt2 checkpoint written before model families (format version 1; tests/fixtures/gpt2-v1,
// made by the release at commit f72cc34) loads into today's gpt2 family and continues: the loss of
// the step after it and the parameters after that step equal what the old release computed.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "train/trainer.h"

using namespace llmpi;
namespace fs = std::filesystem;

namespace {
std::string fixture(const std::string& name) {
  for (std::string base : {"tests/fixtures/gpt2-v1/", "../tests/fixtures/gpt2-v1/"})
    if (fs::exists(base + name)) return base + name;
  return "";
}
}  // namespace

TEST(CheckpointCompat, Version1Gpt2CheckpointLoadsAndContinues) {
  const std::string ck3 = fixture("step-00000003.h5"), ck4 = fixture("step-00000004.h5"), data = fixture("train.h5");
  ASSERT_FALSE(ck3.empty()) << "run the tests from the project root (tests/fixtures/gpt2-v1 not found)";
  CheckpointInfo info = read_checkpoint_info(ck3);
  EXPECT_EQ(info.version, 1);
  EXPECT_EQ(info.desc.family, Family::gpt2);
  EXPECT_EQ(info.step, 3);

  const std::string run = (fs::temp_directory_path() / ("llmpi-compat-" + std::to_string(::getpid()))).string();
  Config cfg = load_config(fixture("cfg.json"), {"data.train=" + data, "run.dir=" + run, "checkpoint.every=0"});
  TrainOptions o;
  o.print = false;
  o.resume = ck3;
  TrainResult r = train(cfg, MPI_COMM_SELF, o, true);
  fs::remove_all(run);
  ASSERT_EQ(r.start_step, 3);
  ASSERT_EQ(r.losses.size(), 1u);
  // The old release logged 5.494631290435791 for this step (fixture README).
  EXPECT_NEAR(r.losses[0], 5.494631290435791, 1e-6);
  CheckpointInfo i4 = read_checkpoint_info(ck4);
  std::vector<float> p4(i4.n), m4(i4.n), v4(i4.n);
  read_checkpoint_row(i4, 0, p4.data(), m4.data(), v4.data());
  ASSERT_EQ(r.final_params.size(), p4.size());
  double d2 = 0, r2 = 0;
  for (size_t k = 0; k < p4.size(); k++) {
    d2 += ((double)r.final_params[k] - p4[k]) * ((double)r.final_params[k] - p4[k]);
    r2 += (double)p4[k] * p4[k];
  }
  EXPECT_LT(std::sqrt(d2 / r2), 1e-6) << "parameters after the continued step";
}
