#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"

namespace llmpi {

Optimizer::Optimizer(const Ops& o, size_t n_params, OptimizerKind kind, const std::vector<ShardPiece>& r)
    : ops(&o), sgd(kind == OptimizerKind::sgd), ranges(r) {
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
  ops->free(segments);
}

void Optimizer::step(float* params, const float* grads, const ParamTable& table, double lr, const TrainConfig& tc,
                     float grad_scale) {
  begin_step();
  for (size_t k = 0; k < ranges.size(); k++) update_range(k, params, grads, table, lr, tc, grad_scale);
}

void Optimizer::step_on_device(float* params, const float* grads, const ParamTable& table, double lr,
                               const TrainConfig& tc, const StepScalars* scalars) {
  if (!scalars) fail("internal: Optimizer::step_on_device without the step's scalars");
  begin_step();
  for (size_t k = 0; k < ranges.size(); k++) update_range(k, params, grads, table, lr, tc, 1.0f, scalars);
}

void Optimizer::unstep() {
  if (t <= 0) fail("internal: Optimizer::unstep before any step");
  t--;
}

std::vector<UpdateSegment> update_segments(const ParamTable& table, size_t lo, size_t hi, size_t state_offset) {
  std::vector<UpdateSegment> out;
  if (lo >= hi) return out;
  // The slices the range overlaps, cut to it; neighbours with the same decay flag in one run.
  size_t i = 0;
  while (i < table.slices.size() && table.slices[i].offset + table.slices[i].numel <= lo) i++;
  while (i < table.slices.size() && table.slices[i].offset < hi) {
    size_t j = i;
    while (j + 1 < table.slices.size() && table.slices[j + 1].offset < hi &&
           table.slices[j + 1].decay == table.slices[i].decay)
      j++;
    const size_t off = std::max(lo, table.slices[i].offset);
    const size_t end = std::min(hi, table.slices[j].offset + table.slices[j].numel);
    for (size_t a = off; a < end; a += kUpdateSegmentMax) {  // the run in pieces of at most kUpdateSegmentMax
      UpdateSegment sg;
      sg.offset = a;
      sg.state_offset = state_offset + (a - lo);
      sg.n = (uint32_t)std::min<size_t>(kUpdateSegmentMax, end - a);
      sg.decay = table.slices[i].decay ? 1 : 0;
      out.push_back(sg);
    }
    i = j + 1;
  }
  return out;
}

void Optimizer::build_segments(const ParamTable& table) {
  std::vector<UpdateSegment> all;
  for (size_t k = 0; k < ranges.size(); k++) {
    segment_first.push_back(all.size());
    const std::vector<UpdateSegment> r = update_segments(table, ranges[k].begin, ranges[k].end, state_offset[k]);
    all.insert(all.end(), r.begin(), r.end());
  }
  segment_first.push_back(all.size());
  if (!all.empty()) {
    segments = (UpdateSegment*)ops->alloc(all.size() * sizeof(UpdateSegment));
    ops->copy_to_device(segments, all.data(), all.size() * sizeof(UpdateSegment));
  }
  segments_built = true;
  segments_numel = table.numel;
  segments_slices = table.slices.size();
}

void Optimizer::update_range(size_t k, float* params, const float* grads, const ParamTable& table, double lr,
                             const TrainConfig& tc, float grad_scale, const StepScalars* scalars) {
  if (!segments_built) build_segments(table);  // once: the table never changes
  else if (segments_numel != table.numel || segments_slices != table.slices.size())
    fail("internal: an optimizer is used with another parameter table than its first");
  const size_t first = segment_first[k], count = segment_first[k + 1] - first;
  if (count == 0) return;
  if (sgd)
    ops->sgd_update_segments(params, grads, segments + first, (int)count, grad_scale, scalars, tc.grad_clip,
                             (float)lr, (float)tc.weight_decay);
  else
    ops->adamw_update_segments(params, grads, m, v, segments + first, (int)count, grad_scale, scalars, tc.grad_clip,
                               (float)lr, (float)tc.beta1, (float)tc.beta2, (float)tc.eps, (float)tc.weight_decay,
                               (int)t);
}

double lr_at(const TrainConfig& tc, int64_t s) {
  if (s < tc.warmup_steps) return tc.lr * (double)(s + 1) / (double)tc.warmup_steps;
  const double min_lr = tc.lr * tc.min_lr_ratio;
  const int64_t decay_steps = tc.steps - tc.warmup_steps;
  if (tc.lr_schedule == LrSchedule::constant || decay_steps <= 0) return tc.lr;
  const double progress = std::min(1.0, (double)(s - tc.warmup_steps) / (double)decay_steps);
  if (tc.lr_schedule == LrSchedule::linear) return min_lr + (1.0 - progress) * (tc.lr - min_lr);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (tc.lr - min_lr);
}

void sum_squares_of_pieces_add(const Ops& ops, double* acc, const float* grads, const std::vector<ShardPiece>& pieces,
                               size_t begin, size_t end) {
  for (const ShardPiece& p : pieces) {
    const size_t b = std::max(p.begin, begin), e = std::min(p.end, end);
    if (b < e) ops.sum_squares_add(acc, grads + b, e - b);
  }
}

float clip_factor(double norm, double max_norm) { return clip_factor_of(norm, max_norm); }

}  // namespace llmpi
