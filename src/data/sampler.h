// Which training windows each rank reads at each step (DistributedSampler semantics).
//
// The token stream of n tokens holds S = (n - 1) / seq_len windows; window w is the seq_len + 1
// tokens starting at w * seq_len (inputs = first seq_len, targets = last seq_len). Every epoch e
// draws a permutation of [0, S) with Rng(seed, e) (Fisher–Yates). Global step s lies in epoch
// e = s / steps_per_epoch (steps_per_epoch = S / global_batch; the tail is dropped), and uses the
// permuted windows [k*G, (k+1)*G) with k = s mod steps_per_epoch and G = global_batch; rank r
// takes the contiguous share [r*G/W, (r+1)*G/W). So the same seed and global batch give the same
// samples at the same step for any world size W dividing G.
//
// drop_last = false (GLUE fine-tuning, as PyTorch's DataLoader without drop_last): the epoch has
// ceil(S / G) steps and its last step takes the g = S mod G remaining samples. g is padded up to
// a multiple of W with the epoch's first samples again (as DistributedSampler pads), and every
// rank takes g_padded / W of them, so ranks average equal-sized means. A 1-rank and a W-rank run
// then agree whenever W divides g (no padding is needed).
#pragma once
#include <cstdint>
#include <vector>

namespace llmpi {

struct Sampler {
  int64_t n_windows = 0;
  int global_batch = 0, world = 1, rank = 0;
  uint64_t seed = 0;
  bool drop_last = true;

  // Throws Error when W does not divide G or (drop_last) the data has fewer than G windows.
  Sampler(int64_t n_windows, int global_batch, int world, int rank, uint64_t seed, bool drop_last = true);
  int64_t steps_per_epoch() const {
    return drop_last ? n_windows / global_batch : (n_windows + global_batch - 1) / global_batch;
  }
  int local_batch() const { return global_batch / world; }
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch(); }
  // The window ids this rank reads at global step `step`: local_batch() of them, fewer in the last
  // step of an epoch when drop_last is false and the data does not fill it.
  std::vector<int64_t> windows(int64_t step);

 private:
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

// The permutation of [0, n) for (seed, epoch).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace llmpi
