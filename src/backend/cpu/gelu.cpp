// GELU, tanh approximation (GPT-2):  gelu(x) = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x³),
// k = sqrt(2/pi). Since 0.5 (1 + tanh(u)) = sigmoid(2u), both directions are written with one
// exp and one division, which vectorise (fast_expf), and do not cancel for large negative x the
// way 1 + tanh(u) would. With e = exp(-|2u|) <= 1 (never overflows):
//   sigmoid(2u) = (u >= 0 ? 1 : e) / (1 + e),   sigmoid(2u) (1 - sigmoid(2u)) = e / (1 + e)²
#include <cmath>

#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

namespace {
constexpr float kK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;
constexpr long long kParMin = 1 << 15;
}  // namespace

// out = x * s,  s = sigmoid(2u)
void gelu_forward(float* out, const float* inp, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) {
    const float x = inp[i];
    const float a = 2.0f * kK * (x + kA * x * x * x);
    const float e = fast_expf(-std::fabs(a));
    const float s = select_float(a >= 0.0f, 1.0f, e) / (1.0f + e);
    out[i] = x * s;
  }
}

// d gelu/dx = 0.5(1+tanh u) + 0.5 x sech²(u) u' = s + 2 x s (1 - s) k (1 + 3·0.044715 x²)
// dinp += that * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) {
    const float x = inp[i];
    const float x2 = x * x;
    const float a = 2.0f * kK * (x + kA * x2 * x);
    const float e = fast_expf(-std::fabs(a));
    const float r = 1.0f / (1.0f + e);
    const float s = select_float(a >= 0.0f, 1.0f, e) * r;
    const float ss = e * r * r;  // s (1 - s)
    const float g = s + 2.0f * x * ss * kK * (1.0f + 3.0f * kA * x2);
    dinp[i] += g * dout[i];
  }
}

}  // namespace llmpi::cpu
