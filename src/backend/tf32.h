// TF32 on the host: an fp32 with its mantissa cut to 10 bits (sign, 8-bit exponent, 10-bit
// mantissa; the low 13 bits zero), the operand format of the tensor cores' TF32 products.
// round_to_tf32 rounds to nearest with ties away from zero, exactly as the CUDA kernels' explicit
// `cvt.rna.tf32.f32` (kernels/mma_sync.cuh round_tf32): add half of the dropped part's unit
// (0x1000) to the magnitude's bits and clear the 13 low bits — a carry out of the mantissa raises
// the exponent, the largest finite values round to inf; inf and NaN pass unchanged.
#pragma once
#include <cstdint>
#include <cstring>

namespace llmpi {

inline float round_to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u) return x;  // inf, NaN
  u = (u + 0x1000u) & 0xFFFFE000u;
  float y;
  std::memcpy(&y, &u, sizeof y);
  return y;
}

}  // namespace llmpi
