// Device pages (backend/cuda_ops.h "Device pages", kernels/device_pages.cu): device memory backed
// chunk by chunk where it is used, ZeRO-2's gradient on a GPU.
//  - backing a range backs the chunks it touches, zeroed; what is written there reads back;
//  - a release zeroes the bytes of chunks partly inside it and gives back the chunks wholly inside
//    once the stream that reads them has passed; backed again, they read as zero;
//  - a chunk taken back while its release is in flight reads as zero, not as what it held;
//  - with a limit the host waits for releases in flight instead of backing past it: the peak stays
//    at the limit.
// On the simulated card (make test-cuda) a chunk not backed has no access at all, so a kernel that
// touched one would fault. Skipped without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda_ops.h"
#include "cuda_test_util.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

std::vector<float> read(const char* p, size_t offset, size_t floats) {
  std::vector<float> h(floats);
  gpu().copy_to_host(h.data(), p + offset, floats * sizeof(float));
  return h;
}

bool all_are(const std::vector<float>& v, float x) {
  for (float f : v)
    if (f != x) return false;
  return true;
}

TEST(CudaPages, BackReleaseAndBackAgain) {
  REQUIRE_GPU();
  char* p = static_cast<char*>(cuda_pages_reserve(5 * (size_t(2) << 20)));
  const size_t c = cuda_pages_chunk(p);
  ASSERT_GT(c, 0u);
  EXPECT_EQ(cuda_pages_backed(p), 0u);
  // [c/2, 2c + c/2): chunks 0, 1 and 2
  const size_t lo = c / 2, hi = 2 * c + c / 2, n = (hi - lo) / sizeof(float);
  cuda_pages_back(p, lo, hi - lo);
  EXPECT_EQ(cuda_pages_backed(p), 3 * c);
  EXPECT_TRUE(all_are(read(p, lo, n), 0.0f)) << "newly backed memory reads as zero";
  std::vector<float> ones(n, 1.0f);
  gpu().copy_to_device(p + lo, ones.data(), n * sizeof(float));
  // release [3c/4, 2c + c/4): chunk 1 wholly, chunks 0 and 2 in part
  const size_t rlo = 3 * c / 4, rhi = 2 * c + c / 4;
  cuda_pages_release(p, rlo, rhi - rlo, nullptr);
  cuda_synchronize();
  EXPECT_EQ(cuda_pages_backed(p), 2 * c) << "the chunk wholly inside is given back";
  EXPECT_TRUE(all_are(read(p, lo, (rlo - lo) / sizeof(float)), 1.0f)) << "before the release: kept";
  EXPECT_TRUE(all_are(read(p, rlo, (c - rlo) / sizeof(float)), 0.0f)) << "the released part of chunk 0";
  EXPECT_TRUE(all_are(read(p, 2 * c, (rhi - 2 * c) / sizeof(float)), 0.0f)) << "the released part of chunk 2";
  EXPECT_TRUE(all_are(read(p, rhi, (hi - rhi) / sizeof(float)), 1.0f)) << "after the release: kept";
  cuda_pages_back(p, c, c);
  EXPECT_TRUE(all_are(read(p, c, c / sizeof(float)), 0.0f)) << "backed again: zero";
  EXPECT_EQ(cuda_pages_peak(p), 3 * c);
  cuda_pages_free(p);
}

TEST(CudaPages, TakenBackInFlightReadsZero) {
  REQUIRE_GPU();
  char* p = static_cast<char*>(cuda_pages_reserve(2 * (size_t(2) << 20)));
  const size_t c = cuda_pages_chunk(p);
  cuda_pages_back(p, 0, c);
  std::vector<float> twos(c / sizeof(float), 2.0f);
  gpu().copy_to_device(p, twos.data(), c);
  cuda_pages_release(p, 0, c, nullptr);
  cuda_pages_back(p, 0, c);  // before anything waited for the release
  EXPECT_TRUE(all_are(read(p, 0, c / sizeof(float)), 0.0f));
  EXPECT_EQ(cuda_pages_backed(p), c);
  cuda_pages_free(p);
}

TEST(CudaPages, LimitHoldsThePeak) {
  REQUIRE_GPU();
  char* p = static_cast<char*>(cuda_pages_reserve(8 * (size_t(2) << 20)));
  const size_t c = cuda_pages_chunk(p);
  cuda_pages_limit(p, 2 * c);
  for (size_t k = 0; k < 8; k++) {  // a bucket a chunk, backed and released in turn, the host not
    cuda_pages_back(p, k * c, c);    // waiting for the card: the limit makes it wait
    cuda_pages_release(p, k * c, c, nullptr);
  }
  EXPECT_LE(cuda_pages_peak(p), 2 * c);
  cuda_synchronize();
  EXPECT_EQ(cuda_pages_backed(p), 0u);
  cuda_pages_free(p);
}

}  // namespace
