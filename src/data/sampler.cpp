#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "runtime/error.h"
#include "runtime/rng.h"

namespace llmpi {

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  Rng rng(seed, (uint64_t)epoch + 1);
  for (int64_t i = n - 1; i > 0; i--) std::swap(p[i], p[rng.below((uint64_t)i + 1)]);
  return p;
}

Sampler::Sampler(int64_t n_windows_, int global_batch_, int world_, int rank_, uint64_t seed_, bool drop_last_)
    : n_windows(n_windows_), global_batch(global_batch_), world(world_), rank(rank_), seed(seed_),
      drop_last(drop_last_) {
  if (global_batch % world != 0)
    fail("train.global_batch (", global_batch, ") is not divisible by the number of ranks (", world,
         "): choose a global batch that is a multiple of ", world, " or run with a world size that divides ",
         global_batch);
  if (n_windows < 1 || (drop_last && n_windows < global_batch))
    fail("the training data holds only ", n_windows, " windows of seq_len+1 tokens, fewer than one global batch (",
         global_batch, "): use more data, a smaller train.global_batch or a shorter model.seq_len",
         drop_last && n_windows >= 1 ? " (or train.drop_last=false to train on a partial batch)" : "");
}

std::vector<int64_t> Sampler::windows(int64_t step) {
  int64_t e = epoch_of(step);
  if (e != cached_epoch_) {
    perm_ = epoch_permutation(n_windows, seed, e);
    cached_epoch_ = e;
  }
  const int64_t begin = step % steps_per_epoch() * global_batch;
  const int64_t g = std::min<int64_t>(global_batch, n_windows - begin);
  if (g == global_batch) {
    const int64_t mine = begin + (int64_t)rank * local_batch();
    return std::vector<int64_t>(perm_.begin() + mine, perm_.begin() + mine + local_batch());
  }
  // The epoch's partial last batch: g samples, padded to a multiple of the world size with the
  // epoch's first samples (wrapping again if the epoch is shorter than the padding).
  const int64_t local = (g + world - 1) / world;
  std::vector<int64_t> w(local);
  for (int64_t i = 0; i < local; i++) {
    const int64_t j = (int64_t)rank * local + i;  // position in the padded global batch
    w[i] = j < g ? perm_[begin + j] : perm_[(j - g) % n_windows];
  }
  return w;
}

}  // namespace llmpi
