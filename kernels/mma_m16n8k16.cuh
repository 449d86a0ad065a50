// One tensor-core product of the PTX `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`
// instruction (sm_80 and later): D (16 x 8, fp32) += A (16 x 16, bf16) B (16 x 8, bf16), issued by a
// whole warp, each lane holding its part of every matrix in registers. The parts (PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type"), with g = lane / 4 and t = lane % 4, two
// bf16 to a 32-bit register, the lower column (or row of B) in the low half:
//   a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   d[0], d[1] = D[g][2t, 2t+1]                          d[2], d[3] = D[g+8][2t, 2t+1]
// tools/cuda_cpu_sim/cuda_shim.h defines the same function over these layouts for the CPU runs.
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

}  // namespace llmpi::cuda
