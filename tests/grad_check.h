// Helpers for checking ops against double-precision references: random data, norm-wise relative
// error, rounding-error bounds (gamma_n, a running error analysis, bounded comparisons), and
// central finite differences of a scalar function of a double vector with their error bound.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
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

// ---- rounding-error bounds (docs/TESTING.md "Tolerances") ---------------------------------------------

// Unit roundoffs (round to nearest): fp32, double, and operands rounded to bf16 (8 significant
// bits) or tf32 (11).
inline constexpr double kUnitFp32 = 0x1p-24, kUnitFp64 = 0x1p-53, kUnitBf16 = 0x1p-8, kUnitTf32 = 0x1p-11;

// gamma_n = n u / (1 − n u): a sum of n + 1 terms computed in any order (blocked, pairwise, in
// vector lanes) is within gamma_n · Σ|terms| of the exact sum, and a dot product of n terms (the
// products rounded or fused) within gamma_n · Σ|a_i b_i|; a chain of n roundings of one value
// within gamma_n of it, relatively (Higham, Accuracy and Stability of Numerical Algorithms, 2nd
// ed., Lemma 3.1 and §3.1).
inline double gamma_n(double n, double u = kUnitFp32) { return n * u / (1.0 - n * u); }

// cpu::fast_expf's relative error: 2u over its whole range (range reduction exact up to 0.38u,
// the polynomial's own error 0.05u, its evaluation 1.6u; derived in test_cpu_ops.cpp
// FastExpMatchesExp), and exactly 0 below -87.
inline constexpr double kFastExpRel = 2 * kUnitFp32;
// glibc's tanhf, and logf, log2f, exp2f: at most 2 and 1 ulp from the correctly rounded result
// (the library's table of known maximum errors), so within 2.5 and 1.5 ulp of the exact value, an
// ulp being at most 2u of it. (Measured over every float, glibc 2.36: 2.8u, 0.8u, 1.4u, 1.0u.)
inline constexpr double kTanhfRel = 5 * kUnitFp32, kLogfRel = 3 * kUnitFp32;

// Running error analysis of an fp32 computation (Higham §3.3, to first order): `v` is the exact
// value of an expression, evaluated in double (whose own rounding, 2^-29 of the fp32 one, is left
// out), and `e` bounds |fp32 result − v|. Each operation adds the rounding of its result, u times
// its magnitude (|v| + e), to its operands' errors carried through its partial derivatives; sum()
// adds gamma_n of its terms' magnitudes, so holds whatever order the sum is taken in. Built from
// the operations the code under test performs, it bounds that code's error (rearranging a formula
// changes the bound, not only the value).
struct Err {
  double v = 0.0, e = 0.0;
  Err() = default;
  Err(double value) : v(value) {}  // NOLINT: held exactly (an fp32 input)
  Err(double value, double err) : v(value), e(err) {}
};
inline double mag(const Err& a) { return std::fabs(a.v) + a.e; }  // bounds the computed |value|
// The result v with operand errors e, rounded to fp32 once.
inline Err rounded(double v, double e, double u = kUnitFp32) { return {v, e + u * (std::fabs(v) + e)}; }
// A constant rounded to fp32 (0.044715f for 0.044715).
inline Err constant(double c) { return {c, kUnitFp32 * std::fabs(c)}; }
inline Err operator-(const Err& a) { return {-a.v, a.e}; }
inline Err operator+(const Err& a, const Err& b) { return rounded(a.v + b.v, a.e + b.e); }
inline Err operator-(const Err& a, const Err& b) { return rounded(a.v - b.v, a.e + b.e); }
inline Err operator*(const Err& a, const Err& b) {
  return rounded(a.v * b.v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e);
}
inline Err operator/(const Err& a, const Err& b) {  // |b.v| > b.e
  const double q = a.v / b.v;
  return rounded(q, (a.e + std::fabs(q) * b.e) / (std::fabs(b.v) - b.e));
}
inline Err sqrt(const Err& a) {  // a.v > 0
  const double r = std::sqrt(a.v);
  return rounded(r, a.e / r);
}
// exp with a relative error `rel` of its own: the argument's error e moves it by exp(v)(e^e − 1).
inline Err exp(const Err& a, double rel) {
  const double x = std::exp(a.v), hi = std::exp(a.v + a.e);
  return {x, (hi - x) + rel * hi};
}
// cpu::fast_expf: kFastExpRel, and 0 where the computed argument may be below -87 (then the error
// may be the value itself).
inline Err fast_exp(const Err& a) {
  Err r = exp(a, kFastExpRel);
  if (a.v - a.e < -87.0) r.e = std::max(r.e, std::exp(a.v + a.e));
  return r;
}
// 2^a with a relative error `rel` of its own (exp2f: kLogfRel's 3u, as above).
inline Err exp2(const Err& a, double rel) {
  const double x = std::exp2(a.v), hi = std::exp2(a.v + a.e);
  return {x, (hi - x) + rel * hi};
}
// log with a relative error `rel` of its own (0 <= a.e < a.v)
inline Err log(const Err& a, double rel) {
  const double l = std::log(a.v);
  return {l, a.e / (a.v - a.e) + rel * (std::fabs(l) + a.e / (a.v - a.e))};
}
// log2 with a relative error `rel` of its own (0 <= a.e < a.v)
inline Err log2(const Err& a, double rel) {
  const double l = std::log2(a.v), d = a.e / (a.v - a.e) / std::log(2.0);
  return {l, d + rel * (std::fabs(l) + d)};
}
// Σ terms in any order: their errors plus gamma_(n−1) of their magnitudes, n counting the terms
// that may be non-zero (adding an exact zero rounds nothing). Sum takes the terms one at a time.
struct Sum {
  double v = 0.0, e = 0.0, m = 0.0, n = 0.0;
  void add(const Err& t) {
    const double a = mag(t);
    v += t.v, e += t.e, m += a, n += a > 0.0;
  }
  Err result(double u = kUnitFp32) const { return {v, e + gamma_n(std::max(n - 1.0, 0.0), u) * m}; }
};
inline Err sum(const std::vector<Err>& terms, double u = kUnitFp32) {
  Sum s;
  for (const Err& t : terms) s.add(t);
  return s.result(u);
}

// The largest |a_i − ref_i| / bound_i (0 / 0 counted 0, d / 0 infinite, NaN the worst), and where.
template <typename A>
double worst_ratio(const A* a, const double* ref, const double* bound, size_t n, size_t* where = nullptr) {
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = std::fabs(static_cast<double>(a[i]) - ref[i]);
    const double r = d == 0.0 ? 0.0 : d <= bound[i] ? d / bound[i] : (bound[i] > 0.0 ? d / bound[i] : INFINITY);
    if (!(r <= worst)) worst = r, at = i;  // (a NaN difference is the worst)
  }
  if (where) *where = at;
  return worst;
}
template <typename A>
double worst_ratio(const std::vector<A>& a, const std::vector<double>& ref, const std::vector<double>& bound) {
  return worst_ratio(a.data(), ref.data(), bound.data(), std::min({a.size(), ref.size(), bound.size()}));
}

// A bounded comparison: every |a_i − ref_i| within bound_i (a zero bound admits only equality).
// Fails naming the worst element (largest |a_i − ref_i| / bound_i) and its ratio. With
// LLMPI_PRINT_BOUNDS set in the environment every check prints that ratio, so that a bound's
// margin can be read on any kernel path (tools/kernel_paths.sh).
template <typename A>
::testing::AssertionResult within_bound(const A* a, const double* ref, const double* bound, size_t n,
                                        const std::string& what = "") {
  size_t at = 0;
  const double worst = worst_ratio(a, ref, bound, n, &at);
  if (std::getenv("LLMPI_PRINT_BOUNDS") != nullptr)
    std::printf("  bound %-60s %zu elements, worst |error| / bound %.4g\n", what.c_str(), n, worst);
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": element " << at << " of " << n << " is "
                                       << static_cast<double>(a[at]) << ", the reference " << ref[at] << " (off by "
                                       << std::fabs(static_cast<double>(a[at]) - ref[at]) << ", bound " << bound[at]
                                       << ": " << worst << " times it)";
}
template <typename A>
::testing::AssertionResult within_bound(const std::vector<A>& a, const std::vector<double>& ref,
                                        const std::vector<double>& bound, const std::string& what = "") {
  if (a.size() != ref.size() || bound.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": sizes " << a.size() << ", " << ref.size() << ", "
                                         << bound.size();
  return within_bound(a.data(), ref.data(), bound.data(), ref.size(), what);
}
// The values and the error bounds of Errs.
inline std::vector<double> values(const std::vector<Err>& x) {
  std::vector<double> v(x.size());
  for (size_t i = 0; i < x.size(); i++) v[i] = x[i].v;
  return v;
}
inline std::vector<double> errors(const std::vector<Err>& x) {
  std::vector<double> e(x.size());
  for (size_t i = 0; i < x.size(); i++) e[i] = x[i].e;
  return e;
}

// ---- finite differences ------------------------------------------------------------------------------

// The components a finite difference is taken for: idx, or all n when idx is empty.
inline std::vector<size_t> components(const std::vector<size_t>& idx, size_t n) {
  if (!idx.empty()) return idx;
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; i++) all[i] = i;
  return all;
}

// Central finite differences of f(x) = Σ_k w_k out_k(x), taken output by output, for the components
// of x in idx (all when idx is empty):
//   g_i = Σ_k w_k (out_k(x + h e_i) − out_k(x − h e_i)) / (2h),  h = step · max(1, |x_i|),
// with, in *err, a bound on each one's error:
//   |g_i − ∂f/∂x_i| ≤ h²/6 · M3_i + Σ_k |w_k| r_k / h + u n Σ_k |w_k Δ_k| / (2h) + u (1 + 1/step) |g_i|.
// The truncation: Taylor's remainder of the central difference, M3_i (third: one per component of
// idx, or one for all) bounding |∂³f/∂x_i³| within h of x (0 where f is at most quadratic in x_i).
// The roundoff: out_k evaluated in double is within r_k of its value, r_k = 2^-29 out_err[k].e (the
// fp32 bound of out_k's operations, scaled to u = 2^-53), so each difference Δ_k within 2 r_k (an
// output not depending on x_i is the same computation at both points, and differs by exactly 0:
// counting it only widens the bound); the n differences' sum rounds by u n Σ|w_k Δ_k|; and x_i ± h
// rounded to double moves each end by up to u (|x_i| + h) ≤ u h (1/step + 1).
inline std::vector<double> fd_grad(const std::function<std::vector<double>(const std::vector<double>&)>& out,
                                   const std::vector<float>& w, std::vector<double> x, const std::vector<size_t>& idx,
                                   const std::vector<double>& third, const std::vector<Err>& out_err,
                                   std::vector<double>* err, double step = 1e-5) {
  const std::vector<size_t> ids = components(idx, x.size());
  double rounding = 0.0;  // Σ_k |w_k| r_k
  for (size_t k = 0; k < out_err.size(); k++)
    rounding += std::fabs(static_cast<double>(w[k])) * out_err[k].e * (kUnitFp64 / kUnitFp32);
  std::vector<double> g;
  g.reserve(ids.size());
  err->assign(ids.size(), 0.0);
  for (size_t n = 0; n < ids.size(); n++) {
    const size_t i = ids[n];
    const double x0 = x[i];
    const double h = step * std::fmax(1.0, std::fabs(x0));
    x[i] = x0 + h;
    const std::vector<double> op = out(x);
    x[i] = x0 - h;
    const std::vector<double> om = out(x);
    x[i] = x0;
    double s = 0.0, sa = 0.0;
    for (size_t k = 0; k < op.size(); k++) {
      const double t = static_cast<double>(w[k]) * (op[k] - om[k]);
      s += t;
      sa += std::fabs(t);
    }
    g.push_back(s / (2.0 * h));
    const double m3 = third.size() == 1 ? third[0] : third.at(n);
    (*err)[n] = h * h / 6.0 * m3 + rounding / h + kUnitFp64 * static_cast<double>(op.size()) * sa / (2.0 * h) +
                kUnitFp64 * (1.0 + 1.0 / step) * std::fabs(g.back());
  }
  return g;
}

// Central finite differences of a scalar f, without a bound: for a caller that holds them to a
// tolerance of its own (it should derive it from the bound above).
inline std::vector<double> fd_grad(const std::function<double(const std::vector<double>&)>& f,
                                   std::vector<double> x, const std::vector<size_t>& idx, double step = 1e-5) {
  const std::vector<size_t> ids = components(idx, x.size());
  std::vector<double> g;
  g.reserve(ids.size());
  for (size_t i : ids) {
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
