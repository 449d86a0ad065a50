// The content hash of token and classification files: FNV-1a 64 over the values as the file
// defines them (see dataset_identity.h for exactly which bytes), written as 16 lower-case hex
// digits in the root attribute `content_fnv1a64`. Header-only, so the token-file code needs
// nothing else (the fuzz targets link only token_file.cpp and h5_util.cpp).
//
//   h = 14695981039346656037;  for each byte b: h = (h xor b) * 1099511628211   (mod 2^64)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace llmpi {

inline constexpr const char* kContentHashAttr = "content_fnv1a64";

struct Fnv1a64 {
  uint64_t h = 14695981039346656037ull;
  void add(const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  }
  // Values as little-endian bytes of the given width (1, 2 or 4), whatever the host order.
  void add_le(uint32_t v, int bytes) {
    for (int k = 0; k < bytes; k++) h = (h ^ ((v >> (8 * k)) & 0xffu)) * 1099511628211ull;
  }
  void add_u64_le(uint64_t v) {
    for (int k = 0; k < 8; k++) h = (h ^ ((v >> (8 * k)) & 0xffu)) * 1099511628211ull;
  }
  std::string hex() const {
    static const char* digits = "0123456789abcdef";
    std::string s(16, '0');
    for (int i = 0; i < 16; i++) s[size_t(i)] = digits[(h >> (60 - 4 * i)) & 0xf];
    return s;
  }
};

}  // namespace llmpi
