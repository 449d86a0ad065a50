// Weak scaling's configuration (runtime/config.h resolve_batch): train.batch_per_rank resolved into
// the global batch for a number of data-parallel replicas, the one-of-two rule between it and
// train.global_batch, train.lr_scaling's rates and their warm-up, and what the resume contract says
// when another world size changes the resolved global batch.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "data/sampler.h"
#include "file_test_util.h"
#include "model/model_desc.h"
#include "optim/optimizer.h"
#include "runtime/config.h"
#include "runtime/error.h"
#include "train/resume_contract.h"

using namespace llmpi;
using llmpi::test::error_of;

namespace {

Config config_with(const std::vector<std::string>& sets, const std::string& file = "{}") {
  std::vector<std::string> all = {"data.train=x.h5"};
  all.insert(all.end(), sets.begin(), sets.end());
  return parse_config(file, "test", all);
}

}  // namespace

TEST(BatchScaling, BatchPerRankTimesTheReplicas) {
  for (int replicas : {1, 2, 4}) {
    Config c = config_with({"train.batch_per_rank=4"});
    resolve_batch(c, replicas);
    EXPECT_EQ(c.train.global_batch, 4 * replicas);
    EXPECT_EQ(c.resolved["train"]["global_batch"], 4 * replicas) << "config.json records the resolved batch";
    EXPECT_EQ(c.resolved["train"]["batch_per_rank"], 4);
    // Each replica's share of the step is the batch per rank.
    EXPECT_EQ(Sampler(1000, c.train.global_batch, replicas, replicas - 1, 1).local_batch(), 4);
  }
  // With pipeline stages it counts per data-parallel replica: 8 ranks in stages of 2 are 4 replicas.
  Config p = config_with({"train.batch_per_rank=6", "parallel.pp_stages=2", "parallel.microbatches=3"});
  resolve_batch(p, 8 / 2);
  EXPECT_EQ(p.train.global_batch, 24);
  // Without batch_per_rank the global batch is the configured one, whatever the replicas.
  Config g = config_with({"train.global_batch=12"});
  resolve_batch(g, 4);
  EXPECT_EQ(g.train.global_batch, 12);
}

TEST(BatchScaling, BothKeysAreRefusedNamingBothUnlessTheyAgree) {
  Config c = config_with({"train.global_batch=64", "train.batch_per_rank=16"});
  const std::string e = error_of([&] { resolve_batch(c, 2); });
  EXPECT_NE(e.find("'train.global_batch' (64)"), std::string::npos) << e;
  EXPECT_NE(e.find("'train.batch_per_rank' (16)"), std::string::npos) << e;
  EXPECT_NE(e.find("global batch of 32"), std::string::npos) << e;
  // A run's config.json records both; at the world size it was made for they agree.
  Config same = config_with({"train.global_batch=64", "train.batch_per_rank=16"});
  EXPECT_EQ(error_of([&] { resolve_batch(same, 4); }), "(no error)");
  EXPECT_EQ(same.train.global_batch, 64);
  // Both in one file: the same rule.
  Config file = config_with({}, R"({"train": {"global_batch": 64, "batch_per_rank": 16}})");
  EXPECT_NE(error_of([&] { resolve_batch(file, 8); }).find("are both set"), std::string::npos);
  // --set of one replaces the other given in the file.
  Config per_rank = config_with({"train.batch_per_rank=16"}, R"({"train": {"global_batch": 64}})");
  resolve_batch(per_rank, 8);
  EXPECT_EQ(per_rank.train.global_batch, 128);
  Config global = config_with({"train.global_batch=32"}, R"({"train": {"batch_per_rank": 16}})");
  resolve_batch(global, 8);
  EXPECT_EQ(global.train.global_batch, 32);
  EXPECT_EQ(global.train.batch_per_rank, 0);
  // batch_per_rank 0 means "not given".
  Config zero = config_with({"train.global_batch=64", "train.batch_per_rank=0"});
  resolve_batch(zero, 8);
  EXPECT_EQ(zero.train.global_batch, 64);
  EXPECT_NE(error_of([] { config_with({"train.batch_per_rank=-1"}); }).find("'train.batch_per_rank' must be >= 0"),
            std::string::npos);
}

TEST(BatchScaling, LinearRuleGivesTheDocumentedRate) {
  // linear: lr × G / R, R defaulting to the batch per rank: the rate times the replicas (Goyal et al.).
  Config c = config_with({"train.batch_per_rank=16", "train.lr=1e-3", "train.lr_scaling=linear"});
  resolve_batch(c, 8);
  // Exact (unless said otherwise below): the factors are powers of two (128/16, 128/32, √4), and a
  // decimal scaled by one rounds to the same double as the scaled decimal.
  EXPECT_EQ(c.train.lr_factor, 8.0);
  EXPECT_EQ(c.train.lr, 8e-3);
  EXPECT_EQ(c.resolved["train"]["lr"], 1e-3) << "config.json keeps the configured rate";
  resolve_batch(c, 8);
  EXPECT_EQ(c.train.lr, 8e-3) << "resolving again does not scale twice";
  // An explicit reference batch: 1e-3 × 128 / 32.
  Config r = config_with({"train.batch_per_rank=16", "train.lr=1e-3", "train.lr_scaling=linear",
                          "train.lr_reference_batch=32"});
  resolve_batch(r, 8);
  EXPECT_EQ(r.train.lr, 4e-3);
  // sqrt: 1e-3 × √(128 / 32).
  Config s = config_with({"train.batch_per_rank=16", "train.lr=1e-3", "train.lr_scaling=sqrt",
                          "train.lr_reference_batch=32"});
  resolve_batch(s, 8);
  EXPECT_EQ(s.train.lr, 2e-3);
  // A fixed global batch scales from the reference it names: 1e-3 × 48 / 16.
  Config g = config_with({"train.global_batch=48", "train.lr=1e-3", "train.lr_scaling=linear",
                          "train.lr_reference_batch=16"});
  resolve_batch(g, 4);
  // Bound: fl(1e-3)·3 rounds twice, the literal 3e-3 once: ≤ 3u·3e-3 apart (u = 2^-53).
  EXPECT_NEAR(g.train.lr, 3e-3, 3 * 0x1p-53 * 3e-3);
  // none: the configured rate, whatever the batch.
  Config n = config_with({"train.batch_per_rank=16", "train.lr=1e-3"});
  resolve_batch(n, 8);
  EXPECT_EQ(n.train.lr, 1e-3);  // Exact: the rate times 1
  // The warm-up ramps to the scaled rate: lr·(s+1)/W, then the schedule from the scaled peak.
  c.train.warmup_steps = 10;
  c.train.steps = 100;
  // Bound: lr·(s+1)/W rounds twice, the literal once: ≤ 3u of the value apart.
  EXPECT_NEAR(lr_at(c.train, 0), 8e-4, 3 * 0x1p-53 * 8e-4);
  EXPECT_NEAR(lr_at(c.train, 9), 8e-3, 3 * 0x1p-53 * 8e-3);
  EXPECT_LT(lr_at(c.train, 50), 8e-3);
  EXPECT_GT(lr_at(c.train, 50), 8e-3 * c.train.min_lr_ratio);
}

TEST(BatchScaling, ScalingNeedsAReferenceAndAKnownWord) {
  const std::string e = error_of([] { config_with({"train.global_batch=64", "train.lr_scaling=linear"}); });
  EXPECT_NE(e.find("set train.lr_reference_batch"), std::string::npos) << e;
  const std::string w = error_of([] { config_with({"train.batch_per_rank=4", "train.lr_scaling=cubic"}); });
  EXPECT_NE(w.find("\"none\", \"linear\" or \"sqrt\""), std::string::npos) << w;
  const Config c = config_with({"train.lr_reference_batch=64"});
  const std::vector<std::string> notes = keys_without_effect(c);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("'train.lr_reference_batch' has no effect with train.lr_scaling \"none\""), std::string::npos);
}

// A checkpoint made at 2 replicas with batch_per_rank 4 (global batch 8), resumed at 4 replicas:
// the global batch changed, and the message says where the new one comes from and how to keep 8.
TEST(BatchScaling, ResumingAtAnotherWorldSizeIsAChangedGlobalBatch) {
  Config before = config_with({"train.batch_per_rank=4"});
  resolve_batch(before, 2);
  CheckpointInfo ckpt;
  ckpt.path = "run/checkpoints/step-00000010.h5";
  ckpt.desc = model_desc_from_config(before.model, 256);
  ckpt.config_json = before.resolved->dump();
  Config same = config_with({"train.batch_per_rank=4"});
  resolve_batch(same, 2);
  EXPECT_EQ(error_of([&] { check_resume_contract(ckpt, resume_contract_rows(ckpt, same, ckpt.desc), {}); }),
            "(no error)");
  Config after = config_with({"train.batch_per_rank=4"});
  resolve_batch(after, 4);
  const std::string e = error_of([&] { check_resume_contract(ckpt, resume_contract_rows(ckpt, after, ckpt.desc), {}); });
  EXPECT_NE(e.find("train.global_batch 8, but this configuration has 16 (train.batch_per_rank 4 × 4 data-parallel "
                   "replicas"), std::string::npos) << e;
  EXPECT_NE(e.find("--set train.global_batch=8"), std::string::npos) << e;
  // The fix it names works: the global batch of the checkpoint at 4 replicas.
  Config fixed = config_with({"train.global_batch=8"}, R"({"train": {"batch_per_rank": 4}})");
  resolve_batch(fixed, 4);
  EXPECT_EQ(fixed.train.global_batch, 8);
}
