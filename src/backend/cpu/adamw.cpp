// AdamW and the gradient utilities (global-norm clipping uses sum_squares + scale).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

namespace {
constexpr long long kParMin = 1 << 15;
// sum_squares partial sums are taken over fixed chunks of this many elements and added in chunk
// order, so the result is the same bits for any thread count.
constexpr size_t kSumChunk = 1 << 16;
}  // namespace

// For each i (t >= 1):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
// The bias corrections are computed once in double.
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t) {
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), t)));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), t)));
  const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) {
    const float g = grads[i];
    const float mi = beta1 * m[i] + a1 * g;
    const float vi = beta2 * v[i] + a2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = params[i];
    params[i] = p - lr * ((mi * c1) / (std::sqrt(vi * c2) + eps) + weight_decay * p);
  }
}

// For each i: p -= lr * (g + wd * p)   (plain SGD, decoupled weight decay; no momentum)
void sgd_update(float* params, const float* grads, size_t n, float lr, float weight_decay) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) params[i] -= lr * (grads[i] + weight_decay * params[i]);
}

// Σ x², each term widened to double.
double sum_squares(const float* x, size_t n) {
  const size_t nchunks = (n + kSumChunk - 1) / kSumChunk;
  if (nchunks <= 1) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += static_cast<double>(x[i]) * x[i];
    return s;
  }
  std::vector<double> part(nchunks, 0.0);
  const long long nc = static_cast<long long>(nchunks);
#pragma omp parallel for schedule(static)
  for (long long k = 0; k < nc; k++) {
    const size_t i0 = static_cast<size_t>(k) * kSumChunk;
    const size_t i1 = i0 + kSumChunk < n ? i0 + kSumChunk : n;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = i0; i < i1; i++) s += static_cast<double>(x[i]) * x[i];
    part[k] = s;
  }
  double s = 0.0;
  for (double p : part) s += p;
  return s;
}

// x *= s
void scale(float* x, float s, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) x[i] *= s;
}

}  // namespace llmpi::cpu
