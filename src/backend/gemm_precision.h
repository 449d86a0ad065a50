// The precision of the dense layers' GEMMs (runtime.precision), passed to matmul_forward and
// matmul_backward (backend/op_list.h) by the Model that owns the layer. Everything else (master
// weights, gradients, optimizer state, every non-GEMM op, full attention's internal products) is
// fp32 in every mode; fused attention rounds its products' operands in bf16 mode too
// (backend/flash_bf16.h).
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
#pragma once
#include <string>

namespace llmpi {

enum class GemmPrecision { fp32, tf32, bf16 };

inline const char* gemm_precision_name(GemmPrecision p) {
  return p == GemmPrecision::fp32 ? "fp32" : p == GemmPrecision::tf32 ? "tf32" : "bf16";
}

// "fp32" | "tf32" | "bf16" -> true and *out; anything else -> false.
inline bool parse_gemm_precision(const std::string& s, GemmPrecision* out) {
  for (GemmPrecision p : {GemmPrecision::fp32, GemmPrecision::tf32, GemmPrecision::bf16})
    if (s == gemm_precision_name(p)) {
      *out = p;
      return true;
    }
  return false;
}

}  // namespace llmpi
