// The optimizer (AdamW with decoupled weight decay, or plain SGD), the learning-rate schedule,
// and global-norm clipping. AdamW's moments m and v use the parameters' flat layout (one buffer
// each, backend memory); SGD keeps no state.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/ops.h"
#include "params/param_table.h"
#include "runtime/config.h"

namespace llmpi {

struct Optimizer {
  const Ops* ops;
  bool sgd;  // train.optimizer == "sgd"
  size_t n;
  float* m = nullptr;
  float* v = nullptr;
  int64_t t = 0;  // steps taken (bias correction uses t+1 on the next step)

  Optimizer(const Ops& ops, size_t n, const std::string& kind);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every slice of the table; weight decay only where slice.decay.
  void step(float* params, const float* grads, const ParamTable& table, double lr, const TrainConfig& tc);
};

// Learning rate at (0-based) step s: linear warm-up lr·(s+1)/W for s < W, then (train.lr_schedule)
// cosine decay from lr to lr·min_lr_ratio at s = steps, or linear decay
//   lr_s = min_lr + (lr − min_lr)·(1 − (s − W)/(steps − W)),
// which with min_lr_ratio 0 is transformers' get_linear_schedule_with_warmup (the rate used for
// step s is lr·(steps − s)/(steps − W)), or constant lr.
double lr_at(const TrainConfig& tc, int64_t s);

// Global L2 norm of grads (n floats); when max_norm > 0 and the norm exceeds it, grads are scaled
// by max_norm/norm. Returns the norm before clipping.
double clip_grad_norm(const Ops& ops, float* grads, size_t n, double max_norm);

}  // namespace llmpi
