// What a training step hands between the device and the host without waiting (backend/op_list.h,
// "step without host synchronisation"):
//
//   StepScalars    the few numbers a step needs on the host — the loss sum, the gradient's sum of
//                  squares, the first bad target — written on the device by the ops
//                  (sum_to_double, sum_squares_add, softmax_xent_record) into one small buffer in
//                  backend memory, and read by the host in ONE copy (Model::read_scalars,
//                  model/transformer.h): after the gradient sync and before the optimizer where
//                  the clip needs other ranks (world > 1, ZeRO-1, pipelines), else after the
//                  optimizer, which then reads them itself (adamw/sgd_update_segments with
//                  scalars: the clip factor and the skip of a non-finite step decided on the device).
//   UpdateSegment  one row of the multi-tensor optimizer's table (adamw_update_segments,
//                  sgd_update_segments): a piece of the flat buffer with its decay flag. The table
//                  is built once per optimizer range (optim/optimizer.h) and stays in backend memory.
//
// Plain structs of fixed layout, shared by the host, the CPU backend and the CUDA kernels.
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define LLMPI_HOST_DEVICE __host__ __device__
#else
#define LLMPI_HOST_DEVICE
#endif

namespace llmpi {

struct StepScalars {
  double loss_sum = 0;      // Σ of the head's per-row losses of the last forward (sum_to_double)
  double grad_sumsq = 0;    // Σ g² of the gradient this rank counts (sum_squares_add)
  uint64_t bad_target = 0;  // 0, or encode_bad_target of the first row whose target is out of range
  uint64_t reserved = 0;
};

// The bad-target key: larger for an earlier row, so a max over rows (an integer atomicMax on the
// GPU: order-independent) keeps the first bad row and its target; 0 means none (the buffer starts
// zeroed). Rows are non-negative ints, so a real key is never 0.
LLMPI_HOST_DEVICE inline uint64_t encode_bad_target(int row, int32_t target) {
  return ~((static_cast<uint64_t>(static_cast<uint32_t>(row)) << 32) | static_cast<uint32_t>(target));
}
LLMPI_HOST_DEVICE inline int bad_target_row(uint64_t key) { return static_cast<int>(~key >> 32); }
LLMPI_HOST_DEVICE inline int32_t bad_target_value(uint64_t key) {
  return static_cast<int32_t>(static_cast<uint32_t>(~key & 0xffffffffu));
}

// ---- global-norm clipping and the non-finite skip: ONE definition for the host (optim/optimizer.h
// clip_factor, the trainer) and the update kernels (kernels/adamw.cu), so both get the same float ----

LLMPI_HOST_DEVICE inline bool finite_double(double x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// The factor global-norm clipping scales the gradients by: max_norm/norm (a double quotient,
// rounded once to float) when max_norm > 0 and the norm is finite and above it, else 1.
LLMPI_HOST_DEVICE inline float clip_factor_of(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm && finite_double(norm) ? static_cast<float>(max_norm / norm) : 1.0f;
}

// The same from a step's scalars: norm = sqrt(grad_sumsq) (a correctly rounded double square root
// on the host and on the GPU alike).
LLMPI_HOST_DEVICE inline float clip_factor_of(const StepScalars& s, double max_norm) {
  return clip_factor_of(std::sqrt(s.grad_sumsq), max_norm);
}

// Whether a step's update may be applied: its loss sum and gradient sum of squares are finite and
// no target was out of range. Otherwise the update is skipped whole (parameters and moments
// untouched); the host, reading the same scalars afterwards, aborts or counts the skip
// (train.on_nonfinite). Finite doubles here are exactly a finite float loss and gradient norm
// (the host's test where other ranks take part): a sum of finite floats cannot overflow a double.
LLMPI_HOST_DEVICE inline bool update_allowed(const StepScalars& s) {
  return s.bad_target == 0 && finite_double(s.loss_sum) && finite_double(s.grad_sumsq);
}

// Elements [offset, offset + n) of params/grads, their optimizer state at [state_offset, ...) of
// m/v; weight decay applies when decay != 0. n <= kUpdateSegmentMax (one GPU block per segment).
struct UpdateSegment {
  uint64_t offset = 0;
  uint64_t state_offset = 0;
  uint32_t n = 0;
  uint32_t decay = 0;
};
constexpr uint32_t kUpdateSegmentMax = 1u << 16;

}  // namespace llmpi
