// Private to the CPU backend: the functions behind cpu_ops() (see backend/ops.h for the contract
// of each), plus the small vectorisable math helpers the loops share.
//
// Threading: every op splits its work with OpenMP over rows, (batch, head) pairs or fixed-size
// chunks; reductions across rows (dweight, dbias, sum_squares) are done per fixed chunk and then
// combined in chunk order, so results are bitwise identical run to run (and, for those, whatever
// the thread count). GEMMs go to OpenBLAS sgemm.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/bf16.h"
#include "backend/dropout_hash.h"
#include "backend/op_list.h"

extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
int openblas_get_parallel(void);  // 0 sequential, 1 pthreads, 2 OpenMP build
}

namespace llmpi::cpu {

// Every op of backend/op_list.h, implemented in the file of its family: memory.cpp,
// embedding.cpp, layernorm.cpp (LayerNorm, RMSNorm), matmul.cpp, rope.cpp, attention.cpp,
// activations.cpp (GELU tanh/erf, SwiGLU, tanh, dropout), residual.cpp (residual, first token),
// softmax_xent.cpp, adamw.cpp (optimizer updates and gradient utilities).
LLMPI_OPS(LLMPI_DECLARE_OP)

// memory.cpp: counts one result handed to the host (readback_count): copy_to_host, sum_squares,
// softmax_xent's target check.
void count_readback();
// matmul.cpp: counts n weight values rounded to bf16 (bf16_weight_rounding_count).
void count_bf16_weight_rounding(size_t n);

// memory.cpp: this thread's scratch of at least `floats` floats (grown on demand, never shrunk).
// Its content is valid until the next call on this thread: an op uses it without calling another
// op meanwhile (the bf16 GEMM operands; a row or block of an output kept only in bf16).
float* thread_scratch(size_t floats);

// dst[i] = bf16 bits of src[i] (round to nearest even, backend/bf16.h), i < n, on this thread.
inline void store_bf16_bits(uint16_t* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = float_to_bf16_bits(src[i]);
}

// attention.cpp: rows of the T x T score matrix are processed in blocks of this many query rows;
// with a causal mask a block [i0, i0+kAttnBlock) only needs keys [0, i0+kAttnBlock), so the GEMMs
// skip most of the upper (masked) triangle.
constexpr int kAttnBlock = 64;

// Holds OpenBLAS to one thread for the lifetime of the object when `active` (OpenMP threads then
// run concurrent single-threaded GEMMs: attention.cpp per (b, head), matmul.cpp per tile). Not
// needed (and not done) with an OpenMP-built OpenBLAS: it runs single-threaded inside a parallel
// region by itself, and its openblas_set_num_threads(1) would also set OpenMP's thread count to 1,
// so the parallel region this guards would run on one thread.
struct SerialBlas {
  int saved = 0;
  explicit SerialBlas(bool active) {
    if (active && openblas_get_parallel() != 2) {
      saved = openblas_get_num_threads();
      if (saved > 1) openblas_set_num_threads(1);
      else saved = 0;
    }
  }
  ~SerialBlas() {
    if (saved > 1) openblas_set_num_threads(saved);
  }
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;
};

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

// Dropout's keep decision, dropout_keep(key, i, p) of backend/dropout_hash.h, bit for bit, in a
// form whose loops vectorise: dropout_keep compares u = (h >> 40) * 2^-24 with p, and that product
// is exact in float, so u >= p exactly when the integer (h >> 40) >= ceil(p * 2^24)
// (dropout_threshold(p), computed once per call). dropout_keep_bits is all ones for a kept element
// and 0 for a dropped one; keep_or_zero(bits, x) is then x or +0. (The uint64 -> float conversion
// and the float select this avoids put branches in the loop, which stop vectorisation.)
// test_cpu_ops checks the decision against dropout_keep.
inline uint64_t dropout_threshold(float p) {
  const double t = std::ceil(static_cast<double>(p) * 16777216.0);
  return t <= 0.0 ? 0 : static_cast<uint64_t>(t);
}
inline uint32_t dropout_keep_bits(uint64_t key, uint64_t i, uint64_t threshold) {
  const uint64_t h = mix64(key ^ mix64(i * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull));
  return 0u - static_cast<uint32_t>((h >> 40) >= threshold);
}
inline float keep_or_zero(uint32_t bits, float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u &= bits;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

// Static partition of [0, n) into `parts` contiguous pieces; piece i is [begin, end).
inline void split_range(size_t n, int parts, int i, size_t* begin, size_t* end) {
  const size_t q = n / parts, r = n % parts;
  const size_t ui = static_cast<size_t>(i);
  *begin = ui * q + (ui < r ? ui : r);
  *end = *begin + q + (ui < r ? 1 : 0);
}

}  // namespace llmpi::cpu
