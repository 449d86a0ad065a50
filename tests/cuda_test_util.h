// Shared by the CUDA test files (test_cuda_*.cpp): the skip-without-a-GPU guards, device buffers
// filled from and read back to host vectors, and the comparisons every CUDA test makes against
// the CPU backend (the oracle). Each test file keeps its own tolerances and its own cases.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/bf16.h"
#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "grad_check.h"

namespace llmpi::test {

// First statement of every GPU test: skips ("no GPU: <reason>") where cuda_available() is false.
#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    std::string why_;                                                   \
    if (!llmpi::cuda_available(&why_)) GTEST_SKIP() << "no GPU: " << why_; \
    llmpi::cuda_bind_device(0);                                         \
  } while (0)

// After REQUIRE_GPU: skips when the card has less than `bytes` free (a smaller card than the
// H100/H200 the real-shape tests are sized for).
#define REQUIRE_GPU_MEMORY(bytes)                                                              \
  do {                                                                                         \
    size_t free_ = 0, total_ = 0;                                                              \
    llmpi::cuda_mem_info(&free_, &total_);                                                     \
    if (free_ < (bytes))                                                                       \
      GTEST_SKIP() << "not enough GPU memory: needs " << (bytes) / 1e9 << " GB, " << free_ / 1e9 \
                   << " GB free";                                                              \
  } while (0)

// Switches the named unverified CUDA paths off (backend/cuda_ops.h "Paths") for the scope, on top
// of LLMPI_CUDA_OFF's list ("" adds none; with replace, the list is exactly `list`: "" turns every
// path on), and restores the list after. Tests of our kernels keep cuDNN's attention off so that
// they test them; cuDNN's tests turn it on.
struct ScopedCudaPathsOff {
  std::string saved;
  explicit ScopedCudaPathsOff(const std::string& list, bool replace = false) {
    saved = cuda_set_paths_off("");
    cuda_set_paths_off(replace ? list : saved + "," + list);
  }
  ~ScopedCudaPathsOff() { cuda_set_paths_off(saved); }
  ScopedCudaPathsOff(const ScopedCudaPathsOff&) = delete;
  ScopedCudaPathsOff& operator=(const ScopedCudaPathsOff&) = delete;
};

inline const Ops& gpu() { return cuda_ops(); }
inline const Ops& cpu() { return cpu_ops(); }

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();

// A device buffer of the CUDA backend, filled from / read back to host vectors.
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : p(gpu().alloc(b)), bytes(b) {}
  template <typename T>
  explicit Dev(const std::vector<T>& h) : Dev(h.size() * sizeof(T)) {
    gpu().copy_to_device(p, h.data(), bytes);
  }
  ~Dev() { gpu().free(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  float* f() { return static_cast<float*>(p); }
  int32_t* i() { return static_cast<int32_t*>(p); }
  std::vector<float> get() const {
    std::vector<float> h(bytes / sizeof(float));
    gpu().copy_to_host(h.data(), p, bytes);
    return h;
  }
};

// n NaNs: outputs are poisoned with them, so an element a kernel forgets to write fails.
inline std::vector<float> nans(size_t n) { return std::vector<float>(n, kNaN); }

// ‖a − ref‖/‖ref‖ for float vectors.
inline double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  return rel_err(a, to_double(ref));
}

// The parts an op added to buffers that started at `before` (backward ops add, op_list.h).
inline std::vector<float> added(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> d(after.size());
  for (size_t k = 0; k < after.size(); k++) d[k] = after[k] - before[k];
  return d;
}

inline bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// "" when a and b hold the same bits, else where and how many elements differ (EXPECT_EQ on
// vectors of millions of floats would print them all).
inline std::string bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size())
    return "sizes differ: " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  size_t first = a.size(), count = 0;
  for (size_t i = 0; i < a.size(); i++)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (count++ == 0) first = i;
    }
  if (count == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu of %zu elements differ, the first at %zu: %.9g vs %.9g", count,
                a.size(), first, a[first], b[first]);
  return buf;
}
#define EXPECT_SAME_BITS(a, b) EXPECT_EQ(llmpi::test::bit_difference((a), (b)), "")

// The bf16 bits of each value (backend/bf16.h: round to nearest even).
inline std::vector<uint16_t> host_bits(const std::vector<float>& w) {
  std::vector<uint16_t> b(w.size());
  for (size_t i = 0; i < w.size(); i++) b[i] = float_to_bf16_bits(w[i]);
  return b;
}

// A row-major [rows, cols] matrix as rows of ld >= cols values, the padding `fill` (a padded row
// stride: GemmMode::out_ld / dout_ld, the LM head's logits); unpad_rows undoes it.
template <typename T>
std::vector<T> pad_rows(const std::vector<T>& a, int rows, int cols, int ld, T fill) {
  std::vector<T> p(static_cast<size_t>(rows) * ld, fill);
  for (int r = 0; r < rows; r++)
    std::memcpy(&p[static_cast<size_t>(r) * ld], &a[static_cast<size_t>(r) * cols], sizeof(T) * cols);
  return p;
}
template <typename T>
std::vector<T> unpad_rows(const std::vector<T>& p, int rows, int cols, int ld) {
  std::vector<T> a(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; r++)
    std::memcpy(&a[static_cast<size_t>(r) * cols], &p[static_cast<size_t>(r) * ld], sizeof(T) * cols);
  return a;
}
// The padding columns of p (rows of ld values, cols used), row by row.
template <typename T>
std::vector<T> padding_of(const std::vector<T>& p, int rows, int cols, int ld) {
  std::vector<T> out;
  for (int r = 0; r < rows; r++)
    out.insert(out.end(), p.begin() + static_cast<size_t>(r) * ld + cols, p.begin() + static_cast<size_t>(r + 1) * ld);
  return out;
}

}  // namespace llmpi::test
