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

// One row: the loss, and with grad_scale != 0 the gradient written into g (z itself, or another
// row: the same operations either way).
inline float xent_row(const float* z, float* g, int y, int V, float grad_scale) {
  const float zy = z[y];
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < V; j++) mx = z[j] > mx ? z[j] : mx;
  float s = 0.0f;
  if (grad_scale != 0.0f) {
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < V; j++) {
      const float e = fast_expf(z[j] - mx);
      g[j] = e;
      s += e;
    }
    const float f = grad_scale / s;
#pragma omp simd
    for (int j = 0; j < V; j++) g[j] *= f;
    g[y] -= grad_scale;
  } else {
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < V; j++) s += fast_expf(z[j] - mx);
  }
  return std::log(s) + (mx - zy);
}

// The first bad target of rows [0, N) into *bad (encode_bad_target; max-combined).
void record_bad_target(const int32_t* targets, int N, int V, uint64_t* bad, int row0) {
  for (int n = 0; n < N; n++)
    if (targets[n] < 0 || targets[n] >= V) {
      const uint64_t key = encode_bad_target(row0 + n, targets[n]);
      if (key > *bad) *bad = key;
      break;  // the first bad row of this call is the largest key it can give
    }
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
  for (int n = 0; n < N; n++) {
    float* z = logits + static_cast<size_t>(n) * V;
    losses[n] = xent_row(z, z, targets[n], V, grad_scale);
  }
}

// The same with the bad targets recorded instead of thrown (bad rows: loss NaN, logits untouched),
// on rows ld apart.
void softmax_xent_record(float* logits, int ld, float* losses, const int32_t* targets, int N, int V,
                         float grad_scale, uint64_t* bad, int row0) {
  if (ld < V) fail("internal: softmax_xent_record with ld ", ld, " < V ", V);
  record_bad_target(targets, N, V, bad, row0);
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * V > (1 << 15))
  for (int n = 0; n < N; n++) {
    const int y = targets[n];
    float* z = logits + static_cast<size_t>(n) * ld;
    losses[n] = y < 0 || y >= V ? std::numeric_limits<float>::quiet_NaN() : xent_row(z, z, y, V, grad_scale);
  }
}

// The gradient of each row computed into a per-thread fp32 row by the same xent_row, then rounded
// into grad's row (padding zero): each value softmax_xent_record would have written, rounded.
void softmax_xent_bf16_grad(const float* logits, int ld, float* losses, const int32_t* targets, int N, int V,
                            float grad_scale, uint16_t* grad, uint64_t* bad, int row0) {
  if (grad_scale == 0.0f || ld < V) fail("internal: softmax_xent_bf16_grad needs grad_scale != 0 and ld >= V");
  record_bad_target(targets, N, V, bad, row0);
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * V > (1 << 15))
  for (int n = 0; n < N; n++) {
    const int y = targets[n];
    if (y < 0 || y >= V) {
      losses[n] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    float* row = thread_scratch(static_cast<size_t>(V));
    losses[n] = xent_row(logits + static_cast<size_t>(n) * ld, row, y, V, grad_scale);
    uint16_t* g = grad + static_cast<size_t>(n) * ld;
    store_bf16_bits(g, row, static_cast<size_t>(V));
    for (int j = V; j < ld; j++) g[j] = 0;
  }
}

// A vocabulary shard's cross-entropy (tensor parallelism): xent_row's three passes, with the
// group's max and sums between them (model/layers/lm_head.cpp lm_xent).
void vocab_xent_max(float* rowmax, const float* logits, int ld, int N, int Vn) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * Vn > (1 << 15))
  for (int n = 0; n < N; n++) {
    const float* z = logits + static_cast<size_t>(n) * ld;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < Vn; j++) mx = z[j] > mx ? z[j] : mx;
    rowmax[n] = mx;
  }
}

void vocab_xent_sums(float* sums, const float* logits, int ld, const float* rowmax, const int32_t* targets, int v0,
                     int N, int Vn) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * Vn > (1 << 15))
  for (int n = 0; n < N; n++) {
    const float* z = logits + static_cast<size_t>(n) * ld;
    const float mx = rowmax[n];
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < Vn; j++) s += fast_expf(z[j] - mx);
    sums[n] = s;
    const int y = targets[n] - v0;
    sums[N + n] = y >= 0 && y < Vn ? z[y] : 0.0f;
  }
}

void vocab_xent_finish(float* logits, int ld, float* losses, const float* rowmax, const float* sums,
                       const int32_t* targets, int v0, int N, int Vn, float grad_scale) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * Vn > (1 << 15))
  for (int n = 0; n < N; n++) {
    float* z = logits + static_cast<size_t>(n) * ld;
    const float mx = rowmax[n], s = sums[n];
    losses[n] = std::log(s) + (mx - sums[N + n]);
    if (grad_scale == 0.0f) continue;
    const float f = grad_scale / s;
#pragma omp simd
    for (int j = 0; j < Vn; j++) z[j] = fast_expf(z[j] - mx) * f;
    const int y = targets[n] - v0;
    if (y >= 0 && y < Vn) z[y] -= grad_scale;
  }
}

}  // namespace llmpi::cpu
