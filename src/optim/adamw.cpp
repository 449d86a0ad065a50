#include "optim/adamw.h"

#include <cmath>

namespace llmpi {

AdamW::AdamW(const Ops& o, size_t n_) : ops(&o), n(n_) {
  m = (float*)ops->alloc(n * sizeof(float));
  v = (float*)ops->alloc(n * sizeof(float));
}

AdamW::~AdamW() {
  ops->free(m);
  ops->free(v);
}

void AdamW::step(float* params, const float* grads, const ParamTable& table, double lr,
                 const TrainConfig& tc) {
  t++;
  // Neighbouring slices with the same decay flag are updated in one call.
  size_t i = 0;
  while (i < table.slices.size()) {
    size_t j = i;
    while (j + 1 < table.slices.size() && table.slices[j + 1].decay == table.slices[i].decay) j++;
    size_t off = table.slices[i].offset;
    size_t len = table.slices[j].offset + table.slices[j].numel - off;
    ops->adamw_update(params + off, grads + off, m + off, v + off, len, (float)lr, (float)tc.beta1,
                      (float)tc.beta2, (float)tc.eps, table.slices[i].decay ? (float)tc.weight_decay : 0.0f,
                      (int)t);
    i = j + 1;
  }
}

double lr_at(const TrainConfig& tc, int64_t s) {
  if (s < tc.warmup_steps) return tc.lr * (double)(s + 1) / (double)tc.warmup_steps;
  double min_lr = tc.lr * tc.min_lr_ratio;
  int64_t decay_steps = tc.steps - tc.warmup_steps;
  if (decay_steps <= 0) return tc.lr;
  double progress = std::min(1.0, (double)(s - tc.warmup_steps) / (double)decay_steps);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (tc.lr - min_lr);
}

double clip_grad_norm(const Ops& ops, float* grads, size_t n, double max_norm) {
  double norm = std::sqrt(ops.sum_squares(grads, n));
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) ops.scale(grads, (float)(max_norm / norm), n);
  return norm;
}

}  // namespace llmpi
