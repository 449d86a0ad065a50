// Fused softmax + cross-entropy over the vocabulary.
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "runtime/error.h"

namespace llmpi::cpu {

// Per row n with logits z (length V), target y:
//   mx = max_j z_j;  S = Σ_j exp(z_j - mx)            (every term in (0, 1], S in [1, V])
//   loss_n = log S + mx - z_y                          (= -log softmax(z)_y, no overflow)
//   if grad_scale != 0:  z_j <- grad_scale * (exp(z_j - mx) / S - [j == y])
// Three passes over a row (max; exp + sum, storing the exps in place when a gradient is asked
// for; scale), each vectorised; a 4096-float row stays in L1 between passes.
namespace {

// One row: the loss, and with grad_scale != 0 the gradient written over z.
inline float xent_row(float* z, int y, int V, float grad_scale) {
  const float zy = z[y];
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
  float s = 0.0f;
  if (grad_scale != 0.0f) {
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < V; j++) {
      const float e = fast_expf(z[j] - mx);
      z[j] = e;
      s += e;
    }
    const float f = grad_scale / s;
#pragma omp simd
    for (int j = 0; j < V; j++) z[j] *= f;
    z[y] -= grad_scale;
  } else {
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < V; j++) s += fast_expf(z[j] - mx);
  }
  return std::log(s) + (mx - zy);
}

}  // namespace

void softmax_xent(float* logits, float* losses, const int32_t* targets, int N, int V,
                  float grad_scale) {
  count_readback();  // the target check is a result the host gets (a host wait on a GPU)
  for (int n = 0; n < N; n++)
    if (targets[n] < 0 || targets[n] >= V)
      fail("softmax_xent: target ", targets[n], " at row ", n, " is outside the vocabulary [0, ",
           V, "); check the data set's vocab_size against the model's");
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * V > (1 << 15))
  for (int n = 0; n < N; n++)
    losses[n] = xent_row(logits + static_cast<size_t>(n) * V, targets[n], V, grad_scale);
}

// The same with the bad targets recorded instead of thrown (bad rows: loss NaN, logits untouched).
void softmax_xent_record(float* logits, float* losses, const int32_t* targets, int N, int V,
                         float grad_scale, uint64_t* bad, int row0) {
  for (int n = 0; n < N; n++)
    if (targets[n] < 0 || targets[n] >= V) {
      const uint64_t key = encode_bad_target(row0 + n, targets[n]);
      if (key > *bad) *bad = key;
      break;  // the first bad row of this call is the largest key it can give
    }
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * V > (1 << 15))
  for (int n = 0; n < N; n++) {
    const int y = targets[n];
    losses[n] = y < 0 || y >= V ? std::numeric_limits<float>::quiet_NaN()
                                : xent_row(logits + static_cast<size_t>(n) * V, y, V, grad_scale);
  }
}

}  // namespace llmpi::cpu
