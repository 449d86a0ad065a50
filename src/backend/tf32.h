// TF32 on the host: an fp32 with its mantissa cut to 10 bits (sign, 8-bit exponent, 10-bit
// mantissa; the low 13 bits zero), the operand format of the tensor cores' TF32 products.
// round_to_tf32 rounds to nearest with ties away from zero, exactly as the CUDA kernels' explicit
// `cvt.rna.tf32.f32` (kernels/mma_sync.cuh round_tf32) compiles for sm_80 and sm_90 (its SASS, read
// by a desk review: unless |x| >= inf or NaN, add 0x1000; then always clear the 13 low bits):
// half of the dropped part's unit added to the magnitude's bits — a carry out of the mantissa
// raises the exponent, the largest finite values round to inf — and the low bits cleared, also
// of inf and NaN (a NaN whose payload is only in those bits becomes inf, as on the device).
#pragma once
#include <cstdint>
#include <cstring>

namespace llmpi {

inline float round_to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) != 0x7F800000u) u += 0x1000u;  // not inf or NaN
  u &= 0xFFFFE000u;
  float y;
  std::memcpy(&y, &u, sizeof y);
  return y;
}

}  // namespace llmpi
