// Private to the CPU backend: the functions behind cpu_ops() (see backend/ops.h for the contract
// of each), plus the small vectorisable math helpers the loops share.
//
// Threading: every op splits its work with OpenMP over rows, (batch, head) pairs or fixed-size
// chunks; reductions across rows (dweight, dbias, sum_squares) are done per fixed chunk and then
// combined in chunk order, so results are bitwise identical run to run (and, for those, whatever
// the thread count). GEMMs go to OpenBLAS sgemm.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace llmpi::cpu {

// memory.cpp
void* alloc(size_t bytes);
void free(void* p);
void zero(void* p, size_t bytes);
void copy(void* dst, const void* src, size_t bytes);

// embedding.cpp
void embedding_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                       int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                        int T, int C);

// layernorm.cpp
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// matmul.cpp
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// attention.cpp
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);
// Rows of the T x T score matrix are processed in blocks of this many query rows; a block
// [i0, i0+kAttnBlock) only needs keys [0, i0+kAttnBlock), so the GEMMs skip most of the
// upper (masked) triangle.
constexpr int kAttnBlock = 64;

// gelu.cpp
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// residual.cpp
void residual_forward(float* out, const float* a, const float* b, size_t n);

// softmax_xent.cpp
void softmax_xent(float* logits, float* losses, const int32_t* targets, int N, int V,
                  float grad_scale);

// adamw.cpp (optimizer updates and gradient utilities)
void sgd_update(float* params, const float* grads, size_t n, float lr, float weight_decay);
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);
double sum_squares(const float* x, size_t n);
void scale(float* x, float s, size_t n);

// ---- vectorisable math ------------------------------------------------------------------------

// c ? a : b on the bit patterns. A plain float `c ? a : b` lets GCC push later arithmetic into
// the two arms, where -ftrapping-math then forbids if-conversion and the loop stops vectorising.
#pragma omp declare simd notinbranch
inline float select_float(bool c, float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof ua);
  std::memcpy(&ub, &b, sizeof ub);
  const uint32_t u = c ? ua : ub;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

// exp(x) in float for x <= 88 (every caller passes x <= 0: softmax arguments z - max z, and
// -|2u| in GELU): within ~2 ulp of expf for x >= -87, exactly 0 below -87 (where expf would be
// under 1.7e-38: never a denormal, whose arithmetic is slow), NaN for NaN; inputs above 88 are
// outside the contract (they would overflow the exponent field). Branch-free so that loops calling
// it vectorise (libm's expf does not vectorise without -ffast-math).
//   x = n ln2 + r, |r| <= ln2/2   (n = round(x / ln2), ln2 split in two parts for exactness)
//   exp(r) ~ 1 + r + r^2 P(r)     (Cephes expf minimax polynomial, degree 5)
//   exp(x) = 2^n exp(r)           (2^n built directly in the exponent bits)
// Below -87, x is replaced by -88, for which n = -127: the exponent field of 2^n is then 0, so the
// scale and the result are +0. (For x >= -87, n >= -126 and r > 0.33 when n = -126: normal.)
#pragma omp declare simd notinbranch
inline float fast_expf(float x) {
  // An integer select: with a float `x < -87 ? -88 : x` GCC sees a constant result on one arm,
  // turns the whole function into a branch and, under -ftrapping-math, no longer vectorises it.
  const float xc = select_float(x < -87.0f, -88.0f, x);  // NaN flows through (compare false)
  // Round x/ln2 to the nearest integer with the 1.5*2^23 trick: the integer lands in the low
  // mantissa bits of t.
  const float t = __builtin_fmaf(xc, 1.44269504088896341f, 12582912.0f);
  const float n = t - 12582912.0f;
  // (Unsigned arithmetic: wraps instead of overflowing when x is NaN.)
  uint32_t tb;
  std::memcpy(&tb, &t, sizeof tb);
  const uint32_t ni = tb - 0x4B400000u;
  float r = __builtin_fmaf(n, -0.693359375f, xc);
  r = __builtin_fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  p = __builtin_fmaf(p, r * r, r) + 1.0f;
  const uint32_t eb = (ni + 127u) << 23;
  float s;
  std::memcpy(&s, &eb, sizeof s);
  return p * s;
}

// Static partition of [0, n) into `parts` contiguous pieces; piece i is [begin, end).
inline void split_range(size_t n, int parts, int i, size_t* begin, size_t* end) {
  const size_t q = n / parts, r = n % parts;
  const size_t ui = static_cast<size_t>(i);
  *begin = ui * q + (ui < r ? ui : r);
  *end = *begin + q + (ui < r ? 1 : 0);
}

}  // namespace llmpi::cpu
