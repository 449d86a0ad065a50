// Gradient buckets: contiguous, complete, tensor-aligned, sized as configured.
#include <gtest/gtest.h>

#include "comm/grad_sync.h"
#include "model_test_util.h"

using namespace llmpi;

namespace {
void expect_cover(const std::vector<Bucket>& bs, const ParamTable& t) {
  ASSERT_FALSE(bs.empty());
  EXPECT_EQ(bs.front().begin, 0u);
  EXPECT_EQ(bs.front().first_slice, 0u);
  for (size_t i = 0; i < bs.size(); i++) {
    EXPECT_EQ(bs[i].begin, t.slices[bs[i].first_slice].offset);
    EXPECT_EQ(bs[i].end, t.slices[bs[i].last_slice].offset + t.slices[bs[i].last_slice].numel);
    if (i > 0) {
      EXPECT_EQ(bs[i].begin, bs[i - 1].end);
      EXPECT_EQ(bs[i].first_slice, bs[i - 1].last_slice + 1);
    }
  }
  EXPECT_EQ(bs.back().end, t.numel);
  EXPECT_EQ(bs.back().last_slice, t.slices.size() - 1);
}
}  // namespace

TEST(Buckets, PerTensorWholeAndSized) {
  ParamTable t = build_param_table(test::desc_of("gpt2", 4, 4, 256, 256, 4096));
  auto per_tensor = make_buckets(t, 0, 1);
  expect_cover(per_tensor, t);
  EXPECT_EQ(per_tensor.size(), t.slices.size());

  auto whole = make_buckets(t, 1e9, 1e9);
  expect_cover(whole, t);
  EXPECT_EQ(whole.size(), 1u);

  auto sized = make_buckets(t, 4.0, 1.0);  // 4 MB buckets, first at most ~1 MB
  expect_cover(sized, t);
  EXPECT_GT(sized.size(), 2u);
  // Exact in effect: the sizes are whole floats, 4e-6 MB apart, so a limit met or missed is met
  // or missed by at least that, and the quotients by 1e6 round by < 1e-15 MB.
  const double first_mb = (sized[0].end - sized[0].begin) * 4 / 1e6;
  EXPECT_GE(first_mb, 1.0);
  // A bucket stops at the first tensor that takes it to its size: it exceeds the size by less
  // than that one tensor.
  EXPECT_LT(first_mb - t.slices[sized[0].last_slice].numel * 4 / 1e6, 1.0);
  for (size_t i = 1; i + 1 < sized.size(); i++) {
    const double mb = (sized[i].end - sized[i].begin) * 4 / 1e6;
    EXPECT_GE(mb, 4.0) << "bucket " << i;
    EXPECT_LT(mb - t.slices[sized[i].last_slice].numel * 4 / 1e6, 4.0) << "bucket " << i;
  }
}
