// The sampler: disjoint and complete across ranks, reproducible by seed, reshuffled by epoch, and
// the same global batch at the same step for every world size.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/sampler.h"
#include "runtime/error.h"

using namespace llmpi;

TEST(Sampler, DisjointAndCompleteAcrossRanks) {
  for (int64_t n : {16, 37, 100, 257}) {
    for (int world : {1, 2, 3, 4, 8}) {
      const int G = 2 * world;
      if (n < G) continue;
      std::vector<Sampler> ranks;
      for (int r = 0; r < world; r++) ranks.emplace_back(n, G, world, r, 42);
      const int64_t spe = ranks[0].steps_per_epoch();
      ASSERT_EQ(spe, n / G);
      for (int64_t epoch = 0; epoch < 2; epoch++) {
        std::multiset<int64_t> seen;
        for (int64_t k = 0; k < spe; k++) {
          for (auto& s : ranks) {
            for (int64_t w : s.windows(epoch * spe + k)) seen.insert(w);
          }
        }
        // One epoch covers spe*G distinct windows, each in [0, n), none twice.
        EXPECT_EQ(seen.size(), (size_t)(spe * G)) << "n=" << n << " world=" << world;
        EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), seen.size())
            << "a window was given twice, n=" << n << " world=" << world;
        for (int64_t w : seen) ASSERT_TRUE(w >= 0 && w < n);
        if (spe * G == n) {
          EXPECT_EQ(*seen.rbegin(), n - 1);
        }
      }
    }
  }
}

TEST(Sampler, SameGlobalBatchForEveryWorldSize) {
  const int64_t n = 240;
  const int G = 12;
  Sampler one(n, G, 1, 0, 7);
  for (int world : {2, 3, 4, 6, 12}) {
    for (int64_t step : {0, 5, 19, 20, 43}) {
      std::vector<int64_t> joined;
      for (int r = 0; r < world; r++) {
        Sampler s(n, G, world, r, 7);
        auto w = s.windows(step);
        joined.insert(joined.end(), w.begin(), w.end());
      }
      EXPECT_EQ(joined, one.windows(step)) << "world " << world << " step " << step;
    }
  }
}

TEST(Sampler, SameBySeedDifferentByEpochAndSeed) {
  EXPECT_EQ(epoch_permutation(1000, 5, 0), epoch_permutation(1000, 5, 0));
  EXPECT_NE(epoch_permutation(1000, 5, 0), epoch_permutation(1000, 5, 1));
  EXPECT_NE(epoch_permutation(1000, 5, 0), epoch_permutation(1000, 6, 0));
  auto p = epoch_permutation(1000, 5, 3);
  std::sort(p.begin(), p.end());
  for (int64_t i = 0; i < 1000; i++) ASSERT_EQ(p[i], i);
}

TEST(Sampler, ClearErrors) {
  try {
    Sampler s(100, 10, 4, 0, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by the number of ranks (4)"), std::string::npos) << e.what();
  }
  try {
    Sampler s(5, 8, 2, 0, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one global batch"), std::string::npos) << e.what();
  }
}

// drop_last = false: ceil(n / G) steps per epoch; the last step reads the remaining samples,
// padded up to a multiple of the world size with the epoch's first samples (as DistributedSampler
// pads); every sample of the epoch is read, the padding is the only repetition, and when the world
// size divides the remainder every world size reads the same samples at every step.
TEST(Sampler, KeepLastPartialBatch) {
  for (int64_t n : {9, 37, 70, 100}) {
    for (int world : {1, 2, 3, 4}) {
      const int G = 2 * world;
      std::vector<Sampler> ranks;
      for (int r = 0; r < world; r++) ranks.emplace_back(n, G, world, r, 7, /*drop_last=*/false);
      const int64_t spe = ranks[0].steps_per_epoch();
      ASSERT_EQ(spe, (n + G - 1) / G);
      for (int64_t epoch = 0; epoch < 2; epoch++) {
        std::multiset<int64_t> seen;
        std::vector<size_t> last_sizes;
        for (int64_t k = 0; k < spe; k++)
          for (auto& s : ranks) {
            std::vector<int64_t> w = s.windows(epoch * spe + k);
            if (k + 1 < spe || n % G == 0) {
              EXPECT_EQ(w.size(), (size_t)G / world);
            }
            if (k + 1 == spe) last_sizes.push_back(w.size());
            seen.insert(w.begin(), w.end());
          }
        const int64_t g = n - (spe - 1) * G, padded = (g + world - 1) / world * world;
        for (size_t sz : last_sizes) EXPECT_EQ(sz, (size_t)(padded / world)) << "n=" << n << " world=" << world;
        std::set<int64_t> distinct(seen.begin(), seen.end());
        EXPECT_EQ(distinct.size(), (size_t)n) << "every sample is read, n=" << n << " world=" << world;
        EXPECT_EQ(seen.size(), (size_t)((spe - 1) * G + padded)) << "only the padding repeats";
        for (int64_t w : seen) ASSERT_TRUE(w >= 0 && w < n);
      }
    }
  }
  // 70 samples, global batch 8: 9 steps, the last of 6 samples; 1 and 2 ranks read the same ones.
  Sampler one(70, 8, 1, 0, 3, false), a(70, 8, 2, 0, 3, false), b(70, 8, 2, 1, 3, false);
  for (int64_t step = 0; step < 18; step++) {
    std::vector<int64_t> both = a.windows(step), second = b.windows(step);
    both.insert(both.end(), second.begin(), second.end());
    EXPECT_EQ(both, one.windows(step)) << "step " << step;
  }
  EXPECT_EQ(one.windows(8).size(), 6u);
  // Fewer samples than one global batch: one partial step per epoch.
  Sampler small(3, 8, 2, 1, 3, false);
  EXPECT_EQ(small.steps_per_epoch(), 1);
  EXPECT_EQ(small.windows(0).size(), 2u);
}
