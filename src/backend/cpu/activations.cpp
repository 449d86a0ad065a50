// Pointwise activations and dropout: GELU (tanh approximation, GPT-2; exact erf form, BERT),
// SwiGLU (LLaMA's MLP), tanh (BERT's pooler), dropout with a hashed mask.
//
// Loops are flat over the elements (or rows for SwiGLU), vectorisable (fast_expf and select_float
// instead of libm exp and branches, where it matters) and split over OpenMP threads above kParMin
// elements; no op reduces across elements, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "runtime/error.h"

namespace llmpi::cpu {

namespace {
constexpr float kK = 0.7978845608028654f;      // sqrt(2/pi)
constexpr float kA = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;    // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1/sqrt(2 pi)
constexpr long long kParMin = 1 << 15;

void check_dropout_p(const char* op, float p) {
  if (!(p >= 0.0f && p < 1.0f)) fail(op, ": dropout probability ", p, " is outside [0, 1)");
}
}  // namespace

// ---- GELU, tanh approximation -------------------------------------------------------------------
// gelu(x) = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x³), k = sqrt(2/pi). Since
// 0.5 (1 + tanh(u)) = sigmoid(2u), both directions are written with one exp and one division,
// which vectorise (fast_expf), and do not cancel for large negative x the way 1 + tanh(u) would.
// With e = exp(-|2u|) <= 1 (never overflows):
//   sigmoid(2u) = (u >= 0 ? 1 : e) / (1 + e),   sigmoid(2u) (1 - sigmoid(2u)) = e / (1 + e)²

// gelu(x) = x * s,  s = sigmoid(2u)
static inline float gelu_tanh_value(float x) {
  const float a = 2.0f * kK * (x + kA * x * x * x);
  const float e = fast_expf(-std::fabs(a));
  const float s = select_float(a >= 0.0f, 1.0f, e) / (1.0f + e);
  return x * s;
}

void gelu_forward(float* out, const float* inp, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) out[i] = gelu_tanh_value(inp[i]);
}

// d gelu/dx = 0.5(1+tanh u) + 0.5 x sech²(u) u' = s + 2 x s (1 - s) k (1 + 3·0.044715 x²)
static inline float gelu_tanh_grad(float x) {
  const float x2 = x * x;
  const float a = 2.0f * kK * (x + kA * x2 * x);
  const float e = fast_expf(-std::fabs(a));
  const float r = 1.0f / (1.0f + e);
  const float s = select_float(a >= 0.0f, 1.0f, e) * r;
  const float ss = e * r * r;  // s (1 - s)
  return s + 2.0f * x * ss * kK * (1.0f + 3.0f * kA * x2);
}

// dinp += gelu'(inp) * dout
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) dinp[i] += gelu_tanh_grad(inp[i]) * dout[i];
}

// out[i] = f(inp[i]) for i < n, also (or only: out null) rounded to bf16 into out_bf16: in blocks
// of kBf16Block values, computed into out's block (or this thread's scratch) by the same loop, so
// with the same bits either way, and rounded from there. (The elementwise activations' bf16 path.)
constexpr long long kBf16Block = 4096;
template <class F>
static void map_with_bf16(float* out, uint16_t* out_bf16, const float* inp, size_t n, F f) {
  const long long nn = static_cast<long long>(n), blocks = (nn + kBf16Block - 1) / kBf16Block;
#pragma omp parallel for schedule(static) if (nn > kParMin)
  for (long long b = 0; b < blocks; b++) {
    const long long i0 = b * kBf16Block, m = std::min(kBf16Block, nn - i0);
    float* o = out ? out + i0 : thread_scratch(kBf16Block);
    const float* x = inp + i0;
#pragma omp simd
    for (long long i = 0; i < m; i++) o[i] = f(x[i]);
    store_bf16_bits(out_bf16 + i0, o, static_cast<size_t>(m));
  }
}

// ---- dense layer + GELU (tanh), fused on CUDA; here exactly the unfused sequence ---------------
// pre = inp·W^T + bias; act = gelu(pre) (with act_bf16: map_with_bf16 of gelu_forward's
// expression, the same bits as gelu_forward, then rounding)
void matmul_gelu_forward(float* pre, float* act, const float* inp, const float* weight, const float* bias, int N,
                         int C, int OC, GemmMode gemm, uint16_t* act_bf16) {
  if (gemm.out_stride(OC) != OC) fail("internal: matmul_gelu_forward writes contiguous rows (out_ld ", gemm.out_ld, ")");
  matmul_forward(pre, inp, weight, bias, N, C, OC, gemm);
  if (N <= 0 || OC <= 0) return;
  const size_t n = static_cast<size_t>(N) * OC;
  if (act_bf16 == nullptr) return gelu_forward(act, pre, n);
  map_with_bf16(act, act_bf16, pre, n, [](float x) { return gelu_tanh_value(x); });
}

// dpre = gelu'(pre) ⊙ (dout·W), overwriting dpre. The unfused model zeroed a scratch d, added
// dout·W into it (matmul_backward), zeroed dpre and added gelu'(pre)·d (gelu_backward). Here d is
// dpre itself: the same GEMM into zeros (the result does not depend on where it is written), then
// dpre[i] = 0 + g·dpre[i] with g written exactly as gelu_backward writes it, so the bits are those
// of the unfused sequence (tests/test_cuda_epilogues.cpp checks it on the CPU, bit for bit).
void matmul_dgelu_backward(float* dpre, const float* dout, const float* weight, const float* pre, int N, int C,
                           int OC, GemmMode gemm) {
  if (N <= 0 || C <= 0) return;
  const size_t n = static_cast<size_t>(N) * C;  // (matmul_backward refuses tf32, as everywhere)
  std::memset(dpre, 0, n * sizeof(float));
  matmul_backward(dpre, nullptr, nullptr, dout, nullptr, weight, N, C, OC, gemm);
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) {
    float acc = 0.0f;  // gelu_backward's dinp, zeroed
    acc += gelu_tanh_grad(pre[i]) * dpre[i];
    dpre[i] = acc;
  }
}

// ---- GELU, exact (erf) --------------------------------------------------------------------------
// gelu(x) = x Phi(x),  Phi(x) = (1 + erf(x/sqrt 2)) / 2 = erfc(-x/sqrt 2) / 2
// (erfc keeps the left tail accurate, where 1 + erf(...) would cancel).
//
// libm's erfc does not vectorise (about 10 ns an element here), so erfc is evaluated with the
// classic Chebyshev-fitted form (Numerical Recipes' erfcc; fractional error < 1.2e-7 for every
// z >= 0 in exact arithmetic, about 3e-7 with float and fast_expf):
//   erfc(z) = t exp(-z² + P(t)),  t = 1 / (1 + z/2),  P a degree-9 polynomial
// and Phi(x) = erfc(z)/2 for x < 0, 1 - erfc(z)/2 for x >= 0, with z = |x|/sqrt 2.
static inline float normal_cdf(float x) {
  const float z = std::fabs(x) * kInvSqrt2;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = __builtin_fmaf(p, t, -0.82215223f);
  p = __builtin_fmaf(p, t, 1.48851587f);
  p = __builtin_fmaf(p, t, -1.13520398f);
  p = __builtin_fmaf(p, t, 0.27886807f);
  p = __builtin_fmaf(p, t, -0.18628806f);
  p = __builtin_fmaf(p, t, 0.09678418f);
  p = __builtin_fmaf(p, t, 0.37409196f);
  p = __builtin_fmaf(p, t, 1.00002368f);
  p = __builtin_fmaf(p, t, -1.26551223f);
  // exp(-z² + P) as exp(-zz) exp(P - e), zz + e = z² exactly (e from an fma): the large part of the
  // exponent is never rounded again, which keeps the far left tail's relative error small.
  const float zz = z * z, e = __builtin_fmaf(z, z, -zz);
  const float half_erfc = 0.5f * t * fast_expf(-zz) * fast_expf(p - e);  // both arguments <= 0.01
  // Phi = x < 0 ? half_erfc : 1 - half_erfc, blended on the bits by the sign of x (a float select
  // here makes GCC branch, and the loop would not vectorise).
  const float upper = 1.0f - half_erfc;
  uint32_t hb, ub, xb;
  std::memcpy(&hb, &half_erfc, sizeof hb);
  std::memcpy(&ub, &upper, sizeof ub);
  std::memcpy(&xb, &x, sizeof xb);
  const uint32_t negative = 0u - (xb >> 31);  // all ones when the sign bit is set
  const uint32_t rb = (hb & negative) | (ub & ~negative);
  float r;
  std::memcpy(&r, &rb, sizeof r);
  return r;
}

// out = x Phi(x) (with out_bf16: map_with_bf16)
void gelu_erf_forward(float* out, const float* inp, size_t n, uint16_t* out_bf16) {
  const long long nn = static_cast<long long>(n);
  if (out_bf16 == nullptr) {
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
    for (long long i = 0; i < nn; i++) {
      const float x = inp[i];
      out[i] = x * normal_cdf(x);
    }
    return;
  }
  map_with_bf16(out, out_bf16, inp, n, [](float x) { return x * normal_cdf(x); });
}

// d gelu/dx = Phi(x) + x phi(x),  phi(x) = exp(-x²/2) / sqrt(2 pi);  dinp += that * dout
void gelu_erf_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) {
    const float x = inp[i];
    const float cdf = normal_cdf(x);
    const float pdf = kInvSqrt2Pi * fast_expf(-0.5f * x * x);
    dinp[i] += (cdf + x * pdf) * dout[i];
  }
}

// ---- SwiGLU -------------------------------------------------------------------------------------
// Row n of inp is [gate | up], F each: out[n, f] = silu(g) u, silu(g) = g sigmoid(g), with
// g = inp[n, f], u = inp[n, F + f]. With e = exp(-|g|) <= 1:
//   sigmoid(g) = (g >= 0 ? 1 : e) / (1 + e),   1 - sigmoid(g) = (g >= 0 ? e : 1) / (1 + e)

// out = g sigmoid(g) u (with out_bf16 also, or only, rounded: row by row, as gelu_erf_forward)
void swiglu_forward(float* out, const float* inp, int N, int F, uint16_t* out_bf16) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * F > kParMin)
  for (int n = 0; n < N; n++) {
    const float* gate = inp + static_cast<size_t>(n) * 2 * F;
    const float* up = gate + F;
    float* o = out ? out + static_cast<size_t>(n) * F : thread_scratch(static_cast<size_t>(F));
#pragma omp simd
    for (int f = 0; f < F; f++) {
      const float g = gate[f];
      const float e = fast_expf(-std::fabs(g));
      const float sig = select_float(g >= 0.0f, 1.0f, e) / (1.0f + e);
      o[f] = g * sig * up[f];
    }
    if (out_bf16) store_bf16_bits(out_bf16 + static_cast<size_t>(n) * F, o, static_cast<size_t>(F));
  }
}

// d out / d g = u sigmoid(g) (1 + g (1 - sigmoid(g)));   d out / d u = silu(g)
//   dgate += dout u sigmoid(g) (1 + g (1 - sigmoid(g)));   dup += dout g sigmoid(g)
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * F > kParMin)
  for (int n = 0; n < N; n++) {
    const float* gate = inp + static_cast<size_t>(n) * 2 * F;
    const float* up = gate + F;
    const float* d = dout + static_cast<size_t>(n) * F;
    float* dgate = dinp + static_cast<size_t>(n) * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int f = 0; f < F; f++) {
      const float g = gate[f];
      const float e = fast_expf(-std::fabs(g));
      const float r = 1.0f / (1.0f + e);
      const float sig = select_float(g >= 0.0f, 1.0f, e) * r;
      const float one_minus_sig = select_float(g >= 0.0f, e, 1.0f) * r;
      dgate[f] += d[f] * up[f] * sig * (1.0f + g * one_minus_sig);
      dup[f] += d[f] * g * sig;
    }
  }
}

// ---- tanh ---------------------------------------------------------------------------------------
// out = tanh(x) (libm's tanhf: accurate for small |x| too; the pooler is only B x C elements)
void tanh_forward(float* out, const float* inp, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) out[i] = std::tanh(inp[i]);
}

// d tanh(x)/dx = 1 - tanh(x)² = 1 - out²;  dinp += dout (1 - out²)
void tanh_backward(float* dinp, const float* out, const float* dout, size_t n) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
  for (long long i = 0; i < nn; i++) dinp[i] += dout[i] * (1.0f - out[i] * out[i]);
}

// ---- dropout ------------------------------------------------------------------------------------
// keep_i = dropout_keep(key, i, p) (backend/dropout_hash.h; evaluated as dropout_keep_bits, the
// same decision), scale = 1/(1-p) rounded to float:
//   out_i = keep_i ? inp_i * scale : 0       (p == 0: out = inp, a copy)
// Elementwise, so out may be inp (in place).
void dropout_forward(float* out, const float* inp, size_t n, float p, uint64_t key) {
  check_dropout_p("dropout_forward", p);
  if (p == 0.0f) {
    if (n && out != inp) std::memmove(out, inp, n * sizeof(float));
    return;
  }
  const float scale = 1.0f / (1.0f - p);
  const uint64_t thr = dropout_threshold(p);
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for simd schedule(static) if (nn > kParMin / 4)
  for (long long i = 0; i < nn; i++)
    out[i] = keep_or_zero(dropout_keep_bits(key, static_cast<uint64_t>(i), thr), inp[i] * scale);
}

// dinp_i += keep_i ? dout_i * scale : 0    (p == 0: dinp += dout)
void dropout_backward(float* dinp, const float* dout, size_t n, float p, uint64_t key) {
  check_dropout_p("dropout_backward", p);
  const long long nn = static_cast<long long>(n);
  if (p == 0.0f) {
#pragma omp parallel for simd schedule(static) if (nn > kParMin)
    for (long long i = 0; i < nn; i++) dinp[i] += dout[i];
    return;
  }
  const float scale = 1.0f / (1.0f - p);
  const uint64_t thr = dropout_threshold(p);
#pragma omp parallel for simd schedule(static) if (nn > kParMin / 4)
  for (long long i = 0; i < nn; i++)
    dinp[i] += keep_or_zero(dropout_keep_bits(key, static_cast<uint64_t>(i), thr), dout[i] * scale);
}

}  // namespace llmpi::cpu
