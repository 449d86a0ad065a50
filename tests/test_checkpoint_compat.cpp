// A gpt2 checkpoint written before model families (format version 1; tests/fixtures/gpt2-v1,
// made by the release at commit f72cc34) loads into today's gpt2 family and continues: the loss of
// the step after it and the parameters after that step equal what the old release computed.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "optim/optimizer.h"
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
  // Bound: the same model, batch and state in fp32, today's kernels summing in other orders
  // (gamma_n = n·u/(1 − n·u), u = 2^-24). The predictions are near uniform (5.49 ≈ ln 256), so
  // the logits are ≪ 1: each within 2·gamma_K of 1 (K = 64, the longest sum before them: the
  // MLP's channels, the rows), moving a row's log-sum-exp and target logit by that; the
  // log-sum-exp's sum of V ones within gamma_V each side; the mean of N rows within gamma_N of
  // the loss each side.
  auto gamma = [](double n) { return n * 0x1p-24 / (1 - n * 0x1p-24); };
  const double V = info.desc.vocab_size, N = (double)cfg.train.global_batch * info.desc.max_seq_len;
  const double K = std::max({info.desc.d_model, info.desc.ffn_dim, info.desc.max_seq_len});
  EXPECT_NEAR(r.losses[0], 5.494631290435791, 2 * 2 * gamma(K) + 2 * gamma(V) + 2 * gamma(N) * 5.5);
  CheckpointInfo i4 = read_checkpoint_info(ck4);
  std::vector<float> p4(i4.n), m4(i4.n), v4(i4.n);
  read_checkpoint_row(i4, 0, p4.data(), m4.data(), v4.data());
  ASSERT_EQ(r.final_params.size(), p4.size());
  double d2 = 0, r2 = 0;
  for (size_t k = 0; k < p4.size(); k++) {
    d2 += ((double)r.final_params[k] - p4[k]) * ((double)r.final_params[k] - p4[k]);
    r2 += (double)p4[k] * p4[k];
  }
  // Bound: the optimizer state is read bitwise, so the parameters differ by the step's AdamW
  // update only, lr_t·m̂/(√v̂ + ε) with |m̂/√v̂| ≤ A = (1 − β1)/√(1 − β2)/√(1 − β1²/β2)·
  // √(1 − β2^t)/(1 − β1^t); its rounding is that of the gradients relative to their terms (no
  // gradient here cancels far below them), 2·gamma_K with K = V, the longest sum (the LM head's).
  const TrainConfig& tc = cfg.train;
  const double t = 4, A = (1 - tc.beta1) / std::sqrt(1 - tc.beta2) / std::sqrt(1 - tc.beta1 * tc.beta1 / tc.beta2) *
                          std::sqrt(1 - std::pow(tc.beta2, t)) / (1 - std::pow(tc.beta1, t));
  const double per_param = 2 * gamma(V) * lr_at(tc, 3) * A;
  EXPECT_LT(std::sqrt(d2 / r2), per_param * std::sqrt((double)p4.size() / r2)) << "parameters after the continued step";
}
