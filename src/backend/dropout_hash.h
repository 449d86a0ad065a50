// The dropout mask as a pure function: element i of a tensor is kept when
// dropout_keep(key, i, p), so forward and backward agree without storing a mask, the CPU and
// CUDA backends drop the same elements, and a resumed run drops what an uninterrupted one would.
//
// key = dropout_key(seed, step, rank, micro_batch, layer, site): a counter-based stream per
// (run seed, training step, rank, micro-batch, layer, site within the layer). The hash is
// SplitMix64's finaliser (a bijection of 64-bit words with full avalanche), applied to the key
// mixed with the element index; the top 24 bits give u in [0, 1), kept when u >= p.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define LLMPI_HOST_DEVICE __host__ __device__
#else
#define LLMPI_HOST_DEVICE
#endif

namespace llmpi {

LLMPI_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

LLMPI_HOST_DEVICE inline bool dropout_keep(uint64_t key, uint64_t i, float p) {
  const uint64_t h = mix64(key ^ mix64(i * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f) >= p;
}

// Sites within a layer that draw a dropout mask.
enum DropoutSite : int { kDropEmbedding = 0, kDropAttnProbs = 1, kDropAttnOut = 2, kDropMlpOut = 3, kDropPooler = 4 };

inline uint64_t dropout_key(uint64_t seed, int64_t step, int rank, int micro_batch, int layer, int site) {
  uint64_t k = mix64(seed + 0x1000193ull);
  k = mix64(k ^ static_cast<uint64_t>(step));
  k = mix64(k ^ (static_cast<uint64_t>(static_cast<uint32_t>(rank)) << 32 | static_cast<uint32_t>(micro_batch)));
  k = mix64(k ^ (static_cast<uint64_t>(static_cast<uint32_t>(layer + 1)) << 8 | static_cast<uint32_t>(site)));
  return k;
}

}  // namespace llmpi
