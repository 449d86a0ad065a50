// The CPU backend's bf16 and tf32 fused attention (flash_attention_forward/backward with prec = bf16 or tf32): the
// emulation of the CUDA tensor-core kernels' rounding (backend/flash_bf16.h), which is the oracle
// of tests/test_cuda_flash_bf16.cpp.
//  - FlashBf16Cpu.MatchesTheRoundingSpecInDouble: out, lse and the added dqkv against an
//    independent double-precision implementation of the spec (the same bf16 operands, sums in
//    double), over T = 1, 5, 67, 130, NH/NKV 4/4 and 4/2, causal and bidirectional with a mask
//    (queries and a sequence with no visible key), dropout 0 and 0.1, hs 16 and 64. The two differ
//    only by the fp32 sums of the op, and through them by a rare flip of a P or dS rounding (the
//    same kind of difference, other fp32 summation orders, separates the GPU from the CPU): held
//    element by element to a running error analysis of the op that knows where a flip can happen.
//  - ...OnlyTheRoundedInputsCount: qkv and round_to_bf16(qkv) give the same bits (q, k, v are
//    read only through their bf16 roundings), and the result differs from the fp32 op by more than
//    fp32 rounding (the mode is applied) and by no more than the rounding's bound (element by
//    element).
//  - ...SameBitsWithOneAndTwoThreads. Each of the three for bf16 and for tf32 (the same rounding
//    points with round_to_tf32, which Tf32Rounding checks bit by bit).
//  - FlashBf16Model: gpt2 / llama (grouped K/V) / bert (padding mask) with fused attention, 20 AdamW
//    steps in bf16 follow fp32 within 1e-2 (the bf16 tolerance, as test_precision.cpp
//    checks for full attention).
#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/bf16.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/dropout_hash.h"
#include "backend/flash_bf16.h"
#include "backend/tf32.h"
#include "backend/ops.h"
#include "flash_bf16_test_util.h"
#include "grad_check.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "ref_transformer.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

const FlashCase kCases[] = {
    {"T1", 1, 1, 4, 4, 16, true, false, 0.0f},
    {"T5_bidir_mask", 3, 5, 4, 2, 16, false, true, 0.0f},
    {"T67_causal", 2, 67, 4, 4, 16, true, false, 0.0f},
    {"T67_causal_mask_drop", 3, 67, 4, 2, 16, true, true, 0.1f},
    {"T130_bidir_mask_drop", 3, 130, 4, 2, 64, false, true, 0.1f},
    {"T130_causal_gqa", 2, 130, 4, 2, 64, true, false, 0.0f},
};

const Ops& ops() { return cpu_ops(); }

struct Result {
  std::vector<float> out, lse, dqkv;  // dqkv: the added part
};

Result run(const FlashCase& c, const std::vector<float>& qkv, GemmPrecision prec) {
  const auto mask = flash_mask(c);
  const int32_t* m = mask.empty() ? nullptr : mask.data();
  Result r;
  r.out.assign(c.n_out(), std::numeric_limits<float>::quiet_NaN());
  r.lse.assign(c.n_lse(), std::numeric_limits<float>::quiet_NaN());
  ops().flash_attention_forward(r.out.data(), r.lse.data(), qkv.data(), m, c.B, c.T, c.NH, c.NKV, c.hs,
                                c.causal, c.p, kFlashDropKey, prec);
  const auto dout = flash_dout(c), d0 = flash_dqkv0(c);
  std::vector<float> dqkv = d0;
  ops().flash_attention_backward(dqkv.data(), dout.data(), r.out.data(), r.lse.data(), qkv.data(), m, c.B,
                                 c.T, c.NH, c.NKV, c.hs, c.causal, c.p, kFlashDropKey, prec);
  r.dqkv.resize(dqkv.size());
  for (size_t k = 0; k < dqkv.size(); k++) r.dqkv[k] = dqkv[k] - d0[k];
  return r;
}

// The operand rounding of a precision: bf16 or tf32 (backend/flash_bf16.h: the same points).
using Rounding = float (*)(float);
Rounding rounding(GemmPrecision prec) { return prec == GemmPrecision::bf16 ? round_to_bf16 : round_to_tf32; }

// backend/flash_bf16.h's function in double: the same rounded operands (q, k, v, dO; P before P V,
// P~ before P~^T dO, dS' before its two products), every sum in double. The backward takes the
// op's out and lse, as the op does. Computed in Errs (grad_check.h), operation by operation as
// backend/cpu/attention.cpp's emulation computes, so each value comes with a bound on the op's
// distance from it: its fp32 sums (the scores, l and l_r, the P V and gradient GEMMs, D), exp2f
// and log2f (kLogfRel each), the float constants (c is the same float on both sides; ln 2, log2 e
// and 1/sqrt(hs) are rounded), and each rounding the op makes at the spec's points. There the op
// rounds its fp32 value, within e of the reference's x, where the reference rounds x: rounding is
// monotone, so the two land between rnd(x − e) and rnd(x + e), the same value unless a rounding
// boundary lies within e of x (a flip: one ulp of the rounded precision). The integer maximum M is
// the reference's: the op's may exceed it by 1 when the row's maximum is within e of an integer,
// which halves every e of the row (and l, l_r), and out and lse do not depend on it.
//
// spec = false: the same computation against the EXACT attention of the unrounded qkv instead:
// every operand and every rounding point then carry up to the rounded precision's unit (u_r = 2^-8
// for bf16, 2^-11 for tf32) of their value, a bound on the op's distance from the fp32 function.
struct SpecErr {
  std::vector<Err> out, lse, dqkv;  // dqkv: the added part, after − dqkv0 in float as run() takes it
};
SpecErr reference(const FlashCase& c, const std::vector<float>& qkv, const std::vector<float>& out_f,
                  const std::vector<float>& lse_f, Rounding rnd, bool spec = true) {
  const double ur = rnd == round_to_bf16 ? kUnitBf16 : kUnitTf32;
  auto bf = [&](const Err& x) -> Err {  // the op's rounding of a value it computed within x.e of x.v
    if (!spec) return {x.v, x.e + ur * mag(x)};
    const double v = rnd(static_cast<float>(x.v));
    if (x.e == 0.0) return Err(v);
    const double lo = rnd(static_cast<float>(x.v - x.e)), hi = rnd(static_cast<float>(x.v + x.e));
    return {v, std::max(std::fabs(lo - v), std::fabs(hi - v))};
  };
  auto operand = [&](float x) { return spec ? Err(rnd(x)) : Err(x, ur * std::fabs(x)); };
  const int T = c.T, W = c.W(), C = c.C(), hs = c.hs, G = c.NH / c.NKV;
  const auto mask = flash_mask(c);
  const auto dout = flash_dout(c), d0 = flash_dqkv0(c);
  const Err cs(flash_bf16_score_scale(hs));  // the op's float c, exactly
  const Err sc = Err(1.0) / sqrt(Err(static_cast<double>(hs)));
  const Err inv_keep = c.p > 0.0f ? Err(1.0) / (Err(1.0) - Err(c.p)) : Err(1.0);
  const Err ln2 = constant(std::log(2.0)), log2e = constant(1.0 / std::log(2.0));
  SpecErr r;
  r.out.assign(c.n_out(), Err(0.0));
  r.lse.assign(c.n_lse(), Err(-INFINITY));
  std::vector<Sum> dq(c.n_qkv());
  for (size_t e = 0; e < dq.size(); e++) dq[e].add(Err(d0[e]));
  auto at = [&](int b, int t, int col) { return operand(qkv[(static_cast<size_t>(b) * T + t) * W + col]); };
  auto visible = [&](int b, int i, int j) {
    return !(c.causal && j > i) && (mask.empty() || mask[static_cast<size_t>(b) * T + j] != 0);
  };
  auto keep = [&](int b, int h, int i, int j) {
    const uint64_t e = ((static_cast<uint64_t>(b) * c.NH + h) * T + i) * T + j;
    return c.p == 0.0f || dropout_keep(kFlashDropKey, e, c.p);
  };
  std::vector<Err> t(T);
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.NH; h++) {
      const int g = h / G, qc = h * hs, kc = (c.NH + g) * hs, vc = (c.NH + c.NKV + g) * hs;
      for (int i = 0; i < T; i++) {
        const size_t row = (static_cast<size_t>(b) * c.NH + h) * T + i;
        double mx = -INFINITY;
        for (int j = 0; j < T; j++) {
          if (!visible(b, i, j)) continue;
          Sum s;
          for (int d = 0; d < hs; d++) s.add(cs * at(b, i, qc + d) * at(b, j, kc + d));
          t[j] = s.result();
          mx = std::max(mx, t[j].v);
        }
        // forward
        if (mx != -INFINITY) {
          const Err M(std::ceil(mx));
          Sum l, l_r;
          std::vector<Sum> acc(hs);
          for (int j = 0; j < T; j++) {
            if (!visible(b, i, j)) continue;
            const Err e = exp2(t[j] - M, kLogfRel), er = bf(e);
            l.add(e);
            l_r.add(er);
            if (!keep(b, h, i, j)) continue;
            for (int d = 0; d < hs; d++) acc[d].add(er * at(b, j, vc + d));
          }
          const Err f = inv_keep / l_r.result();
          for (int d = 0; d < hs; d++) r.out[(static_cast<size_t>(b) * T + i) * C + qc + d] = acc[d].result() * f;
          r.lse[row] = (M + log2(l.result(), kLogfRel)) * ln2;
        }
        // backward, from the op's out and lse
        const float L = lse_f[row];
        if (L == -INFINITY) continue;
        const float* dOi = &dout[(static_cast<size_t>(b) * T + i) * C + qc];
        const float* Oi = &out_f[(static_cast<size_t>(b) * T + i) * C + qc];
        // (spec = false: the exact out and lse, the op's within their bounds of them)
        Sum D;
        for (int d = 0; d < hs; d++)
          D.add(Err(dOi[d]) * (spec ? Err(Oi[d]) : r.out[(static_cast<size_t>(b) * T + i) * C + qc + d]));
        const Err Lb = (spec ? Err(L) : r.lse[row]) * log2e;
        for (int j = 0; j < T; j++) {
          if (!visible(b, i, j)) continue;
          const Err P = exp2(t[j] - Lb, kLogfRel);
          const Err Pt = keep(b, h, i, j) ? P * inv_keep : Err(0.0);
          Sum dP;
          for (int d = 0; d < hs; d++) dP.add(operand(dOi[d]) * at(b, j, vc + d));
          const Err ds = bf(sc * (Pt * dP.result() - P * D.result())), pt = bf(Pt);
          for (int d = 0; d < hs; d++) {
            dq[(static_cast<size_t>(b) * T + j) * W + vc + d].add(pt * operand(dOi[d]));
            dq[(static_cast<size_t>(b) * T + i) * W + qc + d].add(ds * at(b, j, kc + d));
            dq[(static_cast<size_t>(b) * T + j) * W + kc + d].add(ds * at(b, i, qc + d));
          }
        }
      }
    }
  for (size_t e = 0; e < dq.size(); e++) r.dqkv.push_back(dq[e].result() - Err(d0[e]));
  return r;
}

class FlashBf16Cpu : public ::testing::TestWithParam<FlashCase> {};

}  // namespace

TEST_P(FlashBf16Cpu, MatchesTheRoundingSpecInDouble) {
  const FlashCase& c = GetParam();
  const auto qkv = flash_qkv(c);
  for (GemmPrecision prec : {GemmPrecision::bf16, GemmPrecision::tf32}) {
    SCOPED_TRACE(gemm_precision_name(prec));
    const Result r = run(c, qkv, prec);
    // Bound: reference()'s Errs, element by element (the fp32 sums, and a flip wherever the op's
    // value may straddle a rounding boundary).
    const SpecErr ref = reference(c, qkv, r.out, r.lse, rounding(prec));
    std::vector<double> lse, lse_bound;
    std::vector<float> lse_got;
    for (size_t k = 0; k < ref.lse.size(); k++) {
      if (ref.lse[k].v == -INFINITY) {  // Exact: a row with no visible key is written -inf
        ASSERT_EQ(r.lse[k], -INFINITY) << k;
        continue;
      }
      lse.push_back(ref.lse[k].v), lse_bound.push_back(ref.lse[k].e), lse_got.push_back(r.lse[k]);
    }
    std::printf("%s %s: out %.2e, dqkv %.2e (norm-wise)\n", c.name, gemm_precision_name(prec),
                rel_err(r.out, values(ref.out)), rel_err(r.dqkv, values(ref.dqkv)));
    EXPECT_TRUE(within_bound(r.out, values(ref.out), errors(ref.out), std::string(c.name) + " out"));
    EXPECT_TRUE(within_bound(lse_got, lse, lse_bound, std::string(c.name) + " lse"));
    EXPECT_TRUE(within_bound(r.dqkv, values(ref.dqkv), errors(ref.dqkv), std::string(c.name) + " dqkv"));
  }
}

// Only the rounded inputs count (Exact: rounding is idempotent, so q, k, v, read only through their
// roundings, give the op the same values either way), and the mode is applied (Exact: the result is
// not the fp32 op's bits, which it would be with nothing rounded) and its rounding is no larger
// than bf16's (tf32's). Bound: each op is within its bound of the exact attention of the unrounded
// qkv, the rounded one by reference(spec = false) (u_r of every operand and rounded intermediate,
// and its fp32 sums), the fp32 one by attention_err, so they are within the sum, element by element.
TEST_P(FlashBf16Cpu, OnlyTheRoundedInputsCount) {
  const FlashCase& c = GetParam();
  const auto qkv = flash_qkv(c);
  for (GemmPrecision prec : {GemmPrecision::bf16, GemmPrecision::tf32}) {
    SCOPED_TRACE(gemm_precision_name(prec));
    std::vector<float> qkv_r = qkv;
    for (float& x : qkv_r) x = rounding(prec)(x);
    const Result a = run(c, qkv, prec), b = run(c, qkv_r, prec);
    EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(float)));
    if (c.T < 5) continue;  // a single key: P = 1 exactly in every mode
    const Result f = run(c, qkv, GemmPrecision::fp32);
    const auto mask = flash_mask(c);
    const auto d0 = flash_dqkv0(c);
    const AttentionCall call{c.B, c.T, c.NH, c.NKV, c.hs, c.causal, mask.empty() ? nullptr : mask.data(), c.p,
                             kFlashDropKey, true};
    const AttentionErr e32 = attention_err(call, qkv, flash_dout(c), d0);
    const SpecErr er = reference(c, qkv, a.out, a.lse, rounding(prec), false);
    std::vector<double> bo(a.out.size()), bg(a.dqkv.size());
    for (size_t k = 0; k < bo.size(); k++) bo[k] = er.out[k].e + e32.out[k].e;
    for (size_t k = 0; k < bg.size(); k++) bg[k] = er.dqkv[k].e + (e32.dqkv[k] - Err(d0[k])).e;  // f's added part
    const double eo = rel_err(a.out, to_double(f.out)), eg = rel_err(a.dqkv, to_double(f.dqkv));
    std::printf("%s: %s vs fp32: out %.2e, dqkv %.2e\n", c.name, gemm_precision_name(prec), eo, eg);
    EXPECT_TRUE(within_bound(a.out, to_double(f.out), bo, std::string(c.name) + " out"));
    EXPECT_TRUE(within_bound(a.dqkv, to_double(f.dqkv), bg, std::string(c.name) + " dqkv"));
    EXPECT_NE(0, std::memcmp(a.out.data(), f.out.data(), a.out.size() * sizeof(float))) << "equals fp32: not applied";
    EXPECT_NE(0, std::memcmp(a.dqkv.data(), f.dqkv.data(), a.dqkv.size() * sizeof(float))) << "equals fp32: not applied";
  }
}

// Exact: a (b, h) pair, in the backward a (b, kv head), is one thread's, its sums in a fixed order.
TEST_P(FlashBf16Cpu, SameBitsWithOneAndTwoThreads) {
  const FlashCase& c = GetParam();
  const auto qkv = flash_qkv(c);
  const int saved = omp_get_max_threads(), saved_blas = openblas_get_num_threads();
  openblas_set_num_threads(1);  // as in test_flash_attention.cpp: OpenMP threads only
  for (GemmPrecision prec : {GemmPrecision::bf16, GemmPrecision::tf32}) {
    omp_set_num_threads(1);
    const Result one = run(c, qkv, prec);
    omp_set_num_threads(2);
    const Result two = run(c, qkv, prec);
    EXPECT_EQ(0, std::memcmp(one.out.data(), two.out.data(), one.out.size() * sizeof(float))) << gemm_precision_name(prec);
    EXPECT_EQ(0, std::memcmp(one.dqkv.data(), two.dqkv.data(), one.dqkv.size() * sizeof(float))) << gemm_precision_name(prec);
  }
  omp_set_num_threads(saved);
  openblas_set_num_threads(saved_blas);
}

// round_to_tf32 is cvt.rna.tf32.f32: nearest, ties away from zero, 13 low bits cleared (Exact: bit
// patterns).
TEST(Tf32Rounding, NearestTiesAwayFromZero) {
  EXPECT_EQ(to_bits(round_to_tf32(from_bits(0x3F800FFFu))), 0x3F800000u);  // below half: down
  EXPECT_EQ(to_bits(round_to_tf32(from_bits(0x3F801000u))), 0x3F802000u);  // a tie: away from zero
  EXPECT_EQ(to_bits(round_to_tf32(from_bits(0xBF801000u))), 0xBF802000u);  // negative tie: away too
  EXPECT_EQ(to_bits(round_to_tf32(from_bits(0x3F803000u))), 0x3F804000u);  // a tie on an odd last bit
  EXPECT_EQ(to_bits(round_to_tf32(from_bits(0x3FFFF000u))), 0x40000000u);  // carry into the exponent
  EXPECT_EQ(to_bits(round_to_tf32(from_bits(0x7F7FF000u))), 0x7F800000u);  // the largest finite: to inf
  EXPECT_TRUE(std::isnan(round_to_tf32(std::nanf(""))));
  EXPECT_EQ(to_bits(round_to_tf32(from_bits(0x7F800001u))), 0x7F800000u);  // a low-bit-only NaN: inf, as the device
  EXPECT_EQ(round_to_tf32(-INFINITY), -INFINITY);
  EXPECT_EQ(to_bits(round_to_tf32(-0.0f)), 0x80000000u);
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashBf16Cpu, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<FlashCase>& i) { return std::string(i.param.name); });

// ---- whole models ------------------------------------------------------------------------------------

namespace {

struct ModelFamily {
  const char* name;
  const char* family;
  std::vector<std::string> extra;
};

// training_losses (model_test_util.h) with fused attention.
std::vector<float> fused_losses(const ModelDesc& d0, GemmPrecision prec, int steps) {
  ModelDesc d = d0;
  d.attention = AttentionImpl::fused;
  return training_losses(d, prec, steps);
}

}  // namespace

// Bound: as test_precision.cpp's PrecisionTraining: 2u_bf of the loss at a step, and the drift of 20
// AdamW steps, which no rounding bound follows: 1e-2 ≈ 2.6 u_bf is the project's bf16 tolerance.
TEST(FlashBf16Model, FusedBf16FollowsFp32LossesWithin1e2) {
  const ModelFamily families[] = {
      {"gpt2", "gpt2", {}},
      {"llama_gqa", "llama", {"model.n_kv_head=1"}},
      {"bert", "bert", {"model.num_labels=3"}},
  };
  for (const ModelFamily& f : families) {
    const ModelDesc d = desc_of(f.family, 2, 2, 32, 16, 64, f.extra);
    const int steps = 20;
    const auto f32 = fused_losses(d, GemmPrecision::fp32, steps);
    const auto b16 = fused_losses(d, GemmPrecision::bf16, steps);
    const test::CurveGap gap = test::curve_gap(f32, b16);
    for (int s = 0; s < steps; s++)
      EXPECT_LT(gap.per_step[s], 1e-2) << f.name << " step " << s + 1 << ": bf16 " << b16[s] << " vs fp32 " << f32[s];
    std::printf("%s (fused): losses %.4f -> %.4f (fp32), %.4f -> %.4f (bf16); largest gap %.2e\n", f.name,
                f32[0], f32.back(), b16[0], b16.back(), gap.worst);
    EXPECT_FALSE(gap.identical) << f.name;
    EXPECT_LT(f32.back(), f32.front()) << f.name;
  }
}
