// Dense layer on OpenBLAS sgemm or oneDNN's matmul. Row-major throughout; transposes are expressed
// with the GEMMs' transpose flags, never with copies.
//
// Precision (backend/gemm_precision.h): fp32 runs on the engine selected process-wide
// (backend/cpu/onednn_gemm.h, runtime.cpu_fp32_gemm): OpenBLAS sgemm, or oneDNN's fp32 matmul on
// the operands as they are (the bias added as it writes out). bf16 runs on the engine selected
// process-wide (runtime.cpu_bf16_gemm):
//   - emulate: the GEMM operands are rounded to bf16 (round to nearest even, backend/bf16.h) into a
//     per-thread fp32 scratch buffer and the same sgemm runs on the rounded copies; a product of
//     two bf16 values is exact in fp32, so this is a bf16 GEMM with fp32 accumulation, as the
//     tensor cores compute it up to summation order. With gemm.weight_bf16 (a bf16 Model's weight
//     copy) the weight's scratch copy is widened from those bits instead of rounded from weight:
//     exact, so the same operands whenever the copy is current (and a stale copy gives the same
//     wrong answer as on a GPU); the same for inp_bf16 and dout_bf16.
//   - onednn: oneDNN multiplies the bf16 operands themselves: gemm.weight_bf16 / inp_bf16 /
//     dout_bf16 are read in place, and an operand given only in fp32 is converted to bf16 bits
//     (the same rounding) into a per-thread scratch buffer first.
// Either way bias and dbias stay fp32 (dbias sums the unrounded dout). tf32 is refused.
#include <cblas.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "backend/bf16.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/onednn_gemm.h"
#include "runtime/error.h"


namespace llmpi::cpu {

namespace {

// Tile edges fall on multiples of this many rows / columns.
constexpr int kGemmTileQuantum = 16;
// Below this many FLOPs (~50 us on one core) a GEMM is one call: OpenBLAS runs it on one thread.
constexpr double kGemmMinParallelFlops = 4e6;

// The threads one dense-layer GEMM of these sizes runs on: OpenBLAS's thread count (the trainer
// sets it to runtime.threads), or 1 inside a parallel region and for a small GEMM. Whatever
// OpenMP's count is, so results do not change with it.
int gemm_threads(int M, int N, int K) {
  const bool small = 2.0 * M * N * K < kGemmMinParallelFlops;
  return omp_in_parallel() || small ? 1 : openblas_get_num_threads();
}

// C[M,N] = op(A) op(B) + beta C (row-major, alpha = 1), as cblas_sgemm, with the GEMM's threads
// taken from OpenMP's pool rather than OpenBLAS's own.
//
// Why: Debian's default OpenBLAS is the pthreads build, whose worker threads are a second pool
// beside OpenMP's, and each pool spin-waits while the other works. With runtime.threads 2 on 2
// cores a 2-thread sgemm ran no faster than a 1-thread one, and a training step at 1 rank x 2
// threads took 1.5-1.6x as long as at 2 ranks x 1 thread (a 2-core AMD EPYC VM). So when OpenBLAS
// is allowed T > 1 threads (the trainer sets runtime.threads), the output is cut into a grid of
// about T tiles, as square as the shape allows, edges on multiples of kGemmTileQuantum, and T
// OpenMP threads compute one tile each with an OpenBLAS call held to one thread. The
// GEMM's parallelism is OpenBLAS's thread count, whatever OpenMP's: tile boundaries depend only on
// (M, N, T), so results do not change with OpenMP's thread count, nor run to run.
// When OpenBLAS is held to one thread (tests comparing OpenMP thread counts do that), inside a
// parallel region, or for a small GEMM, it is a single cblas_sgemm call.
void sgemm_on_omp_threads(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A,
                          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const int threads = gemm_threads(M, N, K);
  const int m_units = (M + kGemmTileQuantum - 1) / kGemmTileQuantum;
  const int n_units = (N + kGemmTileQuantum - 1) / kGemmTileQuantum;
  // rows x cols tiles: the most tiles up to the thread count that the shape can hold, as a factor
  // pair whose tiles are closest to square.
  int rows = 1, cols = 1;
  for (int tiles = threads; tiles > 1 && rows * cols == 1; tiles--) {
    double best = INFINITY;
    for (int r = 1; r <= tiles; r++) {
      if (tiles % r != 0 || r > m_units || tiles / r > n_units) continue;
      const double skew = std::fabs(std::log((static_cast<double>(M) / r) / (static_cast<double>(N) / (tiles / r))));
      if (skew < best) best = skew, rows = r, cols = tiles / r;
    }
  }
  auto tile = [&](int m0, int m1, int n0, int n1) {
    const float* a = ta == CblasNoTrans ? A + static_cast<size_t>(m0) * lda : A + m0;
    const float* b = tb == CblasNoTrans ? B + n0 : B + static_cast<size_t>(n0) * ldb;
    cblas_sgemm(CblasRowMajor, ta, tb, m1 - m0, n1 - n0, K, 1.0f, a, lda, b, ldb, beta,
                C + static_cast<size_t>(m0) * ldc + n0, ldc);
  };
  if (rows * cols == 1) {
    tile(0, M, 0, N);
    return;
  }
  SerialBlas serial(true);
#pragma omp parallel num_threads(rows * cols)
  for (int t = omp_get_thread_num(); t < rows * cols; t += omp_get_num_threads()) {
    size_t u0, u1, v0, v1;
    split_range(static_cast<size_t>(m_units), rows, t / cols, &u0, &u1);
    split_range(static_cast<size_t>(n_units), cols, t % cols, &v0, &v1);
    const int m0 = static_cast<int>(u0) * kGemmTileQuantum, m1 = std::min(M, static_cast<int>(u1) * kGemmTileQuantum);
    const int n0 = static_cast<int>(v0) * kGemmTileQuantum, n1 = std::min(N, static_cast<int>(v1) * kGemmTileQuantum);
    if (m1 > m0 && n1 > n0) tile(m0, m1, n0, n1);
  }
}

// dst[i] = round_to_bf16(src[i]), i < n
void round_into_bf16(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 18) && !omp_in_parallel())
  for (size_t i = 0; i < n; i++) dst[i] = round_to_bf16(src[i]);
}

// dst[i] = the float of the bf16 bits src[i] (exact), i < n
void widen_bf16(float* dst, const uint16_t* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 18) && !omp_in_parallel())
  for (size_t i = 0; i < n; i++) dst[i] = bf16_bits_to_float(src[i]);
}

// An activation operand [n values] of a bf16 GEMM into dst: widened from a16 when given, else
// rounded from a.
void bf16_operand_into(float* dst, const float* a, const uint16_t* a16, size_t n) {
  if (a16 != nullptr) return widen_bf16(dst, a16, n);
  round_into_bf16(dst, a, n);
}

// The weight operand [n values] of a bf16 GEMM into dst: widened from w16 when given, else
// rounded from w (and counted: bf16_weight_rounding_count).
void bf16_weight_into(float* dst, const float* w, const uint16_t* w16, size_t n) {
  if (w16 == nullptr) {
    count_bf16_weight_rounding(n);
    return round_into_bf16(dst, w, n);
  }
  widen_bf16(dst, w16, n);
}

// dst[i] = bf16 bits of src[i] (round to nearest even), i < n
void to_bf16_bits(uint16_t* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 18) && !omp_in_parallel())
  for (size_t i = 0; i < n; i++) dst[i] = float_to_bf16_bits(src[i]);
}

// oneDNN's operands as bf16 bits: a16 itself when given, else a [n values] converted into dst.
const uint16_t* bf16_bits_operand(uint16_t* dst, const float* a, const uint16_t* a16, size_t n) {
  if (a16 != nullptr) return a16;
  to_bf16_bits(dst, a, n);
  return dst;
}

// The weight operand as bf16 bits: w16 when given, else w [n values] converted into dst (and
// counted: bf16_weight_rounding_count).
const uint16_t* bf16_bits_weight(uint16_t* dst, const float* w, const uint16_t* w16, size_t n) {
  if (w16 != nullptr) return w16;
  count_bf16_weight_rounding(n);
  to_bf16_bits(dst, w, n);
  return dst;
}

// This thread's scratch of at least `values` bf16 values (oneDNN's converted operands), valid
// until the next call on this thread; grown on demand, never shrunk.
uint16_t* thread_bf16_scratch(size_t values) {
  thread_local std::vector<uint16_t> buf;
  if (buf.size() < values) buf.resize(values);
  return buf.data();
}

bool on_onednn(GemmPrecision prec) {
  if (prec == GemmPrecision::fp32) return cpu_fp32_gemm() == CpuFp32Gemm::onednn;
  return prec == GemmPrecision::bf16 && cpu_bf16_gemm() == CpuBf16Gemm::onednn;
}

// oneDNN's matmul on bf16 bits or on fp32 values, as onednn_bf16_gemm / onednn_f32_gemm.
void onednn_gemm(bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B, int ldb,
                 float beta, float* C, int ldc, const float* bias = nullptr) {
  onednn_bf16_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, gemm_threads(M, N, K), bias);
}
void onednn_gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float beta,
                 float* C, int ldc, const float* bias = nullptr) {
  onednn_f32_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, gemm_threads(M, N, K), bias);
}

// matmul_backward's two GEMMs on oneDNN with the operands of type T (bf16 bits or fp32):
// dinp += dout·weight and dweight += dout^T·inp, each when not null; dout's rows ldd apart.
template <typename T>
void onednn_backward_gemms(float* dinp, float* dweight, const T* dout, size_t ldd, const T* inp, const T* weight,
                           int N, int C, int OC) {
  if (dinp != nullptr) onednn_gemm(false, false, N, C, OC, dout, static_cast<int>(ldd), weight, C, 1.0f, dinp, C);
  if (dweight != nullptr) onednn_gemm(true, false, OC, C, N, dout, static_cast<int>(ldd), inp, C, 1.0f, dweight, C);
}

std::atomic<uint64_t> weight_roundings{0};

size_t round16(size_t n) { return (n + 15) / 16 * 16; }

void check_cpu_precision(GemmPrecision prec) {
  if (prec == GemmPrecision::tf32)
    fail("runtime.precision \"tf32\" is a CUDA tensor-core mode; use \"fp32\" or \"bf16\" on the CPU");
}

// matmul_backward's two GEMMs, fp32 or the bf16 emulation: dinp += dout·weight and
// dweight += dout^T·inp (each when not null) on sgemm; in bf16 on rounded copies of dout, weight
// (for dinp) and inp (for dweight), widened from gemm.*_bf16 when given.
void emulated_backward_gemms(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                             int N, int C, int OC, size_t ldd, const GemmMode& gemm) {
  const float* dout_g = dout;  // the GEMMs' dout, rows ldg apart
  size_t ldg = ldd;
  if (gemm.prec == GemmPrecision::bf16 && (dinp != nullptr || dweight != nullptr)) {
    const size_t nd = static_cast<size_t>(N) * OC, nw = dinp ? static_cast<size_t>(OC) * C : 0,
                 ni = dweight ? static_cast<size_t>(N) * C : 0;
    float* s = thread_scratch(round16(nd) + round16(nw) + ni);
    // dout's rounded copy, contiguous: widened from dout_bf16 (exact), or rounded from dout
#pragma omp parallel for schedule(static) if (nd > (1 << 18) && !omp_in_parallel())
    for (int n = 0; n < N; n++) {  // row n (its call runs serially inside this loop)
      const uint16_t* row16 = gemm.dout_bf16 ? gemm.dout_bf16 + n * ldd : nullptr;
      bf16_operand_into(s + static_cast<size_t>(n) * OC, row16 ? nullptr : dout + n * ldd, row16,
                        static_cast<size_t>(OC));
    }
    dout_g = s;
    ldg = static_cast<size_t>(OC);
    if (dinp) {
      bf16_weight_into(s + round16(nd), weight, gemm.weight_bf16, nw);
      weight = s + round16(nd);
    }
    if (dweight) {
      bf16_operand_into(s + round16(nd) + round16(nw), inp, gemm.inp_bf16, ni);
      inp = s + round16(nd) + round16(nw);
    }
  }
  if (dinp != nullptr)
    sgemm_on_omp_threads(CblasNoTrans, CblasNoTrans, N, C, OC, dout_g, static_cast<int>(ldg), weight, C, 1.0f, dinp, C);
  if (dweight != nullptr)
    sgemm_on_omp_threads(CblasTrans, CblasNoTrans, OC, C, N, dout_g, static_cast<int>(ldg), inp, C, 1.0f, dweight, C);
}

// matmul_backward's two GEMMs in bf16 on oneDNN: dout, weight (for dinp) and inp (for dweight) as
// bf16 bits, gemm.*_bf16 read in place (dout_bf16 with its row stride), the others converted.
void onednn_bf16_backward_gemms(float* dinp, float* dweight, const float* dout, const float* inp,
                                const float* weight, int N, int C, int OC, size_t ldd, const GemmMode& gemm) {
  if (dinp == nullptr && dweight == nullptr) return;
  const size_t nd = gemm.dout_bf16 ? 0 : static_cast<size_t>(N) * OC,
               nw = dinp && !gemm.weight_bf16 ? static_cast<size_t>(OC) * C : 0,
               ni = dweight && !gemm.inp_bf16 ? static_cast<size_t>(N) * C : 0;
  uint16_t* s = thread_bf16_scratch(round16(nd) + round16(nw) + ni);
  const uint16_t* d16 = gemm.dout_bf16;  // rows ldg apart
  size_t ldg = ldd;
  if (d16 == nullptr) {  // dout's bf16 bits, contiguous
#pragma omp parallel for schedule(static) if (nd > (1 << 18) && !omp_in_parallel())
    for (int n = 0; n < N; n++)
      store_bf16_bits(s + static_cast<size_t>(n) * OC, dout + n * ldd, static_cast<size_t>(OC));
    d16 = s;
    ldg = static_cast<size_t>(OC);
  }
  const uint16_t* w16 = dinp ? bf16_bits_weight(s + round16(nd), weight, gemm.weight_bf16, nw) : nullptr;
  const uint16_t* x16 = dweight ? bf16_bits_operand(s + round16(nd) + round16(nw), inp, gemm.inp_bf16, ni) : nullptr;
  onednn_backward_gemms(dinp, dweight, d16, ldg, x16, w16, N, C, OC);
}

}  // namespace

void count_bf16_weight_rounding(size_t n) { weight_roundings.fetch_add(n, std::memory_order_relaxed); }
uint64_t bf16_weight_rounding_count() { return weight_roundings.load(std::memory_order_relaxed); }

void bf16_copy(uint16_t* dst, const float* src, size_t n) {
  count_bf16_weight_rounding(n);
  to_bf16_bits(dst, src, n);
}

// out[N,OC] = inp[N,C] · weight[OC,C]^T + bias[OC]   (out's rows gemm.out_stride(OC) apart)
// sgemm: with a bias, out is first filled with the bias rows and sgemm accumulates (beta = 1);
// this costs the same single pass over out as sgemm's own beta = 0 clearing would. oneDNN (fp32,
// or bf16 on the bf16 operands) adds the bias as it writes out; the bf16 emulation replaces inp
// and weight by rounded copies first.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, GemmMode gemm) {
  check_cpu_precision(gemm.prec);
  if (N <= 0 || OC <= 0) return;
  const int ldo = gemm.out_stride(OC);
  if (ldo < OC) fail("internal: matmul_forward with out_ld ", ldo, " < OC ", OC);
  const size_t ni = static_cast<size_t>(N) * C, nw = static_cast<size_t>(OC) * C;
  if (C > 0 && on_onednn(gemm.prec)) {
    if (gemm.prec == GemmPrecision::fp32)
      return onednn_gemm(false, true, N, OC, C, inp, C, weight, C, 0.0f, out, ldo, bias);
    uint16_t* s = thread_bf16_scratch((gemm.inp_bf16 ? 0 : round16(ni)) + (gemm.weight_bf16 ? 0 : nw));
    const uint16_t* x16 = bf16_bits_operand(s, inp, gemm.inp_bf16, ni);
    const uint16_t* w16 = bf16_bits_weight(s + (gemm.inp_bf16 ? 0 : round16(ni)), weight, gemm.weight_bf16, nw);
    onednn_gemm(false, true, N, OC, C, x16, C, w16, C, 0.0f, out, ldo, bias);
    return;
  }
  if (gemm.prec == GemmPrecision::bf16 && C > 0) {
    float* s = thread_scratch(round16(ni) + nw);
    bf16_operand_into(s, inp, gemm.inp_bf16, ni);
    bf16_weight_into(s + round16(ni), weight, gemm.weight_bf16, nw);
    inp = s;
    weight = s + round16(ni);
  }
  float beta = 0.0f;
  if (bias != nullptr || C <= 0) {  // (no input: out = bias, or 0)
#pragma omp parallel for schedule(static) if (static_cast<long long>(N) * OC > (1 << 16))
    for (int n = 0; n < N; n++) {
      float* o = out + static_cast<size_t>(n) * ldo;
#pragma omp simd
      for (int j = 0; j < OC; j++) o[j] = bias != nullptr ? bias[j] : 0.0f;
    }
    beta = 1.0f;
  }
  if (C <= 0) return;
  sgemm_on_omp_threads(CblasNoTrans, CblasTrans, N, OC, C, inp, C, weight, C, beta, out, ldo);
}

// dinp[N,C]     += dout[N,OC] · weight[OC,C]         (sgemm or oneDNN, beta = 1)
// dweight[OC,C] += dout[N,OC]^T · inp[N,C]           (sgemm or oneDNN, beta = 1)
// dbias[OC]     += Σ_n dout[n, :]                    (column sum; threads split the columns,
//                                                     each column summed in row order)
// dout's rows (and dout_bf16's) are gemm.dout_stride(OC) apart.
// Each of the three is skipped when its output is null; they are independent, so calling with
// dinp alone and then with dweight, dbias alone gives the same bits as one call with all three.
// bf16: the two GEMMs read bf16 dout, weight (for dinp) and inp (for dweight), the column sum the
// fp32 dout. oneDNN reads gemm.weight_bf16 / inp_bf16 / dout_bf16 in place and converts the others;
// the emulation reads rounded fp32 copies (widened from gemm.*_bf16 when given).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, GemmMode gemm) {
  check_cpu_precision(gemm.prec);
  if (N <= 0 || OC <= 0 || C <= 0) return;
  const size_t ldd = static_cast<size_t>(gemm.dout_stride(OC));
  if (ldd < static_cast<size_t>(OC)) fail("internal: matmul_backward with dout_ld ", ldd, " < OC ", OC);
  if (on_onednn(gemm.prec) && gemm.prec == GemmPrecision::fp32)
    onednn_backward_gemms(dinp, dweight, dout, ldd, inp, weight, N, C, OC);
  else if (on_onednn(gemm.prec))
    onednn_bf16_backward_gemms(dinp, dweight, dout, inp, weight, N, C, OC, ldd, gemm);
  else
    emulated_backward_gemms(dinp, dweight, dout, inp, weight, N, C, OC, ldd, gemm);
  if (dbias != nullptr) {
#pragma omp parallel if (static_cast<long long>(N) * OC > (1 << 16) && OC >= 32)
    {
      const int nt = omp_get_num_threads(), it = omp_get_thread_num();
      const size_t lines = (static_cast<size_t>(OC) + 15) / 16;
      size_t l0, l1;
      split_range(lines, nt, it, &l0, &l1);
      const int j0 = static_cast<int>(l0 * 16);
      const int j1 = static_cast<int>(l1 * 16 < static_cast<size_t>(OC) ? l1 * 16 : OC);
      for (int n = 0; n < N; n++) {
        const float* d = dout + n * ldd;
#pragma omp simd
        for (int j = j0; j < j1; j++) dbias[j] += d[j];
      }
    }
  }
}

}  // namespace llmpi::cpu
