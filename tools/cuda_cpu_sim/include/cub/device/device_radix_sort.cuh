// tools/cuda_cpu_sim's stand-in for CUB's DeviceRadixSort::SortPairs: a stable sort of (key, value)
// pairs by the key's bits [begin_bit, end_bit) (radix sort orders signed keys as their bit
// patterns with the sign flipped), with CUB's two-call protocol (temp null: the size it needs).
#pragma once
#include <algorithm>
#include <cstddef>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"

namespace cub {
struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* vals_in,
                               V* vals_out, int n, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 256;
      return cudaSuccess;
    }
    llmpi::sim::reach(stream);
    using U = std::make_unsigned_t<K>;
    auto radix = [&](K k) {
      U u = static_cast<U>(k);
      if constexpr (std::is_signed_v<K>) u ^= U(1) << (sizeof(K) * 8 - 1);
      const int width = end_bit - begin_bit;
      u >>= begin_bit;
      return width >= static_cast<int>(sizeof(K) * 8) ? u : static_cast<U>(u & ((U(1) << width) - 1));
    };
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return radix(keys_in[a]) < radix(keys_in[b]); });
    std::vector<K> k(static_cast<size_t>(n));
    std::vector<V> v(static_cast<size_t>(n));
    for (int i = 0; i < n; i++) k[i] = keys_in[order[i]], v[i] = vals_in[order[i]];
    std::copy(k.begin(), k.end(), keys_out);
    std::copy(v.begin(), v.end(), vals_out);
    return cudaSuccess;
  }
};
}  // namespace cub
