#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

namespace llmpi {

Optimizer::Optimizer(const Ops& o, size_t n_params, const std::string& kind, const std::vector<ShardPiece>& r)
    : ops(&o), sgd(kind == "sgd"), ranges(r) {
  if (ranges.empty()) ranges.push_back({0, n_params});
  for (const ShardPiece& p : ranges) {
    state_offset.push_back(n);
    n += p.end - p.begin;
  }
  if (!sgd && n > 0) {
    m = (float*)ops->alloc(n * sizeof(float));
    v = (float*)ops->alloc(n * sizeof(float));
  }
}

Optimizer::~Optimizer() {
  ops->free(m);
  ops->free(v);
}

void Optimizer::step(float* params, const float* grads, const ParamTable& table, double lr, const TrainConfig& tc) {
  begin_step();
  for (size_t k = 0; k < ranges.size(); k++) update_range(k, params, grads, table, lr, tc);
}

void Optimizer::update_range(size_t k, float* params, const float* grads, const ParamTable& table, double lr,
                             const TrainConfig& tc) {
  const size_t lo = ranges[k].begin, hi = ranges[k].end;
  if (lo >= hi) return;
  // The slices the range overlaps, cut to it; neighbours with the same decay flag in one call.
  size_t i = 0;
  while (i < table.slices.size() && table.slices[i].offset + table.slices[i].numel <= lo) i++;
  while (i < table.slices.size() && table.slices[i].offset < hi) {
    size_t j = i;
    while (j + 1 < table.slices.size() && table.slices[j + 1].offset < hi &&
           table.slices[j + 1].decay == table.slices[i].decay)
      j++;
    const size_t off = std::max(lo, table.slices[i].offset);
    const size_t end = std::min(hi, table.slices[j].offset + table.slices[j].numel);
    const float wd = table.slices[i].decay ? (float)tc.weight_decay : 0.0f;
    if (sgd) {
      ops->sgd_update(params + off, grads + off, end - off, (float)lr, wd);
    } else {
      const size_t s = state_offset[k] + (off - lo);
      ops->adamw_update(params + off, grads + off, m + s, v + s, end - off, (float)lr, (float)tc.beta1,
                        (float)tc.beta2, (float)tc.eps, wd, (int)t);
    }
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

double sum_squares_of_pieces(const Ops& ops, const float* grads, const std::vector<ShardPiece>& pieces, size_t limit) {
  double local = 0;
  for (const ShardPiece& p : pieces) {
    const size_t end = std::min(p.end, limit);
    if (p.begin < end) local += ops.sum_squares(grads + p.begin, end - p.begin);
  }
  return local;
}

double clip_grad_norm_sharded(const Ops& ops, float* grads, const std::vector<ShardPiece>& pieces, size_t limit,
                              MPI_Comm comm, double max_norm) {
  double local = sum_squares_of_pieces(ops, grads, pieces, limit), total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_DOUBLE, MPI_SUM, comm);
  const double norm = std::sqrt(total);
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm))
    for (const ShardPiece& p : pieces)
      if (p.begin < p.end) ops.scale(grads + p.begin, (float)(max_norm / norm), p.end - p.begin);
  return norm;
}

double clip_grad_norm(const Ops& ops, float* grads, size_t n, double max_norm) {
  double norm = std::sqrt(ops.sum_squares(grads, n));
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) ops.scale(grads, (float)(max_norm / norm), n);
  return norm;
}

}  // namespace llmpi
