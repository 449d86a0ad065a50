// The CUDA backend at the shapes GPT-2 124M training really uses, against the CPU backend (the
// oracle), and the NCCL gradient averaging at world size 1. The toy-sized tests of every op are in
// test_cuda_ops.cpp; these catch what only a real shape shows: grid limits, 32-bit index overflow
// (N·V = 65536 · 50257 > 2^31), shared-memory and workspace sizes, long runs of one token,
// rounding over long sums, and whole-step determinism.
//
//   CudaRealShape.*   softmax + cross-entropy at V = 50257 (N = 1024 with extreme logits, and
//                     N·V > 2^31), attention at T = 1024 / 1023 with hs = 64, LayerNorm, RMSNorm
//                     and the dbias column sums at N = 65536 rows, embedding backward with one
//                     dominant token (bitwise), AdamW / sum_squares / scale at 124,439,808 elements,
//                     one GPT-2 124M step CPU vs GPU, and two GPU steps giving the same bits
//   NcclSync.*        world size 1: averaging is the identity, bit for bit (NcclComm directly,
//                     every bucket size, boundaries inside "tensors"; in bf16 the gradient's bf16
//                     rounding; and GradSync with parallel.sync = nccl around a real backward)
//
// Tolerances: each op's rounding bound against the magnitude of what it sums (cuda_test_util.h
// "Bounds", as in test_cuda_ops.cpp) unless a comment argues otherwise. The 65536-row column sums
// are compared with a double reference: the GPU's, whose order is its kernel's (chunks of 32 rows,
// then the chunks' sums), must be within its bound of it, and the GPU and CPU within that plus
// the CPU's own measured distance from it (triangle inequality), which the CPU's row-order sums'
// worst case, gamma_n(65536) = 3.9e-3 of the magnitude, would not bound usefully.
//
// Every GPU test skips ("no GPU: <reason>") when cuda_available() is false; the large ones also
// skip when the card lacks the memory they need. Run time on a 16-core GPU machine: each test a few
// seconds (the CPU reference is the slow side; OpenMP-parallel where the CPU backend is).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda_ops.h"
#include "comm/nccl.h"
#include "backend/ops.h"
#include "comm/grad_sync.h"
#include "cuda_test_util.h"
#include "grad_check.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "runtime/error.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

constexpr int kVocab = 50257;                  // GPT-2's vocabulary
constexpr size_t kGpt2Params = 124439808;      // GPT-2 124M's parameter count (wpe 1024 x 768)

// Uniform floats in [lo, hi) as a pure function of (seed, index): splitmix64 of both. Parallel and
// fast (random_floats' mt19937 takes seconds for the hundreds of millions of values used here),
// and any element can be regenerated on its own.
inline float hashed_uniform(uint64_t seed, uint64_t i, float lo, float hi) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
  return lo + (hi - lo) * u;
}
void fill_hashed(float* v, size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f,
                 uint64_t first = 0) {
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < nn; i++) v[i] = hashed_uniform(seed, first + i, lo, hi);
}
std::vector<float> hashed_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  fill_hashed(v.data(), n, seed, lo, hi);
  return v;
}

// Column sums in double of x [N, M] (the exact reference of the dbias / dweight sums, up to 1e-16).
std::vector<double> column_sums(const std::vector<float>& x, int N, int M) {
  std::vector<double> s(M, 0.0);
  for (int n = 0; n < N; n++) {
    const float* r = x.data() + static_cast<size_t>(n) * M;
    for (int j = 0; j < M; j++) s[j] += r[j];
  }
  return s;
}

// The check argued in the header for long fp32 sums, against their magnitude (Σ|terms| and the
// start value): gpu within gamma_n(gpu_len) of the double reference, gpu_len the longest chain of
// roundings of the card's sum (its terms' own roundings, the add to the start value and the
// added part's subtraction included), and within that plus the CPU's measured distance from the
// reference of the CPU (triangle inequality).
void expect_long_sum(const std::vector<float>& gpu_v, const std::vector<float>& cpu_v,
                     const std::vector<double>& exact, const std::vector<double>& mag, double gpu_len,
                     const std::string& what) {
  const double g = rel_to_magnitude(gpu_v, exact, mag), c = rel_to_magnitude(cpu_v, exact, mag);
  std::printf("[          ] %s: GPU %.3g, CPU %.3g of the magnitude from the double reference (bound %.3g)\n",
              what.c_str(), g, c, gamma_n(gpu_len));
  EXPECT_LT(g, gamma_n(gpu_len)) << what << ": the GPU's sum is further from the double reference";
  EXPECT_LT(rel_to_magnitude(gpu_v, cpu_v, mag), gamma_n(gpu_len) + c) << what;
}
// The card's column sums (kernels/matmul.cu, layernorm.cu): chunks of 32 rows, then the chunks'
// sums one after another at the longest (the serial pass; the 16 lanes' pass is shorter), into
// the start value.
double column_sum_length(int N) { return 32 + (N + 31) / 32 + 2; }

}  // namespace

// ---- sizes (runs everywhere) ------------------------------------------------------------------------

// The model the real-shape tests stand for: GPT-2 124M (12 layers, d 768, 12 heads, T 1024, V 50257).
TEST(CudaRealShape, Gpt2SmallHasItsRealParameterCount) {
  const ModelDesc d = desc_of("gpt2", 12, 12, 768, 1024, kVocab);
  EXPECT_EQ(build_param_table(d).numel, kGpt2Params);
}

// ---- softmax + cross-entropy at V = 50257 -----------------------------------------------------------

// N = 1024 rows (one sequence of 1024 positions), random logits, and rows with extreme logits.
// Each row's loss is checked on its own against its bound (xent_bounds: the sum of 50257
// exponentials in other orders, gamma_n(V) relative at worst, the loss log S + max - z_y seeing it
// through log S); the gradient norm-wise over all rows and over each extreme row.
TEST(CudaRealShape, SoftmaxXentGpt2Vocabulary) {
  REQUIRE_GPU();
  const int N = 1024, V = kVocab;
  const size_t NV = static_cast<size_t>(N) * V;
  auto z = hashed_floats(NV, 500, -4.0f, 4.0f);
  auto y = random_ints(N, 501, 0, V);
  auto row = [&](int n) { return z.data() + static_cast<size_t>(n) * V; };
  // 0: the target dominates (+80: p_y rounds to 1, loss ~ 0)
  row(0)[y[0]] = 80.0f;
  // 1: another logit dominates (loss ~ 80 + 4); exp(z - 0) would overflow without the max
  y[1] = 17;
  row(1)[V - 1] = 80.0f;
  // 2: all logits equal: loss = log V, gradient 1/V - [j = y]
  std::fill(row(2), row(2) + V, 3.0f);
  // 3: logits ±1e4, the target at -1e4 and the maximum elsewhere: loss 2e4
  for (int j = 0; j < V; j++) row(3)[j] = (j % 3 == 0) ? 1e4f : -1e4f;
  y[3] = 1;
  // 4: a huge spread: one logit 1e30, the rest -1e30 (every other exp underflows to 0)
  std::fill(row(4), row(4) + V, -1e30f);
  row(4)[12345] = 1e30f;
  y[4] = 54;
  // 5, 6: the targets at the ends of the vocabulary, the maximum at the other end
  y[5] = V - 1;
  row(5)[0] = 30.0f;
  y[6] = 0;
  row(6)[V - 1] = 30.0f;
  // 7: logits far below the maximum (z - max < -87: the CPU's exp flushes to 0, the GPU's gives
  //    a denormal; both vanish next to the maximum's term 1)
  for (int j = 0; j < V; j++) row(7)[j] = -90.0f - (j % 7);
  row(7)[9] = 0.0f;
  y[7] = 9;
  const int kExtremeRows = 8;
  const float gs = 1.0f / N;  // the trainer's grad_scale: the mean over the batch's rows

  for (float scale : {0.0f, gs}) {
    auto rz = z;
    std::vector<float> rl(N, kNaN);
    cpu().softmax_xent(rz.data(), rl.data(), y.data(), N, V, scale);
    Dev gz(z), gl(nans(N)), gy(y);
    gpu().softmax_xent(gz.f(), gl.f(), gy.i(), N, V, scale);
    const auto loss = gl.get();
    const XentBounds xb = xent_bounds(z.data(), V, y.data(), N, V, scale);
    for (int n = 0; n < N; n++)  // Bound: xent_bounds, row by row
      ASSERT_LE(std::fabs(loss[n] - rl[n]), xb.loss[n])
          << "row " << n << ": " << loss[n] << " vs " << rl[n] << ", grad_scale " << scale;
    // Bound, the exact values: equal logits give S = V exactly (exps of 0, integer sums) and
    // loss = logf(V), within 1 ulp, against log V in double: 1.5 ulp <= 3u log V. Row 3: S = the
    // ceil(V/3) maxima exactly (the rest's exps are 0), loss = logf(S) + 2e4 rounded: u (2e4 + 3 log S).
    // Row 4: S = 1, loss = the rounded 1e30 + 1e30: u 2e30.
    EXPECT_NEAR(loss[2], std::log(static_cast<double>(V)), 3 * kU * std::log(static_cast<double>(V))) << "equal logits";
    const double s3 = (V + 2.0) / 3.0;  // S = #maxima = ceil(V/3)
    EXPECT_NEAR(loss[3], 2e4 + std::log(s3), kU * (2e4 + 3 * std::log(s3)));
    EXPECT_NEAR(loss[4], 2e30, kU * 2e30);
    const auto g = gz.get();
    if (scale == 0.0f) {
      EXPECT_SAME_BITS(g, z) << "logits must stay untouched without a gradient";  // Exact
      continue;
    }
    ASSERT_TRUE(all_finite(g));
    EXPECT_LT(rel_to_magnitude(g, rz, xb.grad), 1.0) << "gradient, all rows";
    for (int n = 0; n < kExtremeRows; n++) {
      const std::vector<float> gr(g.begin() + static_cast<size_t>(n) * V,
                                  g.begin() + static_cast<size_t>(n + 1) * V);
      const std::vector<float> cr(rz.begin() + static_cast<size_t>(n) * V,
                                  rz.begin() + static_cast<size_t>(n + 1) * V);
      const std::vector<double> br(xb.grad.begin() + static_cast<size_t>(n) * V,
                                   xb.grad.begin() + static_cast<size_t>(n + 1) * V);
      EXPECT_LT(rel_to_magnitude(gr, cr, br), 1.0) << "gradient of extreme row " << n;
    }
    // The gradient of each row sums to 0 (softmax sums to 1): a row the kernel skipped would not.
    // Bound: the card's gs e_j / S, each within ε_S + kExpU + u |z_j − max| + 2u of gs p_j, and
    // gs rounded off the target: |Σ_j g_j| <= gs (2 ε_S + kExpU + 4u) (ε_S holds u Σ p_j |z_j − max|).
    for (int n = 0; n < N; n++) {
      double s = 0.0;
      for (int j = 0; j < V; j++) s += g[static_cast<size_t>(n) * V + j];
      ASSERT_LE(std::fabs(s), scale * (2 * xb.eps_s[n] + kExpU + 4 * kU)) << "row " << n;
    }
  }
}

// More than 2^31 logits (B·T = 43008 rows of 50257: 2,161,453,056 elements, 8.6 GB): a 32-bit
// element index would wrap in the last rows. The logits are generated and uploaded in slabs (host
// memory stays small); the CPU oracle runs on a few rows only (rows are independent), among them
// the ones on each side of element 2^31 and the last.
TEST(CudaRealShape, SoftmaxXentBeyond2To31Logits) {
  REQUIRE_GPU();
  const int N = 43008, V = kVocab;
  const size_t NV = static_cast<size_t>(N) * V;
  ASSERT_GT(NV, size_t(1) << 31);
  REQUIRE_GPU_MEMORY(NV * sizeof(float) + (size_t(1) << 30));
  const uint64_t seed = 510;
  const auto y = random_ints(N, 511, 0, V);
  Dev gz(NV * sizeof(float)), gl(nans(N)), gy(y);
  const int slab = 1024;
  std::vector<float> host(static_cast<size_t>(slab) * V);
  for (int n0 = 0; n0 < N; n0 += slab) {
    const int rows = std::min(slab, N - n0);
    fill_hashed(host.data(), static_cast<size_t>(rows) * V, seed, -6.0f, 6.0f,
                static_cast<size_t>(n0) * V);
    gpu().copy_to_device(gz.f() + static_cast<size_t>(n0) * V, host.data(),
                         static_cast<size_t>(rows) * V * sizeof(float));
  }
  const float gs = 1.0f / N;
  gpu().softmax_xent(gz.f(), gl.f(), gy.i(), N, V, gs);
  const auto loss = gl.get();
  // Not a tolerance: logits in [-6, 6) put a loss log S + (max - z_y) in (0, log V + 12) = (0, 22.83)
  // (S >= 1, the other terms > 0; S <= V).
  for (int n = 0; n < N; n++)
    ASSERT_TRUE(std::isfinite(loss[n]) && loss[n] > 0.0f && loss[n] < 30.0f)
        << "row " << n << ": loss " << loss[n];
  const int wrap = static_cast<int>((size_t(1) << 31) / V);  // row holding element 2^31
  for (int n : {0, 1, wrap - 1, wrap, wrap + 1, N / 2, N - 2, N - 1}) {
    std::vector<float> zr(V);
    fill_hashed(zr.data(), V, seed, -6.0f, 6.0f, static_cast<size_t>(n) * V);
    float rl = kNaN;
    cpu().softmax_xent(zr.data(), &rl, &y[n], 1, V, gs);
    std::vector<float> gr(V);
    gpu().copy_to_host(gr.data(), gz.f() + static_cast<size_t>(n) * V, V * sizeof(float));
    std::vector<float> z0(V);  // the row's logits (zr now holds the CPU's gradient)
    fill_hashed(z0.data(), V, seed, -6.0f, 6.0f, static_cast<size_t>(n) * V);
    const XentBounds xb = xent_bounds(z0.data(), V, &y[n], 1, V, gs);  // Bound: xent_bounds
    EXPECT_LE(std::fabs(loss[n] - rl), xb.loss[0]) << "row " << n;
    EXPECT_LT(rel_to_magnitude(gr, zr, xb.grad), 1.0) << "gradient of row " << n;
  }
}

// ---- attention at T = 1024 / 1023, head size 64 ------------------------------------------------------

namespace {

struct RealAttnCase {
  const char* name;
  int B, T, NH, NKV;
  bool causal;
  bool padding;  // key padding: sequence b keeps its first T - 37 keys (b = 0) or (T + 1) / 2
};
std::ostream& operator<<(std::ostream& os, const RealAttnCase& c) { return os << c.name; }
class CudaRealShapeAttention : public ::testing::TestWithParam<RealAttnCase> {};

}  // namespace

// Forward out and att, backward dqkv, against the CPU within attention_bounds (cuda_test_util.h:
// the scores' dot products of hs = 64 terms through the softmax, sums over up to T = 1024 keys).
// Masked entries of att must be exact zeros; the backward is repeated and must give the same bits.
TEST_P(CudaRealShapeAttention, MatchesCpu) {
  REQUIRE_GPU();
  const RealAttnCase c = GetParam();
  const int B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, hs = 64;
  const int W = (NH + 2 * NKV) * hs, C = NH * hs;
  const size_t att_n = static_cast<size_t>(B) * NH * T * T;
  const size_t out_n = static_cast<size_t>(B) * T * C;
  const uint32_t seed = 600 + static_cast<uint32_t>(T + NH * 7 + NKV * 11 + B * 13 + c.causal);
  // q, k in [-2, 2]: scores up to ~30 (sharp rows), as trained models have
  const auto qkv = random_floats(static_cast<size_t>(B) * T * W, seed, -2.0f, 2.0f);
  std::vector<int32_t> mask;
  if (c.padding) {
    mask.assign(static_cast<size_t>(B) * T, 1);
    for (int b = 0; b < B; b++) {
      const int len = b == 0 ? T - 37 : (T + 1) / 2;
      for (int t = len; t < T; t++) mask[static_cast<size_t>(b) * T + t] = 0;
    }
  }
  const int32_t* cmask = mask.empty() ? nullptr : mask.data();
  const uint64_t key = 0;  // no dropout

  std::vector<float> rout(out_n, kNaN), ratt(att_n, kNaN);
  cpu().attention_forward(rout.data(), ratt.data(), qkv.data(), cmask, B, T, NH, NKV, hs, c.causal,
                          0.0f, key);
  Dev gqkv(qkv), gout(nans(out_n)), gatt(nans(att_n));
  Dev gmask(mask.empty() ? std::vector<int32_t>{0} : mask);
  const int32_t* dmask = mask.empty() ? nullptr : gmask.i();
  gpu().attention_forward(gout.f(), gatt.f(), gqkv.f(), dmask, B, T, NH, NKV, hs, c.causal, 0.0f,
                          key);
  const auto out = gout.get(), att = gatt.get();
  const auto dout = random_floats(out_n, seed + 1);
  const auto dqkv0 = random_floats(qkv.size(), seed + 2);
  const AttnBounds ab = attention_bounds(qkv, mask, B, T, NH, NKV, hs, c.causal, 0.0f, key, dout, dqkv0, true);
  EXPECT_LT(rel_to_magnitude(out, rout, ab.out), 1.0) << "forward out";
  EXPECT_LT(rel_to_magnitude(att, ratt, ab.att), 1.0) << "forward att";
  for (int b = 0; b < B; b++)  // Exact: zeros where a key is not visible
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const float* r = att.data() + ((static_cast<size_t>(b) * NH + h) * T + i) * T;
        for (int j = 0; j < T; j++) {
          const bool visible = (!c.causal || j <= i) &&
                               (mask.empty() || mask[static_cast<size_t>(b) * T + j] != 0);
          if (!visible) {
            ASSERT_EQ(r[j], 0.0f) << "b=" << b << " h=" << h << " i=" << i << " j=" << j;
          }
        }
      }

  auto rdqkv = dqkv0;
  std::vector<float> rscratch(att_n, kNaN);
  cpu().attention_backward(rdqkv.data(), rscratch.data(), dout.data(), qkv.data(), ratt.data(),
                           cmask, B, T, NH, NKV, hs, c.causal, 0.0f, key);
  Dev gdout(dout), gdqkv(dqkv0), gscratch(nans(att_n));
  gpu().attention_backward(gdqkv.f(), gscratch.f(), gdout.f(), gqkv.f(), gatt.f(), dmask, B, T, NH,
                           NKV, hs, c.causal, 0.0f, key);
  const auto gd = gdqkv.get();
  ASSERT_TRUE(all_finite(gd));
  const auto gadd = added(gd, dqkv0), radd = added(rdqkv, dqkv0);
  EXPECT_LT(rel_to_magnitude(gadd, radd, ab.dqkv), 1.0) << "backward dqkv";
  std::vector<float> gkv, rkv;  // the k and v parts alone
  for (size_t r = 0; r < static_cast<size_t>(B) * T; r++)
    for (int col = NH * hs; col < W; col++) {
      gkv.push_back(gadd[r * W + col]);
      rkv.push_back(radd[r * W + col]);
    }
  EXPECT_LT(rel_to_magnitude(gkv, rkv, kv_columns_d(ab.dqkv, NH, NKV, hs)), 1.0) << "backward dk, dv";
  Dev gdqkv2(dqkv0);  // Exact: the same call again, the same bits (below)
  gpu().attention_backward(gdqkv2.f(), gscratch.f(), gdout.f(), gqkv.f(), gatt.f(), dmask, B, T, NH,
                           NKV, hs, c.causal, 0.0f, key);
  EXPECT_SAME_BITS(gdqkv2.get(), gd) << "backward is not deterministic";
}

INSTANTIATE_TEST_SUITE_P(
    Gpt2, CudaRealShapeAttention,
    ::testing::Values(RealAttnCase{"causal_T1024", 1, 1024, 4, 4, true, false},
                      RealAttnCase{"causal_T1023", 1, 1023, 4, 4, true, false},
                      RealAttnCase{"causal_gqa_T1023", 1, 1023, 4, 2, true, false},
                      RealAttnCase{"bidir_padding_T1024", 2, 1024, 2, 2, false, true},
                      RealAttnCase{"bidir_padding_mqa_T1023", 2, 1023, 2, 1, false, true}),
    [](const ::testing::TestParamInfo<RealAttnCase>& i) { return std::string(i.param.name); });

// ---- LayerNorm, RMSNorm and column sums at N = 65536 rows (B = 64, T = 1024) --------------------------

TEST(CudaRealShape, LayerNormAt65536Rows) {
  REQUIRE_GPU();
  const int N = 65536, C = 768;
  const size_t NC = static_cast<size_t>(N) * C;
  REQUIRE_GPU_MEMORY(6 * NC * sizeof(float));
  const auto x = hashed_floats(NC, 700, -2.0f, 2.0f);
  const auto w = random_floats(C, 701), b = random_floats(C, 702);
  std::vector<float> ro(NC, kNaN), rm(N, kNaN), rr(N, kNaN);
  cpu().layernorm_forward(ro.data(), rm.data(), rr.data(), x.data(), w.data(), b.data(), N, C,
                          1e-5f, nullptr);
  Dev gx(x), gw(w), gb(b);
  const auto dout = hashed_floats(NC, 703);
  const auto dx0 = hashed_floats(NC, 704), dw0 = random_floats(C, 705), db0 = random_floats(C, 706);
  // Bound: norm_bounds (cuda_test_util.h), the backward's inputs the CPU's mean and rstd on both sides
  const NormBounds nb = norm_bounds(true, x, w, b, N, C, 1e-5f, dout, dx0, dw0, db0);
  {
    Dev out(nans(NC)), mean(nans(N)), rstd(nans(N));
    gpu().layernorm_forward(out.f(), mean.f(), rstd.f(), gx.f(), gw.f(), gb.f(), N, C, 1e-5f, nullptr);
    EXPECT_LT(rel_to_magnitude(out.get(), ro, nb.out), 1.0) << "out";
    EXPECT_LT(rel_to_magnitude(mean.get(), rm, nb.mean), 1.0) << "mean";
    EXPECT_LT(rel_to_magnitude(rstd.get(), rr, nb.rstd), 1.0) << "rstd";
  }
  auto rdx = dx0, rdw = dw0, rdb = db0;
  cpu().layernorm_backward(rdx.data(), rdw.data(), rdb.data(), dout.data(), x.data(), w.data(),
                           rm.data(), rr.data(), N, C);
  Dev gdout(dout), gm(rm), gr(rr), gdx(dx0), gdw(dw0), gdb(db0);
  gpu().layernorm_backward(gdx.f(), gdw.f(), gdb.f(), gdout.f(), gx.f(), gw.f(), gm.f(), gr.f(), N,
                           C);
  EXPECT_LT(rel_to_magnitude(added(gdx.get(), dx0), added(rdx, dx0), nb.dinp), 1.0) << "dinp";
  // dweight_c = Σ_n norm_c dout_c and dbias_c = Σ_n dout_c over 65536 rows: in double for reference
  // (norm_c from the float mean and rstd both sides read; a term 3 roundings on the card)
  std::vector<double> ew(C, 0.0), eb(C, 0.0), mw = abs_d(dw0), mb = abs_d(db0);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      const size_t i = static_cast<size_t>(n) * C + c;
      const double nrm = (static_cast<double>(x[i]) - rm[n]) * rr[n];
      ew[c] += nrm * dout[i];
      eb[c] += dout[i];
      mw[c] += std::fabs(nrm * dout[i]);
      mb[c] += std::fabs(static_cast<double>(dout[i]));
    }
  expect_long_sum(added(gdw.get(), dw0), added(rdw, dw0), ew, mw, column_sum_length(N) + 3, "layernorm dweight");
  expect_long_sum(added(gdb.get(), db0), added(rdb, db0), eb, mb, column_sum_length(N), "layernorm dbias");
}

TEST(CudaRealShape, RmsNormAt65536Rows) {
  REQUIRE_GPU();
  const int N = 65536, C = 768;
  const size_t NC = static_cast<size_t>(N) * C;
  REQUIRE_GPU_MEMORY(6 * NC * sizeof(float));
  const auto x = hashed_floats(NC, 710, -2.0f, 2.0f);
  const auto w = random_floats(C, 711);
  std::vector<float> ro(NC, kNaN), rr(N, kNaN);
  cpu().rmsnorm_forward(ro.data(), rr.data(), x.data(), w.data(), N, C, 1e-6f, nullptr);
  Dev gx(x), gw(w);
  const auto dout = hashed_floats(NC, 712);
  const auto dx0 = hashed_floats(NC, 713), dw0 = random_floats(C, 714);
  const NormBounds nb = norm_bounds(false, x, w, {}, N, C, 1e-6f, dout, dx0, dw0);  // Bound: norm_bounds
  {
    Dev out(nans(NC)), rstd(nans(N));
    gpu().rmsnorm_forward(out.f(), rstd.f(), gx.f(), gw.f(), N, C, 1e-6f, nullptr);
    EXPECT_LT(rel_to_magnitude(out.get(), ro, nb.out), 1.0) << "out";
    EXPECT_LT(rel_to_magnitude(rstd.get(), rr, nb.rstd), 1.0) << "rstd";
  }
  auto rdx = dx0, rdw = dw0;
  cpu().rmsnorm_backward(rdx.data(), rdw.data(), dout.data(), x.data(), w.data(), rr.data(), N, C);
  Dev gdout(dout), gr(rr), gdx(dx0), gdw(dw0);
  gpu().rmsnorm_backward(gdx.f(), gdw.f(), gdout.f(), gx.f(), gw.f(), gr.f(), N, C);
  EXPECT_LT(rel_to_magnitude(added(gdx.get(), dx0), added(rdx, dx0), nb.dinp), 1.0) << "dinp";
  std::vector<double> ew(C, 0.0), mw = abs_d(dw0);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      const size_t i = static_cast<size_t>(n) * C + c;
      ew[c] += static_cast<double>(x[i]) * rr[n] * dout[i];
      mw[c] += std::fabs(static_cast<double>(x[i]) * rr[n] * dout[i]);
    }
  expect_long_sum(added(gdw.get(), dw0), added(rdw, dw0), ew, mw, column_sum_length(N) + 3, "rmsnorm dweight");
}

// matmul_backward's dbias: Σ_n dout[n, :] over 65536 rows, for the widths of GPT-2's dense layers
// (768: attention and MLP projections, 2304: qkv, 3072: MLP up). dinp and dweight null (their GEMMs
// are the matmul tests' business, and without dweight's GEMM no epilogue sums dbias), so our
// column-sum kernels are what is measured. The CPU sums each column in row order (a worst case of
// gamma_n(65536): why the comparison goes through the double reference, see the header).
TEST(CudaRealShape, MatmulBiasColumnSumsAt65536Rows) {
  REQUIRE_GPU();
  const int N = 65536, C = 8;
  for (int OC : {768, 2304, 3072}) {
    const size_t n_out = static_cast<size_t>(N) * OC;
    const auto dout = hashed_floats(n_out, 720 + OC);
    const auto inp = random_floats(static_cast<size_t>(N) * C, 721);
    const auto weight = random_floats(static_cast<size_t>(OC) * C, 722);
    const auto db0 = random_floats(OC, 723);
    auto rdb = db0;
    cpu().matmul_backward(nullptr, nullptr, rdb.data(), dout.data(), inp.data(), weight.data(), N,
                          C, OC, GemmPrecision::fp32);
    Dev gdout(dout), ginp(inp), gweight(weight), gdb(db0);
    gpu().matmul_backward(nullptr, nullptr, gdb.f(), gdout.f(), ginp.f(), gweight.f(), N, C, OC,
                          GemmPrecision::fp32);
    std::vector<double> mag = column_sums(abs_f(dout), N, OC);
    for (int j = 0; j < OC; j++) mag[j] += std::fabs(static_cast<double>(db0[j]));
    expect_long_sum(added(gdb.get(), db0), added(rdb, db0), column_sums(dout, N, OC), mag, column_sum_length(N),
                    "dbias OC=" + std::to_string(OC));
  }
}

// ---- embedding backward with one dominant token -------------------------------------------------------

// B = 8, T = 1024, C = 768, V = 50257, 90% of the positions carry token 198 (GPT-2's "\n"): one
// run of ~7400 rows summed serially in the GPU's run kernel. Same summation order as the CPU
// (sorted runs in position order): bitwise equal, as CudaOps.EmbeddingBackward demands.
TEST(CudaRealShape, EmbeddingBackwardOneDominantToken) {
  REQUIRE_GPU();
  const int B = 8, T = 1024, C = 768, V = kVocab, N = B * T;
  auto inp = random_ints(N, 730, 0, V);
  const auto r = random_floats(N, 731, 0.0f, 1.0f);
  int dominant = 0;
  for (int n = 0; n < N; n++)
    if (r[n] < 0.9f) {
      inp[n] = 198;
      dominant++;
    }
  inp[N - 1] = V - 1;  // the table's last row
  inp[0] = 0;          // and its first
  ASSERT_GT(dominant, N * 8 / 10);
  const auto dout = hashed_floats(static_cast<size_t>(N) * C, 732);
  const auto dwte0 = hashed_floats(static_cast<size_t>(V) * C, 733);
  const auto dwpe0 = random_floats(static_cast<size_t>(T) * C, 734);
  auto rwte = dwte0, rwpe = dwpe0;
  cpu().embedding_backward(rwte.data(), rwpe.data(), dout.data(), inp.data(), B, T, C);
  Dev ginp(inp), gdout(dout), gwte(dwte0), gwpe(dwpe0);
  gpu().embedding_backward(gwte.f(), gwpe.f(), gdout.f(), ginp.i(), B, T, C);
  const auto w = gwte.get();
  // Exact: the same terms added to the start values in the same order on both sides
  EXPECT_SAME_BITS(w, rwte) << "dwte: the same terms in the same order on both sides";
  EXPECT_SAME_BITS(gwpe.get(), rwpe) << "dwpe";
  EXPECT_NE(w[198 * static_cast<size_t>(C)], dwte0[198 * static_cast<size_t>(C)]);
}

// ---- AdamW, sum_squares and scale over GPT-2 124M's 124,439,808 parameters -----------------------------

// Two AdamW steps over one flat buffer of every parameter. After step 1, m = (1-b1) g exactly on
// both sides (Exact: m starts at 0: whether a compiler fuses b1·m + (1-b1)·g into an FMA or not,
// the result is the rounded (1-b1)·g), and likewise v = ((1-b2) g) g, so both must match bit for
// bit — an element a kernel skipped or wrote twice fails; after step 2, params, m, v within
// adamw_bound (cuda_test_util.h; elementwise arithmetic, FMA contraction being the difference),
// each element's bound computed from its regenerated p0, g1, g2.
TEST(CudaRealShape, AdamWOverGpt2SmallParameterCount) {
  REQUIRE_GPU();
  const size_t n = kGpt2Params;
  REQUIRE_GPU_MEMORY(5 * n * sizeof(float));
  auto p = hashed_floats(n, 740, -0.1f, 0.1f);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  Dev gp(p), gm(m), gv(v);
  for (int t = 1; t <= 2; t++) {
    const auto g = hashed_floats(n, 740 + t, -1e-2f, 1e-2f);
    cpu().adamw_update(p.data(), g.data(), m.data(), v.data(), n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                       t);
    Dev gg(g);
    gpu().adamw_update(gp.f(), gg.f(), gm.f(), gv.f(), n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    if (t == 1) {
      EXPECT_SAME_BITS(gm.get(), m) << "m after step 1";
      EXPECT_SAME_BITS(gv.get(), v) << "v after step 1";
    }
  }
  // ‖gpu − cpu‖ against ‖bound‖ for p, m, v, the bounds never stored (hashed values regenerate)
  const std::vector<float> got[3] = {gp.get(), gm.get(), gv.get()};
  const std::vector<float>* want[3] = {&p, &m, &v};
  double d2[3] = {0, 0, 0}, b2[3] = {0, 0, 0};
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for schedule(static) reduction(+ : d2[:3], b2[:3])
  for (long long i = 0; i < nn; i++) {
    const double g[2] = {hashed_uniform(741, i, -1e-2f, 1e-2f), hashed_uniform(742, i, -1e-2f, 1e-2f)};
    const OptBound ob = adamw_bound(hashed_uniform(740, i, -0.1f, 0.1f), g, 2, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f);
    const double b[3] = {ob.p, ob.m, ob.v};
    for (int k = 0; k < 3; k++) {
      const double d = static_cast<double>(got[k][i]) - (*want[k])[i];
      d2[k] += d * d;
      b2[k] += b[k] * b[k];
    }
  }
  const char* what[3] = {"params", "m", "v"};
  for (int k = 0; k < 3; k++) EXPECT_LT(std::sqrt(d2[k] / b2[k]), 1.0) << what[k];
}

// sum_squares in double on both sides: the CPU over 65536-element chunks, the GPU over a fixed
// grid; each is a sum of positive terms (x² exact in double) whose longest chain of additions is
// at most 65536 + n/65536 + 64 (the chunks, then the chunks in order; the card's threads and two
// block trees are shorter), so both are within gamma_n(that, 2^-53) ≈ 7.5e-12 (relative) of the
// exact sum, as in CudaOps.SumSquaresAndScale. Exact: repeating gives the same bits; scale is one
// multiply: bitwise.
TEST(CudaRealShape, SumSquaresAndScaleOverGpt2SmallParameterCount) {
  REQUIRE_GPU();
  const size_t n = kGpt2Params;
  REQUIRE_GPU_MEMORY(2 * n * sizeof(float));
  auto x = hashed_floats(n, 750);
  Dev gx(x);
  for (size_t len : {n, n - 77}) {
    const double rc = cpu().sum_squares(x.data(), len);
    const double rg = gpu().sum_squares(gx.f(), len);
    EXPECT_LT(std::fabs(rg - rc) / rc, 2 * gamma_n(65536.0 + len / 65536.0 + 64, 0x1p-53)) << len;
    // Not a rounding bound: the mean of 1.2e8 values x², whose standard deviation is 0.30/sqrt(n)
    // = 2.7e-5; 1e-3 is 37 of them, and a skipped slab of 1% of the elements moves it by 3e-3.
    EXPECT_NEAR(rc / len, 1.0 / 3.0, 1e-3) << "E[x²] of uniform [-1, 1): the sum covers every element";
    EXPECT_EQ(gpu().sum_squares(gx.f(), len), rg) << "not deterministic, n=" << len;
  }
  cpu().scale(x.data(), 0.37f, n);
  gpu().scale(gx.f(), 0.37f, n);
  EXPECT_SAME_BITS(gx.get(), x) << "scale";
}

// ---- one full GPT-2 124M step -------------------------------------------------------------------------------

namespace {

ModelDesc gpt2_small() { return desc_of("gpt2", 12, 12, 768, 1024, kVocab); }

// One training step as the trainer takes it (forward, backward, global-norm clipping at 1.0,
// AdamW with decay on the 2-D tensors); returns the loss.
float train_step(Model& m, Activations& a, const Batch& batch, float* mom, float* var, int t) {
  const Ops& o = *m.ops;
  const size_t n = m.table.numel;
  m.zero_grads();
  const float loss = m.forward(a, batch, HeadMode::train);
  m.backward(a);
  const double norm = std::sqrt(o.sum_squares(m.grads, n));
  if (norm > 1.0) o.scale(m.grads, static_cast<float>(1.0 / norm), n);
  for (const ParamSlice& s : m.table.slices)
    o.adamw_update(m.params + s.offset, m.grads + s.offset, mom + s.offset, var + s.offset,
                   s.numel, 6e-4f, 0.9f, 0.95f, 1e-8f, s.decay ? 0.1f : 0.0f, t);
  return loss;
}

}  // namespace

// B = 1, T = 1024: the loss and every parameter tensor's gradient, CPU vs GPU, as
// CudaModel.LossAndEveryGradientMatchCpu does for toy models. Bound (an estimate, not a worst
// case, to confirm on a card): the first-order worst case CudaModel uses, 2 gamma_n(L) with L the
// summed lengths of the sums along the chain, is 2 gamma_n(~3e5) ≈ 0.04 at 12 layers of width 768
// and T 1024 — nothing. So: the loss (a mean of 1024 row losses ≈ log V ≈ 10.8, which sees the
// logits' rounding only through log Σ exp) within 1e-5; each gradient tensor within 1e-4 of its
// own norm (B = 1: the per-example magnitude of CudaModel is the gradient itself). The estimate:
// each op of the chain agrees within its bound and typically to ~u sqrt(K) ≈ 3e-6 (fp32 sums over
// K ≤ 3072 in another order); a 12-layer forward and backward chains ~20 such ops per layer, whose
// independent rounding differences add in quadrature: sqrt(240)·1e-6 ≈ 1.5e-5, so 1e-4 leaves a
// margin of ~6 for amplification through LayerNorm and softmax. Measured on the CPU (2026-11-24):
// the CPU backend against itself with every GEMM's reduction (K) split in two halves — another fp32
// summation order, as a GPU's blocking gives — differs by at most 1.5e-6 per tensor
// (h.7.ln_2.weight) and not at all in the loss's printed 8 digits: 1e-4 leaves ~70x for what else
// differs on the GPU (exp, attention's and the norms' sums). Each tensor's error is printed, so a
// GPU run records the real figures.
TEST(CudaRealShape, Gpt2SmallStepLossAndEveryGradientMatchCpu) {
  REQUIRE_GPU();
  REQUIRE_GPU_MEMORY(size_t(8) << 30);
  const ModelDesc d = gpt2_small();
  const int B = 1, T = 1024;
  RandomBatch rb(d, B, T, 760);
  Model mc(d, cpu()), mg(d, gpu());
  ASSERT_EQ(mc.table.numel, kGpt2Params);
  Activations ac(mc, B, T), ag(mg, B, T);
  mc.init_params(761);
  mg.init_params(761);
  mc.zero_grads();
  mg.zero_grads();
  const float lc = mc.forward(ac, rb.b, HeadMode::train);
  const float lg = mg.forward(ag, rb.b, HeadMode::train);
  std::printf("[          ] loss: CPU %.7f, GPU %.7f\n", lc, lg);
  EXPECT_LT(std::fabs(lg - lc) / std::fabs(lc), 1e-5) << lg << " vs " << lc;
  mc.backward(ac);
  mg.backward(ag);
  const auto gc = mc.grads_host(), gg = mg.grads_host();
  ASSERT_EQ(gc.size(), gg.size());
  ASSERT_TRUE(all_finite(gg));
  double worst = 0.0;
  std::string worst_name;
  for (const ParamSlice& s : mc.table.slices) {
    const std::vector<float> a(gg.begin() + s.offset, gg.begin() + s.offset + s.numel);
    const std::vector<float> r(gc.begin() + s.offset, gc.begin() + s.offset + s.numel);
    const double e = rel(a, r);
    EXPECT_LT(e, 1e-4) << s.name;
    if (e > worst) {
      worst = e;
      worst_name = s.name;
    }
  }
  std::printf("[          ] largest gradient difference: %.3g (%s) over %zu tensors\n", worst,
              worst_name.c_str(), mc.table.slices.size());
}

// Two training steps (forward, backward, clipping, AdamW) from the same state, twice on the GPU in
// two separate models: the same bits — loss, every parameter, every gradient and both AdamW
// moments (Exact: no float atomics anywhere; cuBLAS on one stream, reproducible on one card).
// B = 2, T = 1024.
TEST(CudaRealShape, Gpt2SmallStepsAreBitwiseRepeatable) {
  REQUIRE_GPU();
  REQUIRE_GPU_MEMORY(size_t(20) << 30);
  const ModelDesc d = gpt2_small();
  const int B = 2, T = 1024;
  RandomBatch b1(d, B, T, 770), b2(d, B, T, 771);
  struct Run {
    float loss[2];
    std::vector<float> params, grads, m, v;
  };
  auto run = [&]() {
    Run r;
    Model m(d, gpu());
    Activations a(m, B, T);
    m.init_params(772);
    const size_t n = m.table.numel;
    Dev mom(n * sizeof(float)), var(n * sizeof(float));
    r.loss[0] = train_step(m, a, b1.b, mom.f(), var.f(), 1);
    r.loss[1] = train_step(m, a, b2.b, mom.f(), var.f(), 2);
    r.params = m.params_host();
    r.grads = m.grads_host();
    r.m = mom.get();
    r.v = var.get();
    return r;
  };
  const Run x = run(), y = run();
  EXPECT_EQ(std::memcmp(x.loss, y.loss, sizeof x.loss), 0)
      << x.loss[0] << " " << x.loss[1] << " vs " << y.loss[0] << " " << y.loss[1];
  EXPECT_SAME_BITS(x.params, y.params) << "parameters differ between two identical runs";
  EXPECT_SAME_BITS(x.grads, y.grads) << "gradients differ between two identical runs";
  EXPECT_SAME_BITS(x.m, y.m) << "AdamW m differs";
  EXPECT_SAME_BITS(x.v, y.v) << "AdamW v differs";
  EXPECT_TRUE(all_finite(x.params));
  EXPECT_LT(x.loss[1], 11.5f);  // (not a tolerance: the second step's loss is a loss, about log V)
}

// ---- NCCL at world size 1 --------------------------------------------------------------------------------

#define REQUIRE_NCCL()                                                              \
  do {                                                                              \
    std::string why_;                                                               \
    if (!nccl_available(&why_)) GTEST_SKIP() << "no GPU or no NCCL: " << why_;      \
    cuda_bind_device(0);                                                            \
  } while (0)

// Runs everywhere: parallel.sync = nccl with the CPU backend is refused with the fix.
TEST(NcclSync, GradSyncRefusesTheCpuBackend) {
  const ModelDesc d = desc_of("gpt2", 1, 2, 16, 8, 11);
  Model m(d, cpu());
  SyncOptions o;
  o.method = SyncMethod::nccl;
  try {
    GradSync s(o, MPI_COMM_SELF, cpu(), m.grads, m.table, nullptr);
    ADD_FAILURE() << "no error for parallel.sync = nccl on the CPU backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runtime.device \"cuda\""), std::string::npos) << e.what();
  }
}

// NcclComm over MPI_COMM_SELF (a communicator of one rank, whatever mpiexec started): ncclAvg over
// one rank is the identity (the sum of one term, times 1), so every pass comes back bit for bit.
// The passes cover uneven ranges — one float, ranges ending inside "tensors", a whole buffer — as
// the gradient sync's buckets do, enqueued back to back before the compute stream waits for them.
TEST(NcclSync, WorldOneAveragingIsTheIdentity) {
  REQUIRE_NCCL();
  auto nccl = nccl_comm_create(MPI_COMM_SELF);
  ASSERT_TRUE(nccl);
  EXPECT_EQ(nccl->world(), 1);
  const size_t total = 3000017;
  const auto h = random_floats(total, 800, -3.0f, 3.0f);
  // range ends: ends of tensors of sizes 1, 7, 768, 2304·768, ... and some points inside them
  std::vector<size_t> ends;
  {
    const size_t sizes[] = {1, 7, 768, 589824, 3, 1000000, 65536, 1};
    size_t at = 0;
    for (size_t s : sizes) {
      if (s > 10) ends.push_back(at + s / 3);  // inside the tensor
      at += s;
      ends.push_back(at);
    }
    ASSERT_LT(at, total);
    ends.push_back(total - 5);
    ends.push_back(total);
  }
  Dev g(h);
  const size_t before = nccl->passes();
  size_t start = 0;
  for (size_t k : ends) {
    nccl->allreduce_avg(g.f() + start, k - start);
    start = k;
  }
  nccl->compute_waits();
  EXPECT_EQ(nccl->passes() - before, ends.size());
  // Exact: over one rank ncclAvg multiplies by 1/1 = 1 and sums one term
  EXPECT_SAME_BITS(g.get(), h) << "world 1 must give the gradient back unchanged";
  // the whole buffer in one pass, an empty pass (not counted), and the host wait
  nccl->allreduce_avg(g.f(), total);
  nccl->allreduce_avg(g.f() + 17, 0);
  nccl->compute_waits();
  nccl->synchronize();
  EXPECT_EQ(nccl->passes() - before, ends.size() + 1);
  EXPECT_SAME_BITS(g.get(), h);
}

// parallel.grad_dtype bf16 through NCCL at world size 1: each pass is rounded to bfloat16 on the
// device, averaged as ncclBfloat16 (over one rank: unchanged) and widened back, so the gradient
// comes back as exactly its bf16 rounding (the host's bf16_round: nearest, ties to even), whatever
// the ranges (the device staging buffer grows to the largest).
TEST(NcclSync, Bf16WorldOneGivesTheBf16Rounding) {
  REQUIRE_NCCL();
  auto nccl = nccl_comm_create(MPI_COMM_SELF);
  const size_t total = 1000003;
  auto h = random_floats(total, 820, -3.0f, 3.0f);
  h[0] = 1.0f + 0x1p-8f;      // a tie: to even (1.0)
  h[1] = 1.0f + 3 * 0x1p-8f;  // a tie: to even (1 + 2^-6)
  h[2] = 1e-30f;
  std::vector<float> expect(total);
  for (size_t i = 0; i < total; i++) expect[i] = bf16_widen(bf16_round(h[i]));
  ASSERT_NE(bit_difference(expect, h), "") << "the rounding must change something";
  for (const std::vector<size_t>& ends : {std::vector<size_t>{1, 5000, 5001, 777777, total}, std::vector<size_t>{total}}) {
    Dev g(h);
    size_t start = 0;
    for (size_t k : ends) {
      nccl->allreduce_avg(g.f() + start, k - start, /*bf16=*/true);
      start = k;
    }
    nccl->compute_waits();
    EXPECT_SAME_BITS(g.get(), expect) << ends.size() << " passes";  // Exact: one rounding to bf16, then widened
  }
}

// GradSync with parallel.sync = nccl around a real backward of a small GPT-2 on the GPU, as the
// trainer drives it (constructor, connect, begin_step, backward reporting ready prefixes, finish):
// at world size 1 the gradients are those of the same backward without any sync, bit for bit,
// and no bytes are counted. (GradSync skips the exchange at world size 1, so this checks the
// set-up path — communicator creation after agreement — and that nothing touches the gradients;
// WorldOneAveragingIsTheIdentity above runs the collectives themselves.)
TEST(NcclSync, GradSyncNcclAtWorldOneLeavesGradientsUnchanged) {
  REQUIRE_NCCL();
  const ModelDesc d = desc_of("gpt2", 2, 4, 64, 32, 97);
  const int B = 3, T = 32;
  RandomBatch rb(d, B, T, 810);
  Model ref(d, gpu()), m(d, gpu());
  Activations ar(ref, B, T), am(m, B, T);
  ref.init_params(811);
  m.init_params(811);
  for (double bucket_mb : {0.0, 0.01, 25.0}) {
    SyncOptions o;
    o.method = SyncMethod::nccl;
    o.bucket_mb = bucket_mb;
    GradSync sync(o, MPI_COMM_SELF, gpu(), m.grads, m.table, nullptr);
    sync.connect();
    ref.zero_grads();
    m.zero_grads();
    const float lr = ref.forward(ar, rb.b, HeadMode::train);
    ref.backward(ar);
    sync.begin_step();
    const float lm = m.forward(am, rb.b, HeadMode::train);
    size_t last = 0, calls = 0;
    m.backward(am, [&](size_t k) {
      EXPECT_GE(k, last);
      last = k;
      calls++;
      sync.on_ready(k);
    });
    sync.finish();
    EXPECT_EQ(last, m.table.numel) << "backward's last ready call covers the whole gradient";
    EXPECT_GT(calls, 1u);
    EXPECT_EQ(lm, lr);  // Exact: the same model and batch through the same kernels
    EXPECT_SAME_BITS(m.grads_host(), ref.grads_host()) << "bucket_mb " << bucket_mb;  // Exact: untouched
    EXPECT_EQ(sync.step.bytes_sent, 0.0);  // Exact: a byte count (a double holding an integer), nothing sent
    EXPECT_EQ(sync.step.collectives, 0);
  }
}
