// Helpers for checking ops against double-precision references: random data, norm-wise relative
// error, and central finite differences of a scalar function of a double vector.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace llmpi::test {

// Uniform floats in [lo, hi) from a fixed-seed generator.
inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

inline std::vector<int32_t> random_ints(size_t n, uint32_t seed, int32_t lo, int32_t hi_excl) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi_excl - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// A float's IEEE bits and back (the rounding tests: bf16, tf32).
inline float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline uint32_t to_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// ‖a − ref‖ / ‖ref‖ (‖·‖ the Euclidean norm); a and ref have the same length. A zero reference
// gives the absolute norm of the difference.
template <typename A>
double rel_err(const A* a, const double* ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}
template <typename A>
double rel_err(const std::vector<A>& a, const std::vector<double>& ref) {
  return rel_err(a.data(), ref.data(), ref.size());
}

// Central finite differences of f at x for the components in idx (all when idx is empty):
//   g_i = (f(x + h e_i) − f(x − h e_i)) / (2h),  h = step · max(1, |x_i|).
// The truncation error is O(h² f''') and the rounding error O(1e-16 |f| / h): with f in double
// and step 1e-5 both are far below the 1e-4 tolerance the tests use.
inline std::vector<double> fd_grad(const std::function<double(const std::vector<double>&)>& f,
                                   std::vector<double> x, const std::vector<size_t>& idx,
                                   double step = 1e-5) {
  std::vector<size_t> all;
  const std::vector<size_t>* ids = &idx;
  if (idx.empty()) {
    all.resize(x.size());
    for (size_t i = 0; i < x.size(); i++) all[i] = i;
    ids = &all;
  }
  std::vector<double> g;
  g.reserve(ids->size());
  for (size_t i : *ids) {
    const double x0 = x[i];
    const double h = step * std::fmax(1.0, std::fabs(x0));
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g.push_back((fp - fm) / (2.0 * h));
  }
  return g;
}

// Σ_i a_i · w_i: turns a vector-valued forward into the scalar loss whose gradient with respect to
// the output is w (the `dout` handed to a backward function).
inline double dot(const std::vector<double>& a, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * w[i];
  return s;
}

}  // namespace llmpi::test
