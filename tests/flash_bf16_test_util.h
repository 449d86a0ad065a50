// Shared by test_flash_bf16.cpp (the CPU emulation) and test_cuda_flash_bf16.cpp (the CUDA
// tensor-core kernel against it): the attention cases and their random inputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "grad_check.h"

namespace llmpi::test {

struct FlashCase {
  const char* name;
  int B, T, NH, NKV, hs;
  bool causal;
  bool masked;  // key padding mask (see flash_mask)
  float p;      // attention-probability dropout
  int W() const { return (NH + 2 * NKV) * hs; }
  int C() const { return NH * hs; }
  size_t n_qkv() const { return static_cast<size_t>(B) * T * W(); }
  size_t n_out() const { return static_cast<size_t>(B) * T * C(); }
  size_t n_lse() const { return static_cast<size_t>(B) * NH * T; }
};

inline constexpr uint64_t kFlashDropKey = 0x5eedbf16;

// The key padding mask of a masked case ([B, T]; empty when unmasked): sequence 0 has key 0
// masked and ~30% random holes (causal: its query 0 sees no key), sequence 1 is padded to half its
// length, sequence 2 (when B > 2) has no valid key at all.
inline std::vector<int32_t> flash_mask(const FlashCase& c) {
  if (!c.masked) return {};
  std::vector<int32_t> m(static_cast<size_t>(c.B) * c.T, 1);
  const auto r = random_floats(static_cast<size_t>(c.T), 700 + c.T, 0.0f, 1.0f);
  for (int t = 0; t < c.T; t++) m[t] = r[t] < 0.3f ? 0 : 1;
  m[0] = 0;
  if (c.B > 1)
    for (int t = (c.T + 1) / 2; t < c.T; t++) m[static_cast<size_t>(c.T) + t] = 0;
  if (c.B > 2)
    for (int t = 0; t < c.T; t++) m[2 * static_cast<size_t>(c.T) + t] = 0;
  return m;
}

// qkv entries in [-2, 2] (scores of a few units: peaked and flat rows both occur), dout in
// [-1, 1], dqkv's starting values (backward ops add) in [-1, 1].
inline std::vector<float> flash_qkv(const FlashCase& c) { return random_floats(c.n_qkv(), 11 + c.T, -2.0f, 2.0f); }
inline std::vector<float> flash_dout(const FlashCase& c) { return random_floats(c.n_out(), 12 + c.T); }
inline std::vector<float> flash_dqkv0(const FlashCase& c) { return random_floats(c.n_qkv(), 13 + c.T); }

}  // namespace llmpi::test
