// The bf16 GEMM operands produced once (model/transformer.h "bf16 weight copy",
// backend/gemm_precision.h GemmMode): the Model's bf16 weight copy, the LM head's logits gradient
// written in bf16, and the activations only GEMMs read kept in bf16 (the pre-norm norms' outputs,
// the MLP's activation output).
//  - bf16_copy writes backend/bf16.h's bits (nearest even, canonical NaN) and counts its values;
//  - the dense-layer ops read a given weight copy instead of rounding the weight: with the copy of
//    the weight they give the bits of rounding it themselves, and with the copy of ANOTHER weight
//    they give that weight's result (so the copy is what the GEMMs read); without a copy they
//    count the weight values they round (bf16_weight_rounding_count), with one they count none;
//  - the norm forwards' and the activation forwards' (erf GELU, SwiGLU, GPT-2's dense layer + tanh
//    GELU) bf16 output is their fp32 output rounded, with or without the fp32 one; the GEMMs read a bf16 input (inp null) as they would
//    have rounded the fp32 one;
//  - softmax_xent_bf16_grad on logits in padded rows gives softmax_xent_record's losses and its
//    gradient rounded, with zero padding, logits untouched, bad targets recorded; matmul_backward reads a given bf16 dout
//    (dout null) as it would have rounded the fp32 one, and a dout that is not the rounded one
//    changes the result;
//  - a bf16 Model's training steps (plain, fused LM head, split backward; gpt2 with a chunked tied
//    head, llama with grouped K/V heads, bert) have the same bits as the same steps on a backend
//    whose dense ops ignore the weight copy and round in every call, with every activation in fp32
//    (Activations::bf16_operands false: the path before) — so the activations kept only in bf16
//    and the LM head's logits gradient written in bf16 give the same bits too;
//  - and in such a step every dense weight is rounded exactly once (the LM head's too, whatever
//    its chunk count), against more than that when every op rounds; fp32 rounds nothing;
//  - the copy gives every tensor a 256-byte boundary although the fp32 parameters are packed
//    (BERT with 3 labels), so every copy a dense op gets is as aligned as its own scratch.
// Every case runs the CPU's bf16 GEMMs on the emulation (runtime.cpu_bf16_gemm "emulate"), the
// oracle; oneDNN's engine is tested in test_cpu_bf16_gemm.cpp. The CUDA cases (CudaBf16Operands.*)
// skip without a GPU. Every comparison is exact: a bf16 operand widened from given bits is the
// value rounding it would give (float_to_bf16_bits is the rounding, and widening is exact), so the
// GEMMs make the same calls on the same values; a bf16 output is the rounding of the fp32 value
// the same loop computed; a Model step takes the same ops in the same order either way (on the
// GPU too: the same kernels and cuBLAS calls, deterministic for one shape on one stream).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/bf16.h"
#include "backend/cpu/onednn_gemm.h"
#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "grad_check.h"
#include "model_test_util.h"
#include "params/param_table.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

// The backend B with its four dense-layer ops handing Through(g) to B's op instead of the
// caller's GemmMode g.
template <const Ops& (*B)(), GemmMode (*Through)(const GemmMode&)>
const Ops& dense_ops_through() {
  static const Ops ops = [] {
    Ops o = B();
    o.matmul_forward = [](float* out, const float* inp, const float* w, const float* b, int N, int C, int OC,
                          GemmMode g) { B().matmul_forward(out, inp, w, b, N, C, OC, Through(g)); };
    o.matmul_backward = [](float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                           int N, int C, int OC, GemmMode g) {
      B().matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, Through(g));
    };
    o.matmul_gelu_forward = [](float* pre, float* act, const float* inp, const float* w, const float* b, int N, int C,
                               int OC, GemmMode g, uint16_t* act16) {
      B().matmul_gelu_forward(pre, act, inp, w, b, N, C, OC, Through(g), act16);
    };
    o.matmul_dgelu_backward = [](float* dpre, const float* dout, const float* w, const float* pre, int N, int C, int OC,
                                 GemmMode g) { B().matmul_dgelu_backward(dpre, dout, w, pre, N, C, OC, Through(g)); };
    return o;
  }();
  return ops;
}

// The precision and the row strides of g, without its weight copy; the reference is never handed
// an input or output gradient in bf16 (Activations::bf16_operands false).
GemmMode without_copies(const GemmMode& g) {
  if (g.dout_bf16 != nullptr || g.inp_bf16 != nullptr) std::abort();
  GemmMode m(g.prec);
  m.out_ld = g.out_ld;
  m.dout_ld = g.dout_ld;
  return m;
}

// The backend B with dense-layer ops that drop the caller's copies (GemmMode::weight_bf16) and
// round their operands themselves: the behaviour before the copies existed, the reference of these
// tests (with Activations::bf16_operands false, so the Model keeps every activation in fp32 and
// hands the GEMMs fp32 operands).
template <const Ops& (*B)()>
const Ops& rounding_in_every_op() {
  return dense_ops_through<B, without_copies>();
}

// The bf16 weight copies the Model hands its dense ops: how many, and how many of them do not
// start on a 256-byte boundary.
struct CopyAlignment {
  size_t seen = 0, misaligned = 0;
  void note(const uint16_t* w16) {
    if (w16 == nullptr) return;
    seen++;
    misaligned += reinterpret_cast<uintptr_t>(w16) % 256 != 0;
  }
};
CopyAlignment g_copy_alignment;

GemmMode noting_copy_alignment(const GemmMode& g) {
  g_copy_alignment.note(g.weight_bf16);
  return g;
}

// The backend B recording g_copy_alignment.
template <const Ops& (*B)()>
const Ops& recording_copy_alignment() {
  return dense_ops_through<B, noting_copy_alignment>();
}


const GemmPrecision kBf16 = GemmPrecision::bf16;

struct DenseCase {
  int N, C, OC;
};
// Odd sizes (padded bf16 rows on CUDA, the unfused paths), then GPT-2-like multiples of 8 (the
// cuBLASLt epilogues) large enough for the CPU's tiled sgemm.
const DenseCase kDense[] = {{37, 70, 53}, {96, 256, 768}};

// The four dense-layer ops on backend o, with weight w and GemmMode g; every output in one vector
// (get(p, n): n floats at p as a host vector).
template <typename Get>
std::vector<float> dense_ops(const Ops& o, const DenseCase& s, const float* x, const float* w, const float* b,
                             const float* dout, const float* pre, GemmMode g, float* out, float* out2,
                             float* dinp, float* dpre, const Get& get) {
  const int N = s.N, C = s.C, OC = s.OC;
  o.matmul_forward(out, x, w, b, N, C, OC, g);
  std::vector<float> all = get(out, (size_t)N * OC);
  o.matmul_gelu_forward(out, out2, x, w, b, N, C, OC, g, nullptr);
  for (float v : get(out2, (size_t)N * OC)) all.push_back(v);
  o.zero(dinp, (size_t)N * C * sizeof(float));
  o.matmul_backward(dinp, nullptr, nullptr, dout, nullptr, w, N, C, OC, g);
  for (float v : get(dinp, (size_t)N * C)) all.push_back(v);
  o.matmul_dgelu_backward(dpre, dout, w, pre, N, C, OC, g);
  for (float v : get(dpre, (size_t)N * C)) all.push_back(v);
  return all;
}

}  // namespace

// ---- the op and the dense layers, CPU ------------------------------------------------------------------

TEST(Bf16WeightCopy, Bf16CopyWritesTheHostRoundingAndCountsIt) {
  std::vector<float> x = random_floats(1000, 1, -3.0f, 3.0f);
  x.insert(x.end(), {0.0f, -0.0f, 1.00390625f /* a tie */, std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::quiet_NaN(), 3.4028235e38f /* rounds to inf */, 1e-40f});
  std::vector<uint16_t> got(x.size(), 0xABCD);
  const uint64_t before = cpu_ops().bf16_weight_rounding_count();
  cpu_ops().bf16_copy(got.data(), x.data(), x.size());
  EXPECT_EQ(cpu_ops().bf16_weight_rounding_count() - before, x.size());
  EXPECT_EQ(got, host_bits(x));
  EXPECT_EQ(got[x.size() - 3], 0x7FFF) << "NaN is the canonical quiet NaN";
}

TEST(Bf16WeightCopy, DenseOpsReadTheCopyInsteadOfTheWeight) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  const Ops& o = cpu_ops();
  auto get = [](const float* p, size_t n) { return std::vector<float>(p, p + n); };
  for (const DenseCase& s : kDense) {
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    const auto x = random_floats(nx, 2), w = random_floats(nw, 3), w2 = random_floats(nw, 4), b = random_floats(s.OC, 5),
               dout = random_floats(nd, 6), pre = random_floats(nx, 7, -3.0f, 3.0f);
    std::vector<float> out(nd), out2(nd), dinp(nx), dpre(nx);
    const std::string where = "N=" + std::to_string(s.N) + " OC=" + std::to_string(s.OC);
    auto run = [&](const float* weight, GemmMode g) {
      return dense_ops(o, s, x.data(), weight, b.data(), dout.data(), pre.data(), g, out.data(), out2.data(),
                       dinp.data(), dpre.data(), get);
    };
    uint64_t c0 = o.bf16_weight_rounding_count();
    const auto rounding = run(w.data(), kBf16);
    EXPECT_EQ(o.bf16_weight_rounding_count() - c0, 4 * nw) << where << ": each op rounds the weight once";
    const auto bits = host_bits(w), bits2 = host_bits(w2);
    c0 = o.bf16_weight_rounding_count();
    const auto with_copy = run(w.data(), GemmMode(kBf16, bits.data()));
    EXPECT_EQ(o.bf16_weight_rounding_count(), c0) << where << ": with a copy nothing is rounded";
    EXPECT_SAME_BITS(rounding, with_copy) << where;
    // The copy of w2 handed with the weight w: the ops compute with w2.
    const auto other = run(w.data(), GemmMode(kBf16, bits2.data()));
    EXPECT_SAME_BITS(other, run(w2.data(), kBf16)) << where << ": the copy is not what the GEMMs read";
    EXPECT_NE(bit_difference(other, rounding), "") << where;
    // fp32 ignores a copy.
    EXPECT_SAME_BITS(run(w.data(), GemmMode(GemmPrecision::fp32, bits2.data())), run(w.data(), GemmPrecision::fp32))
        << where;
  }
}

// ---- the logits gradient in bf16, CPU --------------------------------------------------------------

namespace {
// Logits [N, V] with a wide range, targets with one bad row (when bad_row >= 0).
struct XentCase {
  int N, V;
  std::vector<float> logits;
  std::vector<int32_t> targets;
  XentCase(int N_, int V_, int bad_row, uint32_t seed) : N(N_), V(V_), logits(random_floats((size_t)N_ * V_, seed, -8.0f, 8.0f)) {
    for (int n = 0; n < N; n++) targets.push_back((n * 7 + 3) % V);
    if (bad_row >= 0) targets[bad_row] = V + 2;
  }
};
}  // namespace

// The logits come in rows of the padded stride ld (the LM head's chunk buffer), the padding NaN:
// read, it would make the loss NaN; it must be left as it is.
TEST(Bf16LogitsGradient, IsTheRecordedGradientRoundedWithZeroPadding) {
  for (auto [N, V, bad_row] : {std::array<int, 3>{5, 53, -1}, std::array<int, 3>{37, 1001, 11}, std::array<int, 3>{64, 4099, -1}}) {
    const XentCase x(N, V, bad_row, 60);
    const int ld = lm_logits_row_stride(V);
    const float scale = 0.37f;
    const std::string where = "N=" + std::to_string(N) + " V=" + std::to_string(V);
    // the reference: the fp32 gradient over contiguous logits
    std::vector<float> want = x.logits, want_loss(N, -1.0f);
    uint64_t want_bad = 0;
    cpu_ops().softmax_xent_record(want.data(), V, want_loss.data(), x.targets.data(), N, V, scale, &want_bad, 100);
    const std::vector<float> in = pad_rows(x.logits, N, V, ld, kNaN);
    std::vector<float> logits = in, loss(N, -1.0f);
    std::vector<uint16_t> grad((size_t)N * ld, 0xABCD);
    uint64_t bad = 0;
    cpu_ops().softmax_xent_bf16_grad(logits.data(), ld, loss.data(), x.targets.data(), N, V, scale, grad.data(), &bad, 100);
    EXPECT_SAME_BITS(loss, want_loss) << where;
    EXPECT_EQ(bad, want_bad) << where;
    EXPECT_EQ(bad != 0, bad_row >= 0) << where;
    EXPECT_SAME_BITS(logits, in) << where << ": the logits are left as they are";
    size_t wrong = 0, pad = 0;
    for (int n = 0; n < N; n++) {
      if (n == bad_row) continue;
      for (int j = 0; j < ld; j++) {
        const uint16_t g = grad[(size_t)n * ld + j];
        if (j < V) wrong += g != float_to_bf16_bits(want[(size_t)n * V + j]);
        else pad += g != 0;
      }
    }
    EXPECT_EQ(wrong, 0u) << where;
    EXPECT_EQ(pad, 0u) << where << ": padding not zero";
  }
}

TEST(Bf16LogitsGradient, MatmulBackwardReadsTheBf16Dout) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  for (const DenseCase& s : kDense) {
    const int ld = bf16_row_stride(s.OC);
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    const auto x = random_floats(nx, 61), w = random_floats(nw, 62), dout = random_floats(nd, 63),
               dx0 = random_floats(nx, 64), dw0 = random_floats(nw, 65);
    std::vector<uint16_t> d16 = pad_rows(host_bits(dout), s.N, s.OC, ld, uint16_t{0x3F80} /* 1.0: must not be read */);
    const std::string where = "N=" + std::to_string(s.N) + " OC=" + std::to_string(s.OC);
    auto want_x = dx0, want_w = dw0, got_x = dx0, got_w = dw0;
    cpu_ops().matmul_backward(want_x.data(), want_w.data(), nullptr, dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                              kBf16);
    GemmMode g(kBf16);
    g.dout_bf16 = d16.data();
    g.dout_ld = ld;
    cpu_ops().matmul_backward(got_x.data(), got_w.data(), nullptr, nullptr, x.data(), w.data(), s.N, s.C, s.OC, g);
    EXPECT_SAME_BITS(got_x, want_x) << where;
    EXPECT_SAME_BITS(got_w, want_w) << where;
    // Another dout in bf16 changes both.
    d16[0] ^= 0x0100;
    auto other_x = dx0, other_w = dw0;
    cpu_ops().matmul_backward(other_x.data(), other_w.data(), nullptr, nullptr, x.data(), w.data(), s.N, s.C, s.OC, g);
    EXPECT_NE(bit_difference(other_x, want_x), "") << where;
    EXPECT_NE(bit_difference(other_w, want_w), "") << where;
  }
}

// ---- the norms' outputs in bf16, CPU ----------------------------------------------------------------

namespace {
// What forwards wrote: their fp32 outputs and their bf16 bits, in call order.
struct ForwardOutputs {
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  // The n values at out and at out16 (each skipped when null) appended from backend o.
  void append(const Ops& o, const float* out, const uint16_t* out16, size_t n) {
    if (out) {
      const size_t k = f32.size();
      f32.resize(k + n);
      o.copy_to_host(f32.data() + k, out, n * sizeof(float));
    }
    if (out16) {
      const size_t k = b16.size();
      b16.resize(k + n);
      o.copy_to_host(b16.data() + k, out16, n * sizeof(uint16_t));
    }
  }
};
// The four norm forwards on backend o: LayerNorm, RMSNorm and the two fused residual + norm ops,
// writing out (may be null) and out16 (may be null).
ForwardOutputs norm_outputs(const Ops& o, int N, int C, bool with_f32, bool with_b16, float* x, float* a, float* b,
                         float* res, float* w, float* bias, float* out, uint16_t* out16, float* mean, float* rstd) {
  ForwardOutputs r;
  const size_t n = (size_t)N * C;
  for (int k = 0; k < 4; k++) {
    float* of = with_f32 ? out : nullptr;
    uint16_t* ob = with_b16 ? out16 : nullptr;
    switch (k) {
      case 0: o.layernorm_forward(of, mean, rstd, x, w, bias, N, C, 1e-5f, ob); break;
      case 1: o.rmsnorm_forward(of, rstd, x, w, N, C, 1e-6f, ob); break;
      case 2: o.residual_layernorm_forward(res, of, mean, rstd, a, b, w, bias, N, C, 1e-5f, ob); break;
      case 3: o.residual_rmsnorm_forward(res, of, rstd, a, b, w, N, C, 1e-6f, ob); break;
    }
    r.append(o, with_f32 ? out : nullptr, with_b16 ? out16 : nullptr, n);
  }
  return r;
}
}  // namespace

TEST(Bf16NormOutput, IsTheFp32OutputRoundedWithOrWithoutIt) {
  for (auto [N, C] : {std::array<int, 2>{7, 70}, std::array<int, 2>{300, 768}}) {
    const size_t n = (size_t)N * C;
    auto x = random_floats(n, 70, -2.0f, 3.0f), a = random_floats(n, 71), b = random_floats(n, 72),
         w = random_floats(C, 73), bias = random_floats(C, 74);
    std::vector<float> res(n), out(n), mean(N), rstd(N);
    std::vector<uint16_t> out16(n);
    auto run = [&](bool f32, bool b16) {
      std::fill(out.begin(), out.end(), kNaN);
      std::fill(out16.begin(), out16.end(), 0xABCD);
      return norm_outputs(cpu_ops(), N, C, f32, b16, x.data(), a.data(), b.data(), res.data(), w.data(), bias.data(),
                          out.data(), out16.data(), mean.data(), rstd.data());
    };
    const std::string where = "N=" + std::to_string(N) + " C=" + std::to_string(C);
    const ForwardOutputs fp32 = run(true, false), both = run(true, true), only = run(false, true);
    EXPECT_SAME_BITS(both.f32, fp32.f32) << where;
    EXPECT_EQ(both.b16, host_bits(fp32.f32)) << where;
    EXPECT_EQ(only.b16, both.b16) << where << ": the bf16 output alone";
  }
}

namespace {
// erf GELU over n values and SwiGLU over [N, 2F] on backend o, writing out (may be null) and out16
// (may be null); both outputs in order.
ForwardOutputs activation_outputs(const Ops& o, int N, int F, bool with_f32, bool with_b16, const float* inp,
                               float* out, uint16_t* out16) {
  ForwardOutputs r;
  const size_t n = (size_t)N * F;
  for (int k = 0; k < 2; k++) {
    float* of = with_f32 ? out : nullptr;
    uint16_t* ob = with_b16 ? out16 : nullptr;
    if (k == 0) o.gelu_erf_forward(of, inp, n, ob);
    else o.swiglu_forward(of, inp, N, F, ob);
    r.append(o, with_f32 ? out : nullptr, with_b16 ? out16 : nullptr, n);
  }
  return r;
}
}  // namespace

// N·F = 4403 and 1.3M values: one partial block of the CPU's bf16 path, and many blocks over threads.
TEST(Bf16ActivationOutput, IsTheFp32OutputRoundedWithOrWithoutIt) {
  for (auto [N, F] : {std::array<int, 2>{37, 119}, std::array<int, 2>{640, 2048}}) {
    const auto inp = random_floats((size_t)N * 2 * F, 80, -4.0f, 4.0f);
    std::vector<float> out((size_t)N * F);
    std::vector<uint16_t> out16((size_t)N * F);
    auto run = [&](bool f32, bool b16) {
      std::fill(out.begin(), out.end(), kNaN);
      return activation_outputs(cpu_ops(), N, F, f32, b16, inp.data(), out.data(), out16.data());
    };
    const std::string where = "N=" + std::to_string(N) + " F=" + std::to_string(F);
    const ForwardOutputs fp32 = run(true, false), both = run(true, true), only = run(false, true);
    EXPECT_SAME_BITS(both.f32, fp32.f32) << where;
    EXPECT_EQ(both.b16, host_bits(fp32.f32)) << where;
    EXPECT_EQ(only.b16, both.b16) << where << ": the bf16 output alone";
  }
}

namespace {
// GPT-2's dense layer + GELU (tanh) in precision prec on backend o, writing act (may be null) and
// act16 (may be null): pre, then act and act16.
ForwardOutputs gemm_gelu_outputs(const Ops& o, const DenseCase& s, GemmPrecision prec, bool with_f32, bool with_b16,
                                 const float* x, const float* w, const float* b, float* pre, float* act,
                                 uint16_t* act16) {
  ForwardOutputs r;
  const size_t n = (size_t)s.N * s.OC;
  o.matmul_gelu_forward(pre, with_f32 ? act : nullptr, x, w, b, s.N, s.C, s.OC, prec, with_b16 ? act16 : nullptr);
  r.append(o, pre, nullptr, n);
  r.append(o, with_f32 ? act : nullptr, with_b16 ? act16 : nullptr, n);
  return r;
}
// The act part of gemm_gelu_outputs' f32 (after pre)
std::vector<float> act_part(const ForwardOutputs& r, size_t n) { return {r.f32.begin() + n, r.f32.end()}; }
}  // namespace

// GPT-2's GELU output (matmul_gelu_forward's act_bf16), in fp32 and bf16: the fp32 act rounded,
// pre and act unchanged by asking for it, and the same bf16 bits without the fp32 act.
TEST(Bf16ActivationOutput, GemmGeluOutputIsTheFp32OutputRoundedWithOrWithoutIt) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  for (const DenseCase& s : kDense) {
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    const auto x = random_floats(nx, 81, -2.0f, 2.0f), w = random_floats(nw, 82), b = random_floats(s.OC, 83);
    std::vector<float> pre(nd), act(nd);
    std::vector<uint16_t> act16(nd);
    for (GemmPrecision prec : {GemmPrecision::fp32, kBf16}) {
      auto run = [&](bool f32, bool b16) {
        std::fill(pre.begin(), pre.end(), kNaN);
        std::fill(act.begin(), act.end(), kNaN);
        std::fill(act16.begin(), act16.end(), 0xABCD);
        return gemm_gelu_outputs(cpu_ops(), s, prec, f32, b16, x.data(), w.data(), b.data(), pre.data(), act.data(),
                                 act16.data());
      };
      const std::string where = std::string(prec == kBf16 ? "bf16" : "fp32") + " N=" + std::to_string(s.N) +
                                " OC=" + std::to_string(s.OC);
      const ForwardOutputs fp32 = run(true, false), both = run(true, true), only = run(false, true);
      EXPECT_SAME_BITS(both.f32, fp32.f32) << where;
      EXPECT_EQ(both.b16, host_bits(act_part(fp32, nd))) << where;
      EXPECT_SAME_BITS(only.f32, std::vector<float>(fp32.f32.begin(), fp32.f32.begin() + nd)) << where << ": pre";
      EXPECT_EQ(only.b16, both.b16) << where << ": the bf16 output alone";
    }
  }
}

TEST(Bf16NormOutput, GemmsReadTheBf16Input) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  for (const DenseCase& s : kDense) {
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    const auto x = random_floats(nx, 75), w = random_floats(nw, 76), b = random_floats(s.OC, 77),
               dout = random_floats(nd, 78), dw0 = random_floats(nw, 79);
    const auto x16 = host_bits(x);
    GemmMode g(kBf16);
    g.inp_bf16 = x16.data();
    const std::string where = "N=" + std::to_string(s.N) + " OC=" + std::to_string(s.OC);
    std::vector<float> want(nd), got(nd, kNaN), pre(nd), act(nd, kNaN), want_act(nd);
    cpu_ops().matmul_forward(want.data(), x.data(), w.data(), b.data(), s.N, s.C, s.OC, kBf16);
    cpu_ops().matmul_forward(got.data(), nullptr, w.data(), b.data(), s.N, s.C, s.OC, g);
    EXPECT_SAME_BITS(got, want) << where;
    cpu_ops().matmul_gelu_forward(pre.data(), want_act.data(), x.data(), w.data(), b.data(), s.N, s.C, s.OC, kBf16,
                                  nullptr);
    cpu_ops().matmul_gelu_forward(pre.data(), act.data(), nullptr, w.data(), b.data(), s.N, s.C, s.OC, g, nullptr);
    EXPECT_SAME_BITS(act, want_act) << where;
    auto want_w = dw0, got_w = dw0;
    cpu_ops().matmul_backward(nullptr, want_w.data(), nullptr, dout.data(), x.data(), nullptr, s.N, s.C, s.OC, kBf16);
    cpu_ops().matmul_backward(nullptr, got_w.data(), nullptr, dout.data(), nullptr, nullptr, s.N, s.C, s.OC, g);
    EXPECT_SAME_BITS(got_w, want_w) << where;
  }
}

// ---- the Model ----------------------------------------------------------------------------------------

namespace {

struct WeightCopyFamily {
  const char* name;
  const char* family;
  std::vector<std::string> extra;
};
std::ostream& operator<<(std::ostream& os, const WeightCopyFamily& c) { return os << c.name; }

const WeightCopyFamily kFamilies[] = {
    {"gpt2", "gpt2", {}},
    {"llama_gqa", "llama", {"model.n_kv_head=1"}},
    {"bert", "bert", {"model.num_labels=3"}},
};

enum class StepKind { plain, fused_head, split_backward };
const char* step_name(StepKind k) {
  return k == StepKind::plain ? "plain" : k == StepKind::fused_head ? "fused head" : "split backward";
}

// One training step's forward and backward on m (gradients zeroed first); the loss.
float train_step(Model& m, Activations& a, const Batch& b, StepKind kind) {
  m.zero_grads();
  float loss = 0;
  switch (kind) {
    case StepKind::plain:
      loss = m.forward(a, b, HeadMode::train);
      m.backward(a);
      break;
    case StepKind::fused_head:
      loss = m.forward(a, b, HeadMode::fused);
      m.backward(a);
      break;
    case StepKind::split_backward:
      loss = m.forward(a, b, HeadMode::train);
      m.begin_backward(a, BackwardMode::input_only);
      if (m.part.head) m.head_backward(a, {});
      m.blocks_backward(a, m.l0(), m.l1(), {});
      if (m.part.embedding) m.embed_backward(a, {});
      m.weight_backward(a, {});
      break;
  }
  return loss;
}

struct StepResult {
  std::vector<float> losses, params, grads;
};

// `steps` AdamW steps of a bf16 model of d on backend o, from the same initial values and batches;
// `reference`: the LM head's gradient in fp32 over the logits (logits_grad_bf16 cleared).
StepResult train_bf16(const ModelDesc& d, const Ops& o, StepKind kind, int steps, bool reference) {
  const int B = 4, T = 16;
  Model m(d, o, ModelPart::whole(), kBf16);
  Activations a;
  a.bf16_operands = !reference;
  a.allocate(m, B, T);
  EXPECT_EQ(a.logits_grad_bf16 != nullptr, d.head == HeadKind::lm && !reference);
  EXPECT_EQ(a.layers[0].norm1_bf16 != nullptr, d.pre_norm && !reference);
  EXPECT_EQ(a.layers[0].norm1 == nullptr, d.pre_norm && !reference) << "a norm kept in bf16 is not kept in fp32";
  m.init_params(3);
  std::vector<RandomBatch> data;
  data.reserve(2);
  for (int k = 0; k < 2; k++) data.emplace_back(d, B, T, 40 + k);
  const size_t n = m.table.numel;
  float *mom = static_cast<float*>(o.alloc(n * sizeof(float))), *vel = static_cast<float*>(o.alloc(n * sizeof(float)));
  StepResult r;
  for (int step = 1; step <= steps; step++) {
    r.losses.push_back(train_step(m, a, data[step % 2].b, kind));
    o.adamw_update(m.params, m.grads, mom, vel, n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
  }
  o.free(mom);
  o.free(vel);
  r.params = m.params_host();
  r.grads = m.grads_host();
  return r;
}

// Dense weight values a forward of the whole model of d rounds: every dense layer's weight once
// (the tied LM head is the token embedding).
size_t dense_weight_values(const Model& m) {
  size_t n = 0;
  for (const ParamSlice& s : m.table.slices)
    switch (s.role) {
      case kQkvW: case kAttnOutW: case kFcW: case kProjW: case kLmHead: case kPoolerW: case kClsW:
        n += s.numel;
        break;
      case kTokEmb:
        if (m.desc.head == HeadKind::lm && m.desc.tie_embeddings) n += s.numel;
        break;
      default:
        break;
    }
  return n;
}

class Bf16OperandsModel : public ::testing::TestWithParam<WeightCopyFamily> {};

// The LM head in 3 chunks of 24 rows (N = 64): the head weight is read by 3 forward GEMMs, 2
// recomputed ones and 3 input-gradient GEMMs per step.
ModelDesc copy_desc(const WeightCopyFamily& c) {
  ModelDesc d = desc_of(c.family, 2, 2, 32, 16, 64, c.extra);
  d.lm_head_chunk_rows = 24;
  return d;
}

}  // namespace

TEST_P(Bf16OperandsModel, StepsHaveTheBitsOfRoundingInEveryOp) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  const WeightCopyFamily& c = GetParam();
  const ModelDesc d = copy_desc(c);
  for (StepKind kind : {StepKind::plain, StepKind::fused_head, StepKind::split_backward}) {
    const StepResult want = train_bf16(d, rounding_in_every_op<cpu_ops>(), kind, 3, true);
    const StepResult got = train_bf16(d, cpu_ops(), kind, 3, false);
    const std::string where = std::string(c.name) + ", " + step_name(kind);
    EXPECT_SAME_BITS(got.losses, want.losses) << where;
    EXPECT_SAME_BITS(got.grads, want.grads) << where;
    EXPECT_SAME_BITS(got.params, want.params) << where;
  }
}

TEST_P(Bf16OperandsModel, EachDenseWeightIsRoundedOncePerStep) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  const WeightCopyFamily& c = GetParam();
  const ModelDesc d = copy_desc(c);
  const int B = 4, T = 16;
  RandomBatch batch(d, B, T, 50);
  for (StepKind kind : {StepKind::plain, StepKind::fused_head, StepKind::split_backward}) {
    const std::string where = std::string(c.name) + ", " + step_name(kind);
    Model m(d, cpu_ops(), ModelPart::whole(), kBf16);
    Activations a(m, B, T);
    m.init_params(3);
    uint64_t c0 = cpu_ops().bf16_weight_rounding_count();
    train_step(m, a, batch.b, kind);
    EXPECT_EQ(cpu_ops().bf16_weight_rounding_count() - c0, dense_weight_values(m)) << where;
    // Rounding in every op rounds more: the backward's input gradients round the weights again.
    Model r(d, rounding_in_every_op<cpu_ops>(), ModelPart::whole(), kBf16);
    Activations ra;
    ra.bf16_operands = false;
    ra.allocate(r, B, T);
    r.init_params(3);
    c0 = cpu_ops().bf16_weight_rounding_count();
    train_step(r, ra, batch.b, kind);
    EXPECT_GT(cpu_ops().bf16_weight_rounding_count() - c0, 2 * dense_weight_values(m)) << where;
    // fp32 rounds nothing.
    Model f(d, cpu_ops(), ModelPart::whole(), GemmPrecision::fp32);
    Activations fa(f, B, T);
    f.init_params(3);
    c0 = cpu_ops().bf16_weight_rounding_count();
    train_step(f, fa, batch.b, kind);
    EXPECT_EQ(cpu_ops().bf16_weight_rounding_count(), c0) << where;
  }
}

// The fp32 parameters are packed (after BERT's 3-label classifier every later tensor starts at an
// odd float); the bf16 copy gives every tensor a 256-byte boundary (aligned_copy_layout), the parts
// of one tensor (BERT's q, k, v) adjacent, and every copy a dense op is handed starts on one.
TEST_P(Bf16OperandsModel, WeightCopyTensorsAre256ByteAligned) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  const WeightCopyFamily& c = GetParam();
  const ModelDesc d = copy_desc(c);
  Model m(d, recording_copy_alignment<cpu_ops>(), ModelPart::whole(), kBf16);
  const ParamTable& t = m.table;
  std::vector<size_t> off;
  const size_t n16 = aligned_copy_layout(t, &off);
  ASSERT_EQ(off.size(), t.slices.size());
  bool odd = false;
  for (size_t i = 0; i < t.slices.size(); i++) {
    const ParamSlice& s = t.slices[i];
    odd |= s.offset % 2 == 1;
    const bool part = i > 0 && t.slices[i - 1].layer == s.layer && t.slices[i - 1].role == s.role;
    if (part)
      EXPECT_EQ(off[i], off[i - 1] + t.slices[i - 1].numel) << s.name << ": the parts of a tensor are adjacent";
    else
      EXPECT_EQ(off[i] % 128, 0u) << s.name;
    EXPECT_LE(off[i] + s.numel, n16) << s.name;
  }
  EXPECT_LT(n16, t.numel + 128 * t.slices.size());
  if (std::string(c.family) == "bert") {
    EXPECT_TRUE(odd) << "the case needs packed tensors at odd offsets";
  }
  Activations a(m, 4, 16);
  m.init_params(3);
  RandomBatch batch(d, 4, 16, 51);
  g_copy_alignment = {};
  for (StepKind kind : {StepKind::plain, StepKind::fused_head, StepKind::split_backward})
    train_step(m, a, batch.b, kind);
  EXPECT_GT(g_copy_alignment.seen, 0u);
  EXPECT_EQ(g_copy_alignment.misaligned, 0u) << "of " << g_copy_alignment.seen << " weight copies handed to dense ops";
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16OperandsModel, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<WeightCopyFamily>& i) { return std::string(i.param.name); });

// ---- CUDA ----------------------------------------------------------------------------------------------

TEST(CudaBf16Operands, Bf16CopyEqualsTheHostRounding) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  std::vector<float> x = random_floats(100003, 8, -3.0f, 3.0f);
  x.insert(x.end(), {0.0f, -0.0f, 1.00390625f, std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::quiet_NaN(), 3.4028235e38f, 1e-40f});
  Dev dx(x), dy(x.size() * sizeof(uint16_t));
  gpu().bf16_copy(static_cast<uint16_t*>(dy.p), dx.f(), x.size());
  std::vector<uint16_t> got(x.size());
  gpu().copy_to_host(got.data(), dy.p, dy.bytes);
  EXPECT_EQ(got, host_bits(x));
}

TEST(CudaBf16Operands, DenseOpsWithTheCopyEqualRoundingInTheOp) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  const Ops& o = gpu();
  for (const DenseCase& s : kDense) {
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    Dev x(random_floats(nx, 2)), w(random_floats(nw, 3)), b(random_floats(s.OC, 5)), dout(random_floats(nd, 6)),
        pre(random_floats(nx, 7, -3.0f, 3.0f)), out(nd * 4), out2(nd * 4), dinp(nx * 4), dpre(nx * 4),
        w16(nw * sizeof(uint16_t));
    auto get = [&](const float* p, size_t n) {
      std::vector<float> h(n);
      o.copy_to_host(h.data(), p, n * sizeof(float));
      return h;
    };
    auto run = [&](GemmMode g) {
      return dense_ops(o, s, x.f(), w.f(), b.f(), dout.f(), pre.f(), g, out.f(), out2.f(), dinp.f(), dpre.f(), get);
    };
    const std::string where = "N=" + std::to_string(s.N) + " OC=" + std::to_string(s.OC);
    const auto rounding = run(kBf16);
    o.bf16_copy(static_cast<uint16_t*>(w16.p), w.f(), nw);
    const uint64_t c0 = o.bf16_weight_rounding_count();
    EXPECT_SAME_BITS(run(GemmMode(kBf16, static_cast<const uint16_t*>(w16.p))), rounding) << where;
    EXPECT_EQ(o.bf16_weight_rounding_count(), c0) << where;
  }
}

TEST(CudaBf16Operands, LogitsGradientIsTheRecordedOneRounded) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  // (V = 60000: more than a block's shared memory holds, the kernel that reads the row twice)
  for (auto [N, V, bad_row] : {std::array<int, 3>{37, 1001, 11}, std::array<int, 3>{64, 50257, -1},
                               std::array<int, 3>{8, 60000, 3}}) {
    const XentCase x(N, V, bad_row, 66);
    const int ld = lm_logits_row_stride(V);
    const std::string where = "N=" + std::to_string(N) + " V=" + std::to_string(V);
    const std::vector<float> in = pad_rows(x.logits, N, V, ld, kNaN);  // (as on the CPU)
    Dev want(x.logits), want_loss(nans(N)), logits(in), loss(nans(N)), grad((size_t)N * ld * sizeof(uint16_t)),
        flags(std::vector<uint64_t>{0, 0}), targets(x.targets);
    gpu().softmax_xent_record(want.f(), V, want_loss.f(), targets.i(), N, V, 0.37f, static_cast<uint64_t*>(flags.p), 100);
    gpu().copy_to_device(grad.p, std::vector<uint16_t>((size_t)N * ld, 0xABCD).data(), grad.bytes);
    gpu().softmax_xent_bf16_grad(logits.f(), ld, loss.f(), targets.i(), N, V, 0.37f, static_cast<uint16_t*>(grad.p),
                                 static_cast<uint64_t*>(flags.p) + 1, 100);
    EXPECT_SAME_BITS(loss.get(), want_loss.get()) << where;
    EXPECT_SAME_BITS(logits.get(), in) << where;
    std::vector<uint64_t> f(2);
    gpu().copy_to_host(f.data(), flags.p, sizeof(uint64_t) * 2);
    EXPECT_EQ(f[0], f[1]) << where;
    std::vector<uint16_t> g((size_t)N * ld);
    gpu().copy_to_host(g.data(), grad.p, grad.bytes);
    const auto w = want.get();
    size_t wrong = 0, pad = 0;
    for (int n = 0; n < N; n++) {
      if (n == bad_row) continue;
      for (int j = 0; j < ld; j++) {
        if (j < V) wrong += g[(size_t)n * ld + j] != float_to_bf16_bits(w[(size_t)n * V + j]);
        else pad += g[(size_t)n * ld + j] != 0;
      }
    }
    EXPECT_EQ(wrong, 0u) << where;
    EXPECT_EQ(pad, 0u) << where;
  }
}

TEST(CudaBf16Operands, MatmulBackwardReadsTheBf16Dout) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  for (const DenseCase& s : kDense) {
    const int ld = bf16_row_stride(s.OC);
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    const auto dout = random_floats(nd, 63);
    const std::vector<uint16_t> h16 = pad_rows(host_bits(dout), s.N, s.OC, ld, uint16_t{0});
    Dev x(random_floats(nx, 61)), w(random_floats(nw, 62)), d(dout), d16(h16.size() * sizeof(uint16_t)),
        want_x(random_floats(nx, 64)), want_w(random_floats(nw, 65)), got_x(random_floats(nx, 64)),
        got_w(random_floats(nw, 65));
    gpu().copy_to_device(d16.p, h16.data(), d16.bytes);
    gpu().matmul_backward(want_x.f(), want_w.f(), nullptr, d.f(), x.f(), w.f(), s.N, s.C, s.OC, kBf16);
    GemmMode g(kBf16);
    g.dout_bf16 = static_cast<const uint16_t*>(d16.p);
    g.dout_ld = ld;
    gpu().matmul_backward(got_x.f(), got_w.f(), nullptr, nullptr, x.f(), w.f(), s.N, s.C, s.OC, g);
    const std::string where = "N=" + std::to_string(s.N) + " OC=" + std::to_string(s.OC);
    EXPECT_SAME_BITS(got_x.get(), want_x.get()) << where;
    EXPECT_SAME_BITS(got_w.get(), want_w.get()) << where;
  }
}

// On the GPU the V rule (float4 rows) must not depend on which outputs are written: C = 768 takes
// V = 4, C = 70 and a row-misaligned bf16 output V = 1.
TEST(CudaBf16Operands, NormOutputIsTheFp32OutputRoundedWithOrWithoutIt) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  for (auto [N, C] : {std::array<int, 2>{7, 70}, std::array<int, 2>{300, 768}}) {
    const size_t n = (size_t)N * C;
    Dev x(random_floats(n, 70, -2.0f, 3.0f)), a(random_floats(n, 71)), b(random_floats(n, 72)), w(random_floats(C, 73)),
        bias(random_floats(C, 74)), res(n * 4), out(n * 4), out16(n * 2 + 16), mean(N * 4), rstd(N * 4);
    for (int shift : {0, 1}) {  // shift: the bf16 output one value off its alignment
      uint16_t* o16 = static_cast<uint16_t*>(out16.p) + shift;
      auto run = [&](bool f32, bool b16) {
        return norm_outputs(gpu(), N, C, f32, b16, x.f(), a.f(), b.f(), res.f(), w.f(), bias.f(), out.f(), o16, mean.f(),
                            rstd.f());
      };
      const std::string where = "N=" + std::to_string(N) + " C=" + std::to_string(C) + " shift " + std::to_string(shift);
      const ForwardOutputs fp32 = run(true, false), both = run(true, true), only = run(false, true);
      EXPECT_EQ(both.b16, host_bits(both.f32)) << where;
      if (shift == 0) {
        EXPECT_SAME_BITS(both.f32, fp32.f32) << where;
        EXPECT_EQ(only.b16, both.b16) << where << ": the bf16 output alone";
      }
    }
  }
}

TEST(CudaBf16Operands, ActivationOutputIsTheFp32OutputRoundedWithOrWithoutIt) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  for (auto [N, F] : {std::array<int, 2>{37, 119}, std::array<int, 2>{640, 2048}}) {
    Dev inp(random_floats((size_t)N * 2 * F, 80, -4.0f, 4.0f)), out((size_t)N * F * 4), out16((size_t)N * F * 2);
    auto run = [&](bool f32, bool b16) {
      return activation_outputs(gpu(), N, F, f32, b16, inp.f(), out.f(), static_cast<uint16_t*>(out16.p));
    };
    const std::string where = "N=" + std::to_string(N) + " F=" + std::to_string(F);
    const ForwardOutputs fp32 = run(true, false), both = run(true, true), only = run(false, true);
    EXPECT_SAME_BITS(both.f32, fp32.f32) << where;
    EXPECT_EQ(both.b16, host_bits(fp32.f32)) << where;
    EXPECT_EQ(only.b16, both.b16) << where;
  }
}

// matmul_gelu_forward's act_bf16 on CUDA: the rounding of the act written beside it, and the same
// bits without it. In fp32 asking for it leaves cuBLASLt's GELU epilogue (our kernel writes the
// bf16 act), so the fp32 act is compared with the epilogue's only in bf16, where both are ours.
TEST(CudaBf16Operands, GemmGeluOutputIsTheFp32OutputRoundedWithOrWithoutIt) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  for (const DenseCase& s : kDense) {
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    Dev x(random_floats(nx, 81, -2.0f, 2.0f)), w(random_floats(nw, 82)), b(random_floats(s.OC, 83)), pre(nd * 4),
        act(nd * 4), act16(nd * 2);
    for (GemmPrecision prec : {GemmPrecision::fp32, kBf16}) {
      auto run = [&](bool f32, bool b16) {
        return gemm_gelu_outputs(gpu(), s, prec, f32, b16, x.f(), w.f(), b.f(), pre.f(), act.f(),
                                 static_cast<uint16_t*>(act16.p));
      };
      const std::string where = std::string(prec == kBf16 ? "bf16" : "fp32") + " N=" + std::to_string(s.N) +
                                " OC=" + std::to_string(s.OC);
      const ForwardOutputs fp32 = run(true, false), both = run(true, true), only = run(false, true);
      if (prec == kBf16) {
        EXPECT_SAME_BITS(both.f32, fp32.f32) << where;
      }
      EXPECT_EQ(both.b16, host_bits(act_part(both, nd))) << where;
      EXPECT_SAME_BITS(only.f32, std::vector<float>(both.f32.begin(), both.f32.begin() + nd)) << where << ": pre";
      EXPECT_EQ(only.b16, both.b16) << where << ": the bf16 output alone";
    }
  }
}

TEST(CudaBf16Operands, GemmsReadTheBf16Input) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  for (const DenseCase& s : kDense) {
    const size_t nx = (size_t)s.N * s.C, nw = (size_t)s.OC * s.C, nd = (size_t)s.N * s.OC;
    const auto xh = random_floats(nx, 75);
    const auto x16h = host_bits(xh);
    Dev x(xh), x16(nx * 2), w(random_floats(nw, 76)), b(random_floats(s.OC, 77)), dout(random_floats(nd, 78)),
        want(nd * 4), got(nd * 4), pre(nd * 4), want_w(random_floats(nw, 79)), got_w(random_floats(nw, 79));
    gpu().copy_to_device(x16.p, x16h.data(), x16.bytes);
    GemmMode g(kBf16);
    g.inp_bf16 = static_cast<const uint16_t*>(x16.p);
    const std::string where = "N=" + std::to_string(s.N) + " OC=" + std::to_string(s.OC);
    gpu().matmul_forward(want.f(), x.f(), w.f(), b.f(), s.N, s.C, s.OC, kBf16);
    gpu().matmul_forward(got.f(), nullptr, w.f(), b.f(), s.N, s.C, s.OC, g);
    EXPECT_SAME_BITS(got.get(), want.get()) << where;
    gpu().matmul_gelu_forward(pre.f(), want.f(), x.f(), w.f(), b.f(), s.N, s.C, s.OC, kBf16, nullptr);
    gpu().matmul_gelu_forward(pre.f(), got.f(), nullptr, w.f(), b.f(), s.N, s.C, s.OC, g, nullptr);
    EXPECT_SAME_BITS(got.get(), want.get()) << where;
    gpu().matmul_backward(nullptr, want_w.f(), nullptr, dout.f(), x.f(), nullptr, s.N, s.C, s.OC, kBf16);
    gpu().matmul_backward(nullptr, got_w.f(), nullptr, dout.f(), nullptr, nullptr, s.N, s.C, s.OC, g);
    EXPECT_SAME_BITS(got_w.get(), want_w.get()) << where;
  }
}

TEST(CudaBf16Operands, ModelStepsHaveTheBitsOfRoundingInEveryOp) {
  const cpu::ScopedCpuBf16Gemm oracle(CpuBf16Gemm::emulate);  // the emulation, bit for bit
  REQUIRE_GPU();
  for (const WeightCopyFamily& c : kFamilies) {
    const ModelDesc d = copy_desc(c);
    for (StepKind kind : {StepKind::plain, StepKind::fused_head}) {
      const StepResult want = train_bf16(d, rounding_in_every_op<cuda_ops>(), kind, 2, true);
      const StepResult got = train_bf16(d, gpu(), kind, 2, false);
      const std::string where = std::string(c.name) + ", " + step_name(kind);
      EXPECT_SAME_BITS(got.losses, want.losses) << where;
      EXPECT_SAME_BITS(got.grads, want.grads) << where;
      EXPECT_SAME_BITS(got.params, want.params) << where;
    }
  }
}
