// Activation recomputation on the CUDA backend (model/transformer.h "Activation recomputation"):
// the loss and every gradient of selective and full against none, every family, fp32 and bf16,
// full and fused attention, with dropout, over a whole model and a part without the embedding.
// Exact: the same bits (the recomputing ops are the forward's ops on the forward's operands), except
// GELU (tanh) under selective in fp32/tf32, whose forward takes the activation from cuBLASLt's
// epilogue and whose recompute from gelu_forward. Bound there (an estimate, to confirm on a card):
// the forward, and so the loss, is the same in both modes (1e-6 leaves the loss's own ulps room);
// the two activations are fp32 GELUs of the same pre-activation, cuBLASLt's within kLtGeluTol =
// 1e-5 of ours (the estimate of test_cuda_epilogues.cpp, from an H100's 2.9e-6), and only the MLP
// projection's weight gradient reads act in the backward (the GELU's gradient reads pre): a sum
// over the B T rows whose differences, like its values, add terms of random sign, so it moves by
// about kLtGeluTol of its values, held to 1e-5 of the largest gradient value (the worst case,
// kLtGeluTol of the sum's magnitude, is ~sqrt(B T) more). Skips without a GPU; runs on the
// simulated one (tools/cuda_cpu_sim/).
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "recompute_test_util.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

// max |x - y| / max(max |y|, 1e-30): the largest difference relative to the largest value (the
// max-norm of the whole, which no single cancelling element sets)
double relative_gap(const std::vector<float>& x, const std::vector<float>& y) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < x.size() && i < y.size(); i++) {
    worst = std::max(worst, (double)std::fabs(x[i] - y[i]));
    scale = std::max(scale, (double)std::fabs(y[i]));
  }
  return x.size() == y.size() ? worst / scale : 1e30;
}

}  // namespace

// Four of the CPU test's cases (every family; full and fused attention; fp32 and bf16; dropout;
// gpt2 in fp32, whose selective recompute takes GELU from another kernel), to keep the simulated
// GPU's run short.
TEST(CudaRecompute, EveryModeGivesTheBitsOfNone) {
  REQUIRE_GPU();
  for (const RecomputeCase& c : recompute_cases()) {
    if (c.name != "gpt2 dropout" && c.name != "gpt2 bf16" && c.name != "llama fused bf16" && c.name != "bert dropout")
      continue;
    const RecomputeRun none = run_whole(gpu(), c, Recompute::none), part_none = run_part(gpu(), c, Recompute::none);
    for (Recompute rc : {Recompute::selective, Recompute::full}) {
      const RecomputeRun r = run_whole(gpu(), c, rc), part = run_part(gpu(), c, rc);
      const bool epilogue_gelu = rc == Recompute::selective && c.family == "gpt2" && c.precision != GemmPrecision::bf16;
      const std::string what = c.name + " " + option_name(rc);
      if (epilogue_gelu) {
        EXPECT_LT(relative_gap(r.losses, none.losses), 1e-6) << what;
        EXPECT_LT(relative_gap(r.grads, none.grads), 1e-5) << what;
        EXPECT_LT(relative_gap(part.grads, part_none.grads), 1e-5) << what << ": part";
      } else {
        EXPECT_TRUE(same_bits(r.losses, none.losses)) << what;
        EXPECT_TRUE(same_bits(r.grads, none.grads)) << what << ": gradients";
        EXPECT_TRUE(same_bits(part.losses, part_none.losses)) << what << ": part";
        EXPECT_TRUE(same_bits(part.grads, part_none.grads)) << what << ": part gradients";
      }
      EXPECT_LT(r.act_bytes, none.act_bytes) << what;
    }
  }
}
