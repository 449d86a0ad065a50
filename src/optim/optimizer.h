// The optimizer (AdamW with decoupled weight decay, or plain SGD), the learning-rate schedule,
// and global-norm clipping. AdamW's moments m and v cover the ranges of the flat buffer this rank
// updates: the whole buffer, or with ZeRO-1 (parallel.zero 1) only this rank's shard, its piece
// of every bucket (params/buckets.h shard_pieces). The moments of range k are stored contiguously
// at state_offset[k], the ranges one after another (backend memory); SGD keeps no state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "params/buckets.h"
#include "params/param_table.h"
#include "runtime/config.h"

namespace llmpi {

struct Optimizer {
  const Ops* ops;
  bool sgd;  // train.optimizer sgd
  std::vector<ShardPiece> ranges;    // flat-buffer ranges this optimizer updates, in order
  std::vector<size_t> state_offset;  // where range k's moments start in m and v
  size_t n = 0;                      // floats of state per moment: the ranges' total
  float* m = nullptr;
  float* v = nullptr;
  int64_t t = 0;  // steps taken (bias correction uses t+1 on the next step)
  // The multi-tensor update's table (backend memory), built and uploaded at the first update from
  // the parameter table: range k's segments are [segment_first[k], segment_first[k+1]).
  UpdateSegment* segments = nullptr;
  std::vector<size_t> segment_first;

  // The whole buffer of n_params floats (ranges empty), or only `ranges`.
  Optimizer(const Ops& ops, size_t n_params, OptimizerKind kind, const std::vector<ShardPiece>& ranges = {});
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every range (t advances once); weight decay only where slice.decay. Each
  // gradient is read as grads[i] * grad_scale (the clip factor: clip_factor; 1 = none), the same
  // bits as scaling the gradients first; the gradients themselves are not changed.
  void step(float* params, const float* grads, const ParamTable& table, double lr, const TrainConfig& tc,
            float grad_scale = 1.0f);
  // The same with the decision taken on the device from the step's scalars (backend memory,
  // filled before: the loss sum and the gradient's sum of squares), no readback first: the factor
  // is clip_factor_of(*scalars, tc.grad_clip), the host's clip_factor(sqrt(sumsq), tc.grad_clip),
  // and nothing is written unless update_allowed(*scalars) (backend/step_scalars.h). t advances
  // either way: a caller that reads the scalars afterwards and finds the step skipped calls
  // unstep, so the next step's bias correction is the one it would have had.
  void step_on_device(float* params, const float* grads, const ParamTable& table, double lr, const TrainConfig& tc,
                      const StepScalars* scalars);
  // Takes back the t++ of the last step, which the device skipped (no update was applied).
  void unstep();
  // The same in parts (ZeRO-1 all-gathers a bucket while the next range is updated): begin_step
  // advances t, then update_range(k) for every k, each exactly once. One launch per range
  // (adamw_update_segments / sgd_update_segments over the range's segments).
  void begin_step() { t++; }
  void update_range(size_t k, float* params, const float* grads, const ParamTable& table, double lr,
                    const TrainConfig& tc, float grad_scale = 1.0f, const StepScalars* scalars = nullptr);

 private:
  bool segments_built = false;
  size_t segments_numel = 0, segments_slices = 0;  // of the table they were built from
  void build_segments(const ParamTable& table);
};

// The segments of the flat-buffer range [lo, hi) (its moments at state_offset): the slices it
// overlaps cut to it, neighbours with the same decay flag joined, split into pieces of at most
// kUpdateSegmentMax elements (backend/step_scalars.h).
std::vector<UpdateSegment> update_segments(const ParamTable& table, size_t lo, size_t hi, size_t state_offset);

// Learning rate at (0-based) step s: linear warm-up lr·(s+1)/W for s < W, then (train.lr_schedule)
// cosine decay from lr to lr·min_lr_ratio at s = steps, or linear decay
//   lr_s = min_lr + (lr − min_lr)·(1 − (s − W)/(steps − W)),
// which with min_lr_ratio 0 is transformers' get_linear_schedule_with_warmup (the rate used for
// step s is lr·(steps − s)/(steps − W)), or constant lr.
double lr_at(const TrainConfig& tc, int64_t s);

// The factor global-norm clipping scales the gradients by: max_norm/norm (as a float) when
// max_norm > 0 and the norm is finite and above it, else 1 (clip_factor_of in
// backend/step_scalars.h, the one definition the update kernels use too). Global-norm clipping is
// the norm of the gradient (the trainer: sum_squares_add into the step's scalars; ZeRO-1 sums the
// pieces' squares over the group) and this factor folded into Optimizer::step — or, on one rank,
// computed by the update itself from the scalars (Optimizer::step_on_device).
float clip_factor(double norm, double max_norm);
// *acc (backend memory) += the squares of grads in `pieces` within [begin, end): one rank's part
// of a sharded norm (ZeRO-1), piece by piece, without a host wait.
void sum_squares_of_pieces_add(const Ops& ops, double* acc, const float* grads, const std::vector<ShardPiece>& pieces,
                               size_t begin, size_t end);

}  // namespace llmpi
