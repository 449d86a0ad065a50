// AdamW with decoupled weight decay, the learning-rate schedule, and global-norm clipping.
// Moments m and v use the parameters' flat layout (one buffer each, backend memory).
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/ops.h"
#include "model/gpt2.h"
#include "runtime/config.h"

namespace llmpi {

struct AdamW {
  const Ops* ops;
  size_t n;
  float* m = nullptr;
  float* v = nullptr;
  int64_t t = 0;  // steps taken (bias correction uses t+1 on the next step)

  AdamW(const Ops& ops, size_t n);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update of every slice of the table; weight decay only where slice.decay.
  void step(float* params, const float* grads, const ParamTable& table, double lr, const TrainConfig& tc);
};

// Learning rate at (0-based) step s: linear warm-up lr·(s+1)/W for s < W, then cosine decay from
// lr to lr·min_lr_ratio at s = steps.
double lr_at(const TrainConfig& tc, int64_t s);

// Global L2 norm of grads (n floats); when max_norm > 0 and the norm exceeds it, grads are scaled
// by max_norm/norm. Returns the norm before clipping.
double clip_grad_norm(const Ops& ops, float* grads, size_t n, double max_norm);

}  // namespace llmpi
