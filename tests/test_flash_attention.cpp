// Fused attention (flash_attention_forward/backward, backend/op_list.h) on the CPU backend, which
// is the oracle for the CUDA kernels:
//  - against the full attention ops (attention_forward/backward, which store P) over a grid of
//    shapes: T = 1, 5, 67, 130 (one and several row blocks), NH/NKV = 4/4, 4/2, 4/1, causal and
//    bidirectional, with and without a key mask (including a query with no visible key and a
//    sequence with none), dropout 0 and 0.1: out and the ADDED part of dqkv (dqkv starts from
//    random non-zero values), element by element within the two ops' rounding bounds added
//    (ref_transformer.h attention_err: each within its bound of the exact result);
//  - out and lse against a direct computation in double, within the fused op's bound (and lse
//    -inf exactly where no key is visible, with out exactly 0 there);
//  - backward against central finite differences of a double reference on a tiny case, with and
//    without dropout, within the op's bound and the differences' own;
//  - the same bits with 1 and 2 OpenMP threads;
//  - whole models of every family (gpt2; llama with grouped K/V heads; bert with a padding mask
//    and attention dropout): the same loss and gradients, within two summation orders' bound of
//    the magnitude of what they sum, with runtime.attention full and fused,
//    whole and split (zero-bubble input-only + weight) backward, and the activations' memory
//    holding lse [B, NH, T] per layer instead of P [B, NH, T, T]. (That a fused model's split
//    backward equals its whole backward bit for bit: test_backward_split.cpp's fused cases.)
// (CUDA against these ops: tests/test_cuda_ops.cpp, CudaFlashAttention.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/dropout_hash.h"
#include "backend/ops.h"
#include "grad_check.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "ref_transformer.h"
#include "runtime/error.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

// The fused and the full ops compute the same products with the same blocking; they differ in
// how P is normalised in the backward (exp(S - lse) instead of the stored P) and in D_i
// (dO_i · out_i instead of Σ_j P~_ij dP~_ij), and the forwards' softmax rows are other loops:
// each is within its own bound of the exact result (attention_err), so the two within the sum.

struct Case {
  int B, T, NH, NKV, hs;
  bool causal;
  bool masked;
  float p;
  uint64_t key = 0x5eed;
  std::vector<int32_t> mask;
  int W() const { return (NH + 2 * NKV) * hs; }
  int C() const { return NH * hs; }
  size_t n_qkv() const { return static_cast<size_t>(B) * T * W(); }
  size_t n_out() const { return static_cast<size_t>(B) * T * C(); }
  size_t n_att() const { return static_cast<size_t>(B) * NH * T * T; }
  size_t n_lse() const { return static_cast<size_t>(B) * NH * T; }
  const int32_t* mask_ptr() const { return mask.empty() ? nullptr : mask.data(); }
  bool visible(int b, int i, int j) const {
    return !(causal && j > i) && (mask.empty() || mask[static_cast<size_t>(b) * T + j] != 0);
  }
  std::string name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " NH" + std::to_string(NH) +
           " NKV" + std::to_string(NKV) + " hs" + std::to_string(hs) +
           (causal ? " causal" : " bidir") + (masked ? " mask" : "") + " p" + std::to_string(p);
  }
};

// With `masked`: sequence 0 has key 0 masked and 30% random holes (causal: query 0 sees no key),
// sequence 1 is padded to half its length, sequence 2 (when B > 2) has no valid key at all.
Case make_case(int B, int T, int NH, int NKV, int hs, bool causal, bool masked, float p) {
  Case c{B, T, NH, NKV, hs, causal, masked, p, 0x5eed, {}};
  if (!masked) return c;
  c.mask.assign(c.n_lse() / NH, 1);
  const auto r = random_floats(static_cast<size_t>(T), 900 + T, 0.0f, 1.0f);
  for (int t = 0; t < T; t++) c.mask[t] = r[t] < 0.3f ? 0 : 1;
  c.mask[0] = 0;
  if (B > 1)
    for (int t = (T + 1) / 2; t < T; t++) c.mask[static_cast<size_t>(T) + t] = 0;
  if (B > 2)
    for (int t = 0; t < T; t++) c.mask[2 * static_cast<size_t>(T) + t] = 0;
  return c;
}

const Ops& backend() { return cpu_ops(); }

// after − before in double (exact up to 2^-53 of it)
std::vector<double> added(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<double> d(after.size());
  for (size_t k = 0; k < d.size(); k++) d[k] = static_cast<double>(after[k]) - before[k];
  return d;
}

double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  return rel_err(a, to_double(ref));
}

// The case as ref_transformer.h's error model takes it (fused: the flash ops).
AttentionCall call_of(const Case& c, bool fused) {
  return AttentionCall{c.B, c.T, c.NH, c.NKV, c.hs, c.causal, c.mask_ptr(), c.p, c.key, fused};
}

// a + b, elementwise (two bounds added)
std::vector<double> plus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> s(a.size());
  for (size_t k = 0; k < a.size(); k++) s[k] = a[k] + b[k];
  return s;
}

// Attention from the definition in double: out and lse (-inf for a row with no visible key).
void ref_attention(const Case& c, const std::vector<double>& qkv, std::vector<double>* out,
                   std::vector<double>* lse) {
  const int T = c.T, W = c.W(), C = c.C(), hs = c.hs, G = c.NH / c.NKV;
  const double sc = 1.0 / std::sqrt(static_cast<double>(hs));
  out->assign(c.n_out(), 0.0);
  if (lse) lse->assign(c.n_lse(), -INFINITY);
  std::vector<double> s(T);
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.NH; h++) {
      const int g = h / G;
      for (int i = 0; i < T; i++) {
        const double* q = &qkv[(static_cast<size_t>(b) * T + i) * W + h * hs];
        double mx = -INFINITY;
        for (int j = 0; j < T; j++) {
          if (!c.visible(b, i, j)) continue;
          const double* k = &qkv[(static_cast<size_t>(b) * T + j) * W + (c.NH + g) * hs];
          double d = 0.0;
          for (int x = 0; x < hs; x++) d += q[x] * k[x];
          s[j] = d * sc;
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) continue;
        double sum = 0.0;
        for (int j = 0; j < T; j++)
          if (c.visible(b, i, j)) sum += std::exp(s[j] - mx);
        if (lse) (*lse)[(static_cast<size_t>(b) * c.NH + h) * T + i] = mx + std::log(sum);
        double* o = &(*out)[(static_cast<size_t>(b) * T + i) * C + h * hs];
        for (int j = 0; j < T; j++) {
          if (!c.visible(b, i, j)) continue;
          double pj = std::exp(s[j] - mx) / sum;
          const size_t e = ((static_cast<size_t>(b) * c.NH + h) * T + i) * T + j;
          if (c.p > 0.0f) pj = dropout_keep(c.key, e, c.p) ? pj / (1.0 - c.p) : 0.0;
          const double* v = &qkv[(static_cast<size_t>(b) * T + j) * W + (c.NH + c.NKV + g) * hs];
          for (int x = 0; x < hs; x++) o[x] += pj * v[x];
        }
      }
    }
}

void flash_forward(const Case& c, const std::vector<float>& qkv, std::vector<float>* out,
                   std::vector<float>* lse) {
  backend().flash_attention_forward(out->data(), lse->data(), qkv.data(), c.mask_ptr(), c.B, c.T,
                                c.NH, c.NKV, c.hs, c.causal, c.p, c.key, GemmPrecision::fp32);
}
void flash_backward(const Case& c, std::vector<float>* dqkv, const std::vector<float>& dout,
                    const std::vector<float>& out, const std::vector<float>& lse,
                    const std::vector<float>& qkv) {
  backend().flash_attention_backward(dqkv->data(), dout.data(), out.data(), lse.data(), qkv.data(),
                                 c.mask_ptr(), c.B, c.T, c.NH, c.NKV, c.hs, c.causal, c.p, c.key,
                                 GemmPrecision::fp32);
}

// Fused against full, and lse against the double reference, for one case.
void check_against_full(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name());
  const auto qkv = random_floats(c.n_qkv(), seed, -2.0f, 2.0f);
  const auto dout = random_floats(c.n_out(), seed + 1);
  const auto dqkv0 = random_floats(c.n_qkv(), seed + 2);
  const float nan = std::nanf("");
  // full
  std::vector<float> out_full(c.n_out(), nan), att(c.n_att(), nan), scratch(c.n_att(), nan);
  backend().attention_forward(out_full.data(), att.data(), qkv.data(), c.mask_ptr(), c.B, c.T, c.NH,
                          c.NKV, c.hs, c.causal, c.p, c.key);
  auto dqkv_full = dqkv0;
  backend().attention_backward(dqkv_full.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
                           c.mask_ptr(), c.B, c.T, c.NH, c.NKV, c.hs, c.causal, c.p, c.key);
  // fused (outputs poisoned: every element must be written)
  std::vector<float> out(c.n_out(), nan), lse(c.n_lse(), nan);
  flash_forward(c, qkv, &out, &lse);
  auto dqkv = dqkv0;
  flash_backward(c, &dqkv, dout, out, lse, qkv);

  // Bound: each op within its attention_err bound of the exact values, so the two within the sum
  // (the forwards' bounds are the same analysis; the backwards' differ in P and D).
  const AttentionErr ef = attention_err(call_of(c, true), qkv, dout, dqkv0),
                     eu = attention_err(call_of(c, false), qkv, dout, dqkv0);
  const auto bout = errors(ef.out), bdq = plus(errors(ef.dqkv), errors(eu.dqkv));
  EXPECT_TRUE(within_bound(out, to_double(out_full), plus(bout, errors(eu.out)), "forward out"));
  const auto dq = added(dqkv, dqkv0), dq_full = added(dqkv_full, dqkv0);
  EXPECT_TRUE(within_bound(dq, dq_full, bdq, "backward dqkv"));
  // the k and v columns alone (the group sums), so an error there is not hidden by dq
  std::vector<double> kv, kv_full, bkv;
  for (size_t r = 0; r < static_cast<size_t>(c.B) * c.T; r++)
    for (int col = c.NH * c.hs; col < c.W(); col++) {
      kv.push_back(dq[r * c.W() + col]);
      kv_full.push_back(dq_full[r * c.W() + col]);
      bkv.push_back(bdq[r * c.W() + col]);
    }
  EXPECT_TRUE(within_bound(kv, kv_full, bkv, "backward dk, dv"));

  std::vector<double> ro, rl;
  ref_attention(c, to_double(qkv), &ro, &rl);
  EXPECT_TRUE(within_bound(out, ro, bout, "forward out against the double reference"));
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.NH; h++)
      for (int i = 0; i < c.T; i++) {
        const size_t r = (static_cast<size_t>(b) * c.NH + h) * c.T + i;
        if (rl[r] == -INFINITY) {  // Exact: the op writes -inf and zeros for a row with no visible key
          ASSERT_EQ(lse[r], -INFINITY) << "b " << b << " h " << h << " i " << i;
          for (int x = 0; x < c.hs; x++)
            ASSERT_EQ(out[(static_cast<size_t>(b) * c.T + i) * c.C() + h * c.hs + x], 0.0f);
        } else {  // Bound: lse = max + logf(Σ exp) (attention_err)
          ASSERT_LE(std::fabs(lse[r] - rl[r]), ef.lse[r].e)
              << "lse b " << b << " h " << h << " i " << i << ": " << lse[r] << " vs " << rl[r];
        }
      }
}

}  // namespace

TEST(CpuFlashAttention, MatchesFullAttentionOverShapesMasksAndDropout) {
  int cases = 0;
  const int heads[3][2] = {{4, 4}, {4, 2}, {4, 1}};
  for (int T : {1, 5, 67, 130})
    for (const auto& hk : heads)
      for (bool causal : {true, false})
        for (bool masked : {false, true})
          for (float p : {0.0f, 0.1f}) {
            const int B = masked ? 3 : 2;
            const int hs = T == 67 ? 12 : 8;
            check_against_full(make_case(B, T, hk[0], hk[1], hs, causal, masked, p),
                               static_cast<uint32_t>(1000 + cases));
            cases++;
          }
  EXPECT_EQ(cases, 96);
}

// A head size of 64 over several row blocks (GPT-2's shape, scaled down).
TEST(CpuFlashAttention, MatchesFullAttentionHeadSize64) {
  check_against_full(make_case(2, 200, 2, 2, 64, true, false, 0.0f), 77);
  check_against_full(make_case(3, 150, 4, 2, 64, false, true, 0.1f), 78);
}

// The backward adds: started from zero and from random values, the difference is the same
// gradient. Bound: each run within its attention_err bound (from zero, and from the start values,
// whose magnitude enters the sums) of start + the exact gradient.
TEST(CpuFlashAttention, BackwardAddsIntoDqkv) {
  const Case c = make_case(2, 67, 4, 2, 8, true, false, 0.1f);
  const auto qkv = random_floats(c.n_qkv(), 5, -2.0f, 2.0f);
  const auto dout = random_floats(c.n_out(), 6);
  std::vector<float> out(c.n_out()), lse(c.n_lse());
  flash_forward(c, qkv, &out, &lse);
  std::vector<float> from_zero(c.n_qkv(), 0.0f);
  flash_backward(c, &from_zero, dout, out, lse, qkv);
  const auto start = random_floats(c.n_qkv(), 7, 5.0f, 6.0f);
  auto from_start = start;
  flash_backward(c, &from_start, dout, out, lse, qkv);
  const auto bound = plus(errors(attention_err(call_of(c, true), qkv, dout, start).dqkv),
                          errors(attention_err(call_of(c, true), qkv, dout, std::vector<float>(c.n_qkv(), 0.0f)).dqkv));
  EXPECT_TRUE(within_bound(added(from_start, start), to_double(from_zero), bound,
                           "the added part against the gradient"));
  // (not a tolerance: some gradient was written at all)
  EXPECT_GT(rel(from_zero, std::vector<float>(c.n_qkv(), 0.0f)), 0.0) << "nothing was added";
}

// Backward against central finite differences of the double reference (every qkv element).
// Bound: the fused op's attention_err plus the differences' own error (attention_third).
TEST(CpuFlashAttention, BackwardMatchesFiniteDifferences) {
  for (float p : {0.0f, 0.3f})
    for (bool causal : {true, false}) {
      Case c = make_case(2, 5, 4, 2, 4, causal, true, p);
      SCOPED_TRACE(c.name());
      const auto qkv = random_floats(c.n_qkv(), 31, -1.5f, 1.5f);
      const auto dout = random_floats(c.n_out(), 32);
      std::vector<float> out(c.n_out()), lse(c.n_lse());
      flash_forward(c, qkv, &out, &lse);
      std::vector<float> dqkv(c.n_qkv(), 0.0f);
      flash_backward(c, &dqkv, dout, out, lse, qkv);
      const AttentionErr e = attention_err(call_of(c, true), qkv, dout, std::vector<float>(c.n_qkv(), 0.0f));
      std::vector<double> o, err;
      const auto g = fd_grad(
          [&](const std::vector<double>& v) {
            ref_attention(c, v, &o, nullptr);
            return o;
          },
          dout, to_double(qkv), {}, attention_third(call_of(c, true), qkv, dout, e.P), e.out, &err);
      EXPECT_TRUE(within_bound(dqkv, g, plus(errors(e.dqkv), err), "dqkv"));
    }
}

// The same bits with 1 and 2 OpenMP threads (OpenBLAS held to one thread in both runs). Exact: a
// (b, h) pair, in the backward a (b, kv head), is one thread's, its sums in a fixed order.
TEST(CpuFlashAttention, SameBitsForOneAndTwoThreads) {
  const int saved_omp = omp_get_max_threads(), saved_blas = openblas_get_num_threads();
  openblas_set_num_threads(1);
  for (int mode = 0; mode < 4; mode++) {
    const Case c = make_case(3, 150, 8, 2, 16, mode % 2 == 0, mode >= 2, mode >= 2 ? 0.1f : 0.0f);
    const auto qkv = random_floats(c.n_qkv(), 220);
    const auto dout = random_floats(c.n_out(), 221);
    std::vector<std::vector<float>> res[2];
    for (int nt = 1; nt <= 2; nt++) {
      omp_set_num_threads(nt);
      std::vector<float> out(c.n_out()), lse(c.n_lse());
      auto dqkv = random_floats(c.n_qkv(), 222);
      flash_forward(c, qkv, &out, &lse);
      flash_backward(c, &dqkv, dout, out, lse, qkv);
      res[nt - 1] = {out, lse, dqkv};
    }
    for (int k = 0; k < 3; k++)
      EXPECT_EQ(0, std::memcmp(res[0][k].data(), res[1][k].data(), res[0][k].size() * sizeof(float)))
          << "mode " << mode << " buffer " << k;
  }
  omp_set_num_threads(saved_omp);
  openblas_set_num_threads(saved_blas);
}

TEST(CpuFlashAttention, RejectsBadDropoutAndGrouping) {
  std::vector<float> qkv(4 * 3 * 8, 0.5f), out(4 * 8), lse(4);
  EXPECT_THROW(backend().flash_attention_forward(out.data(), lse.data(), qkv.data(), nullptr, 1, 4, 1,
                                             1, 8, true, 1.0f, 0, GemmPrecision::fp32),
               Error);
  EXPECT_THROW(backend().flash_attention_forward(out.data(), lse.data(), qkv.data(), nullptr, 1, 4, 3,
                                             2, 8, true, 0.0f, 0, GemmPrecision::fp32),
               Error);
}

// ---- whole models ----------------------------------------------------------------------------

namespace {

struct ModelCase {
  const char* name;
  const char* family;
  std::vector<std::string> extra;
  bool dropout;  // run forward and backward with dropout (the same keys for both)
};

const ModelCase kModelCases[] = {
    {"gpt2", "gpt2", {}, false},
    {"llama_gqa", "llama", {"model.n_kv_head=2"}, false},
    {"bert_mask_dropout", "bert", {"model.num_labels=3", "model.dropout=0.1", "model.attn_dropout=0.2"}, true},
};

struct ModelRun {
  float loss = 0;
  std::vector<float> grads;
  size_t act_bytes = 0;
};

// One forward and backward (whole, or split: input-only then weight_backward) of a fresh model.
ModelRun run_model(const ModelCase& c, AttentionImpl impl, bool split) {
  ModelDesc d = desc_of(c.family, 2, 4, 64, 67, 97, c.extra);
  d.attention = impl;
  const int B = 3, T = 67;  // two row blocks of the CPU ops
  RandomBatch rb(d, B, T, 60);
  Model m(d, cpu_ops());
  Activations a(m, B, T);
  a.dropout.training = c.dropout;
  a.dropout.seed = 99;
  a.dropout.step = 3;
  m.init_params(7);
  m.zero_grads();
  ModelRun r;
  r.loss = m.forward(a, rb.b, HeadMode::train);
  if (split) {
    m.begin_backward(a, BackwardMode::input_only);
    m.head_backward(a, {});
    m.blocks_backward(a, m.l0(), m.l1(), {});
    m.embed_backward(a, {});
    m.weight_backward(a, {});
  } else {
    m.backward(a);
  }
  r.grads = m.grads_host();
  r.act_bytes = a.bytes();
  return r;
}

}  // namespace

TEST(FlashAttentionModel, EveryFamilyGivesTheSameLossAndGradientsAsFullAttention) {
  for (const ModelCase& c : kModelCases)
    for (bool split : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + (split ? " split backward" : " whole backward"));
      const ModelRun full = run_model(c, AttentionImpl::full, split);
      const ModelRun fused = run_model(c, AttentionImpl::fused, split);
      // Bound: the two compute every op alike but attention, whose sums they take in other orders
      // (the softmax rows and the backward's P and D), so each side's loss is within loss_bound of
      // the exact one (the magnitudes of what it sums: its own and its logits', logit_magnitude,
      // taken without dropout, which rescales a few activations) and every gradient tensor within
      // gamma_K of the magnitude of what it sums (gradient_magnitude), K the step's longest sum
      // (ref_transformer.h longest_sum): the two within twice that (measured 0 for the loss, at most
      // 3e-7 for the gradients).
      const ModelDesc d = desc_of(c.family, 2, 4, 64, 67, 97, c.extra);
      const double K = longest_sum(d, 3, 67), bound = 2.0 * gamma_n(K);
      Model mm(d, cpu_ops());
      mm.init_params(7);
      const RandomBatch rb(d, 3, 67, 60);
      const std::vector<double> P(mm.params, mm.params + mm.table.numel);
      const double M = RefTransformer{d, mm.table}.logit_magnitude(P, rb.b);
      EXPECT_LE(std::fabs(fused.loss - full.loss), 2.0 * loss_bound(full.loss, M, K))
          << fused.loss << " vs " << full.loss;
      ASSERT_EQ(fused.grads.size(), full.grads.size());
      EXPECT_TRUE(gradients_within(build_param_table(d), fused.grads, full.grads, gradient_magnitude(mm, rb.b, 3, 67),
                                   bound, c.name));
      // memory: per layer P [B, NH, T, T] replaced by lse [B, NH, T] (each rounded to 64 floats)
      const size_t B = 3, T = 67, NH = 4, L = 2;
      auto r64 = [](size_t n) { return (n + 63) / 64 * 64; };
      EXPECT_EQ(full.act_bytes - fused.act_bytes, L * (r64(B * NH * T * T) - r64(B * NH * T)) * sizeof(float));
    }
}

// Activations allocated under one implementation are re-allocated when the model's changes (a
// model whose desc changed after allocation would otherwise read a null lse or a short att).
TEST(FlashAttentionModel, ActivationsFollowTheModelsAttention) {
  ModelDesc d = desc_of("gpt2", 1, 2, 16, 8, 11);
  Model m(d, cpu_ops());
  m.init_params(1);
  RandomBatch rb(d, 2, 8, 5);
  Activations a(m, 2, 8);
  EXPECT_EQ(a.attention, AttentionImpl::full);
  EXPECT_NE(a.layers[0].att, nullptr);
  EXPECT_EQ(a.layers[0].lse, nullptr);
  const float full = m.forward(a, rb.b, HeadMode::eval);
  m.desc.attention = AttentionImpl::fused;
  const float fused = m.forward(a, rb.b, HeadMode::eval);  // load_batch re-allocates
  EXPECT_EQ(a.attention, AttentionImpl::fused);
  EXPECT_EQ(a.layers[0].att, nullptr);
  EXPECT_NE(a.layers[0].lse, nullptr);
  // Bound: as in the test above, each loss within loss_bound of the exact one.
  const std::vector<double> P(m.params, m.params + m.table.numel);
  const double M = RefTransformer{d, m.table}.logit_magnitude(P, rb.b);
  EXPECT_NEAR(fused, full, 2.0 * loss_bound(full, M, longest_sum(d, 2, 8)));
  m.desc.attention = AttentionImpl::full;
  EXPECT_THROW(m.blocks_forward(a, 0, 1), Error);  // allocated for fused: refused, not misread
}

// runtime.attention: auto is fused on a GPU when the kernels take the head size, full otherwise
// and on the CPU; fused on a GPU with a head size above the kernels' is refused with the fix.
TEST(FlashAttentionModel, ResolveAttention) {
  EXPECT_EQ(resolve_attention("auto", false, 64), AttentionImpl::full);
  EXPECT_EQ(resolve_attention("auto", true, 64), AttentionImpl::fused);
  EXPECT_EQ(resolve_attention("auto", true, 256), AttentionImpl::full);
  EXPECT_EQ(resolve_attention("full", true, 64), AttentionImpl::full);
  EXPECT_EQ(resolve_attention("fused", false, 256), AttentionImpl::fused);  // the CPU takes any size
  EXPECT_EQ(resolve_attention("fused", true, 128), AttentionImpl::fused);
  try {
    resolve_attention("fused", true, 256);
    ADD_FAILURE() << "a head size of 256 was accepted for the CUDA kernels";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set runtime.attention \"full\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_attention("flash", false, 64), Error);
}
