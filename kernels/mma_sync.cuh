// The tensor-core instructions of the mma fused-attention kernels (kernels/flash_attention_mma.cu),
// PTX `mma.sync` (sm_80 and later), each issued by a whole warp, each lane holding its part of every
// matrix in registers. g = lane / 4, t = lane % 4; fp32 accumulators D (16 x 8) in both:
//   d[0], d[1] = D[g][2t, 2t+1]        d[2], d[3] = D[g+8][2t, 2t+1]
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and "... for mma.m16n8k8").
//
// mma_m16n8k16_bf16: D += A (16 x 16) B (16 x 8), bf16 operands two to a 32-bit register, the lower
// column (or row of B) in the low half:
//   a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
// mma_m16n8k8_tf32: D += A (16 x 8) B (8 x 8), one tf32 (an fp32 whose low 13 bits the tensor cores
// ignore) per register:
//   a[0] = A[g][t]   a[1] = A[g+8][t]   a[2] = A[g][t+4]   a[3] = A[g+8][t+4]
//   b[0] = B[t][g]   b[1] = B[t+4][g]
// round_tf32: cvt.rna.tf32.f32, to nearest with ties away from zero (backend/tf32.h is the host
// twin), so the operands are rounded explicitly rather than cut by the hardware.
// tools/cuda_cpu_sim/cuda_shim.h defines the same three functions over these layouts for the CPU runs.
#pragma once
#include <cstdint>

namespace llmpi::cuda {

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

__device__ __forceinline__ float round_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
#else
  return x;
#endif
}

}  // namespace llmpi::cuda
