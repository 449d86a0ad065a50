// Activation recomputation (model/transformer.h "Activation recomputation", runtime.recompute):
//   - every family, full and fused attention, with dropout, fp32 and bf16: the loss and every
//     gradient of selective and full are the bits of none (Exact: a recomputed tensor is the same
//     op on the same inputs, and the backward then runs the same ops), over the whole model and over a part
//     without the embedding (a pipeline stage's blocks, whose first input is handed in), also
//     when a second micro-batch's forward runs between a forward and its backward;
//   - the activations shrink as the memory estimate says, and in the order none > selective > full;
//   - zb-h1's input-only backward is refused with recomputation, by the configuration.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/memory_estimate.h"
#include "model_test_util.h"
#include "recompute_test_util.h"
#include "runtime/error.h"

using namespace llmpi;
using namespace llmpi::test;


TEST(Recompute, EveryModeGivesTheBitsOfNone) {
  for (const RecomputeCase& c : recompute_cases()) {
    const RecomputeRun none = run_whole(cpu_ops(), c, Recompute::none), part_none = run_part(cpu_ops(), c, Recompute::none);
    ASSERT_EQ(none.losses.size(), 2u);
    ASSERT_GT(none.losses[0], 0.0f) << c.name;
    // the gradient is not trivially zero (a recompute writing nothing would compare equal)
    double norm = 0;
    for (float g : none.grads) norm += (double)g * g;
    ASSERT_GT(norm, 0.0) << c.name;
    for (Recompute rc : {Recompute::selective, Recompute::full}) {
      const RecomputeRun r = run_whole(cpu_ops(), c, rc), part = run_part(cpu_ops(), c, rc);
      EXPECT_TRUE(same_bits(r.losses, none.losses)) << c.name << " " << option_name(rc);
      EXPECT_TRUE(same_bits(r.grads, none.grads)) << c.name << " " << option_name(rc) << ": gradients";
      EXPECT_TRUE(same_bits(part.losses, part_none.losses)) << c.name << " " << option_name(rc) << ": part";
      EXPECT_TRUE(same_bits(part.grads, part_none.grads)) << c.name << " " << option_name(rc) << ": part gradients";
      EXPECT_LT(r.act_bytes, none.act_bytes) << c.name << " " << option_name(rc);
    }
  }
}

// The activations are what the estimate counts, and they fall with the mode; at many layers
// full keeps about one N x C tensor per block.
TEST(Recompute, ActivationsFollowTheEstimate) {
  for (const RecomputeCase& c : recompute_cases()) {
    ModelDesc d = recompute_desc(c);
    d.n_layer = 6;
    size_t bytes[3] = {};
    int i = 0;
    for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
      Model m(d, cpu_ops(), ModelPart::whole(), c.precision, rc);
      Activations a(m, kB, kT);
      const size_t rows = (d.head == HeadKind::lm ? (size_t)kB * kT : kB) * sizeof(float);  // the host loss row
      EXPECT_EQ(a.bytes() + rows, activation_bytes(d, kB, kT, c.precision, rc)) << c.name << " " << option_name(rc);
      ModelPart part;
      part.l0 = 2;
      part.embedding = false;
      Model mp(d, cpu_ops(), part, c.precision, rc);
      Activations ap(mp, kB, kT);
      EXPECT_EQ(ap.bytes() + rows, activation_bytes(d, part, kB, kT, c.precision, rc)) << c.name << " part";
      bytes[i++] = a.bytes();
    }
    EXPECT_GT(bytes[0], bytes[1]) << c.name;
    EXPECT_GT(bytes[1], bytes[2]) << c.name;
    // full: 5 layers of one N x C output (256-byte aligned) less than all of one more layer
    const size_t one_layer_more = activation_bytes(d, kB, kT, c.precision, Recompute::full);
    d.n_layer = 5;
    EXPECT_EQ(one_layer_more - activation_bytes(d, kB, kT, c.precision, Recompute::full),
              activation_floats_aligned((size_t)kB * kT * d.d_model) * sizeof(float))
        << c.name;
  }
}

TEST(Recompute, ZeroBubbleScheduleIsRefused) {
  const auto config = [](const std::string& recompute) {
    return parse_config("{}", "test",
                        {"data.train=-", "parallel.pp_stages=2", "parallel.schedule=zb-h1", "runtime.recompute=" + recompute});
  };
  EXPECT_NO_THROW(config("none"));
  try {
    config("selective");
    FAIL() << "zb-h1 with recomputation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runtime.recompute"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("zb-h1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_config("{}", "test", {"data.train=-", "runtime.recompute=some"}), Error);
  // without pipeline stages the schedule is not used: no error
  EXPECT_NO_THROW(parse_config("{}", "test", {"data.train=-", "parallel.schedule=zb-h1", "runtime.recompute=full"}));
}
