// Fused softmax + cross-entropy over the vocabulary.
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "runtime/error.h"

namespace llmpi::cpu {

// Per row n with logits z (length V), target y:
//   mx = max_j z_j;  S = Σ_j exp(z_j - mx)            (every term in (0, 1], S in [1, V])
//   loss_n = log S + mx - z_y                          (= -log softmax(z)_y, no overflow)
//   if grad_scale != 0:  z_j <- grad_scale * (exp(z_j - mx) / S - [j == y])
// Three passes over a row (max; exp + sum, storing the exps in place when a gradient is asked
// for; scale), each vectorised; a 4096-float row stays in L1 between passes.
void softmax_xent(float* logits, float* losses, const int32_t* targets, int N, int V,
                  float grad_scale) {
  for (int n = 0; n < N; n++)
    if (targets[n] < 0 || targets[n] >= V)
      fail("softmax_xent: target ", targets[n], " at row ", n, " is outside the vocabulary [0, ",
           V, "); check the data set's vocab_size against the model's");
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * V > (1 << 15))
  for (int n = 0; n < N; n++) {
    float* z = logits + static_cast<size_t>(n) * V;
    const int y = targets[n];
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
    losses[n] = std::log(s) + (mx - zy);
  }
}

}  // namespace llmpi::cpu
