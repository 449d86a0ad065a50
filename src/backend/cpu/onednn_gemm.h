// The CPU backend's GEMM engines (runtime.cpu_bf16_gemm and runtime.cpu_fp32_gemm;
// backend/gemm_precision.h CpuBf16Gemm, CpuFp32Gemm) and oneDNN's matmul behind them.
//
// In runtime.precision bf16 the dense layers' GEMMs (matmul_forward, matmul_backward: the LM head
// included) multiply bf16 operands with fp32 accumulation. Two engines compute that:
//   - oneDNN (libdnnl, Debian libdnnl-dev): native bf16 x bf16 -> fp32 matmul on CPUs with bf16
//     instructions (AVX512-BF16, AMX), reading the bf16 operand copies the bf16 mode keeps (the
//     weight copy, the norms' bf16 outputs, the logits gradient) in place; others are converted
//     to bf16 bits first. Compiled only when the Makefile finds oneDNN's header
//     (LLMPI_HAVE_ONEDNN).
//   - the emulation (matmul.cpp): operands rounded to bf16 in fp32 copies, OpenBLAS sgemm. Exact
//     up to summation order (a product of two bf16 values is exact in fp32), so it is the oracle
//     the CUDA backend and the oneDNN engine are tested against.
// The two differ by the order of the fp32 sums (and the bf16 instructions flush denormals), so
// they agree within the bf16 tolerances of docs/TESTING.md ("Tolerances"), not bit for bit.
//
// In fp32 the same GEMMs run on OpenBLAS sgemm or on oneDNN's fp32 matmul (runtime.cpu_fp32_gemm).
// Both are fp32 products with fp32 sums; they differ by the order of the sums only, so they agree
// within the fp32 tolerances, not bit for bit. Each gives the same bits run to run for a given
// GEMM thread count.
//
// Each selection is process-wide. Until a program selects, the engines are the emulation and
// OpenBLAS (so the ops of a test or a tool are the oracle unless it asks); llmpi-train selects
// runtime.cpu_bf16_gemm and runtime.cpu_fp32_gemm at start-up. Their "auto" (the default) times
// oneDNN and the fallback on the run's own GEMMs and keeps the faster, the same on every rank, and
// a resumed run keeps the engine its checkpoint records (backend/cpu/gemm_auto.h, train/setup.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "backend/gemm_precision.h"

namespace llmpi::cpu {

// Whether this build and this CPU can run the oneDNN engine: oneDNN compiled in, a CPU with bf16
// instructions (oneDNN's effective ISA has them), and a bf16 matmul that is not oneDNN's reference
// loop. When not, *why (if given) says which is missing.
bool onednn_bf16_available(std::string* why = nullptr);

// Selects the engine of this process's bf16 GEMMs: automatic, untimed, resolves to onednn when
// onednn_bf16_available(), else to emulate. onednn on a build or CPU without it throws Error
// naming what is missing and the fix (runtime.cpu_bf16_gemm "auto" or "emulate"). `why`, when not
// empty, is the banner's reason for the choice (e.g. what timing "auto" found).
void select_cpu_bf16_gemm(CpuBf16Gemm want, const std::string& why = "");
// The engine in use: onednn or emulate (never automatic).
CpuBf16Gemm cpu_bf16_gemm();
// One line for the start-up banner: the engine in use and why, e.g.
//   "oneDNN 2.6.3 bf16 matmul (brg:avx512_core_bf16)"
//   "emulated (operands rounded to bf16, fp32 OpenBLAS sgemm): oneDNN finds no bf16 instructions ..."
std::string cpu_bf16_gemm_description();

// Whether this build and this CPU can run oneDNN's fp32 matmul: oneDNN compiled in and an fp32
// matmul that is not oneDNN's reference loop. When not, *why (if given) says which is missing.
bool onednn_fp32_available(std::string* why = nullptr);

// Selects the engine of this process's fp32 dense-layer GEMMs: automatic, untimed, resolves to
// cpu_fp32_gemm_for_auto(). onednn on a build or CPU without it throws Error naming what is
// missing and the fix (runtime.cpu_fp32_gemm "auto" or "openblas"). `why` as above.
void select_cpu_fp32_gemm(CpuFp32Gemm want, const std::string& why = "");
// What "auto" selects without timing: openblas, the oracle (timed, it is the faster engine:
// backend/cpu/gemm_auto.h).
CpuFp32Gemm cpu_fp32_gemm_for_auto();
// The engine in use: onednn or openblas (never automatic).
CpuFp32Gemm cpu_fp32_gemm();
// One line for the start-up banner, e.g.
//   "oneDNN 2.6.3 fp32 matmul (brg:avx512_core; runtime.cpu_fp32_gemm \"onednn\")"
//   "OpenBLAS sgemm: runtime.cpu_fp32_gemm \"auto\" timed this run's GEMMs: onednn ..."
std::string cpu_fp32_gemm_description();

// The engine in use for either selection, by its enum (for ScopedCpuGemm).
inline void select_cpu_gemm(CpuBf16Gemm want, const std::string& why = "") { select_cpu_bf16_gemm(want, why); }
inline void select_cpu_gemm(CpuFp32Gemm want, const std::string& why = "") { select_cpu_fp32_gemm(want, why); }
inline CpuBf16Gemm cpu_gemm_in_use(CpuBf16Gemm) { return cpu_bf16_gemm(); }
inline CpuFp32Gemm cpu_gemm_in_use(CpuFp32Gemm) { return cpu_fp32_gemm(); }

// Selects `want` for its lifetime, then restores the engine it found (a run inside a process that
// goes on: tests, a library call of the trainer).
template <typename Engine>
struct ScopedCpuGemm {
  Engine saved;
  explicit ScopedCpuGemm(Engine want) : saved(cpu_gemm_in_use(want)) { select_cpu_gemm(want); }
  ~ScopedCpuGemm() { select_cpu_gemm(saved); }
  ScopedCpuGemm(const ScopedCpuGemm&) = delete;
  ScopedCpuGemm& operator=(const ScopedCpuGemm&) = delete;
};
using ScopedCpuBf16Gemm = ScopedCpuGemm<CpuBf16Gemm>;
using ScopedCpuFp32Gemm = ScopedCpuGemm<CpuFp32Gemm>;

// C[M,N] = op(A) op(B) + bias + beta C through oneDNN's matmul, row-major, as cblas_sgemm with
// alpha 1 and beta 0 or 1: A and B are bf16 bits (op(A) [M,K]: A is [M,K] with rows lda apart, or
// with trans_a [K,M]; op(B) [K,N]: B is [K,N] rows ldb apart, or with trans_b [N,K]), C is fp32 with
// rows ldc apart, accumulated in fp32; bias (may be null) is fp32 [N], added to every row. The
// padding columns of C are not touched. Runs on `threads` OpenMP threads. The primitive for each
// shape (transposes, sizes, strides, beta, bias or not, threads) is made once and kept; its
// scratchpad is this thread's, grown on demand. The same call gives the same bits every time.
// Throws Error when oneDNN is not compiled in or fails.
void onednn_bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                      int ldb, float beta, float* C, int ldc, int threads, const float* bias = nullptr);

// The same with fp32 operands (oneDNN's fp32 matmul, fp32 accumulation): the fp32 dense layers'
// GEMMs under runtime.cpu_fp32_gemm "onednn", and bench-sgemm_rate's comparison with sgemm.
void onednn_f32_gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                     int ldb, float beta, float* C, int ldc, int threads, const float* bias = nullptr);

// The oneDNN implementation that a bf16 / fp32 matmul of this shape gets (e.g. "brg:avx512_core_bf16"),
// or "" when oneDNN is not compiled in (the benchmark's report).
std::string onednn_matmul_impl(bool bf16, bool trans_a, bool trans_b, int M, int N, int K);

}  // namespace llmpi::cpu
