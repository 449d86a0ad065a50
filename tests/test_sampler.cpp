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
