// The precision of the dense layers' GEMMs (runtime.precision), passed to matmul_forward and
// matmul_backward (backend/op_list.h) by the Model that owns the layer. Everything else (master
// weights, gradients, optimizer state, every non-GEMM op, full attention's internal products) is
// fp32 in every mode; fused attention rounds its products' operands in bf16 and tf32 modes too
// (backend/flash_bf16.h: there the kernels round to tf32 explicitly, so the CPU emulates them).
//
//   fp32  operands and accumulation in fp32 (cuBLAS sgemm without TF32; OpenBLAS sgemm)
//   tf32  CUDA only: fp32 operands fed to the tensor cores as TF32 (10-bit mantissa), fp32
//         accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_TF32). The CPU refuses it: how the
//         tensor cores round to TF32 is not specified closely enough to emulate bit for bit.
//   bf16  operands rounded to bf16 (round to nearest even, backend/bf16.h), products accumulated
//         in fp32, fp32 outputs; a backward still ADDS into its fp32 gradients. On CUDA a small
//         kernel converts the operands into bf16 scratch, then cublasGemmEx (bf16 A/B, fp32 C,
//         CUBLAS_COMPUTE_32F); the CPU rounds them into fp32 scratch copies and calls the same
//         sgemm, which is exact emulation up to summation order (a product of two bf16 values is
//         exact in fp32).
//
// A dense layer's ops take a GemmMode: the precision, and in bf16 optionally operands already
// rounded, which the op reads instead of rounding them itself. A bf16 Model rounds each dense
// weight once per forward into its bf16 copy (the bf16_copy op, model/transformer.h "bf16 weight
// copy") and hands the copy to the forward and backward GEMMs (so the chunked LM head's tied wte, V x C,
// is rounded once per forward, not per chunk); it hands over the LM head's logits gradient, which
// the cross-entropy writes in bf16, and the inputs it keeps only in bf16 (the pre-norm norms'
// outputs, the SwiGLU / erf-GELU output). The bits are the same either way: each is what the op
// would have rounded.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/options.h"

namespace llmpi {

// (GemmPrecision itself is a configuration choice: runtime/options.h.)
inline const char* gemm_precision_name(GemmPrecision p) { return option_name(p); }

// The GEMM mode of one dense-layer op call (backend/op_list.h). Built implicitly from a
// GemmPrecision (no copy: the op rounds the weight itself in bf16).
struct GemmMode {
  GemmPrecision prec = GemmPrecision::fp32;
  // bf16 only (ignored otherwise): the bits of round_to_bf16(weight) — the op's weight [OC, C],
  // row-major, in the backend's memory — which the op reads in place of rounding `weight`; the
  // weight is then not read by the GEMMs. Null: the op rounds. The caller keeps it equal to the
  // weight (the op cannot tell a stale copy).
  const uint16_t* weight_bf16 = nullptr;
  // matmul_forward only, any precision: the row stride of out (>= OC values; 0 = OC). The padding
  // columns are not written. The LM head writes its logits in rows padded to a multiple of 64
  // (lm_logits_row_stride, model/model_desc.h), so that every row starts 256-byte aligned: with
  // GPT-2's V = 50257 the rows would be 4-byte aligned only, which keeps cuBLAS from its fastest
  // kernels (Hopper's TMA needs 16-byte row strides; nanoGPT's "pad the vocabulary to 50304").
  int out_ld = 0;
  // matmul_backward only, any precision: the row stride of dout and of dout_bf16 (>= OC values;
  // 0 = OC; the padding is never read).
  int dout_ld = 0;
  // bf16 only, matmul_backward only: the output gradient dout [N, OC] already as bf16 bits (rows
  // of dout_ld values), which the GEMMs read in place of rounding dout (the LM head's logits
  // gradient, written in bf16 by softmax_xent_bf16_grad). dout itself is then read only for dbias
  // and may be null without one.
  const uint16_t* dout_bf16 = nullptr;
  // bf16 only: the layer's input inp [N, C] already as bf16 bits (rows of C values; an activation
  // kept only in bf16), read by the forward GEMM and the backward's weight gradient in place of
  // rounding inp; inp itself may then be null.
  const uint16_t* inp_bf16 = nullptr;
  GemmMode(GemmPrecision p = GemmPrecision::fp32, const uint16_t* w16 = nullptr) : prec(p), weight_bf16(w16) {}
  // out_ld / dout_ld resolved against the output width OC
  int out_stride(int OC) const { return out_ld > 0 ? out_ld : OC; }
  int dout_stride(int OC) const { return dout_ld > 0 ? dout_ld : OC; }
};

// The row stride of a bf16 copy of a [rows, cols] GEMM operand: cols rounded up to a multiple of 8
// values, so every row starts 16-byte aligned, as cuBLAS's tensor-core kernels want 16-bit
// operands (the LM head's V = 50257 would leave them misaligned); the padding is zero.
inline int bf16_row_stride(int cols) { return (cols + 7) / 8 * 8; }

// Which engine multiplies the CPU backend's bf16 GEMMs (runtime.cpu_bf16_gemm; the selector is
// backend/cpu/onednn_gemm.h). Both compute bf16 operands x bf16 operands with fp32 accumulation:
//   automatic  the faster of the two on the run's own GEMMs, timed at start-up, where oneDNN can
//              run; else emulate (backend/cpu/gemm_auto.h)
//   onednn     oneDNN's bf16 matmul (AVX512-BF16 / AMX), native bf16 x bf16 -> fp32
//   emulate    the operands rounded to bf16 in fp32 copies, then OpenBLAS sgemm: exact up to
//              summation order, the oracle the other paths are compared with
// (enum class CpuBf16Gemm and its words: runtime/options.h)
inline const char* cpu_bf16_gemm_name(CpuBf16Gemm e) { return option_name(e); }

// Which engine multiplies the CPU backend's fp32 dense-layer GEMMs (runtime.cpu_fp32_gemm; the
// selector is backend/cpu/onednn_gemm.h). Both are fp32 products with fp32 accumulation, equal up
// to summation order:
//   automatic  the faster of the two on the run's own GEMMs, timed at start-up, where oneDNN can
//              run; else openblas (backend/cpu/gemm_auto.h)
//   onednn     oneDNN's fp32 matmul
//   openblas   OpenBLAS sgemm
// (enum class CpuFp32Gemm and its words: runtime/options.h)
inline const char* cpu_fp32_gemm_name(CpuFp32Gemm e) { return option_name(e); }

// "fp32" | "tf32" | "bf16" -> true and *out; anything else -> false.
inline bool parse_gemm_precision(const std::string& s, GemmPrecision* out) { return parse_option(s, out); }

}  // namespace llmpi
