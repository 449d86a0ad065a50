#include "optim/optimizer.h"

#include <cmath>

namespace llmpi {

Optimizer::Optimizer(const Ops& o, size_t n_, const std::string& kind) : ops(&o), sgd(kind == "sgd"), n(n_) {
  if (!sgd) {
    m = (float*)ops->alloc(n * sizeof(float));
    v = (float*)ops->alloc(n * sizeof(float));
  }
}

Optimizer::~Optimizer() {
  ops->free(m);
  ops->free(v);
}

void Optimizer::step(float* params, const float* grads, const ParamTable& table, double lr,
                 const TrainConfig& tc) {
  t++;
  // Neighbouring slices with the same decay flag are updated in one call.
  size_t i = 0;
  while (i < table.slices.size()) {
    size_t j = i;
    while (j + 1 < table.slices.size() && table.slices[j + 1].decay == table.slices[i].decay) j++;
    size_t off = table.slices[i].offset;
    size_t len = table.slices[j].offset + table.slices[j].numel - off;
    const float wd = table.slices[i].decay ? (float)tc.weight_decay : 0.0f;
    if (sgd)
      ops->sgd_update(params + off, grads + off, len, (float)lr, wd);
    else
      ops->adamw_update(params + off, grads + off, m + off, v + off, len, (float)lr, (float)tc.beta1,
                        (float)tc.beta2, (float)tc.eps, wd, (int)t);
    i = j + 1;
  }
}

double lr_at(const TrainConfig& tc, int64_t s) {
  if (s < tc.warmup_steps) return tc.lr * (double)(s + 1) / (double)tc.warmup_steps;
  const double min_lr = tc.lr * tc.min_lr_ratio;
  const int64_t decay_steps = tc.steps - tc.warmup_steps;
  if (tc.lr_schedule == "constant" || decay_steps <= 0) return tc.lr;
  const double progress = std::min(1.0, (double)(s - tc.warmup_steps) / (double)decay_steps);
  if (tc.lr_schedule == "linear") return min_lr + (1.0 - progress) * (tc.lr - min_lr);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (tc.lr - min_lr);
}

double clip_grad_norm(const Ops& ops, float* grads, size_t n, double max_norm) {
  double norm = std::sqrt(ops.sum_squares(grads, n));
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) ops.scale(grads, (float)(max_norm / norm), n);
  return norm;
}

}  // namespace llmpi
