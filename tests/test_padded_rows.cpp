// Padded row strides (backend/gemm_precision.h GemmMode::out_ld / dout_ld, op_list.h
// softmax_xent_record / softmax_xent_bf16_grad's ld): the LM head keeps its logits in rows of
// lm_logits_row_stride(V) values (a multiple of 64; model/model_desc.h), so its GEMMs see aligned
// rows. Every op must give on padded rows what it gives on contiguous ones, and leave the padding
// alone:
//  - matmul_forward with out_ld writes the contiguous result's bits into rows of out_ld and not a
//    byte of the padding (fp32 and bf16, with and without a bias, and with no input, C = 0);
//  - matmul_backward and matmul_dgelu_backward with dout_ld read dout (and a bf16 dout_bf16) in
//    rows of dout_ld, and never the padding (NaN there: read, it would poison the result);
//    matmul_gelu_forward refuses an out_ld (its two outputs are contiguous);
//  - softmax_xent_record on rows of ld: the same losses and gradient bits, padding untouched;
//  - the Model's LM-head chunk buffer has rows of lm_logits_row_stride(V) (GPT-2: 50304), all_logits
//    and the classifier contiguous ones, and its memory is what memory_estimate counts.
// On the CPU every comparison is exact: the same sgemm calls on the same values, only the row
// stride of the output or of dout differing (OpenBLAS's kernels do not depend on it). The CUDA
// cases (CudaPaddedRows.*) skip without a GPU; there the GEMMs are compared with the CPU (cuBLAS may
// pick another kernel for another stride, so not bit for bit) within two fp32 summation orders'
// bound of the sums' magnitudes (the operands rounded to bf16 first in bf16, whose products are
// exact in fp32), the softmax bit for bit with the GPU's own contiguous result (the same kernel).
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "backend/bf16.h"
#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "grad_check.h"
#include "model/model_desc.h"
#include "model_test_util.h"
#include "ref_transformer.h"
#include "runtime/error.h"
#include "model/memory_estimate.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

const float kSentinel = 1234.5f;  // an output's padding before the op: must still be there after

struct Dense {
  int N, C, OC;
};
// OC odd (padded to 64) and a multiple of 8 that still gets a padded stride (768 -> 832: the
// stride of OC + 1), large enough for the CPU's tiled sgemm.
const Dense kCases[] = {{37, 70, 53}, {96, 256, 768}};
int ld_for(int OC) { return lm_logits_row_stride(OC + 1); }

const GemmPrecision kPrecisions[] = {GemmPrecision::fp32, GemmPrecision::bf16};

std::string where(const Dense& s, GemmPrecision p) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " OC=" + std::to_string(s.OC) + " " +
         gemm_precision_name(p);
}

GemmMode with_out_ld(GemmPrecision p, int ld) {
  GemmMode g(p);
  g.out_ld = ld;
  return g;
}
GemmMode with_dout_ld(GemmPrecision p, int ld) {
  GemmMode g(p);
  g.dout_ld = ld;
  return g;
}

// A dense case's inputs (one seed each), with dout also in rows of ld_for(OC) whose padding is NaN
// (read, it would poison a result), in fp32 and as bf16 bits.
struct DenseInputs {
  int ld;
  std::vector<float> x, w, b, dout, dx0, dw0, db0, pre, padded_dout;
  std::vector<uint16_t> padded_dout16;
  explicit DenseInputs(const Dense& s)
      : ld(ld_for(s.OC)), x(random_floats((size_t)s.N * s.C, 1)), w(random_floats((size_t)s.OC * s.C, 2)),
        b(random_floats(s.OC, 3)), dout(random_floats((size_t)s.N * s.OC, 7)), dx0(random_floats(x.size(), 8)),
        dw0(random_floats(w.size(), 9)), db0(random_floats(s.OC, 10)),
        pre(random_floats((size_t)s.N * s.C, 13, -3.0f, 3.0f)), padded_dout(pad_rows(dout, s.N, s.OC, ld, kNaN)),
        padded_dout16(pad_rows(host_bits(dout), s.N, s.OC, ld, uint16_t{0x7FC0} /* NaN */)) {}
  // The CPU's matmul_backward on contiguous rows (the reference): the three gradients after.
  std::array<std::vector<float>, 3> backward(const Dense& s, GemmPrecision p) const {
    std::array<std::vector<float>, 3> g = {dx0, dw0, db0};
    cpu_ops().matmul_backward(g[0].data(), g[1].data(), g[2].data(), dout.data(), x.data(), w.data(), s.N, s.C, s.OC,
                              p);
    return g;
  }
};

// Two fp32 orders of a dense layer's sums (on the operands rounded to bf16 in bf16): 2 gamma_K
// times the magnitude of each sum's K + 1 terms, for out (the bias and C products), dx (dx0 and OC
// products), dw (dw0 and N products), db (db0 and the N unrounded douts), and d = dout·W alone (OC
// products, the dgelu backward's).
struct DenseBounds {
  std::vector<double> out, dx, dw, db, d;
};
DenseBounds two_orders(const Dense& s, const DenseInputs& in, GemmPrecision p, bool bias) {
  auto r = [p](float v) { return std::fabs(static_cast<double>(p == GemmPrecision::bf16 ? round_to_bf16(v) : v)); };
  DenseBounds b;
  b.out.assign((size_t)s.N * s.OC, 0.0);
  b.d.assign((size_t)s.N * s.C, 0.0);
  b.dw.assign((size_t)s.OC * s.C, 0.0);
  b.db.assign(s.OC, 0.0);
  for (int n = 0; n < s.N; n++)
    for (int o = 0; o < s.OC; o++) {
      double acc = bias ? std::fabs(in.b[o]) : 0.0;
      const double d = r(in.dout[(size_t)n * s.OC + o]);
      b.db[o] += std::fabs(in.dout[(size_t)n * s.OC + o]);
      for (int c = 0; c < s.C; c++) {
        const double x = r(in.x[(size_t)n * s.C + c]), w = r(in.w[(size_t)o * s.C + c]);
        acc += x * w;
        b.d[(size_t)n * s.C + c] += d * w;
        b.dw[(size_t)o * s.C + c] += d * x;
      }
      b.out[(size_t)n * s.OC + o] = 2.0 * gamma_n(s.C) * acc;
    }
  b.dx.resize(b.d.size());
  for (size_t i = 0; i < b.d.size(); i++) b.dx[i] = 2.0 * gamma_n(s.OC) * (std::fabs(in.dx0[i]) + b.d[i]);
  for (size_t i = 0; i < b.dw.size(); i++) b.dw[i] = 2.0 * gamma_n(s.N) * (std::fabs(in.dw0[i]) + b.dw[i]);
  for (int o = 0; o < s.OC; o++) b.db[o] = 2.0 * gamma_n(s.N) * (std::fabs(in.db0[o]) + b.db[o]);
  return b;
}

struct XentRows {
  int N, V, ld;
  std::vector<float> logits;
  std::vector<int32_t> targets;
  XentRows(int N_, int V_, int bad_row, uint32_t seed)
      : N(N_), V(V_), ld(lm_logits_row_stride(V_)), logits(random_floats((size_t)N_ * V_, seed, -8.0f, 8.0f)) {
    for (int n = 0; n < N; n++) targets.push_back((n * 5 + 1) % V);
    if (bad_row >= 0) targets[bad_row] = -3;
  }
};

}  // namespace

TEST(PaddedRows, LmLogitsRowStrideIsTheNextMultipleOf64) {
  EXPECT_EQ(lm_logits_row_stride(50257), 50304);  // GPT-2 (llm.c's padded vocabulary)
  EXPECT_EQ(lm_logits_row_stride(32000), 32000);  // LLaMA: already a multiple of 64
  EXPECT_EQ(lm_logits_row_stride(30522), 30528);  // BERT
  EXPECT_EQ(lm_logits_row_stride(65), 128);
  EXPECT_EQ(lm_logits_row_stride(1), 64);
}

// ---- the dense ops, CPU ----------------------------------------------------------------------------

TEST(PaddedRows, MatmulForwardWritesRowsOfOutLdAndNotThePadding) {
  for (const Dense& s : kCases)
    for (GemmPrecision p : kPrecisions)
      for (bool bias : {true, false}) {
        const DenseInputs in(s);
        const int ld = in.ld;
        const float* bp = bias ? in.b.data() : nullptr;
        std::vector<float> want((size_t)s.N * s.OC), got((size_t)s.N * ld, kSentinel);
        cpu_ops().matmul_forward(want.data(), in.x.data(), in.w.data(), bp, s.N, s.C, s.OC, p);
        cpu_ops().matmul_forward(got.data(), in.x.data(), in.w.data(), bp, s.N, s.C, s.OC, with_out_ld(p, ld));
        const std::string at = where(s, p) + " bias " + std::to_string(bias);
        EXPECT_SAME_BITS(unpad_rows(got, s.N, s.OC, ld), want) << at;  // Exact (see the top)
        EXPECT_SAME_BITS(padding_of(got, s.N, s.OC, ld), std::vector<float>((size_t)s.N * (ld - s.OC), kSentinel))
            << at;
      }
  // No input (C = 0): out = bias, or 0, in rows of out_ld (Exact: copies)
  const int N = 5, OC = 53, ld = ld_for(OC);
  const auto b = random_floats(OC, 4);
  for (bool bias : {true, false}) {
    std::vector<float> got((size_t)N * ld, kSentinel);
    cpu_ops().matmul_forward(got.data(), nullptr, nullptr, bias ? b.data() : nullptr, N, 0, OC,
                             with_out_ld(GemmPrecision::fp32, ld));
    std::vector<float> want;
    for (int n = 0; n < N; n++)
      for (int j = 0; j < OC; j++) want.push_back(bias ? b[j] : 0.0f);
    EXPECT_SAME_BITS(unpad_rows(got, N, OC, ld), want) << "C = 0, bias " << bias;
    EXPECT_SAME_BITS(padding_of(got, N, OC, ld), std::vector<float>((size_t)N * (ld - OC), kSentinel));
  }
}

TEST(PaddedRows, MatmulBackwardReadsDoutRowsOfDoutLd) {
  for (const Dense& s : kCases)
    for (GemmPrecision p : kPrecisions)
      for (bool given16 : {false, true}) {
        if (given16 && p != GemmPrecision::bf16) continue;
        const DenseInputs in(s);
        const auto want = in.backward(s, p);
        GemmMode g = with_dout_ld(p, in.ld);
        if (given16) g.dout_bf16 = in.padded_dout16.data();
        auto got_x = in.dx0, got_w = in.dw0, got_b = in.db0;
        cpu_ops().matmul_backward(got_x.data(), got_w.data(), got_b.data(), in.padded_dout.data(), in.x.data(),
                                  in.w.data(), s.N, s.C, s.OC, g);
        const std::string at = where(s, p) + (given16 ? " dout_bf16" : "");
        EXPECT_SAME_BITS(got_x, want[0]) << at;
        EXPECT_SAME_BITS(got_w, want[1]) << at;
        EXPECT_SAME_BITS(got_b, want[2]) << at;
      }
}

TEST(PaddedRows, DgeluBackwardReadsDoutRowsOfDoutLdAndGeluForwardRefusesOutLd) {
  for (const Dense& s : kCases)
    for (GemmPrecision p : kPrecisions) {
      const DenseInputs in(s);
      std::vector<float> want((size_t)s.N * s.C), got((size_t)s.N * s.C);
      cpu_ops().matmul_dgelu_backward(want.data(), in.dout.data(), in.w.data(), in.pre.data(), s.N, s.C, s.OC, p);
      cpu_ops().matmul_dgelu_backward(got.data(), in.padded_dout.data(), in.w.data(), in.pre.data(), s.N, s.C, s.OC,
                                      with_dout_ld(p, in.ld));
      EXPECT_SAME_BITS(got, want) << where(s, p);
    }
  const Dense s = kCases[0];
  std::vector<float> x((size_t)s.N * s.C), w((size_t)s.OC * s.C), pre((size_t)s.N * 64), act((size_t)s.N * 64);
  EXPECT_THROW(cpu_ops().matmul_gelu_forward(pre.data(), act.data(), x.data(), w.data(), nullptr, s.N, s.C, s.OC,
                                             with_out_ld(GemmPrecision::fp32, 64), nullptr),
               Error);
}

// ---- the cross-entropy, CPU ------------------------------------------------------------------------

TEST(PaddedRows, SoftmaxXentRecordOnRowsOfLd) {
  for (auto [N, V, bad_row] : {std::array<int, 3>{7, 53, -1}, std::array<int, 3>{37, 1001, 4}}) {
    const XentRows x(N, V, bad_row, 14);
    const std::string at = "N=" + std::to_string(N) + " V=" + std::to_string(V);
    for (float scale : {0.0f, 0.25f}) {
      std::vector<float> want = x.logits, want_loss(N);
      uint64_t want_bad = 0;
      cpu_ops().softmax_xent_record(want.data(), V, want_loss.data(), x.targets.data(), N, V, scale, &want_bad, 9);
      std::vector<float> got = pad_rows(x.logits, N, V, x.ld, kNaN), loss(N);
      uint64_t bad = 0;
      cpu_ops().softmax_xent_record(got.data(), x.ld, loss.data(), x.targets.data(), N, V, scale, &bad, 9);
      EXPECT_SAME_BITS(loss, want_loss) << at << " scale " << scale;
      EXPECT_SAME_BITS(unpad_rows(got, N, V, x.ld), want) << at << " scale " << scale;
      EXPECT_SAME_BITS(padding_of(got, N, V, x.ld), std::vector<float>((size_t)N * (x.ld - V), kNaN)) << at;
      EXPECT_EQ(bad, want_bad) << at;
      EXPECT_EQ(bad != 0, bad_row >= 0) << at;
    }
  }
}

// ---- the Model ---------------------------------------------------------------------------------------

TEST(PaddedRows, LmHeadChunkBufferHasPaddedRows) {
  for (const char* family : {"gpt2", "llama", "bert"})
    for (GemmPrecision p : kPrecisions) {
      ModelDesc d = desc_of(family, 1, 2, 32, 8, 101);  // V = 101: rows of 128
      d.lm_head_chunk_rows = 3;
      const Model m(d, cpu_ops(), ModelPart::whole(), p);
      const std::string at = std::string(family) + " " + gemm_precision_name(p);
      for (bool all : {false, true}) {
        Activations a;
        a.all_logits = all;
        a.allocate(m, 2, 8);
        if (d.head != HeadKind::lm) {
          EXPECT_EQ(a.logits_ld, d.num_labels) << at;
        } else {
          EXPECT_EQ(a.logits_ld, all ? 101 : 128) << at << " all_logits " << all;
          EXPECT_EQ(a.lm_rows, all ? 16 : 3) << at;
        }
        if (!all) {  // (activation_bytes also counts the host's row of losses)
          EXPECT_EQ(a.bytes() + m.rows_for_loss(2, 8) * sizeof(float), activation_bytes(d, 2, 8, p))
              << at << ": memory_estimate counts the padding";
        }
      }
    }
}

// ---- CUDA ------------------------------------------------------------------------------------------

TEST(CudaPaddedRows, MatmulForwardWritesRowsOfOutLdAndNotThePadding) {
  REQUIRE_GPU();
  for (const Dense& s : kCases)
    for (GemmPrecision p : kPrecisions)
      for (bool bias : {true, false}) {
        const DenseInputs in(s);
        const int ld = in.ld;
        std::vector<float> want((size_t)s.N * s.OC);
        cpu_ops().matmul_forward(want.data(), in.x.data(), in.w.data(), bias ? in.b.data() : nullptr, s.N, s.C, s.OC,
                                 p);
        Dev dx(in.x), dw(in.w), db(in.b), out(std::vector<float>((size_t)s.N * ld, kSentinel));
        gpu().matmul_forward(out.f(), dx.f(), dw.f(), bias ? db.f() : nullptr, s.N, s.C, s.OC, with_out_ld(p, ld));
        const auto got = out.get();
        const std::string at = where(s, p) + " bias " + std::to_string(bias);
        // Bound: two fp32 orders of the same sums (two_orders).
        EXPECT_TRUE(within_bound(unpad_rows(got, s.N, s.OC, ld), to_double(want), two_orders(s, in, p, bias).out, at));
        EXPECT_SAME_BITS(padding_of(got, s.N, s.OC, ld), std::vector<float>((size_t)s.N * (ld - s.OC), kSentinel))
            << at;
      }
}

TEST(CudaPaddedRows, MatmulBackwardReadsDoutRowsOfDoutLd) {
  REQUIRE_GPU();
  for (const Dense& s : kCases)
    for (GemmPrecision p : kPrecisions)
      for (bool given16 : {false, true}) {
        if (given16 && p != GemmPrecision::bf16) continue;
        const DenseInputs in(s);
        const auto want = in.backward(s, p);
        Dev gx(in.x), gw(in.w), gd(in.padded_dout), gd16(in.padded_dout16), gdx(in.dx0), gdw(in.dw0), gdb(in.db0);
        GemmMode g = with_dout_ld(p, in.ld);
        if (given16) g.dout_bf16 = static_cast<const uint16_t*>(gd16.p);
        gpu().matmul_backward(gdx.f(), gdw.f(), gdb.f(), gd.f(), gx.f(), gw.f(), s.N, s.C, s.OC, g);
        const std::string at = where(s, p) + (given16 ? " dout_bf16" : "");
        // Bound: two fp32 orders of the same sums onto the same initial gradients (two_orders);
        // compared after the adds, which holds the added parts to the same bound.
        const DenseBounds b = two_orders(s, in, p, false);
        EXPECT_TRUE(within_bound(gdx.get(), to_double(want[0]), b.dx, at + " dinp"));
        EXPECT_TRUE(within_bound(gdw.get(), to_double(want[1]), b.dw, at + " dweight"));
        EXPECT_TRUE(within_bound(gdb.get(), to_double(want[2]), b.db, at + " dbias"));
      }
}

TEST(CudaPaddedRows, DgeluBackwardReadsDoutRowsOfDoutLd) {
  REQUIRE_GPU();
  for (const Dense& s : kCases)
    for (GemmPrecision p : kPrecisions) {
      const DenseInputs in(s);
      std::vector<float> want((size_t)s.N * s.C);
      cpu_ops().matmul_dgelu_backward(want.data(), in.dout.data(), in.w.data(), in.pre.data(), s.N, s.C, s.OC, p);
      Dev gw(in.w), gd(in.padded_dout), gpre(in.pre), got(nans((size_t)s.N * s.C));
      gpu().matmul_dgelu_backward(got.f(), gd.f(), gw.f(), gpre.f(), s.N, s.C, s.OC, with_dout_ld(p, in.ld));
      // Bound: dpre = gelu'(pre) d on each side, d = dout·W within gamma_OC of its magnitude m of
      // the exact (|d| ≤ m), gelu' within gelu_tanh_grad_err's bound on the CPU; on the GPU that
      // of our kernel (expf) or, where cuBLASLt's DGELU epilogue runs (fp32, C a multiple of 8),
      // of the tanh form 0.5 (1 + t) + 0.5 x (1 − t²) u', t = tanh u, whichever is larger: t within
      // 5u (tanhf, 2 ulp), 1 − t² within 11u, the rest rounding 6u of x u', so 3.5u + 8.5u |x u'|;
      // and one product's rounding each.
      const DenseBounds b = two_orders(s, in, p, false);
      std::vector<double> bound(want.size());
      for (size_t i = 0; i < want.size(); i++) {
        const double x = in.pre[i], du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
        const Err g_cpu = gelu_tanh_grad_err(in.pre[i]), g_gpu_kernel = gelu_tanh_grad_err(in.pre[i], true);
        const Err g_gpu{g_gpu_kernel.v,
                        std::max(g_gpu_kernel.e, kUnitFp32 * (3.5 + 8.5 * std::fabs(x * du)))};
        const Err d{b.d[i], gamma_n(s.OC) * b.d[i]};  // (its magnitude for its value: a bound on |d|)
        bound[i] = (g_cpu * d).e + (g_gpu * d).e;
      }
      EXPECT_TRUE(within_bound(got.get(), to_double(want), bound, where(s, p)));
    }
}

// The same kernel on each row whatever the stride: the GPU's contiguous result, bit for bit
// (Exact).
TEST(CudaPaddedRows, SoftmaxXentRecordOnRowsOfLd) {
  REQUIRE_GPU();
  for (auto [N, V, bad_row] : {std::array<int, 3>{37, 1001, 4}, std::array<int, 3>{64, 50257, -1}}) {
    const XentRows x(N, V, bad_row, 15);
    const std::string at = "N=" + std::to_string(N) + " V=" + std::to_string(V);
    Dev want(x.logits), want_loss(nans(N)), got(pad_rows(x.logits, N, V, x.ld, kNaN)), loss(nans(N)),
        targets(x.targets), flags(std::vector<uint64_t>{0, 0});
    gpu().softmax_xent_record(want.f(), V, want_loss.f(), targets.i(), N, V, 0.25f, static_cast<uint64_t*>(flags.p), 9);
    gpu().softmax_xent_record(got.f(), x.ld, loss.f(), targets.i(), N, V, 0.25f, static_cast<uint64_t*>(flags.p) + 1,
                              9);
    const auto g = got.get();
    EXPECT_SAME_BITS(loss.get(), want_loss.get()) << at;
    EXPECT_SAME_BITS(unpad_rows(g, N, V, x.ld), want.get()) << at;
    EXPECT_SAME_BITS(padding_of(g, N, V, x.ld), std::vector<float>((size_t)N * (x.ld - V), kNaN)) << at;
    std::vector<uint64_t> f(2);
    gpu().copy_to_host(f.data(), flags.p, sizeof(uint64_t) * 2);
    EXPECT_EQ(f[0], f[1]) << at;
    EXPECT_EQ(f[1] != 0, bad_row >= 0) << at;
  }
}
