// Rotary position embedding (RoPE), Hugging Face "rotate half" convention, in place.
//
// Row n of x (N = B*T rows of `stride` floats) is position t = n % T; its first nh*hs floats are
// nh heads of hs (hs even), and within a head the pairs (i, i + hs/2), i < hs/2, rotate by the
// angle a = t * f_i, f_i = theta^(-2i/hs).
//
// Angles: f_i and a are computed in double and only cos a, sin a rounded to float, so the
// rotation is the exact one up to that last rounding at every position (Hugging Face computes
// f_i and t * f_i in float32, whose angle error grows with t: ~5e-4 rad at t = 4096). The
// cos/sin table [T, hs/2] depends only on (T, hs, theta); the last one built is kept and reused
// (the model asks for the same table for q and k in every layer).
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "runtime/error.h"

namespace llmpi::cpu {

namespace {

constexpr long long kParMin = 1 << 15;

struct RopeTable {
  int T = 0, half = 0;
  float theta = 0.0f;
  std::vector<float> cos_a, sin_a;  // [T, half]: cos/sin of t * f_i
};

// cos_a[t, i] = cos(t f_i), sin_a[t, i] = sin(t f_i), f_i = theta^(-2i/hs), in double then float.
std::shared_ptr<const RopeTable> build_rope_table(int T, int hs, float theta) {
  auto tab = std::make_shared<RopeTable>();
  tab->T = T;
  tab->half = hs / 2;
  tab->theta = theta;
  const int half = hs / 2;
  tab->cos_a.resize(static_cast<size_t>(T) * half);
  tab->sin_a.resize(static_cast<size_t>(T) * half);
  std::vector<double> freq(half);
  for (int i = 0; i < half; i++)
    freq[i] = std::pow(static_cast<double>(theta), -2.0 * i / static_cast<double>(hs));
#pragma omp parallel for schedule(static) if (static_cast<long long>(T) * half > (1 << 12))
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      const double a = static_cast<double>(t) * freq[i];
      tab->cos_a[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(a));
      tab->sin_a[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(a));
    }
  return tab;
}

// The table for (T, hs, theta): the cached one when it matches, else a new one (then cached).
std::shared_ptr<const RopeTable> rope_table(int T, int hs, float theta) {
  static std::mutex mu;
  static std::shared_ptr<const RopeTable> last;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (last && last->T == T && last->half == hs / 2 && last->theta == theta) return last;
  }
  auto tab = build_rope_table(T, hs, theta);
  std::lock_guard<std::mutex> lock(mu);
  last = tab;
  return tab;
}

// Rotates every head of every row by +a (sign = 1) or -a (sign = -1):
//   y[i]        = x[i] cos a - sign x[i+half] sin a
//   y[i+half]   = x[i+half] cos a + sign x[i] sin a
void rotate_rows(float* x, int B, int T, int nh, int hs, int stride, float theta, float sign) {
  if (hs % 2 != 0 || stride < nh * hs)
    fail("rope: head size ", hs, " must be even and the row stride ", stride, " at least nh*hs = ",
         nh * hs);
  if (B <= 0 || T <= 0 || nh <= 0 || hs <= 0) return;
  const auto tab = rope_table(T, hs, theta);
  const int half = hs / 2;
  const long long N = static_cast<long long>(B) * T;
#pragma omp parallel for schedule(static) if (N * nh * hs > kParMin)
  for (long long n = 0; n < N; n++) {
    const size_t t = static_cast<size_t>(n % T);
    const float* ca = tab->cos_a.data() + t * half;
    const float* sa = tab->sin_a.data() + t * half;
    float* row = x + static_cast<size_t>(n) * stride;
    for (int h = 0; h < nh; h++) {
      float* lo = row + static_cast<size_t>(h) * hs;
      float* hi = lo + half;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        const float s = sign * sa[i];
        const float a = lo[i], b = hi[i];
        lo[i] = a * ca[i] - b * s;
        hi[i] = b * ca[i] + a * s;
      }
    }
  }
}

}  // namespace

// x'[i] = x[i] cos a - x[i+hs/2] sin a;  x'[i+hs/2] = x[i+hs/2] cos a + x[i] sin a   (a = t f_i)
void rope_forward(float* x, int B, int T, int nh, int hs, int stride, float theta) {
  rotate_rows(x, B, T, nh, hs, stride, theta, 1.0f);
}

// The forward is a rotation R(a) of each pair, so dL/dx = R(a)^T dL/dx' = R(-a) dL/dx':
//   dx[i] = dx'[i] cos a + dx'[i+hs/2] sin a;  dx[i+hs/2] = dx'[i+hs/2] cos a - dx'[i] sin a
// applied in place (the gradient is transformed, not accumulated: see op_list.h).
void rope_backward(float* dx, int B, int T, int nh, int hs, int stride, float theta) {
  rotate_rows(dx, B, T, nh, hs, stride, theta, -1.0f);
}

}  // namespace llmpi::cpu
