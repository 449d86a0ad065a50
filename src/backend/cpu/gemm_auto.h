// "auto" of runtime.cpu_fp32_gemm (openblas or onednn) and runtime.cpu_bf16_gemm (emulate or
// onednn): the two engines (backend/cpu/onednn_gemm.h) timed on the run's own dense layers at
// start-up, the faster kept (the fallback within kAutoOnednnShare).
//
// The trainer (train/setup.cpp) hands time_dense_layers() its rank's dense layers of one training
// step (model/dense_layers.h: QKV, attention output, MLP in and out, the LM head's chunks or the
// classifier head, on its micro-batch's rows) in the run's precision, on the run's GEMM threads.
// Every rank times its own at once; rank 0's times decide for every rank (one engine everywhere,
// so data-parallel replicas stay bit for bit alike). The engine goes into the run's resolved
// configuration (config.json, every checkpoint), and a resumed run takes it from its checkpoint
// without timing again, so its bits stay those of the run it continues.
//
// The timing is bounded: each distinct shape once (weighed by how many layers share it) as a block
// of at most kTimedRows rows and kTimedFlopsPerThread / (distinct shapes) FLOPs per GEMM thread
// (rows halved first, down to kTimedMinEdge, then the larger of in and out); both engines run every
// block once to warm up, then up to kTimedPasses more times, alternating (no more passes once
// kTimedMaxSeconds have gone), and each block's fastest run counts, scaled by FLOPs to the whole
// step. At most 1.5e9 FLOPs per thread and engine: ~0.15 s at 10 GFLOP/s per core.
#pragma once
#include <string>
#include <vector>

#include "backend/cpu_gemm_times.h"
#include "backend/gemm_precision.h"

namespace llmpi::cpu {

// oneDNN is kept when it takes at most this share of the fallback's time: the faster engine, but
// within 5% the fallback, which is the oracle the other backends are tested against (and a tie
// that timing noise could decide either way does not change the engine from run to run). So the
// choice is never more than 5% slower than the faster engine on the run's GEMMs.
constexpr double kAutoOnednnShare = 0.95;
// A step with less dense-layer work than this (FLOPs, forward and backward) is not timed: its
// GEMMs are too small to tell the engines apart, and "auto" keeps the fallback.
constexpr double kAutoMinStepFlops = 1e8;
constexpr int kTimedRows = 512;
constexpr int kTimedMinEdge = 64;
constexpr double kTimedFlopsPerThread = 5e8;
constexpr int kTimedPasses = 2;
constexpr double kTimedMaxSeconds = 0.5;

// "auto"'s choice from the times: oneDNN when both were timed (positive and finite) and oneDNN's is
// at most kAutoOnednnShare of the fallback's, else the fallback. Pure: the same times, the same
// choice.
bool auto_prefers_onednn(const CpuGemmTimes& t);
CpuFp32Gemm cpu_fp32_gemm_from_times(const CpuGemmTimes& t);
CpuBf16Gemm cpu_bf16_gemm_from_times(const CpuGemmTimes& t);

// A step's dense-layer FLOPs: 6 · rows · in · out (forward, dinp, dweight) per layer.
double dense_step_flops(const std::vector<DenseShape>& layers);

// One distinct shape of a step (count: the layers that share it) and the block of it timed.
struct TimedBlock {
  DenseShape shape, block;
};
// The blocks timed for `layers` on `threads` GEMM threads, in order of first appearance (bounds
// above).
std::vector<TimedBlock> timed_blocks(const std::vector<DenseShape>& layers, int threads);

// Times `layers` (forward with matmul_forward, backward with matmul_backward, bf16 with the weight's
// bf16 copy as the Model hands it) on oneDNN and on the fallback (fp32: OpenBLAS sgemm; bf16: the
// emulation), on OpenBLAS's thread count (the dense layers' GEMM threads). Not timed ({-1, -1})
// where oneDNN cannot run or the step is under kAutoMinStepFlops. The engine selection is the
// caller's again afterwards (its reason is not). Throws Error when an engine fails.
CpuGemmTimes time_dense_layers(GemmPrecision prec, const std::vector<DenseShape>& layers);

// For the banner: "timed this run's GEMMs: onednn 12.3 ms, openblas 35.1 ms per step (...;
// OpenBLAS core Haswell)", or "not timed: ..." (a step too small to time).
std::string describe_gemm_times(GemmPrecision prec, const CpuGemmTimes& t);

// The OpenBLAS kernels' vector generation, by openblas_get_corename()'s name: 0 SSE (Prescott,
// Core2, Nehalem, ... and "Unknown"), 1 AVX (Sandybridge, Bulldozer, ...), 2 AVX2 (Haswell, Zen),
// 3 AVX-512 (SkylakeX, Cooperlake, SapphireRapids); -1 for a name not known here.
int openblas_core_level(const std::string& core);
// The CPU's, on the same scale (AVX-512 = F, BW, DQ and VL, as OpenBLAS's SkylakeX kernels need).
int cpu_vector_level();
// A start-up warning when OpenBLAS runs kernels two or more generations older than the CPU has (its
// generic SSE kernels on an AVX2 or AVX-512 CPU it does not recognise: several times slower),
// naming OPENBLAS_CORETYPE as the fix; "" otherwise. dynamic: OpenBLAS picks its kernels at run
// time (DYNAMIC_ARCH, as Debian's does; without it OPENBLAS_CORETYPE changes nothing).
std::string openblas_core_warning(const std::string& core, int cpu_level, bool dynamic);
// The same for this process's OpenBLAS and CPU.
std::string openblas_core_warning();

// The OPENBLAS_CORETYPE whose kernels fit a CPU of cpu_level ("Sandybridge", "Haswell" or
// "SkylakeX") when OpenBLAS runs `core`, two or more generations older, and can pick its kernels
// at run time (dynamic); "" when its kernels fit (or are unknown here), or it cannot change them.
std::string openblas_fitting_core(const std::string& core, int cpu_level, bool dynamic);

// llmpi-train's first step, before MPI_Init: when OPENBLAS_CORETYPE is not set and this process's
// OpenBLAS has a fitting core to offer (openblas_fitting_core), the program executes itself again
// (/proc/self/exe, the same arguments and environment, so the same PID and MPI launch) with
// OPENBLAS_CORETYPE set to that core and LLMPI_OPENBLAS_CORE_FROM to the kernels OpenBLAS had
// picked. OpenBLAS reads OPENBLAS_CORETYPE once, as it loads, so only a new image can change its
// kernels. A user's OPENBLAS_CORETYPE (whatever its value) is never replaced. Returns when there
// is nothing to change, and when the exec fails (the start-up warning then names the fix).
void exec_with_fitting_openblas_kernels(char** argv);

// For the banner: "OpenBLAS kernels: SkylakeX, set by llmpi-train (...)" when
// exec_with_fitting_openblas_kernels chose them, else "".
std::string openblas_kernels_note();

}  // namespace llmpi::cpu
