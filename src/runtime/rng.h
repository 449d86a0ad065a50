// The project's own PRNG, so that every platform draws the same numbers: splitmix64 to expand a
// seed, xoshiro256** for the stream. (std::*_distribution output is implementation-defined, so
// it is not used for anything that must be reproducible.)
#pragma once
#include <cmath>
#include <cstdint>

namespace llmpi {

inline uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t s[4];
  // Seeded by any number of 64-bit words, e.g. Rng(seed, epoch).
  explicit Rng(uint64_t seed, uint64_t stream = 0) {
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    for (auto& w : s) w = splitmix64(x);
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return result;
  }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; the tiny bias for n << 2^64 is
  // irrelevant here and keeps the sequence simple to reproduce).
  uint64_t below(uint64_t n) { return (uint64_t)(((__uint128_t)next() * n) >> 64); }
  // Uniform double in [0, 1) with 53 random bits.
  double uniform() { return (next() >> 11) * 0x1.0p-53; }
  // Standard normal (Box–Muller, one value per call).
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace llmpi
