// The tensor-core instructions under the fused attention, on the card itself
// (kernels/mma_sync.cuh through backend/cuda_ops.h cuda_mma_probe / cuda_round_tf32). The CPU
// simulator (tools/cuda_cpu_sim) runs the attention kernels against the fragment layouts the PTX
// ISA documents; these tests check that the hardware uses those layouts and that cvt.rna rounds as
// backend/tf32.h does — so a failing CudaFlashBf16 case can be told apart from a wrong layout.
// Skipped without a GPU.
//
//   CudaMma.FragmentLayoutsGiveTheProduct   bf16 m16n8k16 and tf32 m16n8k8: random A, B (their
//       rounded values, so every product is exact in fp32) through the documented layouts: D
//       equals A B summed in double within gamma_n(K + 1, 2^-23) of Σ|a||b| (K = 16 or 8 products
//       summed on the tensor cores, which truncate: cuda_test_util.h kUTc); a layout off by a lane
//       or a register half gives errors of order 1.
//   CudaMma.RoundTf32IsTheHostRounding      cvt.rna.tf32.f32 and round_to_tf32 give the same bits
//       for 2^20 random patterns and the edge cases (ties, carries, the largest finite values,
//       subnormals, ±0, ±inf, NaNs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/bf16.h"
#include "backend/cuda_ops.h"
#include "backend/tf32.h"
#include "cuda_test_util.h"

using namespace llmpi;
using namespace llmpi::test;

TEST(CudaMma, FragmentLayoutsGiveTheProduct) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (GemmPrecision prec : {GemmPrecision::bf16, GemmPrecision::tf32}) {
    SCOPED_TRACE(gemm_precision_name(prec));
    const int K = prec == GemmPrecision::bf16 ? 16 : 8;
    auto rnd = prec == GemmPrecision::bf16 ? round_to_bf16 : round_to_tf32;
    std::vector<float> A(16 * K), B(K * 8), D(16 * 8, std::nanf(""));
    for (float& x : A) x = rnd(dist(rng));
    for (float& x : B) x = rnd(dist(rng));
    cuda_mma_probe(prec, A.data(), B.data(), D.data());
    std::vector<double> exact(16 * 8), mag(16 * 8);
    for (int m = 0; m < 16; m++)
      for (int n = 0; n < 8; n++) {
        double s = 0.0, a = 0.0;
        for (int k = 0; k < K; k++) {
          s += static_cast<double>(A[m * K + k]) * B[k * 8 + n];
          a += std::fabs(static_cast<double>(A[m * K + k]) * B[k * 8 + n]);
        }
        ASSERT_TRUE(std::isfinite(D[m * 8 + n])) << "D[" << m << "][" << n << "] not written";
        exact[m * 8 + n] = s, mag[m * 8 + n] = a;
      }
    // Bound: exact products, K of them (and the zero accumulator) added on the tensor cores
    const double err = rel_to_magnitude(D, exact, mag);
    std::printf("%s mma: D vs A B %.2e of the magnitude (bound %.2e)\n", gemm_precision_name(prec), err,
                gamma_n(K + 1, kUTc));
    EXPECT_LT(err, gamma_n(K + 1, kUTc)) << "the fragment layouts of kernels/mma_sync.cuh are not the hardware's";
  }
}

TEST(CudaMma, RoundTf32IsTheHostRounding) {
  REQUIRE_GPU();
  std::vector<uint32_t> pats = {0x00000000u, 0x80000000u, 0x00000001u, 0x00001000u, 0x00001fffu, 0x007fffffu,
                                0x3F800FFFu, 0x3F801000u, 0xBF801000u, 0x3F803000u, 0x3FFFF000u, 0x7F7FEFFFu,
                                0x7F7FF000u, 0xFF7FF000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u,
                                0xFFC00001u, 0x7F802000u};
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 20); i++) pats.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> in(pats.size()), out(pats.size());
  for (size_t i = 0; i < pats.size(); i++) in[i] = from_bits(pats[i]);
  cuda_round_tf32(in.data(), out.data(), in.size());
  size_t differ = 0;  // Exact: cvt.rna.tf32.f32 and round_to_tf32 are one function (nearest, ties away)
  for (size_t i = 0; i < in.size(); i++) {
    const uint32_t want = to_bits(round_to_tf32(in[i])), got = to_bits(out[i]);
    if (want != got && differ++ < 8)
      ADD_FAILURE() << std::hex << "0x" << pats[i] << ": device 0x" << got << ", host 0x" << want;
  }
  EXPECT_EQ(differ, 0u) << "of " << in.size() << " patterns";
}
