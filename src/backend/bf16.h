// bfloat16 on the host: the top 16 bits of an IEEE fp32 (sign, 8-bit exponent, 7-bit mantissa).
// float_to_bf16_bits rounds to nearest, ties to even, exactly as CUDA's __float2bfloat16_rn:
//   u = bits(x); r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
// (a carry out of the mantissa raises the exponent; the largest finite values round to inf), and
// every NaN becomes the canonical quiet NaN 0x7FFF. Subnormals round like any other value (bf16
// has fp32's exponent range, so its subnormals are fp32's with a shorter mantissa).
// round_to_bf16(x) = the float whose top half is that bf16 and bottom half zero.
#pragma once
#include <cstdint>
#include <cstring>

namespace llmpi {

inline uint16_t float_to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;  // NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline float round_to_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

}  // namespace llmpi
