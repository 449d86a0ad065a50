// The CPU's fp32 GEMM engines (backend/cpu/onednn_gemm.h, runtime.cpu_fp32_gemm): oneDNN's fp32
// matmul against OpenBLAS sgemm. Both are fp32 products with fp32 sums; only the order of the sums
// differs, so they agree to a few fp32 roundings, far tighter than the fp32 CPU-against-CUDA bounds.
//  - selection: the names parse; "openblas" selects sgemm and says so; "auto" selects what
//    cpu_fp32_gemm_for_auto() says (sgemm where oneDNN cannot run, saying why); "onednn" where it
//    cannot run is refused with the fix; the scoped
//    selection restores what it found; the configuration key is validated;
//  - per op, oneDNN against sgemm within 1e-6 norm-wise: matmul_forward and matmul_backward for
//    shapes from tiny to tiled, with and without bias, padded output / output-gradient rows; the
//    backward adds; padding columns untouched; the same bits run to run; not sgemm's bits
//    everywhere (oneDNN ran);
//  - one family (gpt2): 20 AdamW steps within 1e-5 of sgemm's loss curve (measured identical: on
//    this tiny model's sums of at most 128 terms oneDNN adds in sgemm's order; the op cases above
//    are where the orders differ).
// The oneDNN cases skip, saying why, where oneDNN cannot run (a build without it).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/onednn_gemm.h"
#include "backend/ops.h"
#include "cpu_gemm_test_util.h"
#include "grad_check.h"
#include "model_test_util.h"
#include "runtime/config.h"
#include "runtime/error.h"

using namespace llmpi;
using namespace llmpi::test;
using cpu::ScopedCpuFp32Gemm;

namespace {

#define REQUIRE_ONEDNN_FP32()                                        \
  do {                                                               \
    std::string why;                                                 \
    if (!cpu::onednn_fp32_available(&why)) GTEST_SKIP() << why;      \
  } while (0)

}  // namespace

// ---- selection -----------------------------------------------------------------------------------------

TEST(CpuFp32Gemm, NamesParse) {
  CpuFp32Gemm e = CpuFp32Gemm::openblas;
  for (CpuFp32Gemm want : {CpuFp32Gemm::automatic, CpuFp32Gemm::onednn, CpuFp32Gemm::openblas}) {
    ASSERT_TRUE(parse_option(cpu_fp32_gemm_name(want), &e));
    EXPECT_EQ(e, want);
  }
  EXPECT_FALSE(parse_option("sgemm", &e));
  EXPECT_FALSE(parse_option("", &e));
}

TEST(CpuFp32Gemm, SelectionFollowsAvailabilityAndIsRestored) {
  std::string why;
  const bool have = cpu::onednn_fp32_available(&why);
  EXPECT_EQ(have, why.empty()) << why;
  const CpuFp32Gemm before = cpu::cpu_fp32_gemm();
  EXPECT_NE(before, CpuFp32Gemm::automatic);
  {
    ScopedCpuFp32Gemm s(CpuFp32Gemm::openblas);
    EXPECT_EQ(cpu::cpu_fp32_gemm(), CpuFp32Gemm::openblas);
    const std::string d = cpu::cpu_fp32_gemm_description();
    EXPECT_NE(d.find("OpenBLAS sgemm"), std::string::npos) << d;
    EXPECT_NE(d.find("\"openblas\""), std::string::npos) << d;
    {
      ScopedCpuFp32Gemm inner(CpuFp32Gemm::automatic);
      const CpuFp32Gemm resolved = cpu::cpu_fp32_gemm_for_auto();
      EXPECT_EQ(cpu::cpu_fp32_gemm(), resolved);
      if (!have) {
        EXPECT_EQ(resolved, CpuFp32Gemm::openblas);
      }
      const std::string da = cpu::cpu_fp32_gemm_description();
      if (resolved == CpuFp32Gemm::onednn) {
        EXPECT_NE(da.find("oneDNN"), std::string::npos) << da;
        EXPECT_NE(da.find("fp32 matmul"), std::string::npos) << da;
      } else {
        EXPECT_NE(da.find("OpenBLAS sgemm"), std::string::npos) << da;
        if (!have) {
          EXPECT_NE(da.find(why), std::string::npos) << da << " does not say why: " << why;
        }
      }
      if (have) {
        EXPECT_NE(da.find("\"auto\""), std::string::npos) << da;
      }
    }
    EXPECT_EQ(cpu::cpu_fp32_gemm(), CpuFp32Gemm::openblas);
  }
  EXPECT_EQ(cpu::cpu_fp32_gemm(), before);
  if (have) {
    ScopedCpuFp32Gemm s(CpuFp32Gemm::onednn);
    EXPECT_EQ(cpu::cpu_fp32_gemm(), CpuFp32Gemm::onednn);
  } else {
    try {
      cpu::select_cpu_fp32_gemm(CpuFp32Gemm::onednn);
      ADD_FAILURE() << "\"onednn\" selected where it cannot run (" << why << ")";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("runtime.cpu_fp32_gemm \"onednn\""), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
      EXPECT_NE(m.find("use \"auto\""), std::string::npos) << m;
      EXPECT_NE(m.find("\"openblas\""), std::string::npos) << m;
    }
    EXPECT_EQ(cpu::cpu_fp32_gemm(), before);
  }
}

TEST(CpuFp32Gemm, ConfigKeyIsValidated) {
  EXPECT_EQ(parse_config("{}", "test", {"data.train=-"}).runtime.cpu_fp32_gemm, CpuFp32Gemm::automatic);
  EXPECT_EQ(parse_config("{}", "test", {"data.train=-", "runtime.cpu_fp32_gemm=openblas"}).runtime.cpu_fp32_gemm,
            CpuFp32Gemm::openblas);
  try {
    parse_config("{}", "test", {"data.train=-", "runtime.cpu_fp32_gemm=mkl"});
    ADD_FAILURE() << "runtime.cpu_fp32_gemm=mkl accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'runtime.cpu_fp32_gemm' must be \"auto\", \"onednn\" or \"openblas\""),
              std::string::npos)
        << e.what();
  }
}

// ---- the dense layer against sgemm -----------------------------------------------------------------------

namespace {

struct Shape {
  int N, C, OC;
};
// The small ones run on one thread; the last two are big enough (> 4 MFLOP) for two.
const Shape kShapes[] = {{7, 5, 3}, {37, 70, 53}, {256, 96, 160}, {300, 128, 515}};
constexpr double kTol = 1e-6;  // two fp32 summation orders: a few fp32 roundings (6e-8 each) apart

// The results of one dense layer's forward and backward on the engine selected.
struct LayerResults {
  std::vector<float> out, dx, dw, db;
};

LayerResults run_layer(const Shape& s, int pad, bool bias, CpuFp32Gemm engine) {
  ScopedCpuFp32Gemm e(engine);
  GemmMode g(GemmPrecision::fp32);
  g.out_ld = g.dout_ld = s.OC + pad;
  const auto x = random_floats(static_cast<size_t>(s.N) * s.C, 100), w = random_floats(static_cast<size_t>(s.OC) * s.C, 101),
             b = random_floats(s.OC, 102), dout = random_floats(static_cast<size_t>(s.N) * g.dout_ld, 103);
  LayerResults r;
  r.out.assign(static_cast<size_t>(s.N) * g.out_ld, 12345.0f);  // the padding columns must keep it
  r.dx = random_floats(x.size(), 104);
  r.dw = random_floats(w.size(), 105);
  r.db = random_floats(b.size(), 106);
  cpu_ops().matmul_forward(r.out.data(), x.data(), w.data(), bias ? b.data() : nullptr, s.N, s.C, s.OC, g);
  cpu_ops().matmul_backward(r.dx.data(), r.dw.data(), r.db.data(), dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                            g);
  return r;
}

}  // namespace

TEST(CpuFp32Gemm, ForwardAndBackwardMatchSgemm) {
  REQUIRE_ONEDNN_FP32();
  const GemmThreads threads(2, 2);
  bool some_bits_differ = false;
  for (const Shape& s : kShapes)
    for (int pad : {0, 3})
      for (bool bias : {true, false}) {
        const std::string where = "N " + std::to_string(s.N) + " C " + std::to_string(s.C) + " OC " +
                                  std::to_string(s.OC) + " pad " + std::to_string(pad) + " bias " + std::to_string(bias);
        const LayerResults ref = run_layer(s, pad, bias, CpuFp32Gemm::openblas);
        const LayerResults dnn = run_layer(s, pad, bias, CpuFp32Gemm::onednn);
        const LayerResults again = run_layer(s, pad, bias, CpuFp32Gemm::onednn);
        EXPECT_LT(rel_err(dnn.out, to_double(ref.out)), kTol) << where << ": forward";
        EXPECT_LT(rel_err(dnn.dx, to_double(ref.dx)), kTol) << where << ": dinp";
        EXPECT_LT(rel_err(dnn.dw, to_double(ref.dw)), kTol) << where << ": dweight";
        EXPECT_TRUE(same_float_bits(dnn.db, ref.db)) << where << ": dbias is the same column sum on either engine";
        EXPECT_TRUE(same_float_bits(dnn.out, again.out) && same_float_bits(dnn.dx, again.dx) && same_float_bits(dnn.dw, again.dw))
            << where << ": oneDNN's bits changed between two runs";
        some_bits_differ = some_bits_differ || !same_float_bits(dnn.out, ref.out) || !same_float_bits(dnn.dw, ref.dw);
        for (int n = 0; n < s.N; n++)
          for (int j = s.OC; j < s.OC + pad; j++)
            ASSERT_EQ(dnn.out[static_cast<size_t>(n) * (s.OC + pad) + j], 12345.0f) << where << ": padding";
      }
  EXPECT_TRUE(some_bits_differ) << "oneDNN's results are sgemm's bits everywhere: not run?";
}

// The backward adds into the gradients it is given: a second call adds the same again.
TEST(CpuFp32Gemm, BackwardAdds) {
  REQUIRE_ONEDNN_FP32();
  ScopedCpuFp32Gemm e(CpuFp32Gemm::onednn);
  const Shape s{64, 48, 80};
  const auto x = random_floats(static_cast<size_t>(s.N) * s.C, 1), w = random_floats(static_cast<size_t>(s.OC) * s.C, 2),
             dout = random_floats(static_cast<size_t>(s.N) * s.OC, 3);
  std::vector<float> dx1(x.size(), 0.0f), dw1(w.size(), 0.0f), dx2(x.size(), 0.0f), dw2(w.size(), 0.0f);
  cpu_ops().matmul_backward(dx1.data(), dw1.data(), nullptr, dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                            GemmPrecision::fp32);
  for (int k = 0; k < 2; k++)
    cpu_ops().matmul_backward(dx2.data(), dw2.data(), nullptr, dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                              GemmPrecision::fp32);
  std::vector<double> twice_dx(dx1.size()), twice_dw(dw1.size());
  for (size_t i = 0; i < dx1.size(); i++) twice_dx[i] = 2.0 * dx1[i];
  for (size_t i = 0; i < dw1.size(); i++) twice_dw[i] = 2.0 * dw1[i];
  EXPECT_LT(rel_err(dx2, twice_dx), kTol);
  EXPECT_LT(rel_err(dw2, twice_dw), kTol);
}

// ---- a model ------------------------------------------------------------------------------------------

TEST(CpuFp32Gemm, Gpt2TrainingFollowsSgemmLossCurve) {
  REQUIRE_ONEDNN_FP32();
  const ModelDesc d = desc_of("gpt2", 2, 2, 32, 16, 64);
  const int steps = 20;
  std::vector<float> blas, dnn;
  {
    ScopedCpuFp32Gemm e(CpuFp32Gemm::openblas);
    blas = training_losses(d, GemmPrecision::fp32, steps);
  }
  {
    ScopedCpuFp32Gemm e(CpuFp32Gemm::onednn);
    dnn = training_losses(d, GemmPrecision::fp32, steps);
  }
  const CurveGap gap = curve_gap(blas, dnn);
  for (int s = 0; s < steps; s++)
    EXPECT_LT(gap.per_step[s], 1e-5) << "step " << s + 1 << ": oneDNN " << dnn[s] << " vs sgemm " << blas[s];
  std::printf("gpt2: losses %.5f -> %.5f (sgemm), %.5f -> %.5f (oneDNN); largest relative gap %.2e\n", blas[0],
              blas.back(), dnn[0], dnn.back(), gap.worst);
  EXPECT_LT(blas.back(), blas.front()) << "no progress; the comparison means little";
}
