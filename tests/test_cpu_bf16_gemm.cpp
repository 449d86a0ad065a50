// The CPU's bf16 GEMM engines (backend/cpu/onednn_gemm.h, runtime.cpu_bf16_gemm): oneDNN's native
// bf16 matmul against the emulation, the oracle (operands rounded to bf16, fp32 sgemm).
//  - selection: the names parse; "emulate" selects the emulation and says so; "auto" selects oneDNN
//    exactly when it can run here; "onednn" where it cannot is refused with the fix; the scoped
//    selection restores what it found; the configuration key is validated;
//  - the GEMM itself, every transpose combination, beta 0 and 1, padded leading dimensions: within
//    fp32 accumulation's bound of a double-precision product of the bf16-rounded operands;
//  - per op, oneDNN against the emulation, element by element within two fp32 summation orders'
//    bound (the products of bf16 operands being exact in fp32): matmul_forward and matmul_backward for shapes
//    from tiny to tiled, with and without bias, padded output / output-gradient rows, operands
//    given as bf16 bits or only in fp32; the backward adds; padding columns untouched; not the
//    fp32 result (the mode is applied: further from it than fp32 rounding could take it); the split
//    backward equals the fused one bit for bit; the same bits run to run and for 1 and 2 OpenMP
//    threads (OpenBLAS's count, the GEMM's, fixed); 2 GEMM threads within two summation orders' bound
//    of 1;
//  - every family (gpt2, llama with grouped K/V heads, bert): the loss and every parameter's
//    gradient (norm-wise per tensor) within 2u_bf of the magnitude of what they sum (a flipped bf16
//    rounding's size) of the emulation's, and 20 AdamW steps within 1e-2 of the emulation's loss
//    curve (the project's bf16 curve tolerance); and that curve closer to the emulation's than the
//    emulation's is to fp32's (measured: 4-9x closer).
// The oneDNN cases skip, saying why, where oneDNN cannot run (a build without it, a CPU without
// bf16 instructions).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/bf16.h"
#include "backend/cpu/onednn_gemm.h"
#include "backend/ops.h"
#include "cpu_gemm_test_util.h"
#include "grad_check.h"
#include "model_test_util.h"
#include "ref_transformer.h"
#include "runtime/config.h"
#include "runtime/error.h"

using namespace llmpi;
using namespace llmpi::test;
using cpu::ScopedCpuBf16Gemm;

namespace {

#define REQUIRE_ONEDNN()                                             \
  do {                                                               \
    std::string why;                                                 \
    if (!cpu::onednn_bf16_available(&why)) GTEST_SKIP() << why;      \
  } while (0)

std::vector<uint16_t> bf16_bits_of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); i++) b[i] = float_to_bf16_bits(v[i]);
  return b;
}

// k · m_i for every i: a bound of k times the magnitudes m.
std::vector<double> times(double k, const std::vector<double>& m) {
  std::vector<double> b(m.size());
  for (size_t i = 0; i < m.size(); i++) b[i] = k * m[i];
  return b;
}

}  // namespace

// ---- selection -----------------------------------------------------------------------------------------

TEST(CpuBf16Gemm, NamesParse) {
  CpuBf16Gemm e = CpuBf16Gemm::emulate;
  for (CpuBf16Gemm want : {CpuBf16Gemm::automatic, CpuBf16Gemm::onednn, CpuBf16Gemm::emulate}) {
    ASSERT_TRUE(parse_option(cpu_bf16_gemm_name(want), &e));
    EXPECT_EQ(e, want);
  }
  EXPECT_FALSE(parse_option("oneDNN", &e));
  EXPECT_FALSE(parse_option("", &e));
}

TEST(CpuBf16Gemm, SelectionFollowsAvailabilityAndIsRestored) {
  std::string why;
  const bool have = cpu::onednn_bf16_available(&why);
  EXPECT_EQ(have, why.empty()) << why;
  const CpuBf16Gemm before = cpu::cpu_bf16_gemm();
  EXPECT_NE(before, CpuBf16Gemm::automatic);
  {
    ScopedCpuBf16Gemm s(CpuBf16Gemm::emulate);
    EXPECT_EQ(cpu::cpu_bf16_gemm(), CpuBf16Gemm::emulate);
    const std::string d = cpu::cpu_bf16_gemm_description();
    EXPECT_NE(d.find("emulated"), std::string::npos) << d;
    EXPECT_NE(d.find("\"emulate\""), std::string::npos) << d;
    {
      ScopedCpuBf16Gemm inner(CpuBf16Gemm::automatic);
      EXPECT_EQ(cpu::cpu_bf16_gemm(), have ? CpuBf16Gemm::onednn : CpuBf16Gemm::emulate);
      const std::string da = cpu::cpu_bf16_gemm_description();
      if (have) {
        EXPECT_NE(da.find("oneDNN"), std::string::npos) << da;
        EXPECT_NE(da.find("bf16"), std::string::npos) << da;
      } else {
        EXPECT_NE(da.find(why), std::string::npos) << da << " does not say why: " << why;
      }
    }
    EXPECT_EQ(cpu::cpu_bf16_gemm(), CpuBf16Gemm::emulate);
  }
  EXPECT_EQ(cpu::cpu_bf16_gemm(), before);
  if (have) {
    ScopedCpuBf16Gemm s(CpuBf16Gemm::onednn);
    EXPECT_EQ(cpu::cpu_bf16_gemm(), CpuBf16Gemm::onednn);
  } else {
    try {
      cpu::select_cpu_bf16_gemm(CpuBf16Gemm::onednn);
      ADD_FAILURE() << "\"onednn\" selected where it cannot run (" << why << ")";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(why), std::string::npos) << m;
      EXPECT_NE(m.find("use \"auto\""), std::string::npos) << m;
    }
    EXPECT_EQ(cpu::cpu_bf16_gemm(), before);
  }
}

TEST(CpuBf16Gemm, ConfigKeyIsValidated) {
  EXPECT_EQ(parse_config("{}", "test", {"data.train=-"}).runtime.cpu_bf16_gemm, CpuBf16Gemm::automatic);
  EXPECT_EQ(parse_config("{}", "test", {"data.train=-", "runtime.cpu_bf16_gemm=emulate"}).runtime.cpu_bf16_gemm,
            CpuBf16Gemm::emulate);
  try {
    parse_config("{}", "test", {"data.train=-", "runtime.cpu_bf16_gemm=mkl"});
    ADD_FAILURE() << "runtime.cpu_bf16_gemm=mkl accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'runtime.cpu_bf16_gemm' must be \"auto\", \"onednn\" or \"emulate\""),
              std::string::npos)
        << e.what();
  }
}

// ---- the GEMM ------------------------------------------------------------------------------------------

// C = op(A) op(B) + bias + beta C against double arithmetic on the same bf16 operands, for every
// transpose pair, beta 0 and 1, with and without a bias, leading dimensions wider than the matrices
// (whose padding must stay as it was), on 1 and 2 threads.
TEST(CpuBf16Gemm, OnednnGemmIsABf16ProductWithFp32Accumulation) {
  REQUIRE_ONEDNN();
  const int M = 67, N = 45, K = 130, pad = 5;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (float beta : {0.0f, 1.0f})
        for (int threads : {1, 2})
          for (bool with_bias : {false, true}) {
            const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            const auto a = bf16_bits_of(random_floats(static_cast<size_t>(ta ? K : M) * lda, 40));
            const auto b = bf16_bits_of(random_floats(static_cast<size_t>(tb ? N : K) * ldb, 41));
            const auto c0 = random_floats(static_cast<size_t>(M) * ldc, 42), bias = random_floats(N, 43);
            std::vector<float> c = c0;
            cpu::onednn_bf16_gemm(ta, tb, M, N, K, a.data(), lda, b.data(), ldb, beta, c.data(), ldc, threads,
                                  with_bias ? bias.data() : nullptr);
            std::vector<double> want(static_cast<size_t>(M) * N);
            std::vector<float> got(want.size());
            for (int m = 0; m < M; m++)
              for (int n = 0; n < N; n++) {
                double sum = beta * c0[static_cast<size_t>(m) * ldc + n] + (with_bias ? bias[n] : 0.0);
                for (int k = 0; k < K; k++)
                  sum += static_cast<double>(bf16_bits_to_float(ta ? a[static_cast<size_t>(k) * lda + m]
                                                                    : a[static_cast<size_t>(m) * lda + k])) *
                         bf16_bits_to_float(tb ? b[static_cast<size_t>(n) * ldb + k]
                                               : b[static_cast<size_t>(k) * ldb + n]);
                want[static_cast<size_t>(m) * N + n] = sum;
                got[static_cast<size_t>(m) * N + n] = c[static_cast<size_t>(m) * ldc + n];
              }
            const std::string where = std::string("trans ") + (ta ? "T" : "N") + (tb ? "T" : "N") + ", beta " +
                                      std::to_string(beta) + ", threads " + std::to_string(threads) + ", bias " +
                                      std::to_string(with_bias);
            // Bound: K exact products (bf16 × bf16 in fp32), beta c0 and the bias summed in fp32 in
            // some order: within gamma_(K+1) of their magnitudes.
            std::vector<double> bound(want.size());
            for (int m = 0; m < M; m++)
              for (int n = 0; n < N; n++) {
                double mag = std::fabs(beta * c0[static_cast<size_t>(m) * ldc + n]) + (with_bias ? std::fabs(bias[n]) : 0.0);
                for (int k = 0; k < K; k++)
                  mag += std::fabs(static_cast<double>(bf16_bits_to_float(ta ? a[static_cast<size_t>(k) * lda + m]
                                                                              : a[static_cast<size_t>(m) * lda + k])) *
                                   bf16_bits_to_float(tb ? b[static_cast<size_t>(n) * ldb + k]
                                                         : b[static_cast<size_t>(k) * ldb + n]));
                bound[static_cast<size_t>(m) * N + n] = gamma_n(K + 1) * mag;
              }
            EXPECT_TRUE(within_bound(got, want, bound, where));
            for (int m = 0; m < M; m++)  // Exact: the padding is never written
              for (int n = N; n < ldc; n++)
                ASSERT_EQ(c[static_cast<size_t>(m) * ldc + n], c0[static_cast<size_t>(m) * ldc + n])
                    << where << ": padding";
          }
}

// ---- the dense layer against the emulation ---------------------------------------------------------------

namespace {

struct Shape {
  int N, C, OC;
};
// Small ones run on one thread; the last two are big enough (> 4 MFLOP) to run on several when
// OpenBLAS's count (the GEMMs' thread count) allows.
const Shape kShapes[] = {{7, 5, 3}, {37, 70, 53}, {256, 96, 160}, {300, 128, 515}};

// The operands of one dense layer, their bf16 bits, and the fp32 / emulated / oneDNN results.
struct Layer {
  Shape s;
  int out_ld, dout_ld;
  std::vector<float> x, w, b, dout, dx0, dw0, db0;
  std::vector<uint16_t> x16, w16, dout16;
  Layer(Shape s_, int pad, uint32_t seed) : s(s_), out_ld(s_.OC + pad), dout_ld(s_.OC + pad) {
    x = random_floats(static_cast<size_t>(s.N) * s.C, seed);
    w = random_floats(static_cast<size_t>(s.OC) * s.C, seed + 1);
    b = random_floats(s.OC, seed + 2);
    dout = random_floats(static_cast<size_t>(s.N) * dout_ld, seed + 3);
    dx0 = random_floats(x.size(), seed + 4);
    dw0 = random_floats(w.size(), seed + 5);
    db0 = random_floats(b.size(), seed + 6);
    x16 = bf16_bits_of(x);
    w16 = bf16_bits_of(w);
    dout16 = bf16_bits_of(dout);
  }
  // with_bits: the operands handed over as bf16 bits (inp_bf16, weight_bf16, dout_bf16), the fp32
  // ones then null where the contract allows
  GemmMode mode(GemmPrecision p, bool with_bits) const {
    GemmMode g(p, with_bits ? w16.data() : nullptr);
    g.out_ld = out_ld;
    g.dout_ld = dout_ld;
    if (with_bits) g.inp_bf16 = x16.data(), g.dout_bf16 = dout16.data();
    return g;
  }
  std::vector<float> forward(GemmPrecision p, bool with_bits, bool bias, float fill) const {
    std::vector<float> out(static_cast<size_t>(s.N) * out_ld, fill);
    cpu_ops().matmul_forward(out.data(), with_bits ? nullptr : x.data(), w.data(), bias ? b.data() : nullptr, s.N,
                             s.C, s.OC, mode(p, with_bits));
    return out;
  }
  // dx, dw, db after one call adding into the initial gradients
  std::vector<std::vector<float>> backward(GemmPrecision p, bool with_bits) const {
    auto dx = dx0, dw = dw0, db = db0;
    cpu_ops().matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), with_bits ? nullptr : x.data(),
                              with_bits ? nullptr : w.data(), s.N, s.C, s.OC, mode(p, with_bits));
    return {dx, dw, db};
  }
};

// What a backward added: got − initial, in double (exact up to 2^-53 of it)
std::vector<double> added(const std::vector<float>& got, const std::vector<float>& initial) {
  std::vector<double> d(got.size());
  for (size_t i = 0; i < d.size(); i++) d[i] = static_cast<double>(got[i]) - initial[i];
  return d;
}

// The magnitudes of the sums a dense layer's GEMMs take, on the operands rounded to bf16 (bf16) or
// as they are: out |b| + Σ_c |x w|, dx |dx0| + Σ_o |dout w|, dw |dw0| + Σ_n |dout x| (the initial
// gradients, which the backward adds to, as one more term). Two fp32 sums of one set of K + 1
// exact terms in other orders are within 2 gamma_K of that of each other.
struct Magnitudes {
  std::vector<double> out, dx, dw;
};

// The rows' first OC values of a [N, ld] buffer
std::vector<float> unpadded(const std::vector<float>& v, int N, int OC, int ld) {
  std::vector<float> r;
  for (int n = 0; n < N; n++) {
    const auto row = v.begin() + static_cast<size_t>(n) * ld;
    r.insert(r.end(), row, row + OC);
  }
  return r;
}

Magnitudes magnitudes(const Layer& L, bool bias, bool bf16) {
  const Shape& s = L.s;
  auto r = [bf16](float v) { return std::fabs(static_cast<double>(bf16 ? round_to_bf16(v) : v)); };
  Magnitudes m;
  m.out.assign(static_cast<size_t>(s.N) * s.OC, 0.0);
  m.dx.assign(L.x.size(), 0.0);
  m.dw.assign(L.w.size(), 0.0);
  for (int n = 0; n < s.N; n++)
    for (int o = 0; o < s.OC; o++) {
      double acc = bias ? std::fabs(L.b[o]) : 0.0;
      const double d = r(L.dout[static_cast<size_t>(n) * L.dout_ld + o]);
      for (int c = 0; c < s.C; c++) {
        const double x = r(L.x[static_cast<size_t>(n) * s.C + c]), w = r(L.w[static_cast<size_t>(o) * s.C + c]);
        acc += x * w;
        m.dx[static_cast<size_t>(n) * s.C + c] += d * w;
        m.dw[static_cast<size_t>(o) * s.C + c] += d * x;
      }
      m.out[static_cast<size_t>(n) * s.OC + o] = acc;
    }
  for (size_t i = 0; i < m.dx.size(); i++) m.dx[i] += std::fabs(L.dx0[i]);
  for (size_t i = 0; i < m.dw.size(); i++) m.dw[i] += std::fabs(L.dw0[i]);
  return m;
}

// The bound of two fp32 orders of each sum: 2 gamma_K of its magnitude, K the number of terms
// beyond the first (C products and the bias, OC products and dx0, N products and dw0).
std::vector<double> two_orders(const Shape& s, const Magnitudes& m, int k) {
  return times(2.0 * gamma_n(k == 0 ? s.C : k == 1 ? s.OC : s.N), k == 0 ? m.out : k == 1 ? m.dx : m.dw);
}

}  // namespace

TEST(CpuBf16Gemm, ForwardMatchesEmulation) {
  REQUIRE_ONEDNN();
  const GemmThreads threads(2, 2);
  for (const Shape& s : kShapes)
    for (int pad : {0, 3})
      for (bool bias : {true, false})
        for (bool with_bits : {false, true}) {
          const Layer L(s, pad, 100);
          const float fill = 12345.0f;  // the padding columns must keep it
          std::vector<float> emu, dnn, f32;
          {
            ScopedCpuBf16Gemm e(CpuBf16Gemm::emulate);
            emu = L.forward(GemmPrecision::bf16, with_bits, bias, fill);
            f32 = L.forward(GemmPrecision::fp32, false, bias, fill);
          }
          {
            ScopedCpuBf16Gemm e(CpuBf16Gemm::onednn);
            dnn = L.forward(GemmPrecision::bf16, with_bits, bias, fill);
          }
          const std::string where = "N " + std::to_string(s.N) + " pad " + std::to_string(pad) + " bias " +
                                    std::to_string(bias) + " bits " + std::to_string(with_bits);
          const auto ref = to_double(unpadded(emu, s.N, s.OC, L.out_ld));
          const auto dnn_out = unpadded(dnn, s.N, s.OC, L.out_ld), f32_out = unpadded(f32, s.N, s.OC, L.out_ld);
          // Bound: the same exact products of bf16 operands (and the bias), summed in fp32 in two orders.
          EXPECT_TRUE(within_bound(dnn_out, ref, two_orders(s, magnitudes(L, bias, true), 0), where));
          // Exact: the emulation on unrounded operands would be this very sgemm call, bit for bit.
          EXPECT_NE(0, std::memcmp(f32_out.data(), unpadded(emu, s.N, s.OC, L.out_ld).data(), f32_out.size() * sizeof(float)))
              << where << ": the emulation equals fp32";
          // Bound: oneDNN in fp32 would be within two fp32 orders of sgemm everywhere; bf16 goes past it.
          EXPECT_GT(worst_ratio(dnn_out, to_double(f32_out), two_orders(s, magnitudes(L, bias, false), 0)), 1.0)
              << where << ": oneDNN equals fp32, bf16 was not applied";
          for (int n = 0; n < s.N; n++)  // Exact: the padding is never written
            for (int j = s.OC; j < L.out_ld; j++) ASSERT_EQ(dnn[static_cast<size_t>(n) * L.out_ld + j], fill) << where;
        }
}

TEST(CpuBf16Gemm, BackwardMatchesEmulationAndAdds) {
  REQUIRE_ONEDNN();
  const GemmThreads threads(2, 2);
  for (const Shape& s : kShapes)
    for (int pad : {0, 3})
      for (bool with_bits : {false, true}) {
        const Layer L(s, pad, 200);
        std::vector<std::vector<float>> emu, dnn, f32;
        {
          ScopedCpuBf16Gemm e(CpuBf16Gemm::emulate);
          emu = L.backward(GemmPrecision::bf16, with_bits);
          f32 = L.backward(GemmPrecision::fp32, false);
        }
        {
          ScopedCpuBf16Gemm e(CpuBf16Gemm::onednn);
          dnn = L.backward(GemmPrecision::bf16, with_bits);
        }
        const std::string where =
            "N " + std::to_string(s.N) + " pad " + std::to_string(pad) + " bits " + std::to_string(with_bits);
        const std::vector<float>* initial[2] = {&L.dx0, &L.dw0};
        const char* names[2] = {"dinp", "dweight"};
        const Magnitudes m16 = magnitudes(L, false, true), m32 = magnitudes(L, false, false);
        for (int k = 0; k < 2; k++) {
          // the part added, compared: a gradient that started at zero would hide a result written
          // over the initial values. Bound: the same exact products summed onto the initial
          // gradient in two fp32 orders.
          EXPECT_TRUE(within_bound(added(dnn[k], *initial[k]), added(emu[k], *initial[k]), two_orders(s, m16, k + 1),
                                   where + " " + names[k]));
          // Bound: in fp32 oneDNN would be within two fp32 orders of sgemm everywhere.
          EXPECT_GT(worst_ratio(added(dnn[k], *initial[k]), added(f32[k], *initial[k]), two_orders(s, m32, k + 1)), 1.0)
              << where << " " << names[k] << ": oneDNN equals fp32, bf16 was not applied";
        }
        // Exact: dbias is the same fp32 column-sum loop in every mode.
        EXPECT_TRUE(same_float_bits(dnn[2], f32[2])) << where << ": dbias is the fp32 column sum in every mode";
      }
}

// zb-h1's split: the input gradient alone (inp not read), then the weight and bias gradients alone
// (weight not read), equal one fused call bit for bit on oneDNN too; and the same call gives the
// same bits again. Exact: the same oneDNN calls on the same operands (the three outputs are
// independent), and oneDNN's kernels are deterministic for a shape and thread count.
TEST(CpuBf16Gemm, SplitBackwardEqualsFusedAndRepeats) {
  REQUIRE_ONEDNN();
  const GemmThreads threads(2, 2);
  ScopedCpuBf16Gemm e(CpuBf16Gemm::onednn);
  for (const Shape& s : kShapes) {
    const Layer L(s, 0, 300);
    const auto fused = L.backward(GemmPrecision::bf16, false);
    EXPECT_EQ(fused, L.backward(GemmPrecision::bf16, false)) << s.N << ": not the same bits twice";
    auto dx = L.dx0, dw = L.dw0, db = L.db0;
    cpu_ops().matmul_backward(dx.data(), nullptr, nullptr, L.dout.data(), nullptr, L.w.data(), s.N, s.C, s.OC,
                              GemmPrecision::bf16);
    EXPECT_EQ(dw, L.dw0);
    cpu_ops().matmul_backward(nullptr, dw.data(), db.data(), L.dout.data(), L.x.data(), nullptr, s.N, s.C, s.OC,
                              GemmPrecision::bf16);
    EXPECT_TRUE(same_float_bits(dx, fused[0])) << s.N;
    EXPECT_TRUE(same_float_bits(dw, fused[1])) << s.N;
    EXPECT_TRUE(same_float_bits(db, fused[2])) << s.N;
    const auto f1 = L.forward(GemmPrecision::bf16, false, true, 0.0f);
    EXPECT_TRUE(same_float_bits(f1, L.forward(GemmPrecision::bf16, false, true, 0.0f))) << s.N;
  }
}

// The GEMMs' thread count is OpenBLAS's (the trainer sets both to runtime.threads): with it fixed,
// OpenMP's count changes no bit (Exact: the same calls); 2 GEMM threads against 1 only the order of
// fp32 sums (Bound: two orders of the same exact products).
TEST(CpuBf16Gemm, ThreadCounts) {
  REQUIRE_ONEDNN();
  ScopedCpuBf16Gemm e(CpuBf16Gemm::onednn);
  for (const Shape& s : kShapes) {
    const Layer L(s, 0, 400);
    std::vector<float> fwd[3];
    std::vector<std::vector<float>> bwd[3];
    const int omp[3] = {1, 2, 2}, blas[3] = {1, 1, 2};
    for (int r = 0; r < 3; r++) {
      const GemmThreads threads(omp[r], blas[r]);
      fwd[r] = L.forward(GemmPrecision::bf16, false, true, 0.0f);
      bwd[r] = L.backward(GemmPrecision::bf16, false);
    }
    EXPECT_TRUE(same_float_bits(fwd[0], fwd[1])) << s.N;
    EXPECT_EQ(bwd[0], bwd[1]) << s.N;
    const Magnitudes m = magnitudes(L, true, true);
    EXPECT_TRUE(within_bound(fwd[2], to_double(fwd[0]), two_orders(s, m, 0), "out N " + std::to_string(s.N)));
    for (int k = 0; k < 2; k++)
      EXPECT_TRUE(within_bound(added(bwd[2][k], k ? L.dw0 : L.dx0), added(bwd[0][k], k ? L.dw0 : L.dx0),
                               two_orders(s, m, k + 1), std::string(k ? "dw" : "dx") + " N " + std::to_string(s.N)));
  }
}

// ---- whole models --------------------------------------------------------------------------------------

namespace {

struct ModelCase {
  const char* name;
  const char* family;
  std::vector<std::string> extra;
};
std::ostream& operator<<(std::ostream& os, const ModelCase& c) { return os << c.name; }

const ModelCase kFamilies[] = {
    {"gpt2", "gpt2", {}},
    {"llama_gqa", "llama", {"model.n_kv_head=1"}},
    {"bert", "bert", {"model.num_labels=3"}},
};

class CpuBf16GemmModel : public ::testing::TestWithParam<ModelCase> {};

struct LossAndGrads {
  float loss;
  std::vector<float> grads;
};

LossAndGrads loss_and_grads(const ModelDesc& d, CpuBf16Gemm engine) {
  ScopedCpuBf16Gemm e(engine);
  const int B = 3, T = 32;
  RandomBatch rb(d, B, T, 60);
  Model m(d, cpu_ops(), ModelPart::whole(), GemmPrecision::bf16);
  Activations a(m, B, T);
  m.init_params(7);
  m.zero_grads();
  const float loss = m.forward(a, rb.b, HeadMode::train);
  m.backward(a);
  return {loss, m.grads_host()};
}

}  // namespace

// Bound: the two engines multiply the same bf16 operands exactly and sum in fp32 in other orders,
// and a bf16 model rounds each GEMM's operands (its activations and output gradients among them)
// to bf16, where an order difference may flip a rounding: a 2u_bf = 2^-7 change of that operand,
// and so of each product it enters. So every gradient tensor is within 2u_bf of the magnitude of
// what it sums (ref_transformer.h gradient_magnitude; BERT's key bias, 0 in exact arithmetic,
// against its query bias's), and the loss within 2u_bf of the magnitudes it sums: its own and
// twice its logits' (loss_bound's form, logit_magnitude).
TEST_P(CpuBf16GemmModel, LossAndEveryGradientMatchEmulation) {
  REQUIRE_ONEDNN();
  const ModelCase& c = GetParam();
  const ModelDesc d = desc_of(c.family, 2, 4, 64, 32, 96, c.extra);
  const LossAndGrads emu = loss_and_grads(d, CpuBf16Gemm::emulate), dnn = loss_and_grads(d, CpuBf16Gemm::onednn);
  const double bound = 2.0 * kUnitBf16;
  ASSERT_EQ(dnn.grads.size(), emu.grads.size());
  EXPECT_FALSE(same_float_bits(dnn.grads, emu.grads)) << "oneDNN's gradients are the emulation's bits: not run?";
  const ScopedCpuBf16Gemm e(CpuBf16Gemm::emulate);
  Model m(d, cpu_ops(), ModelPart::whole(), GemmPrecision::bf16);
  m.init_params(7);
  const RandomBatch rb(d, 3, 32, 60);
  const std::vector<double> P(m.params, m.params + m.table.numel);
  const double M = RefTransformer{d, m.table}.logit_magnitude(P, rb.b);
  EXPECT_LE(std::fabs(dnn.loss - emu.loss), bound * (std::fabs(emu.loss) + 2.0 * M)) << dnn.loss << " vs " << emu.loss;
  EXPECT_TRUE(gradients_within(m.table, dnn.grads, emu.grads, gradient_magnitude(m, rb.b, 3, 32), bound, c.name));
}

// Bound: at each step the loss is within 2u_bf of itself of the emulation's at the same parameters
// (above); over 20 AdamW steps the parameters drift apart as well, which no rounding bound follows
// (a flipped rounding can turn a small gradient's AdamW step around): 1e-2 ≈ 2.6 u_bf is the
// project's bf16 curve tolerance (docs/PRECISION.md: bf16 curves repeat only to about that), and the
// curve must also stay closer to the emulation's than the emulation's is to fp32's.
TEST_P(CpuBf16GemmModel, TrainingFollowsEmulationLossCurve) {
  REQUIRE_ONEDNN();
  const ModelCase& c = GetParam();
  const ModelDesc d = desc_of(c.family, 2, 2, 32, 16, 64, c.extra);
  const int steps = 20;
  std::vector<float> emu, dnn, f32;
  {
    ScopedCpuBf16Gemm e(CpuBf16Gemm::emulate);
    emu = training_losses(d, GemmPrecision::bf16, steps);
    f32 = training_losses(d, GemmPrecision::fp32, steps);
  }
  {
    ScopedCpuBf16Gemm e(CpuBf16Gemm::onednn);
    dnn = training_losses(d, GemmPrecision::bf16, steps);
  }
  const CurveGap gap = curve_gap(emu, dnn), bf16_gap = curve_gap(f32, emu);
  for (int s = 0; s < steps; s++)
    EXPECT_LT(gap.per_step[s], 1e-2) << c.name << " step " << s + 1 << ": oneDNN " << dnn[s] << " vs emulation "
                                     << emu[s];
  std::printf("%s: losses %.4f -> %.4f (emulation), %.4f -> %.4f (oneDNN); largest relative gap %.2e (bf16 vs fp32: "
              "%.2e)\n",
              c.name, emu[0], emu.back(), dnn[0], dnn.back(), gap.worst, bf16_gap.worst);
  EXPECT_LT(gap.worst, bf16_gap.worst) << "oneDNN strays further from the emulation than bf16 does from fp32";
  EXPECT_FALSE(gap.identical) << "oneDNN's curve is the emulation's bits: not run?";
  EXPECT_LT(emu.back(), emu.front()) << "no progress; the comparison means little";
}

INSTANTIATE_TEST_SUITE_P(Families, CpuBf16GemmModel, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<ModelCase>& i) { return std::string(i.param.name); });
