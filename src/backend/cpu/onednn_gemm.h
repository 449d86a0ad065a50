// The CPU backend's bf16 GEMM engine (runtime.cpu_bf16_gemm; backend/gemm_precision.h CpuBf16Gemm)
// and oneDNN's bf16 matmul behind it.
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
// they agree within the bf16 tolerances of docs/DESIGN.md, not bit for bit.
//
// The selection is process-wide. Until a program selects, the engine is the emulation (so the ops
// of a test or a tool are the oracle unless it asks); llmpi-train selects runtime.cpu_bf16_gemm
// ("auto" by default) at start-up. fp32 GEMMs are OpenBLAS sgemm whatever the selection (oneDNN's
// fp32 matmul measured 4-14% above sgemm on the model's shapes, docs/PERF.md "Reference
// throughput on the CPU"; it is not wired into the fp32 layers).
#pragma once
#include <cstdint>
#include <string>

#include "backend/gemm_precision.h"

namespace llmpi::cpu {

// Whether this build and this CPU can run the oneDNN engine: oneDNN compiled in, a CPU with bf16
// instructions (oneDNN's effective ISA has them), and a bf16 matmul that is not oneDNN's reference
// loop. When not, *why (if given) says which is missing.
bool onednn_bf16_available(std::string* why = nullptr);

// Selects the engine of this process's bf16 GEMMs: automatic resolves to onednn when
// onednn_bf16_available(), else to emulate. onednn on a build or CPU without it throws Error
// naming what is missing and the fix (runtime.cpu_bf16_gemm "auto" or "emulate").
void select_cpu_bf16_gemm(CpuBf16Gemm want);
// The engine in use: onednn or emulate (never automatic).
CpuBf16Gemm cpu_bf16_gemm();
// One line for the start-up banner: the engine in use and why, e.g.
//   "oneDNN 2.6.3 bf16 matmul (brg:avx512_core_bf16)"
//   "emulated (operands rounded to bf16, fp32 OpenBLAS sgemm): oneDNN finds no bf16 instructions ..."
std::string cpu_bf16_gemm_description();

// Selects `want` for its lifetime, then restores the engine it found (a run inside a process that
// goes on: tests, a library call of the trainer).
struct ScopedCpuBf16Gemm {
  CpuBf16Gemm saved;
  explicit ScopedCpuBf16Gemm(CpuBf16Gemm want) : saved(cpu_bf16_gemm()) { select_cpu_bf16_gemm(want); }
  ~ScopedCpuBf16Gemm() { select_cpu_bf16_gemm(saved); }
  ScopedCpuBf16Gemm(const ScopedCpuBf16Gemm&) = delete;
  ScopedCpuBf16Gemm& operator=(const ScopedCpuBf16Gemm&) = delete;
};

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

// The same with fp32 operands (oneDNN's fp32 matmul): for bench-sgemm_rate's comparison with
// OpenBLAS sgemm only; the fp32 dense layers use sgemm.
void onednn_f32_gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                     int ldb, float beta, float* C, int ldc, int threads, const float* bias = nullptr);

// The oneDNN implementation that a bf16 / fp32 matmul of this shape gets (e.g. "brg:avx512_core_bf16"),
// or "" when oneDNN is not compiled in (the benchmark's report).
std::string onednn_matmul_impl(bool bf16, bool trans_a, bool trans_b, int M, int N, int K);

}  // namespace llmpi::cpu
