// ZeRO-1's pieces and the optimizer over them (serial): the ranks' pieces partition every bucket;
// optimizers that each update one rank's pieces produce, put together, exactly the parameters and
// moments of one optimizer over the whole buffer; the sharded norm's parts sum to the whole.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/ops.h"
#include "comm/grad_sync.h"
#include "model_test_util.h"
#include "optim/optimizer.h"
#include "runtime/rng.h"

using namespace llmpi;

TEST(ZeroShard, PiecesPartitionEveryBucket) {
  const ParamTable t = build_param_table(test::desc_of("gpt2", 2, 2, 32, 16, 64));
  for (double mb : {0.0, 0.002, 1e9}) {
    const std::vector<Bucket> buckets = make_buckets(t, mb, mb);
    for (int world : {1, 2, 3, 4, 7}) {
      std::vector<int> owner(t.numel, -1);
      for (int r = 0; r < world; r++) {
        const std::vector<ShardPiece> mine = shard_pieces(buckets, world, r);
        ASSERT_EQ(mine.size(), buckets.size());
        for (size_t b = 0; b < buckets.size(); b++) {
          const size_t n = buckets[b].end - buckets[b].begin, len = mine[b].end - mine[b].begin;
          EXPECT_GE(mine[b].begin, buckets[b].begin);
          EXPECT_LE(mine[b].end, buckets[b].end);
          EXPECT_TRUE(len == n / world || len == n / world + 1) << "pieces differ by at most one float";
          for (size_t i = mine[b].begin; i < mine[b].end; i++) {
            EXPECT_EQ(owner[i], -1) << "float " << i << " owned twice";
            owner[i] = r;
          }
        }
      }
      for (size_t i = 0; i < t.numel; i++) ASSERT_GE(owner[i], 0) << "float " << i << " owned by nobody";
    }
  }
}

TEST(ZeroShard, ShardedOptimizersEqualOneWholeOptimizer) {
  const ParamTable t = build_param_table(test::desc_of("gpt2", 2, 2, 32, 16, 64));
  const Ops& ops = cpu_ops();
  TrainConfig tc;
  tc.weight_decay = 0.1, tc.beta1 = 0.9, tc.beta2 = 0.95, tc.eps = 1e-8;
  Rng rng(7);
  std::vector<float> init(t.numel);
  for (float& x : init) x = (float)(rng.normal() * 0.1);
  const std::vector<Bucket> buckets = make_buckets(t, 0.002, 0.002);  // pieces cut through tensors
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd}) {
    const int world = 3;
    std::vector<float> whole = init, sharded = init;
    Optimizer one(ops, t.numel, kind);
    std::vector<std::unique_ptr<Optimizer>> parts;
    for (int r = 0; r < world; r++)
      parts.push_back(std::make_unique<Optimizer>(ops, t.numel, kind, shard_pieces(buckets, world, r)));
    for (int step = 0; step < 3; step++) {
      std::vector<float> g(t.numel);
      for (float& x : g) x = (float)rng.normal();
      one.step(whole.data(), g.data(), t, 1e-2, tc);
      for (int r = 0; r < world; r++) {
        parts[r]->begin_step();
        for (size_t b = 0; b < buckets.size(); b++) parts[r]->update_range(b, sharded.data(), g.data(), t, 1e-2, tc);
      }
    }
    // Exact: the update is elementwise, the same operations on the same values for every float.
    EXPECT_EQ(sharded, whole) << option_name(kind) << ": every float updated once, as by the whole optimizer";
    if (kind == OptimizerKind::sgd) continue;
    // Exact: the moments come from the same elementwise operations on the same values.
    size_t state = 0;
    for (int r = 0; r < world; r++) {
      state += parts[r]->n;
      for (size_t k = 0; k < parts[r]->ranges.size(); k++) {
        const ShardPiece p = parts[r]->ranges[k];
        for (size_t i = p.begin; i < p.end; i++) {
          ASSERT_EQ(parts[r]->m[parts[r]->state_offset[k] + i - p.begin], one.m[i]);
          ASSERT_EQ(parts[r]->v[parts[r]->state_offset[k] + i - p.begin], one.v[i]);
        }
      }
    }
    EXPECT_EQ(state, t.numel) << "the ranks' moments together cover the buffer once";
    EXPECT_EQ(parts[0]->t, one.t);
  }
}

TEST(ZeroShard, SumOfSquaresOfPiecesAddsUpWithinTheRange) {
  const ParamTable t = build_param_table(test::desc_of("gpt2", 2, 2, 32, 16, 64));
  const Ops& ops = cpu_ops();
  std::vector<float> g(t.numel);
  Rng rng(3);
  for (float& x : g) x = (float)rng.normal();
  const std::vector<Bucket> buckets = make_buckets(t, 0.002, 0.002);
  const std::vector<std::pair<size_t, size_t>> ranges = {
      {0, t.numel}, {0, t.numel - 100}, {0, t.numel / 2}, {777, t.numel / 2 + 3}, {t.numel / 3, t.numel}};
  for (const auto& [begin, end] : ranges) {
    double parts = 0;  // the CPU backend's memory is the host's
    for (int r = 0; r < 4; r++) sum_squares_of_pieces_add(ops, &parts, g.data(), shard_pieces(buckets, 4, r), begin, end);
    const double whole = ops.sum_squares(g.data() + begin, end - begin);
    // Bound: a float's square is exact in double, so only the additions round: n = end − begin
    // nonnegative terms summed in two groupings, each within gamma_n (u = 2^-53) of the sum.
    const double n = double(end - begin), u = 0x1p-53;
    EXPECT_NEAR(parts, whole, 2 * n * u / (1 - n * u) * whole) << "[" << begin << ", " << end << ")";
  }
}
