// runtime.precision (backend/gemm_precision.h) on the CPU backend, the oracle:
//  - the bf16 rounding helper (backend/bf16.h) on known bit patterns: exact values, ties to even
//    both ways, carries into the exponent, overflow to inf, inf, NaN (canonical 0x7FFF, never inf),
//    subnormals and zeros; against a double-precision nearest-even reference on random floats;
//  - matmul_forward / matmul_backward in bf16, on the emulation (runtime.cpu_bf16_gemm "emulate";
//    oneDNN's engine: test_cpu_bf16_gemm.cpp), equal fp32 sgemm on operands rounded beforehand, bit
//    for bit (the same sgemm calls on the same values: the same operations in the same order), and
//    differ from fp32 (the mode is applied) by no more than the operands' rounding can (derived
//    beside the check); the backward still adds into its gradients (within
//    the rounding of two summation orders, derived beside the check); dbias is the fp32 column sum
//    of the unrounded dout; the split calls (dinp alone, then dweight and dbias alone, as zb-h1
//    makes them) equal the fused call bit for bit;
//  - tf32 is refused on the CPU (the op and the Model) with an error naming the fix;
//  - every family (gpt2, llama with grouped K/V heads, bert): 20 AdamW steps in bf16 follow the
//    fp32 losses within 1e-2 relative at every step, and are not bit-identical to them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "backend/bf16.h"
#include "backend/cpu/onednn_gemm.h"
#include "backend/ops.h"
#include "grad_check.h"
#include "model_test_util.h"
#include "runtime/error.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

}  // namespace

// ---- the rounding helper ------------------------------------------------------------------------------
// Exact throughout: bit patterns against the nearest-even rule, computed independently.

TEST(Bf16Rounding, KnownBitPatterns) {
  struct Case {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
  const Case cases[] = {
      {0x3F800000u, 0x3F80, "1.0, exact"},
      {0x3F807FFFu, 0x3F80, "just below the halfway point: down"},
      {0x3F808000u, 0x3F80, "tie, even neighbour below: down"},
      {0x3F808001u, 0x3F81, "just above the halfway point: up"},
      {0x3F818000u, 0x3F82, "tie, odd neighbour below: up to even"},
      {0xBF818000u, 0xBF82, "negative tie: magnitude rounds the same way"},
      {0x3FFF8000u, 0x4000, "tie at the top of a binade: carries into the exponent (2.0)"},
      {0x7F7F7FFFu, 0x7F7F, "below the largest finite bf16's halfway point"},
      {0x7F7FFFFFu, 0x7F80, "FLT_MAX rounds to +inf"},
      {0xFF7FFFFFu, 0xFF80, "-FLT_MAX rounds to -inf"},
      {0x7F800000u, 0x7F80, "+inf"},
      {0xFF800000u, 0xFF80, "-inf"},
      {0x7FC00000u, 0x7FFF, "quiet NaN: canonical"},
      {0x7F800001u, 0x7FFF, "signalling NaN with a low payload: NaN, not inf"},
      {0xFFFFFFFFu, 0x7FFF, "negative NaN: canonical"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x00000001u, 0x0000, "smallest subnormal: rounds to 0"},
      {0x00008000u, 0x0000, "subnormal tie, even neighbour: 0"},
      {0x00018000u, 0x0002, "subnormal tie, odd neighbour: up"},
      {0x00008001u, 0x0001, "subnormal above the halfway point: smallest bf16 subnormal"},
      {0x007FFFFFu, 0x0080, "largest subnormal: up to the smallest normal"},
      {0x80018000u, 0x8002, "negative subnormal tie"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_bf16_bits(from_bits(c.in)), c.out) << c.what << std::hex << " (0x" << c.in << ")";
    if (c.out != 0x7FFF) {
      EXPECT_EQ(to_bits(round_to_bf16(from_bits(c.in))), static_cast<uint32_t>(c.out) << 16);
    }
  }
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Bf16Rounding, EveryBf16ValueIsAFixedPoint) {
  for (uint32_t b = 0; b < 65536; b++) {
    const float x = bf16_bits_to_float(static_cast<uint16_t>(b));
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_bf16_bits(x), b) << std::hex << b;
  }
}

// The nearest bf16 in double arithmetic (ties to the even mantissa), for finite x below the
// overflow threshold: the two bf16 neighbours are the truncation t and t + 1 ulp.
TEST(Bf16Rounding, MatchesNearestEvenInDouble) {
  const auto v = random_floats(200000, 7, -3.0f, 3.0f);
  int ties = 0;
  for (size_t i = 0; i < v.size(); i++) {
    // spread the values over many binades, and force some exact ties
    float x = std::ldexp(v[i], static_cast<int>(i % 200) - 140);
    if (i % 7 == 0) x = from_bits((to_bits(x) & 0xFFFF0000u) | 0x8000u);
    const uint32_t u = to_bits(x);
    const uint16_t lo = static_cast<uint16_t>(u >> 16), hi = static_cast<uint16_t>(lo + 1);
    const double dx = x, dlo = bf16_bits_to_float(lo), dhi = bf16_bits_to_float(hi);
    const double elo = std::fabs(dx - dlo), ehi = std::fabs(dx - dhi);
    uint16_t want = elo < ehi ? lo : ehi < elo ? hi : (lo & 1) ? hi : lo;
    if (elo == ehi) ties++;
    ASSERT_EQ(float_to_bf16_bits(x), want) << std::hex << u;
  }
  EXPECT_GT(ties, 20000);
}

// ---- the dense layer ----------------------------------------------------------------------------------

namespace {
struct Shape {
  int N, C, OC;
};
// Small ones run as one sgemm; the last is big enough (> 4 MFLOP) to be cut into tiles when
// OpenBLAS may use several threads.
const Shape kShapes[] = {{7, 5, 3}, {37, 70, 53}, {256, 96, 160}};
}  // namespace

TEST(MatmulPrecision, Bf16ForwardIsSgemmOnRoundedOperands) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  for (const Shape& s : kShapes) {
    const auto x = random_floats((size_t)s.N * s.C, 1), w = random_floats((size_t)s.OC * s.C, 2),
               b = random_floats(s.OC, 3);
    for (bool bias : {true, false}) {
      std::vector<float> got((size_t)s.N * s.OC, NAN), want(got.size(), NAN), full(got.size(), NAN);
      const float* bp = bias ? b.data() : nullptr;
      cpu_ops().matmul_forward(got.data(), x.data(), w.data(), bp, s.N, s.C, s.OC, GemmPrecision::bf16);
      const auto xr = rounded(x), wr = rounded(w);
      cpu_ops().matmul_forward(want.data(), xr.data(), wr.data(), bp, s.N, s.C, s.OC, GemmPrecision::fp32);
      cpu_ops().matmul_forward(full.data(), x.data(), w.data(), bp, s.N, s.C, s.OC, GemmPrecision::fp32);
      // Exact: the emulation is this sgemm call on the operands rounded beforehand.
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << s.N << " bias " << bias;
      // Exact: without the rounding it would be the fp32 call on the same values, bit for bit.
      EXPECT_NE(0, std::memcmp(got.data(), full.data(), got.size() * sizeof(float))) << "bf16 equals fp32: the mode is not applied";
      // Bound: a product of two operands each within 2^-8 of itself (relatively) is within
      // 2·2^-8 + 2^-16 of the exact product; each side sums its C products (and the bias) in fp32,
      // within gamma_C of their magnitudes; so the two are within the sum of those.
      std::vector<double> bound(got.size());
      for (int n = 0; n < s.N; n++)
        for (int o = 0; o < s.OC; o++) {
          double m = 0.0, mr = 0.0;
          for (int c = 0; c < s.C; c++) {
            m += std::fabs(static_cast<double>(x[(size_t)n * s.C + c]) * w[(size_t)o * s.C + c]);
            mr += std::fabs(static_cast<double>(xr[(size_t)n * s.C + c]) * wr[(size_t)o * s.C + c]);
          }
          const double b = bias ? std::fabs(bp[o]) : 0.0;
          bound[(size_t)n * s.OC + o] =
              (2 * kUnitBf16 + kUnitBf16 * kUnitBf16) * m + gamma_n(s.C) * (m + b) + gamma_n(s.C) * (mr + b);
        }
      EXPECT_TRUE(within_bound(got, to_double(full), bound, "bf16 against fp32, N " + std::to_string(s.N)));
    }
  }
}

TEST(MatmulPrecision, Bf16BackwardIsSgemmOnRoundedOperandsAndAdds) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  for (const Shape& s : kShapes) {
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    const auto x = random_floats(nx, 4), w = random_floats(nw, 5), dout = random_floats(nd, 6);
    // gradients start non-zero: the backward adds
    const auto dx0 = random_floats(nx, 7), dw0 = random_floats(nw, 8), db0 = random_floats(s.OC, 9);
    auto dx = dx0, dw = dw0, db = db0;
    cpu_ops().matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                              GemmPrecision::bf16);
    // Exact: the same adds in fp32 on operands rounded beforehand (the same sgemm calls), except
    // dbias: the unrounded dout
    const auto xr = rounded(x), wr = rounded(w), doutr = rounded(dout);
    auto ex = dx0, ew = dw0, eb = db0;
    cpu_ops().matmul_backward(ex.data(), ew.data(), nullptr, doutr.data(), xr.data(), wr.data(), s.N, s.C, s.OC,
                              GemmPrecision::fp32);
    cpu_ops().matmul_backward(nullptr, nullptr, eb.data(), dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                              GemmPrecision::fp32);
    EXPECT_EQ(dx, ex) << s.N;
    EXPECT_EQ(dw, ew) << s.N;
    EXPECT_EQ(db, eb) << s.N;
    // the added parts are not the fp32 ones (Exact: unrounded, they would be the same calls' bits);
    // dbias is (Exact: the same column-sum loop)
    auto fx = dx0, fw = dw0, fb = db0;
    cpu_ops().matmul_backward(fx.data(), fw.data(), fb.data(), dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                              GemmPrecision::fp32);
    EXPECT_NE(dx, fx);
    EXPECT_NE(dw, fw);
    EXPECT_EQ(db, fb) << "dbias is an fp32 sum in every mode";
    // and they were added to the initial values, not written over them: dx = dx0 + dout·W up to
    // rounding. sgemm with beta 1 may add C at any point of its sum (before, between or after its
    // K blocks, as the kernel OpenBLAS picks for the CPU does), so the two sides are two orders of
    // one sum of OC + 1 terms, each within gamma(OC + 1) * sum|terms| of the exact value (Higham,
    // "Accuracy and Stability of Numerical Algorithms", 3.1; the products of bf16 values are exact
    // in fp32). Written over, dx would miss dx0, whose values are of order 1.
    std::vector<float> zero_x(nx, 0.0f);
    cpu_ops().matmul_backward(zero_x.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), s.N, s.C, s.OC,
                              GemmPrecision::bf16);
    const double u = std::ldexp(1.0, -24), gamma = (s.OC + 1) * u / (1 - (s.OC + 1) * u);
    for (int n = 0; n < s.N; n++)
      for (int c = 0; c < s.C; c++) {
        const size_t k = (size_t)n * s.C + c;
        double magnitude = std::fabs(dx0[k]);
        for (int o = 0; o < s.OC; o++) magnitude += std::fabs((double)doutr[(size_t)n * s.OC + o] * wr[(size_t)o * s.C + c]);
        const double only = (double)dx0[k] + zero_x[k];
        ASSERT_LE(std::fabs(dx[k] - only), 2 * gamma * magnitude + std::fabs(only) * u)
            << s.N << " x " << s.C << ": dx[" << k << "] = " << dx[k] << ", dx0 + dout·W = " << only;
      }
  }
}

// zb-h1's split: the input gradient alone (inp not read), then the weight and bias gradients alone
// (weight not read), equal one fused call bit for bit in bf16 too (Exact: the same sgemm calls on
// the same rounded operands, the outputs independent).
TEST(MatmulPrecision, Bf16SplitBackwardEqualsFusedCall) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  for (const Shape& s : kShapes) {
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    const auto x = random_floats(nx, 10), w = random_floats(nw, 11), dout = random_floats(nd, 12);
    const auto dx0 = random_floats(nx, 13), dw0 = random_floats(nw, 14), db0 = random_floats(s.OC, 15);
    auto dx1 = dx0, dw1 = dw0, db1 = db0, dx2 = dx0, dw2 = dw0, db2 = db0;
    cpu_ops().matmul_backward(dx1.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                              GemmPrecision::bf16);
    cpu_ops().matmul_backward(dx2.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), s.N, s.C, s.OC,
                              GemmPrecision::bf16);
    EXPECT_EQ(dw2, dw0);
    EXPECT_EQ(db2, db0);
    cpu_ops().matmul_backward(nullptr, dw2.data(), db2.data(), dout.data(), x.data(), nullptr, s.N, s.C, s.OC,
                              GemmPrecision::bf16);
    EXPECT_EQ(dx1, dx2);
    EXPECT_EQ(dw1, dw2);
    EXPECT_EQ(db1, db2);
  }
}

TEST(MatmulPrecision, Tf32IsRefusedOnTheCpu) {
  std::vector<float> x(6, 1.0f), w(6, 1.0f), out(4);
  auto expect_refusal = [](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("\"tf32\" is a CUDA tensor-core mode; use \"fp32\" or \"bf16\""),
                std::string::npos)
          << e.what();
    }
  };
  expect_refusal([&] { cpu_ops().matmul_forward(out.data(), x.data(), w.data(), nullptr, 2, 3, 2, GemmPrecision::tf32); },
                 "matmul_forward");
  expect_refusal(
      [&] {
        cpu_ops().matmul_backward(x.data(), w.data(), nullptr, out.data(), x.data(), w.data(), 2, 3, 2,
                                  GemmPrecision::tf32);
      },
      "matmul_backward");
  const ModelDesc d = desc_of("gpt2", 1, 2, 8, 4, 16);
  expect_refusal([&] { Model m(d, cpu_ops(), ModelPart::whole(), GemmPrecision::tf32); }, "Model");
}

TEST(MatmulPrecision, NamesParse) {
  GemmPrecision p = GemmPrecision::fp32;
  for (GemmPrecision q : {GemmPrecision::fp32, GemmPrecision::tf32, GemmPrecision::bf16}) {
    ASSERT_TRUE(parse_gemm_precision(gemm_precision_name(q), &p));
    EXPECT_EQ(p, q);
  }
  EXPECT_FALSE(parse_gemm_precision("fp16", &p));
  EXPECT_FALSE(parse_gemm_precision("BF16", &p));
}

// ---- training ------------------------------------------------------------------------------------------

namespace {

struct PrecisionFamily {
  const char* name;
  const char* family;
  std::vector<std::string> extra;
};
std::ostream& operator<<(std::ostream& os, const PrecisionFamily& c) { return os << c.name; }

const PrecisionFamily kFamilies[] = {
    {"gpt2", "gpt2", {}},
    {"llama_gqa", "llama", {"model.n_kv_head=1"}},
    {"bert", "bert", {"model.num_labels=3"}},
};

class PrecisionTraining : public ::testing::TestWithParam<PrecisionFamily> {};

}  // namespace

// Bound: at one step a bf16 model's loss differs from the fp32 one's at the same parameters by
// about the operands' rounding, 2u_bf = 2^-7 of each product (a mean of positive terms: of the
// loss); over 20 AdamW steps the parameters drift apart as well, which no rounding bound follows:
// 1e-2 ≈ 2.6 u_bf at every step is the project's bf16 tolerance (docs/PRECISION.md).
TEST_P(PrecisionTraining, Bf16FollowsFp32LossesWithin1e2) {
  const PrecisionFamily& c = GetParam();
  const ModelDesc d = desc_of(c.family, 2, 2, 32, 16, 64, c.extra);
  const int steps = 20;
  const auto f32 = training_losses(d, GemmPrecision::fp32, steps);
  const auto b16 = training_losses(d, GemmPrecision::bf16, steps);
  const test::CurveGap gap = test::curve_gap(f32, b16);
  for (int s = 0; s < steps; s++)
    EXPECT_LT(gap.per_step[s], 1e-2) << c.name << " step " << s + 1 << ": bf16 " << b16[s] << " vs fp32 " << f32[s];
  std::printf("%s: losses %.4f -> %.4f (fp32), %.4f -> %.4f (bf16); largest relative gap %.2e\n", c.name, f32[0],
              f32.back(), b16[0], b16.back(), gap.worst);
  // Exact: without the rounding the two runs would be the same calls, bit for bit.
  EXPECT_FALSE(gap.identical) << "bf16 training is bit-identical to fp32: the mode is not applied";
  EXPECT_LT(f32.back(), f32.front()) << "no progress; the comparison means little";
}

INSTANTIATE_TEST_SUITE_P(Families, PrecisionTraining, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<PrecisionFamily>& i) { return std::string(i.param.name); });
