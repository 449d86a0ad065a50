// Shared by the CUDA test files (test_cuda_*.cpp): the skip-without-a-GPU guards, device buffers
// filled from and read back to host vectors, the comparisons every CUDA test makes against the CPU
// backend (the oracle), and the rounding bounds of the ops those comparisons are held to ("Bounds"
// below; docs/TESTING.md "Tolerances"). Each test file keeps its own cases.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/bf16.h"
#include "backend/cuda_ops.h"
#include "backend/dropout_hash.h"
#include "backend/ops.h"
#include "grad_check.h"

namespace llmpi::test {

// First statement of every GPU test: skips ("no GPU: <reason>") where cuda_available() is false.
#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    std::string why_;                                                   \
    if (!llmpi::cuda_available(&why_)) GTEST_SKIP() << "no GPU: " << why_; \
    llmpi::cuda_bind_device(0);                                         \
  } while (0)

// After REQUIRE_GPU: skips when the card has less than `bytes` free (a smaller card than the
// H100/H200 the real-shape tests are sized for).
#define REQUIRE_GPU_MEMORY(bytes)                                                              \
  do {                                                                                         \
    size_t free_ = 0, total_ = 0;                                                              \
    llmpi::cuda_mem_info(&free_, &total_);                                                     \
    if (free_ < (bytes))                                                                       \
      GTEST_SKIP() << "not enough GPU memory: needs " << (bytes) / 1e9 << " GB, " << free_ / 1e9 \
                   << " GB free";                                                              \
  } while (0)

// Switches the named unverified CUDA paths off (backend/cuda_ops.h "Paths") for the scope, on top
// of LLMPI_CUDA_OFF's list ("" adds none; with replace, the list is exactly `list`: "" turns every
// path on), and restores the list after. Tests of our kernels keep cuDNN's attention off so that
// they test them; cuDNN's tests turn it on.
struct ScopedCudaPathsOff {
  std::string saved;
  explicit ScopedCudaPathsOff(const std::string& list, bool replace = false) {
    saved = cuda_set_paths_off("");
    cuda_set_paths_off(replace ? list : saved + "," + list);
  }
  ~ScopedCudaPathsOff() { cuda_set_paths_off(saved); }
  ScopedCudaPathsOff(const ScopedCudaPathsOff&) = delete;
  ScopedCudaPathsOff& operator=(const ScopedCudaPathsOff&) = delete;
};

inline const Ops& gpu() { return cuda_ops(); }
inline const Ops& cpu() { return cpu_ops(); }

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();

// A device buffer of the CUDA backend, filled from / read back to host vectors.
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : p(gpu().alloc(b)), bytes(b) {}
  template <typename T>
  explicit Dev(const std::vector<T>& h) : Dev(h.size() * sizeof(T)) {
    gpu().copy_to_device(p, h.data(), bytes);
  }
  ~Dev() { gpu().free(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  float* f() { return static_cast<float*>(p); }
  int32_t* i() { return static_cast<int32_t*>(p); }
  std::vector<float> get() const {
    std::vector<float> h(bytes / sizeof(float));
    gpu().copy_to_host(h.data(), p, bytes);
    return h;
  }
};

// n NaNs: outputs are poisoned with them, so an element a kernel forgets to write fails.
inline std::vector<float> nans(size_t n) { return std::vector<float>(n, kNaN); }

// ‖a − ref‖/‖ref‖ for float vectors.
inline double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  return rel_err(a, to_double(ref));
}

// The parts an op added to buffers that started at `before` (backward ops add, op_list.h).
inline std::vector<float> added(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> d(after.size());
  for (size_t k = 0; k < after.size(); k++) d[k] = after[k] - before[k];
  return d;
}

inline bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// "" when a and b hold the same bits, else where and how many elements differ (EXPECT_EQ on
// vectors of millions of floats would print them all).
inline std::string bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size())
    return "sizes differ: " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  size_t first = a.size(), count = 0;
  for (size_t i = 0; i < a.size(); i++)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (count++ == 0) first = i;
    }
  if (count == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu of %zu elements differ, the first at %zu: %.9g vs %.9g", count,
                a.size(), first, a[first], b[first]);
  return buf;
}
#define EXPECT_SAME_BITS(a, b) EXPECT_EQ(llmpi::test::bit_difference((a), (b)), "")

// The bf16 bits of each value (backend/bf16.h: round to nearest even).
inline std::vector<uint16_t> host_bits(const std::vector<float>& w) {
  std::vector<uint16_t> b(w.size());
  for (size_t i = 0; i < w.size(); i++) b[i] = float_to_bf16_bits(w[i]);
  return b;
}

// A row-major [rows, cols] matrix as rows of ld >= cols values, the padding `fill` (a padded row
// stride: GemmMode::out_ld / dout_ld, the LM head's logits); unpad_rows undoes it.
template <typename T>
std::vector<T> pad_rows(const std::vector<T>& a, int rows, int cols, int ld, T fill) {
  std::vector<T> p(static_cast<size_t>(rows) * ld, fill);
  for (int r = 0; r < rows; r++)
    std::memcpy(&p[static_cast<size_t>(r) * ld], &a[static_cast<size_t>(r) * cols], sizeof(T) * cols);
  return p;
}
template <typename T>
std::vector<T> unpad_rows(const std::vector<T>& p, int rows, int cols, int ld) {
  std::vector<T> a(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; r++)
    std::memcpy(&a[static_cast<size_t>(r) * cols], &p[static_cast<size_t>(r) * ld], sizeof(T) * cols);
  return a;
}
// The padding columns of p (rows of ld values, cols used), row by row.
template <typename T>
std::vector<T> padding_of(const std::vector<T>& p, int rows, int cols, int ld) {
  std::vector<T> out;
  for (int r = 0; r < rows; r++)
    out.insert(out.end(), p.begin() + static_cast<size_t>(r) * ld + cols, p.begin() + static_cast<size_t>(r + 1) * ld);
  return out;
}

// ---- Bounds ---------------------------------------------------------------------------------------
// A bounded comparison (docs/TESTING.md "Tolerances") holds |gpu − cpu| to the sum of what each
// side's rounding can move its result by, to first order: a sum of n terms in any order is within
// gamma_n(n)·(Σ|terms|) of the exact sum (Higham, "Accuracy and Stability of Numerical
// Algorithms", 3.1), so a bound is a unit roundoff times a length times the magnitude of what is
// summed, never the result's own size, which cancels. Every operation is counted as one rounding
// (an FMA, which rounds once where the other side rounds twice, is covered). The arithmetic:
//   kU     fp32, round to nearest: the CPU, and CUDA's fp32 arithmetic on CUDA cores (division and
//          sqrtf correctly rounded under nvcc's default -prec-div / -prec-sqrt)
//   kUTc   the tensor cores' fp32 accumulation (cuBLAS bf16 / tf32 GEMMs, mma.sync), which is not
//          round to nearest: it truncates (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of
//          NVIDIA tensor cores", 2021), taken as 2^-23 per addition; also the CPU's bf16 engines
//          (oneDNN's AVX-512 bf16 and AMX dot products), whose order and rounding are their own
//   kUTf32 an fp32 operand cut to tf32's 10 stored bits: below 2^-10 relative, rounded or truncated
//   kUBf16 bf16 rounded to nearest
//   kExpU  exp's relative error: CUDA's expf and exp2f within 2 ulp (CUDA Math API), the CPU's
//          fast_expf within 3e-7 (CpuOps.FastExpMatchesExp); 5u covers both. logf: 1 ulp (2u).
// (gamma_n itself is grad_check.h's: n u / (1 - n u), u = 2^-24 unless given.)
constexpr double kU = 0x1p-24, kUTc = 0x1p-23, kUTf32 = 0x1p-10, kUBf16 = 0x1p-8, kExpU = 5 * kU;
static_assert(kU == kUnitFp32, "gamma_n's default unit roundoff is fp32's");

// ‖a − ref‖ / ‖mag‖: the difference against the magnitude of what each element sums; or, with a
// bound per element as mag, the share of that bound the difference takes norm-wise (below 1 when
// |a − ref| <= mag held element by element). NaN in a gives NaN (every EXPECT_LT on it fails).
template <typename R>
double rel_to_magnitude(const std::vector<float>& a, const std::vector<R>& ref, const std::vector<double>& mag) {
  EXPECT_EQ(a.size(), ref.size());
  EXPECT_EQ(a.size(), mag.size());
  double d = 0.0, m = 0.0;
  for (size_t i = 0; i < a.size() && i < ref.size() && i < mag.size(); i++) {
    const double x = static_cast<double>(a[i]) - static_cast<double>(ref[i]);
    d += x * x;
    m += mag[i] * mag[i];
  }
  return m > 0.0 ? std::sqrt(d / m) : (d > 0.0 ? INFINITY : std::sqrt(d));
}

// |v| in double; and c·|v| + |w| (a magnitude made of parts).
inline std::vector<double> abs_d(const std::vector<float>& v, double c = 1.0) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = c * std::fabs(static_cast<double>(v[i]));
  return r;
}
inline std::vector<double> plus_abs(std::vector<double> m, const std::vector<float>& w, double c = 1.0) {
  for (size_t i = 0; i < m.size() && i < w.size(); i++) m[i] += c * std::fabs(static_cast<double>(w[i]));
  return m;
}
inline std::vector<double> scaled(std::vector<double> m, double c) {
  for (double& x : m) x *= c;
  return m;
}
inline std::vector<float> abs_f(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = std::fabs(v[i]);
  return r;
}

// Dense layers (backend/ops.h matmul_*): the magnitude of each output's sum, from the CPU's fp32
// GEMM on absolute values (a sum of positive terms, which its rounding moves by < gamma_n(K)
// relative: nothing for a bound). out: |x|·|W|ᵀ + |bias|; the backward's added parts, with the
// values they are added to: dinp |dinp0| + |dout|·|W|, dweight |dweight0| + |dout|ᵀ·|x|, dbias
// |dbias0| + Σ_n |dout| (an empty start: 0).
inline std::vector<double> matmul_out_magnitude(const std::vector<float>& x, const std::vector<float>& w,
                                                const float* bias, int N, int C, int OC) {
  std::vector<float> ab;
  if (bias) ab = abs_f(std::vector<float>(bias, bias + OC));
  std::vector<float> out(static_cast<size_t>(N) * OC);
  cpu_ops().matmul_forward(out.data(), abs_f(x).data(), abs_f(w).data(), bias ? ab.data() : nullptr, N, C, OC,
                           GemmPrecision::fp32);
  return std::vector<double>(out.begin(), out.end());
}
struct MatmulBackwardMagnitude {
  std::vector<double> dinp, dweight, dbias;
};
inline MatmulBackwardMagnitude matmul_backward_magnitude(const std::vector<float>& dout, const std::vector<float>& x,
                                                         const std::vector<float>& w, int N, int C, int OC,
                                                         const std::vector<float>& dinp0 = {},
                                                         const std::vector<float>& dweight0 = {},
                                                         const std::vector<float>& dbias0 = {}) {
  auto start = [](const std::vector<float>& v, size_t n) { return v.empty() ? std::vector<float>(n, 0.0f) : abs_f(v); };
  std::vector<float> dx = start(dinp0, static_cast<size_t>(N) * C), dw = start(dweight0, static_cast<size_t>(OC) * C),
                     db = start(dbias0, OC);
  cpu_ops().matmul_backward(dx.data(), dw.data(), db.data(), abs_f(dout).data(), abs_f(x).data(), abs_f(w).data(), N,
                            C, OC, GemmPrecision::fp32);
  return {std::vector<double>(dx.begin(), dx.end()), std::vector<double>(dw.begin(), dw.end()),
          std::vector<double>(db.begin(), db.end())};
}

// Two GEMMs of a dense layer summing K terms plus one (the bias, or the value the backward adds
// to), against the magnitude: each side within gamma_n(K + 1) of the exact sum, and the added part
// fl(after − before) one rounding more, so
//   fp32 on both sides (cuBLAS's sgemm, any blocking or split-K; the CPU's)  2 gamma_n(K + 2)
//   bf16: the same operands rounded to nearest even on both sides, their products exact in fp32,
//         the sums on tensor cores or the CPU's bf16 engines (kUTc): 2 gamma_n(K + 2, kUTc),
//         times (1 + 2^-8)² for the rounded operands' magnitude
//   tf32 against fp32: each operand cut by < 2^-10 ((1 + 2^-10)² − 1 on a product, exact in fp32
//         once cut), tensor-core sums, the CPU's fp32 sums
inline double gemm_bound(GemmPrecision gpu_prec, int K) {
  switch (gpu_prec) {
    case GemmPrecision::bf16:
      return 2 * gamma_n(K + 2, kUTc) * (1 + kUBf16) * (1 + kUBf16);
    case GemmPrecision::tf32:
      return (1 + kUTf32) * (1 + kUTf32) - 1 + gamma_n(K + 2, kUTc) + gamma_n(K + 2);
    default:
      return 2 * gamma_n(K + 2);
  }
}

// ---- LayerNorm / RMSNorm bounds (kernels/layernorm.cu, backend/cpu/layernorm.cpp) ----------------
// Per row x of C values, first order, each side (the bound returned is the sum of both sides: any
// summation orders, the warp's and the CPU's vector lanes alike):
//   mean = Σx / C:        |Δmean| <= gamma_n(C + 1) A,  A = Σ|x| / C
//   var = Σ(x − mean)²/C: relative gamma_n(C + 4) (the mean's error drops out to first order,
//                         Σ(x − mean) = 0, leaving C Δmean² for the second, counted)
//   rstd = 1/sqrt(var + eps): relative ε_r = ε_var / 2 + 3u (sqrt and the reciprocal: IEEE)
//   out_c = (x_c − mean) rstd w_c + b_c:  |Δ| <= |Δmean| rstd |w_c| + |x_c − mean| rstd |w_c| (ε_r + 4u) + u|b_c|
// RMSNorm is the same without the mean (Σx²: relative gamma_n(C + 2)).
// Backward, norm_c = (x_c − mean) rstd and g_c = w_c dout_c (mean, rstd given):
//   sg = Σ g, sgn = Σ g norm:   |Δ| <= gamma_n(C + 4) · (Σ|g|, Σ|g norm|)
//   dinp_c += rstd (g_c − sg/C − norm_c sgn/C): magnitude M_c = rstd (|g_c| + Σ|g|/C + |norm_c| Σ|g norm|/C),
//                               |Δ| <= gamma_n(C + 8) M_c, and the add to dinp0 and the added part's
//                               subtraction: gamma_n(C + 10) M_c + u |dinp0_c|
//   dweight_c += Σ_n norm dout, dbias_c += Σ_n dout: N + 1 terms (the start value), each term
//                               3 roundings: gamma_n(N + 4) (Σ_n |norm dout| + |dweight0|)
// When the two sides' backwards read different mean / rstd (each its own forward's), those
// differences (dmean, drstd per row, the forward bounds) are carried through to first order:
// δnorm_c <= dmean rstd + |x_c − mean| drstd, into sgn, dinp and dweight.
// Every added part fl(after − before) rounds once more on each side: 2u (|before| + magnitude)
// (in dinp's gamma_n(C + 10)).
struct NormBounds {
  std::vector<double> out, mean, rstd;    // forward (mean: LayerNorm only)
  std::vector<double> dinp, dweight, dbias;  // backward's added parts (dbias: LayerNorm only)
};

// layernorm = false: RMSNorm (b, db0, the mean ignored). dout empty: the forward's bounds only.
// stats_differ: each side's backward reads its own forward's mean and rstd.
inline NormBounds norm_bounds(bool layernorm, const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& b, int N, int C, float eps,
                              const std::vector<float>& dout = {}, const std::vector<float>& dx0 = {},
                              const std::vector<float>& dw0 = {}, const std::vector<float>& db0 = {},
                              bool stats_differ = false) {
  NormBounds r;
  const size_t NC = static_cast<size_t>(N) * C;
  r.out.assign(NC, 0.0);
  r.mean.assign(N, 0.0);
  r.rstd.assign(N, 0.0);
  const bool bwd = !dout.empty();
  if (bwd) {
    r.dinp.assign(NC, 0.0);
    r.dweight.assign(C, 0.0);
    r.dbias.assign(C, 0.0);
  }
  std::vector<double> mag_w(C, 0.0), dev_w(C, 0.0), mag_b(C, 0.0);  // the column sums' magnitudes, their deviations
  const double gC = gamma_n(C + 1), gvar = gamma_n(C + 4);
  for (int n = 0; n < N; n++) {
    const float* xr = x.data() + static_cast<size_t>(n) * C;
    double s = 0.0, A = 0.0;
    for (int c = 0; c < C; c++) s += xr[c], A += std::fabs(static_cast<double>(xr[c]));
    const double m = layernorm ? s / C : 0.0;
    A /= C;
    double v = 0.0;
    for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
    v /= C;
    const double rstd = 1.0 / std::sqrt(v + eps);
    const double dm = layernorm ? gC * A : 0.0;                          // one side's |Δmean|
    const double e_var = gvar + (layernorm ? dm * dm / std::max(v, 1e-300) : 0.0);
    const double e_r = e_var / 2 + 3 * kU;                                // one side's relative |Δrstd|
    r.mean[n] = 2 * dm;
    r.rstd[n] = 2 * e_r * rstd;
    for (int c = 0; c < C; c++) {
      const double d = std::fabs(xr[c] - m), aw = std::fabs(static_cast<double>(w[c]));
      r.out[static_cast<size_t>(n) * C + c] =
          2 * (dm * rstd * aw + d * rstd * aw * (e_r + 4 * kU) + (layernorm ? kU * std::fabs(static_cast<double>(b[c])) : 0.0));
    }
    if (!bwd) continue;
    const float* dy = dout.data() + static_cast<size_t>(n) * C;
    // the differences of the stats the two sides' backwards read (0: both read the same)
    const double sdm = stats_differ ? r.mean[n] : 0.0, sdr = stats_differ ? r.rstd[n] : 0.0;
    double G1 = 0.0, G2 = 0.0, G3 = 0.0;  // Σ|g|, Σ|g norm|, Σ|g| |δnorm|
    for (int c = 0; c < C; c++) {
      const double g = std::fabs(static_cast<double>(w[c]) * dy[c]), nrm = std::fabs(xr[c] - m) * rstd;
      G1 += g;
      G2 += g * nrm;
      G3 += g * (sdm * rstd + std::fabs(xr[c] - m) * sdr);
    }
    const double gdx = gamma_n(C + 10);
    for (int c = 0; c < C; c++) {
      const size_t i = static_cast<size_t>(n) * C + c;
      const double g = std::fabs(static_cast<double>(w[c]) * dy[c]), nrm = std::fabs(xr[c] - m) * rstd;
      const double dnrm = sdm * rstd + std::fabs(xr[c] - m) * sdr;
      const double M = rstd * (g + (layernorm ? G1 / C : 0.0) + nrm * G2 / C);
      const double d0 = dx0.empty() ? 0.0 : std::fabs(static_cast<double>(dx0[i]));
      r.dinp[i] = 2 * (gdx * M + kU * d0) + (M / rstd) * sdr + rstd * (dnrm * G2 / C + nrm * G3 / C);
      const double t = nrm * std::fabs(static_cast<double>(dy[c]));
      mag_w[c] += t;
      dev_w[c] += dnrm * std::fabs(static_cast<double>(dy[c]));
      mag_b[c] += std::fabs(static_cast<double>(dy[c]));
    }
  }
  if (bwd) {
    const double gN = gamma_n(N + 4);
    for (int c = 0; c < C; c++) {
      const double w0 = dw0.empty() ? 0.0 : std::fabs(static_cast<double>(dw0[c]));
      const double b0 = db0.empty() ? 0.0 : std::fabs(static_cast<double>(db0[c]));
      r.dweight[c] = 2 * gN * (mag_w[c] + w0) + 2 * kU * (mag_w[c] + w0) + dev_w[c];
      r.dbias[c] = 2 * gN * (mag_b[c] + b0) + 2 * kU * (mag_b[c] + b0);
    }
  }
  return r;
}

// ---- softmax + cross-entropy bounds (kernels/softmax_xent.cu, backend/cpu/softmax_xent.cpp) ----
// Per row (logits z, max M exact on both sides, S = Σ_j exp(z_j − M)), each side, first order:
//   S: a sum of V positive terms, gamma_n(V) relative; each term's exp kExpU and its argument's
//      rounding u |z_j − M| (weighted: u A, A = Σ_j |z_j − M| e^{z_j − M} / S). The card's online
//      sum (a running max per thread, rescaled when it grows) multiplies a term by up to n_t + 2
//      exps (n_t logits per thread, <= ceil(V / 512) + 4; their arguments telescope to z_j − M,
//      so A still covers them), 2 roundings per rescale and a 1024-thread tree:
//        ε_S = gamma_n(V + 3 n_t + 12) + (n_t + 2) kExpU + u A   (the CPU's three passes: less)
//      (and a term below e^-87, 0 on the CPU and a denormal on the card: < V 2^-125 of S >= 1)
//   loss = log S + (M − z_y):  ε_S + 2u |log S| (logf, 1 ulp) + u |M − z_y| + u |loss|
//   grad_j = gs (e^{z_j − M} / S − [j = y]):  gs p_j (ε_S + kExpU + u |z_j − M| + 2u) + u gs [j = y] (1 + p_j)
// The bounds returned are the sum of both sides (2x); eps_s is one side's ε_S, s the exact S.
struct XentBounds {
  std::vector<double> loss, grad, eps_s, s;
};
// Rows of V logits ld apart; targets y (a target outside [v0, v0 + V): a vocabulary shard's row
// whose target is elsewhere, z_y taken as 0); grad_scale gs (0: no gradient bounds).
inline XentBounds xent_bounds(const float* z, int ld, const int32_t* y, int N, int V, float gs, int v0 = 0) {
  XentBounds r;
  r.loss.assign(N, 0.0);
  r.eps_s.assign(N, 0.0);
  r.s.assign(N, 0.0);
  if (gs != 0.0f) r.grad.assign(static_cast<size_t>(N) * V, 0.0);
  const int n_t = (V + 511) / 512 + 4;
  for (int n = 0; n < N; n++) {
    const float* zr = z + static_cast<size_t>(n) * ld;
    double M = -INFINITY;
    for (int j = 0; j < V; j++) M = std::max(M, static_cast<double>(zr[j]));
    double S = 0.0, A = 0.0;
    for (int j = 0; j < V; j++) {
      if (zr[j] == -INFINITY) continue;
      const double e = std::exp(zr[j] - M);
      S += e;
      A += (M - zr[j]) * e;
    }
    A /= S;
    const double eps = gamma_n(V + 3.0 * n_t + 12) + (n_t + 2) * kExpU + kU * A + V * 0x1p-125;
    const int yl = y[n] - v0;
    const double zy = yl >= 0 && yl < V ? zr[yl] : 0.0;
    r.s[n] = S;
    r.eps_s[n] = eps;
    r.loss[n] = 2 * (eps + 3 * kU * std::fabs(std::log(S)) + 2 * kU * std::fabs(M - zy));
    if (gs == 0.0f) continue;
    for (int j = 0; j < V; j++) {
      const bool zero = zr[j] == -INFINITY;  // exp gives exact zeros on both sides
      const double pj = zero ? 0.0 : std::exp(zr[j] - M) / S, arg = zero ? 0.0 : std::fabs(zr[j] - M);
      const double b = gs * pj * (eps + kExpU + kU * arg + 2 * kU) +
                       (j == yl ? kU * gs * (1 + pj) : 0.0) + gs * 0x1p-125;
      r.grad[static_cast<size_t>(n) * V + j] = 2 * b;
    }
  }
  return r;
}

// ---- attention bounds (kernels/attention.cu and flash_attention.cu in fp32; the CPU's ops) -------
// Per query row i of head h (visible keys j, sc = 1/sqrt(hs), σ_i = max_j sc Σ_d |q_id||k_jd|, the
// largest score magnitude), each side, first order:
//   scores: gamma_n(hs + 1) sc Σ|q||k| <= gamma_n(hs + 1) σ_i; P = exp(s − max) / l is unchanged by
//   a common shift, so P's relative error is at most twice the scores' (2 gamma σ), plus the
//   arguments' rounding (u |s − max|, u |s − lse|: 2u σ + u log T each), exp (kExpU), the sum l
//   (gamma_n(T)), the division, the online softmax's rescales (a factor's exp error cancels in
//   acc / l; each rescale rounds acc and l: 2u per key tile of 16 or more), and in the backward,
//   which recomputes P from the forward's lse (its error: about the forward's again):
//     e_i = 4 gamma_n(hs + 4) (σ_i + 2) + gamma_n(T + T/8 + 8) + 2 kExpU
//   out_id = Σ_j P~_ij v_jd (P~ with dropout's keep / (1 − p)): (e_i + gamma_n(T + 2)) O_id,
//     O_id = Σ_j P~_ij |v_jd|;  att (P): e_i P_ij;  lse: e_i + u |lse|
//   backward, dP_ij = Σ_d dO_id v_jd (gamma_n(hs) Σ_d |dO||v|), D_i = Σ_d dO_id out_id
//     ((e_i + gamma_n(T + hs + 2)) Dabs_i, Dabs_i = Σ_d |dO_id| O_id), dS_ij = P_ij (keep dP_ij − D_i):
//     (e_i + gamma_n(T + hs + 4)) dSabs_ij, dSabs_ij = P_ij (keep Σ_d |dO_id||v_jd| + Dabs_i);
//     dQ_id = sc Σ_j dS_ij k_jd:            (e_i + gamma_n(2T + hs + 6)) sc Σ_j dSabs_ij |k_jd|
//     dK_jd = sc Σ_{h in g} Σ_i dS_ij q_id: Σ (e_i + gamma_n(T + hs + 4) + gamma_n(G T + 2)) sc dSabs_ij |q_id|
//     dV_jd = Σ_{h in g} Σ_i P~_ij dO_id:   Σ (e_i + gamma_n(G T + 2)) P~_ij |dO_id|
//     (the add into dqkv0 and the added part's subtraction: u (|dqkv0| + magnitude) each, the
//     magnitude's share inside e_i)
// Every bound returned is the sum of both sides (2x). No visible key: out 0 and lse -inf exactly,
// no gradient: bound 0. u_dot: the scores' sums' roundoff (kUTc for the tensor-core kernels, given
// qkv as both sides round it; their lse alone is fp32 statistics of those scores).
struct AttnBounds {
  std::vector<double> out, lse, att, dqkv;
};
inline AttnBounds attention_bounds(const std::vector<float>& qkv, const std::vector<int32_t>& mask, int B, int T, int NH,
                                   int NKV, int hs, bool causal, float p, uint64_t key,
                                   const std::vector<float>& dout = {}, const std::vector<float>& dqkv0 = {},
                                   bool with_att = false, double u_dot = kU) {
  const int W = (NH + 2 * NKV) * hs, C = NH * hs, G = NH / NKV;
  const double sc = 1.0 / std::sqrt(static_cast<double>(hs)), keep_scale = p > 0.0f ? 1.0 / (1.0 - p) : 1.0;
  const bool bwd = !dout.empty();
  AttnBounds r;
  r.out.assign(static_cast<size_t>(B) * T * C, 0.0);
  r.lse.assign(static_cast<size_t>(B) * NH * T, 0.0);
  if (with_att) r.att.assign(static_cast<size_t>(B) * NH * T * T, 0.0);
  if (bwd) r.dqkv.assign(static_cast<size_t>(B) * T * W, 0.0);
  const double g_out = gamma_n(T + 2), g_ds = gamma_n(T + hs + 4), g_q = gamma_n(2.0 * T + hs + 6),
               g_kv = gamma_n(static_cast<double>(G) * T + 2);
  std::vector<double> s(T), P(T), ks(T), O(hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const int g = h / G;
      for (int i = 0; i < T; i++) {
        const float* q = qkv.data() + (static_cast<size_t>(b) * T + i) * W + static_cast<size_t>(h) * hs;
        auto kj = [&](int j) { return qkv.data() + (static_cast<size_t>(b) * T + j) * W + static_cast<size_t>(NH + g) * hs; };
        auto vj = [&](int j) { return qkv.data() + (static_cast<size_t>(b) * T + j) * W + static_cast<size_t>(NH + NKV + g) * hs; };
        auto visible = [&](int j) { return (!causal || j <= i) && (mask.empty() || mask[static_cast<size_t>(b) * T + j] != 0); };
        double mx = -INFINITY, sigma = 0.0;
        for (int j = 0; j < T; j++) {
          if (!visible(j)) continue;
          const float* k = kj(j);
          double dot = 0.0, mag = 0.0;
          for (int d = 0; d < hs; d++) dot += static_cast<double>(q[d]) * k[d], mag += std::fabs(static_cast<double>(q[d]) * k[d]);
          s[j] = sc * dot;
          mx = std::max(mx, s[j]);
          sigma = std::max(sigma, sc * mag);
        }
        if (mx == -INFINITY) continue;  // no visible key: exact zeros and -inf on both sides
        double l = 0.0;
        for (int j = 0; j < T; j++) l += visible(j) ? std::exp(s[j] - mx) : 0.0;
        const double lse = mx + std::log(l);
        const double e = 4 * gamma_n(hs + 4, u_dot) * (sigma + 2) + gamma_n(T + T / 8.0 + 8) + 2 * kExpU;
        std::fill(O.begin(), O.end(), 0.0);
        const size_t row = (static_cast<size_t>(b) * NH + h) * T + i;
        for (int j = 0; j < T; j++) {
          P[j] = visible(j) ? std::exp(s[j] - mx) / l : 0.0;
          ks[j] = p > 0.0f ? (dropout_keep(key, row * T + j, p) ? keep_scale : 0.0) : 1.0;
          if (with_att) r.att[row * T + j] = 2 * e * P[j];
          if (P[j] == 0.0 || ks[j] == 0.0) continue;
          const float* v = vj(j);
          for (int d = 0; d < hs; d++) O[d] += P[j] * ks[j] * std::fabs(static_cast<double>(v[d]));
        }
        r.lse[row] = 2 * (e + kU * std::fabs(lse));
        double* ob = r.out.data() + (static_cast<size_t>(b) * T + i) * C + static_cast<size_t>(h) * hs;
        for (int d = 0; d < hs; d++) ob[d] = 2 * (e + g_out) * O[d];
        if (!bwd) continue;
        const float* dO = dout.data() + (static_cast<size_t>(b) * T + i) * C + static_cast<size_t>(h) * hs;
        double Dabs = 0.0;
        for (int d = 0; d < hs; d++) Dabs += std::fabs(static_cast<double>(dO[d])) * O[d];
        double* bq = r.dqkv.data() + (static_cast<size_t>(b) * T + i) * W + static_cast<size_t>(h) * hs;
        for (int j = 0; j < T; j++) {
          if (P[j] == 0.0) continue;
          const float* k = kj(j);
          const float* v = vj(j);
          double dpabs = 0.0;
          for (int d = 0; d < hs; d++) dpabs += std::fabs(static_cast<double>(dO[d]) * v[d]);
          const double dsabs = P[j] * (ks[j] * dpabs + Dabs);
          double* bk = r.dqkv.data() + (static_cast<size_t>(b) * T + j) * W + static_cast<size_t>(NH + g) * hs;
          double* bv = bk + static_cast<size_t>(NKV) * hs;
          for (int d = 0; d < hs; d++) {
            bq[d] += 2 * (e + g_q) * sc * dsabs * std::fabs(static_cast<double>(k[d]));
            bk[d] += 2 * (e + g_ds + g_kv) * sc * dsabs * std::fabs(static_cast<double>(q[d]));
            bv[d] += 2 * (e + g_kv) * P[j] * ks[j] * std::fabs(static_cast<double>(dO[d]));
          }
        }
      }
    }
  if (bwd && !dqkv0.empty())
    for (size_t k = 0; k < r.dqkv.size(); k++) r.dqkv[k] += 4 * kU * std::fabs(static_cast<double>(dqkv0[k]));
  return r;
}

// The k and v columns of a [rows, (NH + 2 NKV) hs] qkv-shaped buffer of bounds.
inline std::vector<double> kv_columns_d(const std::vector<double>& qkv, int NH, int NKV, int hs) {
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * hs, rows = qkv.size() / W;
  std::vector<double> kv;
  for (size_t r = 0; r < rows; r++)
    kv.insert(kv.end(), qkv.begin() + r * W + static_cast<size_t>(NH) * hs, qkv.begin() + (r + 1) * W);
  return kv;
}

// ---- optimizer bounds (kernels/adamw.cu, backend/cpu/adamw.cpp) ----------------------------------
// One element over steps t = 1.. (m = v = 0 at first; g[t - 1] the gradient each side reads, the
// same float on both), each side, first order, the errors carried from step to step:
//   m = b1 m + (1 − b1) g:   e_m' = b1 e_m + u (b1 |m| + (1 − b1)|g| + |m'|)
//   v = b2 v + (1 − b2) g g: e_v' = b2 e_v + 4u v'      (positive terms)
//   r = (m c1) / (sqrt(v c2) + eps): |Δr| <= (e_m' + u |m'|) c1 / den + |r| ((e_v' / v' + u) / 2 + 3u)
//   p = p − lr (r + wd p):   e_p' = e_p (1 + lr wd) + lr |Δr| + u (3 lr wd |p| + 2 lr |r| + |p'|)
// (c1, c2 are the same floats on both sides.) The bounds returned are the sum of both sides.
struct OptBound {
  double p = 0, m = 0, v = 0;
};
inline OptBound adamw_bound(double p, const double* g, int steps, double lr, double b1, double b2, double eps,
                            double wd) {
  double m = 0, v = 0, ep = 0, em = 0, ev = 0;
  for (int t = 1; t <= steps; t++) {
    const double c1 = 1.0 / (1.0 - std::pow(b1, t)), c2 = 1.0 / (1.0 - std::pow(b2, t));
    const double gt = g[t - 1];
    const double m1 = b1 * m + (1 - b1) * gt, v1 = b2 * v + (1 - b2) * gt * gt;
    em = b1 * em + kU * (b1 * std::fabs(m) + (1 - b1) * std::fabs(gt) + std::fabs(m1));
    ev = b2 * ev + 4 * kU * v1;
    const double den = std::sqrt(v1 * c2) + eps, rr = m1 * c1 / den;
    const double dr = (em + kU * std::fabs(m1)) * c1 / den + std::fabs(rr) * ((ev / std::max(v1, 1e-300) + kU) / 2 + 3 * kU);
    const double p1 = p - lr * (rr + wd * p);
    ep = ep * (1 + lr * wd) + lr * dr + kU * (3 * lr * wd * std::fabs(p) + 2 * lr * std::fabs(rr) + std::fabs(p1));
    m = m1, v = v1, p = p1;
  }
  OptBound b;
  b.p = 2 * ep, b.m = 2 * em, b.v = 2 * ev;
  return b;
}
// SGD, p = p − lr (g + wd p): e_p' = e_p (1 + lr wd) + u (wd |p| + |g + wd p| + lr |g + wd p| + |p'|).
inline double sgd_bound(double p, const double* g, int steps, double lr, double wd) {
  double ep = 0;
  for (int t = 0; t < steps; t++) {
    const double a = g[t] + wd * p, p1 = p - lr * a;
    ep = ep * (1 + lr * wd) + kU * (wd * std::fabs(p) + std::fabs(a) * (1 + lr) + std::fabs(p1));
    p = p1;
  }
  return 2 * ep;
}

}  // namespace llmpi::test
