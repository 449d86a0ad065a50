// The CPU's fp32 GEMM engines (backend/cpu/onednn_gemm.h, runtime.cpu_fp32_gemm): oneDNN's fp32
// matmul against OpenBLAS sgemm. Both are fp32 products with fp32 sums; only the order of the sums
// differs, so each result is within 2 gamma_K of the magnitude of its K + 1 terms of the other.
//  - selection: the names parse; "openblas" selects sgemm and says so; "auto" selects what
//    cpu_fp32_gemm_for_auto() says (sgemm where oneDNN cannot run, saying why); "onednn" where it
//    cannot run is refused with the fix; the scoped
//    selection restores what it found; the configuration key is validated;
//  - per op, oneDNN against sgemm, element by element within two summation orders' bound:
//    matmul_forward and matmul_backward for
//    shapes from tiny to tiled, with and without bias, padded output / output-gradient rows; the
//    backward adds; padding columns untouched; the same bits run to run; not sgemm's bits
//    everywhere (oneDNN ran);
//  - one family (gpt2): 20 AdamW steps within 2 gamma_K of sgemm's loss curve, K = 128 the step's
//    longest sum (measured identical: on this tiny model's sums oneDNN adds in sgemm's order; the
//    op cases above are where the orders differ).
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
#include "mpi_test_data.h"
#include "ref_transformer.h"
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
// The results of one dense layer's forward and backward on the engine selected, and the bounds of
// two fp32 orders of each of their sums: 2 gamma_K times the magnitude of the sum's K + 1 terms
// (out: |b| + Σ_c |x w|, dx: |dx0| + Σ_o |dout w|, dw: |dw0| + Σ_n |dout x|).
struct LayerResults {
  std::vector<float> out, dx, dw, db;
  std::vector<double> out_bound, dx_bound, dw_bound;
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
  r.out_bound.assign(static_cast<size_t>(s.N) * s.OC, 0.0);
  r.dx_bound.assign(r.dx.size(), 0.0);
  r.dw_bound.assign(r.dw.size(), 0.0);
  for (size_t i = 0; i < r.dx.size(); i++) r.dx_bound[i] = std::fabs(r.dx[i]);  // (the initial values)
  for (size_t i = 0; i < r.dw.size(); i++) r.dw_bound[i] = std::fabs(r.dw[i]);
  for (int n = 0; n < s.N; n++)
    for (int o = 0; o < s.OC; o++) {
      double acc = bias ? std::fabs(b[o]) : 0.0;
      const double d = std::fabs(dout[static_cast<size_t>(n) * g.dout_ld + o]);
      for (int c = 0; c < s.C; c++) {
        const double xv = std::fabs(x[static_cast<size_t>(n) * s.C + c]), wv = std::fabs(w[static_cast<size_t>(o) * s.C + c]);
        acc += xv * wv;
        r.dx_bound[static_cast<size_t>(n) * s.C + c] += d * wv;
        r.dw_bound[static_cast<size_t>(o) * s.C + c] += d * xv;
      }
      r.out_bound[static_cast<size_t>(n) * s.OC + o] = 2.0 * gamma_n(s.C) * acc;
    }
  for (double& v : r.dx_bound) v *= 2.0 * gamma_n(s.OC);
  for (double& v : r.dw_bound) v *= 2.0 * gamma_n(s.N);
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
        // Bound: two fp32 orders of the same sums (run_layer's bounds); the padding of out is the
        // sentinel on both sides.
        std::vector<double> out_bound(dnn.out.size(), 0.0);
        for (int n = 0; n < s.N; n++)
          for (int o = 0; o < s.OC; o++)
            out_bound[static_cast<size_t>(n) * (s.OC + pad) + o] = ref.out_bound[static_cast<size_t>(n) * s.OC + o];
        EXPECT_TRUE(within_bound(dnn.out, to_double(ref.out), out_bound, where + ": forward"));
        EXPECT_TRUE(within_bound(dnn.dx, to_double(ref.dx), ref.dx_bound, where + ": dinp"));
        EXPECT_TRUE(within_bound(dnn.dw, to_double(ref.dw), ref.dw_bound, where + ": dweight"));
        // Exact: dbias is the same column-sum loop on either engine; oneDNN's kernels are
        // deterministic for a shape and thread count.
        EXPECT_TRUE(same_float_bits(dnn.db, ref.db)) << where << ": dbias is the same column sum on either engine";
        EXPECT_TRUE(same_float_bits(dnn.out, again.out) && same_float_bits(dnn.dx, again.dx) && same_float_bits(dnn.dw, again.dw))
            << where << ": oneDNN's bits changed between two runs";
        some_bits_differ = some_bits_differ || !same_float_bits(dnn.out, ref.out) || !same_float_bits(dnn.dw, ref.dw);
        for (int n = 0; n < s.N; n++)  // Exact: the padding is never written
          for (int j = s.OC; j < s.OC + pad; j++)
            ASSERT_EQ(dnn.out[static_cast<size_t>(n) * (s.OC + pad) + j], 12345.0f) << where << ": padding";
      }
  EXPECT_TRUE(some_bits_differ) << "oneDNN's results are sgemm's bits everywhere: not run?";
}

// The backward adds into the gradients it is given: a second call adds the same again. Bound:
// dx1 is a sum of OC products (dw1: N) from zero, within gamma_(OC−1) of their magnitude m of the
// exact g; dx2 sums the 2 OC products of both calls, within gamma_(2 OC−1) 2m of 2g; so
// |dx2 − 2 dx1| ≤ (2 gamma_(2 OC−1) + 2 gamma_(OC−1)) m.
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
  std::vector<double> twice_dx(dx1.size()), twice_dw(dw1.size()), mx(dx1.size(), 0.0), mw(dw1.size(), 0.0);
  for (size_t i = 0; i < dx1.size(); i++) twice_dx[i] = 2.0 * dx1[i];
  for (size_t i = 0; i < dw1.size(); i++) twice_dw[i] = 2.0 * dw1[i];
  for (int n = 0; n < s.N; n++)
    for (int o = 0; o < s.OC; o++)
      for (int c = 0; c < s.C; c++) {
        const double d = std::fabs(dout[static_cast<size_t>(n) * s.OC + o]);
        mx[static_cast<size_t>(n) * s.C + c] += d * std::fabs(w[static_cast<size_t>(o) * s.C + c]);
        mw[static_cast<size_t>(o) * s.C + c] += d * std::fabs(x[static_cast<size_t>(n) * s.C + c]);
      }
  for (double& v : mx) v *= 2.0 * gamma_n(2 * s.OC - 1) + 2.0 * gamma_n(s.OC - 1);
  for (double& v : mw) v *= 2.0 * gamma_n(2 * s.N - 1) + 2.0 * gamma_n(s.N - 1);
  EXPECT_TRUE(within_bound(dx2, twice_dx, mx, "dx"));
  EXPECT_TRUE(within_bound(dw2, twice_dw, mw, "dw"));
}

// ---- a model ------------------------------------------------------------------------------------------

// Bound (mpi_test_data.h "How far apart two runs of the same training may be", first order in the
// rounding): at the same parameters the two engines' losses (a mean of positive terms) are within
// 2 gamma_K of it, K the step's longest sum (ref_transformer.h longest_sum: 128); their gradient
// elements differ by delta = 2 gamma_K sqrt(K) of their size, which moves each AdamW step (lr 3e-3)
// by at most 2 delta lr, so after s steps each parameter by dp = 2 delta lr s, and the loss by
// 3 |grad L| dp <= 3 · 1.2 L dp more: 8.6e-5 at step 20.
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
  const double K = longest_sum(d, 4, 16), delta = 2.0 * gamma_n(K) * std::sqrt(K), lr = 3e-3;
  for (int s = 0; s < steps; s++) {
    // (the loss of step s + 1 is taken at the parameters after s updates)
    const double bound = 2.0 * gamma_n(K) + 3 * testing_support::kGradNormPerLoss * 2 * delta * lr * s;
    EXPECT_LE(gap.per_step[s], bound) << "step " << s + 1 << ": oneDNN " << dnn[s] << " vs sgemm " << blas[s];
  }
  std::printf("gpt2: losses %.5f -> %.5f (sgemm), %.5f -> %.5f (oneDNN); largest relative gap %.2e\n", blas[0],
              blas.back(), dnn[0], dnn.back(), gap.worst);
  EXPECT_LT(blas.back(), blas.front()) << "no progress; the comparison means little";
}
