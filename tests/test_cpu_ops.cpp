// CPU backend ops (src/backend/cpu/) against plain double-precision references written here:
// forward outputs by norm-wise relative error (< 1e-5), backward gradients against central finite
// differences of the double reference forward (< 1e-4). Every backward starts its gradient
// buffers from non-zero values to check the "+=" convention of backend/op_list.h (rope_backward,
// which transforms its gradient in place by contract, excepted).
#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/dropout_hash.h"
#include "backend/ops.h"
#include "grad_check.h"
#include "runtime/error.h"

extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);
}

using namespace llmpi;
using namespace llmpi::test;

namespace {

constexpr double kFwdTol = 1e-5;
constexpr double kBwdTol = 1e-4;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

const Ops& ops() { return cpu_ops(); }

// The analytic gradient an op added to a buffer that started at `before`, at the given indices
// (all when idx is empty).
std::vector<double> added(const std::vector<float>& after, const std::vector<float>& before,
                          const std::vector<size_t>& idx = {}) {
  std::vector<double> g;
  if (idx.empty()) {
    for (size_t i = 0; i < after.size(); i++)
      g.push_back(static_cast<double>(after[i]) - before[i]);
  } else {
    for (size_t i : idx) g.push_back(static_cast<double>(after[i]) - before[i]);
  }
  return g;
}

// `count` distinct random indices in [0, n), sorted.
std::vector<size_t> sample_indices(size_t n, size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; i++) all[i] = i;
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(std::min(n, count));
  std::sort(all.begin(), all.end());
  return all;
}

// ---- double-precision references --------------------------------------------------------------

// wpe empty: no position embedding.
std::vector<double> ref_embedding(const std::vector<int32_t>& inp, const std::vector<double>& wte,
                                  const std::vector<double>& wpe, int B, int T, int C) {
  std::vector<double> out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++)
        out[(b * T + t) * C + c] =
            wte[inp[b * T + t] * C + c] + (wpe.empty() ? 0.0 : wpe[t * C + c]);
  return out;
}

void ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                   const std::vector<double>& bias, int N, int C, std::vector<double>* out,
                   std::vector<double>* mean = nullptr, std::vector<double>* rstd = nullptr,
                   double eps = 1e-5) {
  out->assign(static_cast<size_t>(N) * C, 0.0);
  if (mean) mean->assign(N, 0.0);
  if (rstd) rstd->assign(N, 0.0);
  for (int n = 0; n < N; n++) {
    double m = 0.0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    double v = 0.0;
    for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + eps);
    for (int c = 0; c < C; c++) (*out)[n * C + c] = (x[n * C + c] - m) * r * w[c] + bias[c];
    if (mean) (*mean)[n] = m;
    if (rstd) (*rstd)[n] = r;
  }
}

std::vector<double> ref_matmul(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>* bias, int N, int C, int OC) {
  std::vector<double> out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int c = 0; c < C; c++) s += x[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
  return out;
}

// One attention problem: shapes, masking and dropout (mask empty = no mask).
struct AttnCase {
  int B, T, NH, NKV, hs;
  bool causal = true;
  AttnCase(int B_, int T_, int NH_, int NKV_, int hs_) : B(B_), T(T_), NH(NH_), NKV(NKV_), hs(hs_) {}
  std::vector<int32_t> mask;  // [B, T], empty: every key valid
  float p = 0.0f;             // attention-probability dropout
  uint64_t key = 0;
  int W() const { return (NH + 2 * NKV) * hs; }
  int C() const { return NH * hs; }
  size_t n_qkv() const { return static_cast<size_t>(B) * T * W(); }
  size_t n_out() const { return static_cast<size_t>(B) * T * C(); }
  size_t n_att() const { return static_cast<size_t>(B) * NH * T * T; }
  const int32_t* mask_ptr() const { return mask.empty() ? nullptr : mask.data(); }
};

// Plain attention from the definition, one query row at a time: query head h reads kv head
// h / (NH/NKV); key j is valid for query i unless (causal and j > i) or mask[b,j] == 0;
// P = softmax over the valid keys (a row with none: P = 0); out_i = Σ_j P_ij d_ij V_j with
// d_ij = keep/(1-p) (dropout_keep of the flat att index) or 1 without dropout.
void ref_attention(const std::vector<double>& qkv, const AttnCase& a, std::vector<double>* out,
                   std::vector<double>* att = nullptr) {
  const int T = a.T, NH = a.NH, hs = a.hs, W = a.W(), C = a.C(), group = a.NH / a.NKV;
  const double sc = 1.0 / std::sqrt(static_cast<double>(hs));
  out->assign(a.n_out(), 0.0);
  if (att) att->assign(a.n_att(), 0.0);
  std::vector<double> p(T);
  std::vector<char> valid(T);
  for (int b = 0; b < a.B; b++)
    for (int h = 0; h < NH; h++) {
      const int g = h / group;
      for (int i = 0; i < T; i++) {
        const double* q = &qkv[(static_cast<size_t>(b) * T + i) * W + h * hs];
        double mx = -INFINITY;
        bool any = false;
        for (int j = 0; j < T; j++) {
          valid[j] = !(a.causal && j > i) && (a.mask.empty() || a.mask[b * T + j] != 0);
          if (!valid[j]) continue;
          any = true;
          const double* k = &qkv[(static_cast<size_t>(b) * T + j) * W + (NH + g) * hs];
          double s = 0.0;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          p[j] = s * sc;
          mx = std::max(mx, p[j]);
        }
        if (!any) continue;  // P = 0, out = 0
        double sum = 0.0;
        for (int j = 0; j < T; j++)
          if (valid[j]) sum += (p[j] = std::exp(p[j] - mx));
        double* o = &(*out)[(static_cast<size_t>(b) * T + i) * C + h * hs];
        for (int j = 0; j < T; j++) {
          if (!valid[j]) continue;
          const double pj = p[j] / sum;
          const size_t e = ((static_cast<size_t>(b) * NH + h) * T + i) * T + j;
          if (att) (*att)[e] = pj;
          double d = 1.0;
          if (a.p > 0.0f) d = dropout_keep(a.key, e, a.p) ? 1.0 / (1.0 - a.p) : 0.0;
          const double* v = &qkv[(static_cast<size_t>(b) * T + j) * W + (NH + a.NKV + g) * hs];
          for (int dd = 0; dd < hs; dd++) o[dd] += pj * d * v[dd];
        }
      }
    }
}

double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// losses[n] = log Σ_j exp(z_j) − z_y, computed as mx + log Σ_j exp(z_j − mx) − z_y.
std::vector<double> ref_xent(const std::vector<double>& z, const std::vector<int32_t>& y, int N,
                             int V) {
  std::vector<double> loss(N);
  for (int n = 0; n < N; n++) {
    double mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = std::max(mx, z[n * V + j]);
    double s = 0.0;
    for (int j = 0; j < V; j++) s += std::exp(z[n * V + j] - mx);
    loss[n] = mx + std::log(s) - z[n * V + y[n]];
  }
  return loss;
}

}  // namespace

// ---- table and memory --------------------------------------------------------------------------

TEST(CpuOps, TableIsComplete) {
  const Ops& o = ops();
  EXPECT_EQ(o.device, Device::cpu);
  EXPECT_FALSE(o.on_gpu());
  // Every entry of the op list: set, and to the CPU backend's function of that name.
  int count = 0;
#define LLMPI_CHECK_OP(ret, name, params)                       \
  EXPECT_NE(o.name, nullptr) << #name;                          \
  EXPECT_EQ(o.name, static_cast<ret(*) params>(&cpu::name)) << #name; \
  count++;
  LLMPI_OPS(LLMPI_CHECK_OP)
#undef LLMPI_CHECK_OP
  // ... and those were all the members: Ops is the device tag followed by one pointer per op.
  EXPECT_EQ(sizeof(Ops), offsetof(Ops, alloc) + static_cast<size_t>(count) * sizeof(void (*)()));
}

TEST(CpuOps, MemoryIsZeroFilledAlignedAndCopies) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{1000}, size_t{1} << 20}) {
    auto* p = static_cast<unsigned char*>(ops().alloc(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    for (size_t i = 0; i < bytes; i++) ASSERT_EQ(p[i], 0) << bytes << " @" << i;
    ops().free(p);
  }
  const std::vector<float> src = random_floats(1000, 1);
  auto* d = static_cast<float*>(ops().alloc(src.size() * sizeof(float)));
  ops().copy_to_device(d, src.data(), src.size() * sizeof(float));
  std::vector<float> back(src.size());
  ops().copy_to_host(back.data(), d, back.size() * sizeof(float));
  EXPECT_EQ(0, std::memcmp(back.data(), src.data(), src.size() * sizeof(float)));
  auto* d2 = static_cast<float*>(ops().alloc(src.size() * sizeof(float)));
  ops().copy(d2, d, src.size() * sizeof(float));  // within the backend's memory
  EXPECT_EQ(0, std::memcmp(d2, src.data(), src.size() * sizeof(float)));
  ops().copy(d2, d2, src.size() * sizeof(float));  // onto itself: a no-op
  ops().copy(d2, nullptr, 0);                      // zero bytes: nothing read
  EXPECT_EQ(0, std::memcmp(d2, src.data(), src.size() * sizeof(float)));
  ops().free(d2);
  ops().zero(d, 10 * sizeof(float));
  for (int i = 0; i < 10; i++) EXPECT_EQ(d[i], 0.0f);
  EXPECT_EQ(d[10], src[10]);
  ops().free(d);
}

// ---- the vectorised exp --------------------------------------------------------------------------

TEST(CpuOps, FastExpMatchesExp) {
  double worst = 0.0;
  for (int i = 0; i <= 2000000; i++) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(cpu::fast_expf(x) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);  // float epsilon is 1.19e-7: within ~2 ulp
  EXPECT_EQ(cpu::fast_expf(0.0f), 1.0f);
  EXPECT_EQ(cpu::fast_expf(-100.0f), 0.0f);
  EXPECT_EQ(cpu::fast_expf(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::fast_expf(kNaN)));
  EXPECT_TRUE(std::isnan(cpu::fast_expf(-kNaN)));
  // Never a denormal: normal down to -87, exactly 0 below.
  for (float x = -87.0f; x < -80.0f; x += 1e-3f)
    ASSERT_GE(cpu::fast_expf(x), std::numeric_limits<float>::min()) << x;
  for (float x = -87.0001f; x > -95.0f; x -= 1e-3f) ASSERT_EQ(cpu::fast_expf(x), 0.0f) << x;
}

// ---- embedding -----------------------------------------------------------------------------------

TEST(CpuOps, EmbeddingForward) {
  const int B = 2, T = 5, C = 8, V = 11;
  const auto inp = random_ints(B * T, 3, 0, V);
  const auto wte = random_floats(V * C, 4), wpe = random_floats(T * C, 5);
  std::vector<float> out(B * T * C, kNaN);
  ops().embedding_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_LT(rel_err(out, ref_embedding(inp, to_double(wte), to_double(wpe), B, T, C)), kFwdTol);
}

TEST(CpuOps, EmbeddingBackward) {
  const int B = 2, T = 5, C = 8, V = 11;
  auto inp = random_ints(B * T, 6, 0, V);
  inp[3] = inp[7] = inp[9] = 2;  // repeated tokens: the scatter-add must accumulate
  const auto wte = random_floats(V * C, 7), wpe = random_floats(T * C, 8);
  const auto dout = random_floats(B * T * C, 9);
  const auto dwte0 = random_floats(V * C, 10), dwpe0 = random_floats(T * C, 11);
  auto dwte = dwte0, dwpe = dwpe0;
  ops().embedding_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
  const auto wted = to_double(wte), wped = to_double(wpe);
  const auto g_wte = fd_grad(
      [&](const std::vector<double>& w) { return dot(ref_embedding(inp, w, wped, B, T, C), dout); },
      wted, {});
  const auto g_wpe = fd_grad(
      [&](const std::vector<double>& w) { return dot(ref_embedding(inp, wted, w, B, T, C), dout); },
      wped, {});
  EXPECT_LT(rel_err(added(dwte, dwte0), g_wte), kBwdTol);
  EXPECT_LT(rel_err(added(dwpe, dwpe0), g_wpe), kBwdTol);
}

// No position embedding (LLaMA): wpe / dwpe null.
TEST(CpuOps, EmbeddingWithoutPositions) {
  const int B = 2, T = 5, C = 8, V = 11;
  auto inp = random_ints(B * T, 120, 0, V);
  inp[1] = inp[6] = 4;
  const auto wte = random_floats(V * C, 121);
  std::vector<float> out(B * T * C, kNaN);
  ops().embedding_forward(out.data(), inp.data(), wte.data(), nullptr, B, T, C);
  EXPECT_LT(rel_err(out, ref_embedding(inp, to_double(wte), {}, B, T, C)), kFwdTol);
  const auto dout = random_floats(B * T * C, 122);
  const auto dwte0 = random_floats(V * C, 123);
  auto dwte = dwte0;
  ops().embedding_backward(dwte.data(), nullptr, dout.data(), inp.data(), B, T, C);
  const auto g = fd_grad(
      [&](const std::vector<double>& w) { return dot(ref_embedding(inp, w, {}, B, T, C), dout); },
      to_double(wte), {});
  EXPECT_LT(rel_err(added(dwte, dwte0), g), kBwdTol);
}

namespace {
// out[n, :] = base[n, :] + table[ids[n], :]
std::vector<double> ref_embedding_add(const std::vector<float>& base, const std::vector<int32_t>& ids,
                                      const std::vector<double>& table, int N, int C) {
  std::vector<double> out(base.begin(), base.end());
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) out[n * C + c] += table[ids[n] * C + c];
  return out;
}
}  // namespace

TEST(CpuOps, EmbeddingAddForward) {
  for (int N : {10, 700}) {  // 700 x 128: the OpenMP path
    const int C = N > 100 ? 128 : 8, V = 3;
    const auto ids = random_ints(N, 124, 0, V);
    const auto table = random_floats(V * C, 125), base = random_floats(N * C, 126);
    auto out = base;
    ops().embedding_add_forward(out.data(), ids.data(), table.data(), N, C);
    EXPECT_LT(rel_err(out, ref_embedding_add(base, ids, to_double(table), N, C)), kFwdTol) << N;
  }
}

TEST(CpuOps, EmbeddingAddBackward) {
  for (int N : {10, 700}) {
    const int C = N > 100 ? 128 : 8, V = 3;  // few ids: every row of the table gets many terms
    const auto ids = random_ints(N, 127, 0, V);
    const auto table = random_floats(V * C, 128), base = random_floats(N * C, 129);
    const auto dout = random_floats(N * C, 130);
    const auto dt0 = random_floats(V * C, 131);
    auto dt = dt0;
    ops().embedding_add_backward(dt.data(), dout.data(), ids.data(), N, C);
    const auto g = fd_grad(
        [&](const std::vector<double>& t) { return dot(ref_embedding_add(base, ids, t, N, C), dout); },
        to_double(table), {});
    EXPECT_LT(rel_err(added(dt, dt0), g), kBwdTol) << N;
  }
}

// ---- layernorm -----------------------------------------------------------------------------------

TEST(CpuOps, LayerNormForward) {
  for (int C : {8, 37, 256}) {
    const int N = 10;
    auto x = random_floats(N * C, 12, -2.0f, 2.0f);
    for (int c = 0; c < C; c++) x[c] += 100.0f;  // a row with a large mean (variance by 2 passes)
    const auto w = random_floats(C, 13), b = random_floats(C, 14);
    std::vector<float> out(N * C, kNaN), mean(N, kNaN), rstd(N, kNaN);
    ops().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                            1e-5f, nullptr);
    std::vector<double> ro, rm, rr;
    ref_layernorm(to_double(x), to_double(w), to_double(b), N, C, &ro, &rm, &rr);
    EXPECT_LT(rel_err(out, ro), kFwdTol) << C;
    EXPECT_LT(rel_err(mean, rm), kFwdTol) << C;
    EXPECT_LT(rel_err(rstd, rr), kFwdTol) << C;
  }
}

TEST(CpuOps, LayerNormBackward) {
  for (int C : {8, 37}) {
    const int N = 10;
    const auto x = random_floats(N * C, 15, -2.0f, 2.0f);
    const auto w = random_floats(C, 16), b = random_floats(C, 17);
    const auto dout = random_floats(N * C, 18);
    std::vector<float> out(N * C), mean(N), rstd(N);
    ops().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                            1e-5f, nullptr);
    const auto dx0 = random_floats(N * C, 19), dw0 = random_floats(C, 20), db0 = random_floats(C, 21);
    auto dx = dx0, dw = dw0, db = db0;
    ops().layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                             mean.data(), rstd.data(), N, C);
    const auto xd = to_double(x), wd = to_double(w), bd = to_double(b);
    std::vector<double> o;
    const auto gx = fd_grad(
        [&](const std::vector<double>& v) { ref_layernorm(v, wd, bd, N, C, &o); return dot(o, dout); },
        xd, {});
    const auto gw = fd_grad(
        [&](const std::vector<double>& v) { ref_layernorm(xd, v, bd, N, C, &o); return dot(o, dout); },
        wd, {});
    const auto gb = fd_grad(
        [&](const std::vector<double>& v) { ref_layernorm(xd, wd, v, N, C, &o); return dot(o, dout); },
        bd, {});
    EXPECT_LT(rel_err(added(dx, dx0), gx), kBwdTol) << C;
    EXPECT_LT(rel_err(added(dw, dw0), gw), kBwdTol) << C;
    EXPECT_LT(rel_err(added(db, db0), gb), kBwdTol) << C;
  }
}

TEST(CpuOps, LayerNormUsesEps) {
  // Rows of small variance, where eps matters: 1e-5 and 1e-2 give different outputs, each matching
  // the reference with its own eps.
  const int N = 6, C = 16;
  const auto x = random_floats(N * C, 132, -0.05f, 0.05f);
  const auto w = random_floats(C, 133), b = random_floats(C, 134);
  for (float eps : {1e-5f, 1e-2f, 1e-12f}) {
    std::vector<float> out(N * C, kNaN), mean(N), rstd(N);
    ops().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                            C, eps, nullptr);
    std::vector<double> ro, rm, rr;
    ref_layernorm(to_double(x), to_double(w), to_double(b), N, C, &ro, &rm, &rr, eps);
    EXPECT_LT(rel_err(out, ro), kFwdTol) << eps;
    EXPECT_LT(rel_err(rstd, rr), kFwdTol) << eps;
  }
}

// ---- RMSNorm -------------------------------------------------------------------------------------

namespace {
// y = x * rstd * w, rstd = 1 / sqrt(mean(x²) + eps)
void ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int N, int C,
                 double eps, std::vector<double>* out, std::vector<double>* rstd = nullptr) {
  out->assign(static_cast<size_t>(N) * C, 0.0);
  if (rstd) rstd->assign(N, 0.0);
  for (int n = 0; n < N; n++) {
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += x[n * C + c] * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; c++) (*out)[n * C + c] = x[n * C + c] * r * w[c];
    if (rstd) (*rstd)[n] = r;
  }
}
}  // namespace

TEST(CpuOps, RMSNormForward) {
  for (int C : {8, 37, 256}) {
    const int N = 10;
    auto x = random_floats(N * C, 135, -2.0f, 2.0f);
    for (int c = 0; c < C; c++) x[C + c] *= 1e-3f;  // a row of small values: eps matters
    const auto w = random_floats(C, 136);
    for (float eps : {1e-5f, 1e-6f}) {
      std::vector<float> out(N * C, kNaN), rstd(N, kNaN);
      ops().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps, nullptr);
      std::vector<double> ro, rr;
      ref_rmsnorm(to_double(x), to_double(w), N, C, eps, &ro, &rr);
      EXPECT_LT(rel_err(out, ro), kFwdTol) << C;
      EXPECT_LT(rel_err(rstd, rr), kFwdTol) << C;
    }
  }
}

TEST(CpuOps, RMSNormBackward) {
  // N = 300: three chunks of the dweight partial sums (and the OpenMP path at C = 128), with a
  // sample of the x gradients; N = 10: every element.
  struct Shape { int N, C; size_t x_samples; };
  for (const Shape s : {Shape{10, 8, 0}, Shape{10, 37, 0}, Shape{300, 128, 300}}) {
    const int N = s.N, C = s.C;
    const float eps = 1e-5f;
    const auto x = random_floats(N * C, 137, -2.0f, 2.0f), w = random_floats(C, 138);
    const auto dout = random_floats(N * C, 139);
    std::vector<float> out(N * C), rstd(N);
    ops().rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps, nullptr);
    const auto dx0 = random_floats(N * C, 140), dw0 = random_floats(C, 141);
    auto dx = dx0, dw = dw0;
    ops().rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    const auto xd = to_double(x), wd = to_double(w);
    const std::vector<size_t> idx = s.x_samples ? sample_indices(x.size(), s.x_samples, 142)
                                                : std::vector<size_t>{};
    std::vector<double> o;
    const auto gx = fd_grad(
        [&](const std::vector<double>& v) { ref_rmsnorm(v, wd, N, C, eps, &o); return dot(o, dout); },
        xd, idx);
    const auto gw = fd_grad(
        [&](const std::vector<double>& v) { ref_rmsnorm(xd, v, N, C, eps, &o); return dot(o, dout); },
        wd, {});
    EXPECT_LT(rel_err(added(dx, dx0, idx), gx), kBwdTol) << C;
    EXPECT_LT(rel_err(added(dw, dw0), gw), kBwdTol) << C;
  }
}

// ---- matmul --------------------------------------------------------------------------------------

TEST(CpuOps, MatmulForward) {
  struct Shape { int N, C, OC; };
  for (const Shape s : {Shape{10, 8, 12}, Shape{37, 20, 33}, Shape{64, 96, 48}}) {
    const auto x = random_floats(s.N * s.C, 22), w = random_floats(s.OC * s.C, 23);
    const auto bias = random_floats(s.OC, 24);
    const auto xd = to_double(x), wd = to_double(w), bd = to_double(bias);
    std::vector<float> out(s.N * s.OC, kNaN);
    ops().matmul_forward(out.data(), x.data(), w.data(), bias.data(), s.N, s.C, s.OC, GemmPrecision::fp32);
    EXPECT_LT(rel_err(out, ref_matmul(xd, wd, &bd, s.N, s.C, s.OC)), kFwdTol);
    std::fill(out.begin(), out.end(), kNaN);  // without bias the old content must not leak in
    ops().matmul_forward(out.data(), x.data(), w.data(), nullptr, s.N, s.C, s.OC, GemmPrecision::fp32);
    EXPECT_LT(rel_err(out, ref_matmul(xd, wd, nullptr, s.N, s.C, s.OC)), kFwdTol);
  }
}

TEST(CpuOps, MatmulBackward) {
  const int N = 10, C = 8, OC = 12;
  const auto x = random_floats(N * C, 25), w = random_floats(OC * C, 26);
  const auto bias = random_floats(OC, 27), dout = random_floats(N * OC, 28);
  const auto dx0 = random_floats(N * C, 29), dw0 = random_floats(OC * C, 30);
  const auto db0 = random_floats(OC, 31);
  auto dx = dx0, dw = dw0, db = db0;
  ops().matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC, GemmPrecision::fp32);
  const auto xd = to_double(x), wd = to_double(w), bd = to_double(bias);
  const auto gx = fd_grad(
      [&](const std::vector<double>& v) { return dot(ref_matmul(v, wd, &bd, N, C, OC), dout); }, xd, {});
  const auto gw = fd_grad(
      [&](const std::vector<double>& v) { return dot(ref_matmul(xd, v, &bd, N, C, OC), dout); }, wd, {});
  const auto gb = fd_grad(
      [&](const std::vector<double>& v) { return dot(ref_matmul(xd, wd, &v, N, C, OC), dout); }, bd, {});
  EXPECT_LT(rel_err(added(dx, dx0), gx), kBwdTol);
  EXPECT_LT(rel_err(added(dw, dw0), gw), kBwdTol);
  EXPECT_LT(rel_err(added(db, db0), gb), kBwdTol);

  // dinp and dbias may be null: dweight is unchanged by skipping them.
  auto dw2 = dw0;
  ops().matmul_backward(nullptr, dw2.data(), nullptr, dout.data(), x.data(), w.data(), N, C, OC, GemmPrecision::fp32);
  EXPECT_EQ(0, std::memcmp(dw2.data(), dw.data(), dw.size() * sizeof(float)));
}

TEST(CpuOps, MatmulBackwardOddShape) {
  // Sizes that are not multiples of the vector width or of the dbias channel split.
  const int N = 37, C = 20, OC = 33;
  const auto x = random_floats(N * C, 32), w = random_floats(OC * C, 33);
  const auto dout = random_floats(N * OC, 34);
  const auto dx0 = random_floats(N * C, 35), dw0 = random_floats(OC * C, 36);
  const auto db0 = random_floats(OC, 37);
  auto dx = dx0, dw = dw0, db = db0;
  ops().matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC, GemmPrecision::fp32);
  // Linear in each argument: the exact gradients are the products themselves, in double.
  std::vector<double> gx(N * C, 0.0), gw(OC * C, 0.0), gb(OC, 0.0);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      const double d = dout[n * OC + o];
      gb[o] += d;
      for (int c = 0; c < C; c++) {
        gx[n * C + c] += d * w[o * C + c];
        gw[o * C + c] += d * x[n * C + c];
      }
    }
  EXPECT_LT(rel_err(added(dx, dx0), gx), kBwdTol);
  EXPECT_LT(rel_err(added(dw, dw0), gw), kBwdTol);
  EXPECT_LT(rel_err(added(db, db0), gb), kBwdTol);
}

// ---- rotary position embedding -------------------------------------------------------------------

namespace {

struct RopeCase { int B, T, nh, hs, stride; float theta; };

// x'[i] = x[i] cos a - x[i+hs/2] sin a;  x'[i+hs/2] = x[i+hs/2] cos a + x[i] sin a,
// with a = t theta^(-2i/hs), on the first nh*hs floats of each row; the rest of the row unchanged.
std::vector<double> ref_rope(const std::vector<double>& x, const RopeCase& r) {
  std::vector<double> y = x;
  const int half = r.hs / 2;
  for (int n = 0; n < r.B * r.T; n++) {
    const int t = n % r.T;
    for (int h = 0; h < r.nh; h++)
      for (int i = 0; i < half; i++) {
        const double a = t * std::pow(static_cast<double>(r.theta), -2.0 * i / r.hs);
        const size_t lo = static_cast<size_t>(n) * r.stride + h * r.hs + i, hi = lo + half;
        y[lo] = x[lo] * std::cos(a) - x[hi] * std::sin(a);
        y[hi] = x[hi] * std::cos(a) + x[lo] * std::sin(a);
      }
  }
  return y;
}

const RopeCase kRopeCases[] = {
    {2, 5, 2, 8, 16, 10000.0f},                  // rows exactly nh*hs wide
    {2, 7, 3, 4, 3 * 4 + 2 * 4 + 5, 500000.0f},  // q heads inside a wider qkv-like row
    {1, 300, 4, 16, 64, 10000.0f},               // 300 x 4 x 16: the OpenMP path
};

}  // namespace

TEST(CpuOps, RopeForward) {
  for (const RopeCase& r : kRopeCases) {
    const size_t n = static_cast<size_t>(r.B) * r.T * r.stride;
    const auto x0 = random_floats(n, 143);
    auto x = x0;
    ops().rope_forward(x.data(), r.B, r.T, r.nh, r.hs, r.stride, r.theta);
    const auto ref = ref_rope(to_double(x0), r);
    EXPECT_LT(rel_err(x, ref), kFwdTol) << r.T;
    for (size_t e = 0; e < n; e++)  // untouched columns keep their bits
      if (static_cast<int>(e % r.stride) >= r.nh * r.hs) {
        ASSERT_EQ(x[e], x0[e]) << e;
      }
  }
}

// Far positions: the angle t * f_i is accurate (computed in double), so the rotation stays within
// float rounding of the exact one even at t ~ 8000 (a float32 angle would be off by ~5e-4 rad).
TEST(CpuOps, RopeForwardLongPositions) {
  const RopeCase r{1, 8192, 1, 8, 8, 10000.0f};
  const auto x0 = random_floats(static_cast<size_t>(r.T) * r.stride, 144);
  auto x = x0;
  ops().rope_forward(x.data(), r.B, r.T, r.nh, r.hs, r.stride, r.theta);
  const auto ref = ref_rope(to_double(x0), r);
  double worst = 0.0;
  for (size_t e = 0; e < x.size(); e++) worst = std::max(worst, std::fabs(x[e] - ref[e]));
  EXPECT_LT(worst, 5e-7);
}

// rope_backward transforms the gradient in place (not +=, by contract): dx = R(a)^T dx'.
TEST(CpuOps, RopeBackward) {
  for (const RopeCase& r : kRopeCases) {
    const size_t n = static_cast<size_t>(r.B) * r.T * r.stride;
    const auto x = random_floats(n, 145), dout = random_floats(n, 146);
    auto dx = dout;
    ops().rope_backward(dx.data(), r.B, r.T, r.nh, r.hs, r.stride, r.theta);
    const std::vector<size_t> idx = n > 2000 ? sample_indices(n, 500, 147) : std::vector<size_t>{};
    const auto g = fd_grad(
        [&](const std::vector<double>& v) { return dot(ref_rope(v, r), dout); }, to_double(x), idx);
    std::vector<double> got;
    if (idx.empty()) got.assign(dx.begin(), dx.end());
    else for (size_t i : idx) got.push_back(dx[i]);
    EXPECT_LT(rel_err(got.data(), g.data(), g.size()), kBwdTol) << r.T;
  }
}

TEST(CpuOps, RopeRejectsOddHeadSize) {
  std::vector<float> x(2 * 3 * 5);
  EXPECT_THROW(ops().rope_forward(x.data(), 2, 3, 1, 5, 5, 10000.0f), Error);
  EXPECT_THROW(ops().rope_backward(x.data(), 2, 3, 2, 4, 5, 10000.0f), Error);  // stride < nh*hs
}

// Forward then backward (the inverse rotation) restores x to within float rounding.
TEST(CpuOps, RopeRoundTrip) {
  for (const RopeCase& r : kRopeCases) {
    const size_t n = static_cast<size_t>(r.B) * r.T * r.stride;
    const auto x0 = random_floats(n, 148);
    auto x = x0;
    ops().rope_forward(x.data(), r.B, r.T, r.nh, r.hs, r.stride, r.theta);
    ops().rope_backward(x.data(), r.B, r.T, r.nh, r.hs, r.stride, r.theta);
    for (size_t e = 0; e < n; e++) ASSERT_NEAR(x[e], x0[e], 4e-7) << e;
  }
}

// ---- attention -----------------------------------------------------------------------------------

namespace {

// The original causal-only implementation (src/backend/cpu/attention.cpp before grouped K/V heads,
// masks and dropout), kept verbatim apart from names: the new op must reproduce its results bit
// for bit when NKV == NH, causal, no mask and no dropout (the GPT-2 path).
namespace legacy {

struct SerialBlas {
  int saved = 0;
  explicit SerialBlas(bool active) {
    if (active) {
      saved = openblas_get_num_threads();
      if (saved > 1) openblas_set_num_threads(1);
      else saved = 0;
    }
  }
  ~SerialBlas() {
    if (saved > 1) openblas_set_num_threads(saved);
  }
};

inline void causal_softmax_row(float* row, int i, int T) {
  const int n = i + 1;
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; j++) {
    const float e = cpu::fast_expf(row[j] - mx);
    row[j] = e;
    s += e;
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int j = 0; j < n; j++) row[j] *= inv;
  for (int j = n; j < T; j++) row[j] = 0.0f;
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const int BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel for schedule(static) if (par)
  for (int bh = 0; bh < BH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + static_cast<size_t>(bh) * T * T;
    float* o = out + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
    for (int i0 = 0; i0 < T; i0 += cpu::kAttnBlock) {
      const int i1 = i0 + cpu::kAttnBlock < T ? i0 + cpu::kAttnBlock : T;
      const int m = i1 - i0;
      float* ab = a + static_cast<size_t>(i0) * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, hs, sc,
                  q + static_cast<size_t>(i0) * C3, C3, k, C3, 0.0f, ab, T);
      for (int i = i0; i < i1; i++) causal_softmax_row(a + static_cast<size_t>(i) * T, i, T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, i1, 1.0f, ab, T, v, C3, 0.0f,
                  o + static_cast<size_t>(i0) * C, C);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const int BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1;
  SerialBlas serial(par);
#pragma omp parallel for schedule(static) if (par)
  for (int bh = 0; bh < BH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const size_t qoff = static_cast<size_t>(b) * T * C3 + static_cast<size_t>(h) * hs;
    const float* q = qkv + qoff;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + qoff;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* p = att + static_cast<size_t>(bh) * T * T;
    float* ds = scratch + static_cast<size_t>(bh) * T * T;
    const float* dO = dout + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hs;
    for (int i0 = 0; i0 < T; i0 += cpu::kAttnBlock) {
      const int i1 = i0 + cpu::kAttnBlock < T ? i0 + cpu::kAttnBlock : T;
      const int m = i1 - i0;
      float* dsb = ds + static_cast<size_t>(i0) * T;
      const float* pb = p + static_cast<size_t>(i0) * T;
      const float* dOb = dO + static_cast<size_t>(i0) * C;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, hs, 1.0f, dOb, C, v, C3, 0.0f,
                  dsb, T);
      for (int i = i0; i < i1; i++) {
        const float* pr = p + static_cast<size_t>(i) * T;
        float* dr = ds + static_cast<size_t>(i) * T;
        const int n = i + 1;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < n; j++) dot += dr[j] * pr[j];
#pragma omp simd
        for (int j = 0; j < n; j++) dr[j] = pr[j] * (dr[j] - dot);
        for (int j = n; j < i1; j++) dr[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, i1, sc, dsb, T, k, C3, 1.0f,
                  dq + static_cast<size_t>(i0) * C3, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, m, sc, dsb, T,
                  q + static_cast<size_t>(i0) * C3, C3, 1.0f, dk, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, m, 1.0f, pb, T, dOb, C, 1.0f,
                  dv, C3);
    }
  }
}

}  // namespace legacy

void run_attention_forward(const AttnCase& a, const std::vector<float>& qkv,
                           std::vector<float>* out, std::vector<float>* att) {
  ops().attention_forward(out->data(), att->data(), qkv.data(), a.mask_ptr(), a.B, a.T, a.NH,
                          a.NKV, a.hs, a.causal, a.p, a.key);
}

void run_attention_backward(const AttnCase& a, std::vector<float>* dqkv,
                            std::vector<float>* scratch, const std::vector<float>& dout,
                            const std::vector<float>& qkv, const std::vector<float>& att) {
  ops().attention_backward(dqkv->data(), scratch->data(), dout.data(), qkv.data(), att.data(),
                           a.mask_ptr(), a.B, a.T, a.NH, a.NKV, a.hs, a.causal, a.p, a.key);
}

// Forward against the double reference; every att entry that the reference leaves at 0 (future
// keys when causal, masked keys, rows without a valid key) must be exactly 0, and the output rows
// of queries without any valid key exactly 0.
void check_attention_forward(const AttnCase& a, uint32_t seed, const char* what = "") {
  const auto qkv = random_floats(a.n_qkv(), seed, -1.5f, 1.5f);
  std::vector<float> out(a.n_out(), kNaN);
  std::vector<float> att(a.n_att(), kNaN);  // stale content must go
  run_attention_forward(a, qkv, &out, &att);
  std::vector<double> ro, ra;
  ref_attention(to_double(qkv), a, &ro, &ra);
  EXPECT_LT(rel_err(out, ro), kFwdTol) << what << " T=" << a.T;
  EXPECT_LT(rel_err(att, ra), kFwdTol) << what << " T=" << a.T;
  for (size_t e = 0; e < att.size(); e++)
    if (ra[e] == 0.0) {
      ASSERT_EQ(att[e], 0.0f) << what << " att element " << e;
    }
  for (size_t e = 0; e < out.size(); e++) {
    ASSERT_FALSE(std::isnan(out[e])) << what << " out element " << e;
    if (ro[e] == 0.0) {
      ASSERT_EQ(out[e], 0.0f) << what << " out element " << e;
    }
  }
}

// The old entry point: causal, NKV == NH, hs = C / NH, no mask, no dropout.
void check_attention_forward(int B, int T, int C, int NH, uint32_t seed) {
  check_attention_forward(AttnCase{B, T, NH, NH, C / NH}, seed);
}

// Backward against finite differences of the reference over `samples` qkv elements (all when 0).
// dqkv starts non-zero (the op adds), and the scratch buffer starts as NaN: any element read before
// it is written would poison the result.
void check_attention_backward(const AttnCase& a, size_t samples, uint32_t seed,
                              const char* what = "") {
  const auto qkv = random_floats(a.n_qkv(), seed, -1.5f, 1.5f);
  const auto dout = random_floats(a.n_out(), seed + 1);
  std::vector<float> out(a.n_out()), att(a.n_att());
  run_attention_forward(a, qkv, &out, &att);
  const auto dqkv0 = random_floats(a.n_qkv(), seed + 2);
  auto dqkv = dqkv0;
  std::vector<float> scratch(att.size(), kNaN);
  run_attention_backward(a, &dqkv, &scratch, dout, qkv, att);
  const std::vector<size_t> idx = samples ? sample_indices(a.n_qkv(), samples, seed + 3)
                                          : std::vector<size_t>{};
  std::vector<double> o;
  const auto g = fd_grad(
      [&](const std::vector<double>& v) { ref_attention(v, a, &o); return dot(o, dout); },
      to_double(qkv), idx);
  EXPECT_LT(rel_err(added(dqkv, dqkv0, idx), g), kBwdTol) << what << " T=" << a.T;
}

void check_attention_backward(int B, int T, int C, int NH, size_t samples, uint32_t seed) {
  check_attention_backward(AttnCase{B, T, NH, NH, C / NH}, samples, seed);
}

// A padding mask [B, T]: sequence b keeps its first len[b] keys.
std::vector<int32_t> padding_mask(int B, int T, const std::vector<int>& len) {
  std::vector<int32_t> m(static_cast<size_t>(B) * T, 0);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < len[b] && t < T; t++) m[static_cast<size_t>(b) * T + t] = 1;
  return m;
}

}  // namespace

TEST(CpuOps, AttentionForwardSmall) { check_attention_forward(2, 5, 8, 2, 40); }

TEST(CpuOps, AttentionForwardAcrossRowBlocks) {
  static_assert(cpu::kAttnBlock < 70, "the T=70 cases must span two row blocks");
  check_attention_forward(2, 70, 16, 2, 41);
  check_attention_forward(1, 2 * cpu::kAttnBlock + 2, 8, 2, 42);
  check_attention_forward(2, 1, 8, 2, 43);  // T = 1: a single key
  check_attention_forward(1, 64, 256, 4, 44);
}

TEST(CpuOps, AttentionBackwardSmall) {
  check_attention_backward(2, 5, 8, 2, 0, 50);  // every qkv element
  check_attention_backward(1, 2, 4, 1, 0, 51);
}

TEST(CpuOps, AttentionBackwardAcrossRowBlocks) {
  check_attention_backward(1, 70, 16, 2, 400, 60);
  check_attention_backward(2, 2 * cpu::kAttnBlock + 2, 8, 2, 300, 61);
}

// Grouped K/V heads: NH = 4 query heads over NKV = 2 (pairs) and NKV = 1 (multi-query).
TEST(CpuOps, AttentionGroupedKvForward) {
  for (int nkv : {2, 1}) {
    check_attention_forward(AttnCase{2, 5, 4, nkv, 4}, 140 + nkv, "gqa");
    check_attention_forward(AttnCase{2, 70, 4, nkv, 8}, 142 + nkv, "gqa");
    check_attention_forward(AttnCase{1, 2 * cpu::kAttnBlock + 3, 4, nkv, 4}, 144 + nkv, "gqa");
  }
}

TEST(CpuOps, AttentionGroupedKvBackward) {
  for (int nkv : {2, 1}) {
    check_attention_backward(AttnCase{2, 5, 4, nkv, 4}, 0, 150 + nkv, "gqa");  // every element
    check_attention_backward(AttnCase{2, 70, 4, nkv, 4}, 400, 152 + nkv, "gqa");
  }
}

// Bidirectional (BERT): every key valid for every query, except the padded ones. Sequence 0 is
// full, 1 padded inside the first row block, 2 padded across blocks (T = 70 > kAttnBlock), and 3
// fully masked (no valid key for any query: P = 0, out = 0, no gradient).
TEST(CpuOps, AttentionBidirectionalForward) {
  AttnCase a{2, 5, 2, 2, 4};
  a.causal = false;
  check_attention_forward(a, 160, "bidirectional, no mask");
  a.mask = padding_mask(2, 5, {5, 3});
  check_attention_forward(a, 161, "bidirectional, padded");
  AttnCase l{4, 70, 2, 2, 8};
  l.causal = false;
  l.mask = padding_mask(4, 70, {70, 20, 66, 0});
  check_attention_forward(l, 162, "bidirectional, padded across blocks");
  l.mask[5] = 0;  // a hole inside a sequence (not trailing padding)
  l.mask[70 + 2] = 0;
  check_attention_forward(l, 163, "bidirectional, holes");
  AttnCase g = l;  // with grouped K/V
  g.NH = 4;
  g.NKV = 1;
  check_attention_forward(g, 164, "bidirectional, gqa");
}

TEST(CpuOps, AttentionBidirectionalBackward) {
  AttnCase a{2, 5, 2, 2, 4};
  a.causal = false;
  check_attention_backward(a, 0, 170, "bidirectional, no mask");
  a.mask = padding_mask(2, 5, {5, 3});
  check_attention_backward(a, 0, 171, "bidirectional, padded");
  AttnCase l{4, 70, 2, 2, 4};
  l.causal = false;
  l.mask = padding_mask(4, 70, {70, 20, 66, 0});
  l.mask[5] = 0;
  check_attention_backward(l, 500, 172, "bidirectional, padded across blocks");
  AttnCase g{2, 70, 4, 2, 4};
  g.causal = false;
  g.mask = padding_mask(2, 70, {41, 70});
  check_attention_backward(g, 400, 173, "bidirectional, gqa");
}

// Causal with a key mask: left padding gives queries with no valid key at all.
TEST(CpuOps, AttentionCausalWithMask) {
  AttnCase a{2, 70, 4, 2, 4};
  a.mask = padding_mask(2, 70, {70, 70});
  for (int t = 0; t < 3; t++) a.mask[t] = 0;  // sequence 0: left padding, queries 0..2 see nothing
  for (int t = 50; t < 70; t++) a.mask[70 + t] = 0;  // sequence 1: right padding
  a.mask[70 + 10] = 0;
  check_attention_forward(a, 180, "causal + mask");
  check_attention_backward(a, 400, 181, "causal + mask");
  AttnCase s{1, 5, 2, 2, 4};
  s.mask = {0, 1, 0, 1, 1};
  check_attention_forward(s, 182, "causal + mask, small");
  check_attention_backward(s, 0, 183, "causal + mask, small");
}

// Dropout on the probabilities: the reference draws the same keep decisions (dropout_keep of the
// flat att index); with the mask fixed by the key the op is smooth, so finite differences apply.
TEST(CpuOps, AttentionDropoutForward) {
  AttnCase a{2, 70, 4, 2, 4};
  a.p = 0.25f;
  a.key = 0x1234567890abcdefull;
  check_attention_forward(a, 190, "causal + dropout");
  a.causal = false;
  a.mask = padding_mask(2, 70, {70, 33});
  check_attention_forward(a, 191, "bidirectional + mask + dropout");
  AttnCase s{2, 5, 2, 2, 4};
  s.p = 0.5f;
  s.key = 99;
  check_attention_forward(s, 192, "causal + dropout, small");
  // att holds the undropped P: the same as without dropout.
  const auto qkv = random_floats(s.n_qkv(), 193);
  std::vector<float> out(s.n_out()), att(s.n_att()), out0(s.n_out()), att0(s.n_att());
  run_attention_forward(s, qkv, &out, &att);
  AttnCase s0 = s;
  s0.p = 0.0f;
  run_attention_forward(s0, qkv, &out0, &att0);
  EXPECT_EQ(0, std::memcmp(att.data(), att0.data(), att.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(out.data(), out0.data(), out.size() * sizeof(float)));
}

TEST(CpuOps, AttentionDropoutBackward) {
  AttnCase s{2, 5, 2, 2, 4};
  s.p = 0.5f;
  s.key = 99;
  check_attention_backward(s, 0, 200, "causal + dropout, small");
  AttnCase a{2, 70, 4, 2, 4};
  a.p = 0.25f;
  a.key = 0xfeedfacecafebeefull;
  check_attention_backward(a, 400, 201, "causal + gqa + dropout");
  a.causal = false;
  a.mask = padding_mask(2, 70, {70, 33});
  check_attention_backward(a, 400, 202, "bidirectional + mask + gqa + dropout");
}

TEST(CpuOps, AttentionRejectsBadArguments) {
  AttnCase a{1, 3, 1, 1, 2};
  const auto qkv = random_floats(a.n_qkv(), 205);
  std::vector<float> out(a.n_out()), att(a.n_att());
  for (float p : {1.0f, -0.1f, kNaN}) {
    a.p = p;
    EXPECT_THROW(run_attention_forward(a, qkv, &out, &att), Error) << p;
  }
  // And query heads that do not divide into the kv heads.
  AttnCase g{1, 3, 3, 2, 2};
  const auto qkv3 = random_floats(g.n_qkv(), 206);
  std::vector<float> out3(g.n_out()), att3(g.n_att()), dqkv3(g.n_qkv()), scratch3(g.n_att());
  EXPECT_THROW(run_attention_forward(g, qkv3, &out3, &att3), Error);
  EXPECT_THROW(run_attention_backward(g, &dqkv3, &scratch3, out3, qkv3, att3), Error);
}

// The GPT-2 path (NKV == NH, causal, no mask, no dropout) gives the original implementation's
// results bit for bit: out, att and dqkv, at sizes inside one row block, across blocks, and with
// enough (b, h) pairs for the OpenMP path.
TEST(CpuOps, AttentionFastPathBitwiseAsBefore) {
  struct Shape { int B, T, C, NH; };
  for (const Shape s : {Shape{2, 5, 8, 2}, Shape{2, 70, 16, 2},
                        Shape{1, 2 * cpu::kAttnBlock + 2, 8, 2},
                        Shape{4, 200, 64, 4}, Shape{1, 64, 256, 4}, Shape{1, 100, 16, 1}}) {
    const AttnCase a{s.B, s.T, s.NH, s.NH, s.C / s.NH};
    const auto qkv = random_floats(a.n_qkv(), 210 + s.T, -2.0f, 2.0f);
    const auto dout = random_floats(a.n_out(), 211 + s.T);
    const auto dqkv0 = random_floats(a.n_qkv(), 212 + s.T);
    std::vector<float> out(a.n_out()), att(a.n_att()), out_old(a.n_out()), att_old(a.n_att());
    run_attention_forward(a, qkv, &out, &att);
    legacy::attention_forward(out_old.data(), att_old.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    EXPECT_EQ(0, std::memcmp(out.data(), out_old.data(), out.size() * sizeof(float))) << s.T;
    EXPECT_EQ(0, std::memcmp(att.data(), att_old.data(), att.size() * sizeof(float))) << s.T;
    auto dqkv = dqkv0, dqkv_old = dqkv0;
    std::vector<float> scratch(a.n_att()), scratch_old(a.n_att());
    run_attention_backward(a, &dqkv, &scratch, dout, qkv, att);
    legacy::attention_backward(dqkv_old.data(), scratch_old.data(), dout.data(), qkv.data(),
                               att_old.data(), s.B, s.T, s.C, s.NH);
    EXPECT_EQ(0, std::memcmp(dqkv.data(), dqkv_old.data(), dqkv.size() * sizeof(float))) << s.T;
  }
}

// GQA backward: the query heads of a group accumulate into the same dK/dV. Across thread counts
// (OpenBLAS held to one thread in both runs, so that only the OpenMP split differs) the results
// are the same bits, for every masking / dropout mode.
TEST(CpuOps, AttentionSameResultsForOneAndTwoThreads) {
  const int saved_omp = omp_get_max_threads(), saved_blas = openblas_get_num_threads();
  openblas_set_num_threads(1);
  for (int mode = 0; mode < 4; mode++) {
    AttnCase a{3, 150, 8, 2, 16};
    a.causal = mode % 2 == 0;
    if (mode >= 2) {
      a.mask = padding_mask(3, 150, {150, 90, 7});
      a.p = 0.1f;
      a.key = 77;
    }
    const auto qkv = random_floats(a.n_qkv(), 220);
    const auto dout = random_floats(a.n_out(), 221);
    std::vector<std::vector<float>> res[2];
    for (int nt = 1; nt <= 2; nt++) {
      omp_set_num_threads(nt);
      std::vector<float> out(a.n_out()), att(a.n_att()), scratch(a.n_att());
      auto dqkv = random_floats(a.n_qkv(), 222);
      run_attention_forward(a, qkv, &out, &att);
      run_attention_backward(a, &dqkv, &scratch, dout, qkv, att);
      res[nt - 1] = {out, att, dqkv};
    }
    for (int k = 0; k < 3; k++)
      EXPECT_EQ(0, std::memcmp(res[0][k].data(), res[1][k].data(), res[0][k].size() * sizeof(float)))
          << "mode " << mode << " buffer " << k;
  }
  omp_set_num_threads(saved_omp);
  openblas_set_num_threads(saved_blas);
}

// ---- GELU and residual ---------------------------------------------------------------------------

namespace {
std::vector<float> gelu_inputs(uint32_t seed) {
  auto x = random_floats(200, seed, -6.0f, 6.0f);
  for (float v : {0.0f, 1e-6f, -1e-6f, -10.0f, -12.0f, -30.0f, 10.0f, 30.0f}) x.push_back(v);
  return x;
}
}  // namespace

TEST(CpuOps, GeluForward) {
  const auto x = gelu_inputs(70);
  std::vector<float> out(x.size(), kNaN);
  ops().gelu_forward(out.data(), x.data(), x.size());
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); i++) ref[i] = ref_gelu(x[i]);
  EXPECT_LT(rel_err(out, ref), kFwdTol);
  for (size_t i = 0; i < x.size(); i++)  // elementwise too, away from the zero crossing
    if (std::fabs(ref[i]) > 1e-3) {
      EXPECT_NEAR(out[i], ref[i], 2e-6 * std::fabs(ref[i])) << x[i];
    }
}

TEST(CpuOps, GeluBackward) {
  const auto x = gelu_inputs(71);
  const auto dout = random_floats(x.size(), 72);
  const auto dx0 = random_floats(x.size(), 73);
  auto dx = dx0;
  ops().gelu_backward(dx.data(), x.data(), dout.data(), x.size());
  const auto g = fd_grad(
      [&](const std::vector<double>& v) {
        double s = 0.0;
        for (size_t i = 0; i < v.size(); i++) s += ref_gelu(v[i]) * dout[i];
        return s;
      },
      to_double(x), {});
  EXPECT_LT(rel_err(added(dx, dx0), g), kBwdTol);
}

TEST(CpuOps, ResidualForward) {
  const auto a = random_floats(1001, 80), b = random_floats(1001, 81);
  std::vector<float> out(a.size(), kNaN);
  ops().residual_forward(out.data(), a.data(), b.data(), a.size());
  for (size_t i = 0; i < a.size(); i++) ASSERT_EQ(out[i], a[i] + b[i]);
  auto inplace = a;  // out may alias an input
  ops().residual_forward(inplace.data(), inplace.data(), b.data(), a.size());
  EXPECT_EQ(0, std::memcmp(inplace.data(), out.data(), out.size() * sizeof(float)));
}

// ---- exact GELU, SwiGLU, tanh --------------------------------------------------------------------

namespace {
double ref_gelu_erf(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

// Σ_i f(x_i) dout_i: the scalar loss of an elementwise op.
template <typename F>
double elementwise_loss(F f, const std::vector<double>& x, const std::vector<float>& dout) {
  double s = 0.0;
  for (size_t i = 0; i < x.size(); i++) s += f(x[i]) * dout[i];
  return s;
}
}  // namespace

TEST(CpuOps, GeluErfForward) {
  const auto x = gelu_inputs(150);
  std::vector<float> out(x.size(), kNaN);
  ops().gelu_erf_forward(out.data(), x.data(), x.size(), nullptr);
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); i++) ref[i] = ref_gelu_erf(x[i]);
  EXPECT_LT(rel_err(out, ref), kFwdTol);
  for (size_t i = 0; i < x.size(); i++)  // elementwise, tails included (erfc, no cancellation)
    if (std::fabs(ref[i]) > 1e-30) {
      EXPECT_NEAR(out[i], ref[i], 2e-6 * std::fabs(ref[i])) << x[i];
    }
  // The OpenMP path gives the same values.
  const auto big = random_floats(100000, 151, -8.0f, 8.0f);
  std::vector<float> ob(big.size());
  ops().gelu_erf_forward(ob.data(), big.data(), big.size(), nullptr);
  for (size_t i = 0; i < big.size(); i += 997) {
    float one;
    ops().gelu_erf_forward(&one, &big[i], 1, nullptr);
    ASSERT_EQ(one, ob[i]);
  }
}

TEST(CpuOps, GeluErfBackward) {
  const auto x = gelu_inputs(152);
  const auto dout = random_floats(x.size(), 153);
  const auto dx0 = random_floats(x.size(), 154);
  auto dx = dx0;
  ops().gelu_erf_backward(dx.data(), x.data(), dout.data(), x.size());
  const auto g = fd_grad(
      [&](const std::vector<double>& v) { return elementwise_loss(ref_gelu_erf, v, dout); },
      to_double(x), {});
  EXPECT_LT(rel_err(added(dx, dx0), g), kBwdTol);
}

namespace {
// out[n, f] = silu(inp[n, f]) * inp[n, F + f]
std::vector<double> ref_swiglu(const std::vector<double>& inp, int N, int F) {
  std::vector<double> out(static_cast<size_t>(N) * F);
  for (int n = 0; n < N; n++)
    for (int f = 0; f < F; f++)
      out[n * F + f] = ref_silu(inp[n * 2 * F + f]) * inp[n * 2 * F + F + f];
  return out;
}
}  // namespace

TEST(CpuOps, SwiGLUForward) {
  for (int F : {5, 37, 1024}) {  // 40 x 1024: the OpenMP path
    const int N = 40;
    auto inp = random_floats(static_cast<size_t>(N) * 2 * F, 155, -6.0f, 6.0f);
    inp[0] = -30.0f;  // far tails of the gate
    inp[1] = 30.0f;
    inp[2] = 0.0f;
    std::vector<float> out(static_cast<size_t>(N) * F, kNaN);
    ops().swiglu_forward(out.data(), inp.data(), N, F, nullptr);
    const auto ref = ref_swiglu(to_double(inp), N, F);
    EXPECT_LT(rel_err(out, ref), kFwdTol) << F;
    for (size_t i = 0; i < out.size(); i++)
      if (std::fabs(ref[i]) > 1e-12) {
        ASSERT_NEAR(out[i], ref[i], 2e-6 * std::fabs(ref[i])) << F << " @" << i;
      }
  }
}

TEST(CpuOps, SwiGLUBackward) {
  for (int F : {5, 37}) {
    const int N = 6;
    auto inp = random_floats(static_cast<size_t>(N) * 2 * F, 156, -6.0f, 6.0f);
    inp[0] = -12.0f;
    inp[1] = 12.0f;
    const auto dout = random_floats(static_cast<size_t>(N) * F, 157);
    const auto dx0 = random_floats(inp.size(), 158);
    auto dx = dx0;
    ops().swiglu_backward(dx.data(), inp.data(), dout.data(), N, F);
    const auto g = fd_grad(
        [&](const std::vector<double>& v) { return dot(ref_swiglu(v, N, F), dout); },
        to_double(inp), {});
    EXPECT_LT(rel_err(added(dx, dx0), g), kBwdTol) << F;
  }
}

TEST(CpuOps, TanhForward) {
  auto x = random_floats(300, 159, -5.0f, 5.0f);
  for (float v : {0.0f, 1e-7f, -1e-6f, 20.0f, -20.0f}) x.push_back(v);
  std::vector<float> out(x.size(), kNaN);
  ops().tanh_forward(out.data(), x.data(), x.size());
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); i++) ref[i] = std::tanh(static_cast<double>(x[i]));
  EXPECT_LT(rel_err(out, ref), kFwdTol);
  for (size_t i = 0; i < x.size(); i++)  // elementwise too, small |x| included
    EXPECT_NEAR(out[i], ref[i], 2e-7 * std::fabs(ref[i]) + 1e-30) << x[i];
}

// The backward takes the forward's output: dinp += dout (1 - out²).
TEST(CpuOps, TanhBackward) {
  const auto x = random_floats(300, 160, -4.0f, 4.0f);
  std::vector<float> out(x.size());
  ops().tanh_forward(out.data(), x.data(), x.size());
  const auto dout = random_floats(x.size(), 161);
  const auto dx0 = random_floats(x.size(), 162);
  auto dx = dx0;
  ops().tanh_backward(dx.data(), out.data(), dout.data(), x.size());
  const auto g = fd_grad(
      [&](const std::vector<double>& v) {
        return elementwise_loss([](double u) { return std::tanh(u); }, v, dout);
      },
      to_double(x), {});
  EXPECT_LT(rel_err(added(dx, dx0), g), kBwdTol);
}

// ---- dropout -------------------------------------------------------------------------------------

// The vectorisable keep decision of the CPU backend is dropout_keep's, bit for bit.
TEST(CpuOps, DropoutKeepBitsMatchDropoutKeep) {
  const float ps[] = {0.0f, 1e-7f, 0.1f, 0.25f, 0.5f, 1.0f / 3.0f, 0.9f, 0.99999994f,
                      0.5f + 1.0f / 16777216.0f, 0.5f - 1.0f / 33554432.0f};
  const std::vector<uint64_t> keys = {0, 1, 0xdeadbeefcafef00dull,
                                      dropout_key(7, 3, 1, 0, 2, kDropAttnProbs)};
  for (uint64_t key : keys)
    for (float p : ps) {
      const uint64_t thr = cpu::dropout_threshold(p);
      for (uint64_t i = 0; i < 200000; i++)
        ASSERT_EQ(cpu::dropout_keep_bits(key, i, thr) != 0, dropout_keep(key, i, p))
            << "key " << key << " p " << p << " i " << i;
      for (uint64_t i = (uint64_t{1} << 40) - 100; i < (uint64_t{1} << 40) + 100; i++)
        ASSERT_EQ(cpu::dropout_keep_bits(key, i, thr) != 0, dropout_keep(key, i, p));
    }
  // Every threshold boundary, through the hash value directly: u = m 2^-24 >= p  <=>  m >= thr.
  for (float p : ps) {
    const uint64_t thr = cpu::dropout_threshold(p);
    if (thr > 0) {
      EXPECT_LT(static_cast<float>(thr - 1) * (1.0f / 16777216.0f), p) << p;
    }
    EXPECT_GE(static_cast<float>(thr) * (1.0f / 16777216.0f), p) << p;
  }
}

TEST(CpuOps, DropoutForward) {
  const size_t n = 100003;  // the OpenMP path, and not a multiple of the vector width
  const auto x = random_floats(n, 163);
  for (float p : {0.1f, 0.5f}) {
    const uint64_t key = 0xabcdef12345ull + static_cast<uint64_t>(p * 100);
    std::vector<float> out(n, kNaN);
    ops().dropout_forward(out.data(), x.data(), n, p, key);
    std::vector<double> ref(n);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
      const bool keep = dropout_keep(key, i, p);
      kept += keep;
      ref[i] = keep ? x[i] / (1.0 - p) : 0.0;
    }
    EXPECT_LT(rel_err(out, ref), kFwdTol) << p;
    for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i] == 0.0f, ref[i] == 0.0) << i;
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01) << p;
    auto inplace = x;  // in place gives the same bits
    ops().dropout_forward(inplace.data(), inplace.data(), n, p, key);
    EXPECT_EQ(0, std::memcmp(inplace.data(), out.data(), n * sizeof(float)));
  }
  std::vector<float> out(n, kNaN);  // p == 0: a copy
  ops().dropout_forward(out.data(), x.data(), n, 0.0f, 5);
  EXPECT_EQ(0, std::memcmp(out.data(), x.data(), n * sizeof(float)));
}

TEST(CpuOps, DropoutBackward) {
  const size_t n = 1000;
  const auto x = random_floats(n, 164), dout = random_floats(n, 165);
  const auto dx0 = random_floats(n, 166);
  for (float p : {0.0f, 0.3f}) {
    const uint64_t key = 4242;
    auto dx = dx0;
    ops().dropout_backward(dx.data(), dout.data(), n, p, key);
    const auto g = fd_grad(
        [&](const std::vector<double>& v) {
          double s = 0.0;
          for (size_t i = 0; i < n; i++)
            s += (dropout_keep(key, i, p) ? v[i] / (1.0 - p) : 0.0) * dout[i];
          return s;
        },
        to_double(x), {});
    EXPECT_LT(rel_err(added(dx, dx0), g), kBwdTol) << p;
  }
  // The large (OpenMP) path agrees with the forward's mask: dinp += dropout_forward(dout).
  const size_t nb = 100003;
  const auto db = random_floats(nb, 167), base = random_floats(nb, 168);
  std::vector<float> fwd(nb), got = base;
  ops().dropout_forward(fwd.data(), db.data(), nb, 0.2f, 11);
  ops().dropout_backward(got.data(), db.data(), nb, 0.2f, 11);
  for (size_t i = 0; i < nb; i++) ASSERT_EQ(got[i], base[i] + fwd[i]) << i;
}

TEST(CpuOps, DropoutRejectsProbabilityOutsideRange) {
  std::vector<float> x(4, 1.0f), y(4);
  for (float p : {1.0f, 1.5f, -0.01f, kNaN}) {
    EXPECT_THROW(ops().dropout_forward(y.data(), x.data(), x.size(), p, 1), Error) << p;
    EXPECT_THROW(ops().dropout_backward(y.data(), x.data(), x.size(), p, 1), Error) << p;
  }
}

// ---- first token ---------------------------------------------------------------------------------

TEST(CpuOps, FirstToken) {
  const int B = 3, T = 4, C = 5;
  const auto x = random_floats(B * T * C, 169);
  std::vector<float> out(B * C, kNaN);
  ops().first_token_forward(out.data(), x.data(), B, T, C);
  const auto ref = [&](const std::vector<double>& v) {
    std::vector<double> o(B * C);
    for (int b = 0; b < B; b++)
      for (int c = 0; c < C; c++) o[b * C + c] = v[b * T * C + c];
    return o;
  };
  EXPECT_LT(rel_err(out, ref(to_double(x))), kFwdTol);
  const auto dout = random_floats(B * C, 170), dx0 = random_floats(B * T * C, 171);
  auto dx = dx0;
  ops().first_token_backward(dx.data(), dout.data(), B, T, C);
  const auto g = fd_grad([&](const std::vector<double>& v) { return dot(ref(v), dout); },
                         to_double(x), {});
  EXPECT_LT(rel_err(added(dx, dx0), g), kBwdTol);
  for (int b = 0; b < B; b++)  // positions t > 0 are untouched
    for (int e = C; e < T * C; e++) ASSERT_EQ(dx[b * T * C + e], dx0[b * T * C + e]);
}

// ---- softmax + cross-entropy ---------------------------------------------------------------------

TEST(CpuOps, SoftmaxXentLoss) {
  struct Shape { int N, V; float spread; };
  for (const Shape s : {Shape{10, 11, 3.0f}, Shape{4, 4096, 5.0f}, Shape{6, 37, 40.0f}}) {
    auto z = random_floats(static_cast<size_t>(s.N) * s.V, 90, -s.spread, s.spread);
    for (int j = 0; j < s.V; j++) z[j] += 80.0f;  // large logits must not overflow
    const auto y = random_ints(s.N, 91, 0, s.V);
    const auto ref = ref_xent(to_double(z), y, s.N, s.V);
    std::vector<float> loss(s.N, kNaN);
    auto zc = z;
    ops().softmax_xent(zc.data(), loss.data(), y.data(), s.N, s.V, 0.0f);
    EXPECT_LT(rel_err(loss, ref), kFwdTol) << s.V;
    // grad_scale == 0 leaves the logits alone.
    EXPECT_EQ(0, std::memcmp(zc.data(), z.data(), z.size() * sizeof(float)));
    std::fill(loss.begin(), loss.end(), kNaN);
    ops().softmax_xent(zc.data(), loss.data(), y.data(), s.N, s.V, 0.5f);
    EXPECT_LT(rel_err(loss, ref), kFwdTol) << s.V;
  }
}

TEST(CpuOps, SoftmaxXentGradient) {
  const int N = 10, V = 11;
  const float gs = 1.0f / 3.0f;
  const auto z = random_floats(N * V, 92, -3.0f, 3.0f);
  const auto y = random_ints(N, 93, 0, V);
  auto grad = z;
  std::vector<float> loss(N);
  ops().softmax_xent(grad.data(), loss.data(), y.data(), N, V, gs);
  const auto g = fd_grad(
      [&](const std::vector<double>& v) {
        double s = 0.0;
        for (double l : ref_xent(v, y, N, V)) s += l;
        return gs * s;
      },
      to_double(z), {});
  EXPECT_LT(rel_err(grad, g), kBwdTol);
}

// Tensor parallelism: the vocabulary cut into shards [v0, v0 + Vn) of 37 (12, 13, 12 rows), the
// three passes with the shards' maxima and sums combined in between as the group does, give the
// whole cross-entropy's losses and, shard by shard, its gradient columns.
TEST(CpuOps, VocabXentOverShardsEqualsTheWholeOne) {
  const int N = 6, V = 37, ld = 40;
  const int cuts[] = {0, 12, 25, 37};
  const auto zw = random_floats(static_cast<size_t>(N) * V, 94, -4.0f, 4.0f);
  const auto y = random_ints(N, 95, 0, V);
  const float gs = 0.25f;
  auto whole = zw;
  std::vector<float> whole_loss(N);
  ops().softmax_xent(whole.data(), whole_loss.data(), y.data(), N, V, gs);
  std::vector<std::vector<float>> z(3, std::vector<float>(static_cast<size_t>(N) * ld, kNaN));
  for (int k = 0; k < 3; k++)
    for (int n = 0; n < N; n++)
      for (int j = cuts[k]; j < cuts[k + 1]; j++) z[k][n * ld + j - cuts[k]] = zw[n * V + j];
  std::vector<float> mx(N, -INFINITY), sums(2 * N, 0.0f);
  for (int k = 0; k < 3; k++) {  // the max over the group
    std::vector<float> m(N);
    ops().vocab_xent_max(m.data(), z[k].data(), ld, N, cuts[k + 1] - cuts[k]);
    for (int n = 0; n < N; n++) mx[n] = std::max(mx[n], m[n]);
  }
  for (int k = 0; k < 3; k++) {  // the sums over the group
    std::vector<float> s(2 * N);
    ops().vocab_xent_sums(s.data(), z[k].data(), ld, mx.data(), y.data(), cuts[k], N, cuts[k + 1] - cuts[k]);
    for (int i = 0; i < 2 * N; i++) sums[i] += s[i];
  }
  for (int k = 0; k < 3; k++) {
    std::vector<float> loss(N, kNaN);
    ops().vocab_xent_finish(z[k].data(), ld, loss.data(), mx.data(), sums.data(), y.data(), cuts[k], N,
                            cuts[k + 1] - cuts[k], gs);
    EXPECT_LT(rel_err(loss, to_double(whole_loss)), 1e-6) << "shard " << k;
    for (int n = 0; n < N; n++)
      for (int j = cuts[k]; j < cuts[k + 1]; j++)
        EXPECT_NEAR(z[k][n * ld + j - cuts[k]], whole[n * V + j], 1e-7) << "shard " << k << " row " << n << " logit " << j;
  }
}

// The vocabulary shards' lookups sum to the whole lookup (the positions added by one shard), and
// each shard's scatter-add is its rows of the whole one.
TEST(CpuOps, VocabEmbeddingShardsMakeTheWholeOne) {
  const int B = 2, T = 9, C = 24, V = 10;
  const int cuts[] = {0, 3, 10};
  const auto inp = random_ints(B * T, 96, 0, V);
  const auto wte = random_floats(static_cast<size_t>(V) * C, 97), wpe = random_floats(static_cast<size_t>(T) * C, 98);
  std::vector<float> whole(static_cast<size_t>(B) * T * C), sum(whole.size(), 0.0f);
  ops().embedding_forward(whole.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  const auto dout = random_floats(whole.size(), 99);
  std::vector<float> dwte(static_cast<size_t>(V) * C, 0.0f), dwpe(static_cast<size_t>(T) * C, 0.0f);
  ops().embedding_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
  for (int k = 0; k < 2; k++) {
    const int v0 = cuts[k], Vn = cuts[k + 1] - cuts[k];
    std::vector<float> part(whole.size(), kNaN);
    ops().vocab_embedding_forward(part.data(), inp.data(), wte.data() + static_cast<size_t>(v0) * C, v0, Vn,
                                  k == 0 ? wpe.data() : nullptr, B, T, C);
    for (size_t i = 0; i < sum.size(); i++) sum[i] += part[i];
    std::vector<float> g(static_cast<size_t>(Vn) * C, 0.0f), gp(dwpe.size(), 0.0f);
    ops().vocab_embedding_backward(g.data(), gp.data(), dout.data(), inp.data(), v0, Vn, B, T, C);
    EXPECT_TRUE(std::equal(g.begin(), g.end(), dwte.begin() + static_cast<size_t>(v0) * C)) << "shard " << k;
    EXPECT_EQ(gp, dwpe) << "every shard's positions gradient is the whole one";
  }
  EXPECT_EQ(sum, whole) << "one row and the positions per token: the same bits";
}

TEST(CpuOps, SoftmaxXentRejectsTargetOutsideVocabulary) {
  std::vector<float> z(2 * 5, 0.0f), loss(2);
  std::vector<int32_t> y = {1, 5};
  EXPECT_THROW(ops().softmax_xent(z.data(), loss.data(), y.data(), 2, 5, 1.0f), Error);
  y[1] = -1;
  EXPECT_THROW(ops().softmax_xent(z.data(), loss.data(), y.data(), 2, 5, 1.0f), Error);
}

// ---- optimizer and utilities ---------------------------------------------------------------------

TEST(CpuOps, AdamWHandComputedStep) {
  // Betas and inputs are powers of two (or short sums of them) so that float holds them exactly
  // and the hand arithmetic below is exact up to the final division and square root.
  // b1 = 0.875, b2 = 1 - 2^-10, eps 1e-8.
  // Element 0, t = 1, lr 0.1, wd 0.01: p 1, g 0.5, m = v = 0.
  //   m = 0.125·0.5 = 0.0625;  v = 2^-10·0.25 = 2^-12;  mhat = 0.0625/0.125 = 0.5;  vhat = 0.25
  //   p = 1 − 0.1·(0.5/(0.5 + 1e-8) + 0.01·1) = 0.899000002
  const float b1 = 0.875f, b2 = 1.0f - 1.0f / 1024;
  std::vector<float> p = {1.0f}, g = {0.5f}, m = {0.0f}, v = {0.0f};
  ops().adamw_update(p.data(), g.data(), m.data(), v.data(), 1, 0.1f, b1, b2, 1e-8f, 0.01f, 1);
  EXPECT_EQ(m[0], 0.0625f);
  EXPECT_EQ(v[0], 0.000244140625f);
  EXPECT_NEAR(p[0], 0.899000002, 1e-7);
  // t = 3, lr 0.01, no decay: p −2, g −0.125, m 2^-6, v 2^-12.
  //   m = 0.875·2^-6 − 0.125·0.125 = 0.013671875 − 0.015625 = −0.001953125
  //   v = (1 − 2^-10)·2^-12 + 2^-10·2^-6 = 0.000259160995483
  //   mhat = m/(1 − 0.875³) = −0.001953125/0.330078125 = −0.00591715976
  //   vhat = v/(1 − b2³) = 0.000259160995483/0.00292682740837 = 0.0885467297;  sqrt = 0.297568025
  //   p = −2 − 0.01·(−0.00591715976/(0.297568025 + 1e-8)) = −1.99980114935
  p = {-2.0f};
  g = {-0.125f};
  m = {0.015625f};
  v = {0.000244140625f};
  ops().adamw_update(p.data(), g.data(), m.data(), v.data(), 1, 0.01f, b1, b2, 1e-8f, 0.0f, 3);
  EXPECT_EQ(m[0], -0.001953125f);
  EXPECT_NEAR(v[0], 0.000259160995483, 1e-7 * 0.000259160995483);
  EXPECT_NEAR(p[0], -1.99980114935, 2e-7);
}

TEST(CpuOps, AdamWMatchesReferenceOverSteps) {
  const size_t n = 1000;
  auto p = random_floats(n, 100), m = std::vector<float>(n, 0.0f), v = m;
  std::vector<double> pd = to_double(p), md(n, 0.0), vd(n, 0.0);
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int t = 1; t <= 3; t++) {
    const auto g = random_floats(n, 100 + t, -0.1f, 0.1f);
    ops().adamw_update(p.data(), g.data(), m.data(), v.data(), n, static_cast<float>(lr),
                       static_cast<float>(b1), static_cast<float>(b2), static_cast<float>(eps),
                       static_cast<float>(wd), t);
    for (size_t i = 0; i < n; i++) {
      md[i] = b1 * md[i] + (1 - b1) * g[i];
      vd[i] = b2 * vd[i] + (1 - b2) * g[i] * g[i];
      const double mh = md[i] / (1 - std::pow(b1, t)), vh = vd[i] / (1 - std::pow(b2, t));
      pd[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * pd[i]);
    }
  }
  EXPECT_LT(rel_err(p, pd), kFwdTol);
  EXPECT_LT(rel_err(m, md), kFwdTol);
  EXPECT_LT(rel_err(v, vd), kFwdTol);
}

TEST(CpuOps, SumSquaresAndScale) {
  for (size_t n : {size_t{0}, size_t{7}, size_t{1000}, size_t{300001}}) {
    auto x = random_floats(n, 110, -3.0f, 3.0f);
    double ref = 0.0;
    for (float v : x) ref += static_cast<double>(v) * v;
    EXPECT_NEAR(ops().sum_squares(x.data(), n), ref, 1e-12 * (ref + 1.0)) << n;
    const auto x0 = x;
    ops().scale(x.data(), 0.37f, n);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(x[i], x0[i] * 0.37f);
  }
}

// ---- determinism -----------------------------------------------------------------------------------

namespace {

// One pass of every op on a mid-sized problem (large enough for the OpenMP paths); returns all
// buffers written.
std::vector<std::vector<float>> run_all_ops(bool with_attention) {
  const int B = 4, T = 256, C = 64, NH = 4, V = 300, N = B * T, OC = 3 * C;
  const auto inp = random_ints(N, 200, 0, V), tgt = random_ints(N, 201, 0, V);
  const auto wte = random_floats(V * C, 202), wpe = random_floats(T * C, 203);
  const auto lw = random_floats(C, 204), lb = random_floats(C, 205);
  const auto w = random_floats(OC * C, 206), bias = random_floats(OC, 207);
  std::vector<float> emb(N * C), ln(N * C), mean(N), rstd(N), qkv(N * OC), att_out(N * C),
      att(static_cast<size_t>(B) * NH * T * T), scratch(att.size()), gl(N * C), res(N * C);
  ops().embedding_forward(emb.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  ops().layernorm_forward(ln.data(), mean.data(), rstd.data(), emb.data(), lw.data(), lb.data(), N, C,
                          1e-5f, nullptr);
  ops().matmul_forward(qkv.data(), ln.data(), w.data(), bias.data(), N, C, OC, GemmPrecision::fp32);
  if (with_attention)
    ops().attention_forward(att_out.data(), att.data(), qkv.data(), nullptr, B, T, NH, NH, C / NH,
                            true, 0.0f, 0);
  else att_out = ln;
  ops().gelu_forward(gl.data(), att_out.data(), gl.size());
  ops().residual_forward(res.data(), gl.data(), emb.data(), res.size());
  // Logits: the residual stream against wte (tied output), then softmax + xent.
  std::vector<float> logits(static_cast<size_t>(N) * V), losses(N);
  ops().matmul_forward(logits.data(), res.data(), wte.data(), nullptr, N, C, V, GemmPrecision::fp32);
  ops().softmax_xent(logits.data(), losses.data(), tgt.data(), N, V, 1.0f / N);
  std::vector<float> dres(N * C), dwte(V * C), dwpe(T * C), dgl(N * C), datt(N * C),
      dqkv(N * OC), dln(N * C), dw(OC * C), db(OC), dlw(C), dlb(C);
  ops().matmul_backward(dres.data(), dwte.data(), nullptr, logits.data(), res.data(), wte.data(), N,
                        C, V, GemmPrecision::fp32);
  ops().gelu_backward(datt.data(), att_out.data(), dres.data(), datt.size());
  if (with_attention)
    ops().attention_backward(dqkv.data(), scratch.data(), datt.data(), qkv.data(), att.data(),
                             nullptr, B, T, NH, NH, C / NH, true, 0.0f, 0);
  else dqkv.assign(dqkv.size(), 0.25f);
  ops().matmul_backward(dln.data(), dw.data(), db.data(), dqkv.data(), ln.data(), w.data(), N, C, OC, GemmPrecision::fp32);
  ops().layernorm_backward(dres.data(), dlw.data(), dlb.data(), dln.data(), emb.data(), lw.data(),
                           mean.data(), rstd.data(), N, C);
  ops().embedding_backward(dwte.data(), dwpe.data(), dres.data(), inp.data(), B, T, C);
  auto p = wte;
  std::vector<float> m(p.size()), v(p.size());
  ops().adamw_update(p.data(), dwte.data(), m.data(), v.data(), p.size(), 1e-3f, 0.9f, 0.95f, 1e-8f,
                     0.1f, 1);
  const double ss = ops().sum_squares(dwte.data(), dwte.size());
  std::vector<float> ssv(2);
  std::memcpy(ssv.data(), &ss, sizeof ss);
  return {emb, ln, mean, rstd, qkv, att_out, att, gl, res, logits, losses, dres, dwte, dwpe,
          datt, dqkv, dln, dw, db, dlw, dlb, p, m, v, ssv};
}

void expect_bitwise_equal(const std::vector<std::vector<float>>& a,
                          const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); k++) {
    ASSERT_EQ(a[k].size(), b[k].size()) << "buffer " << k;
    EXPECT_EQ(0, std::memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(float)))
        << "buffer " << k << " differs";
  }
}

}  // namespace

TEST(CpuOps, DeterministicRunToRun) {
  const auto a = run_all_ops(true);
  const auto b = run_all_ops(true);
  expect_bitwise_equal(a, b);
  for (const auto& buf : a)
    for (float x : buf) ASSERT_FALSE(std::isnan(x));
}

TEST(CpuOps, SameResultsForOneAndTwoThreads) {
  // The loops split work in ways that do not change any summation order; attention is included
  // only when OpenBLAS runs one thread (attention holds OpenBLAS to one thread while OpenMP runs
  // several, which could otherwise change its GEMMs' blocking).
  const bool attn = openblas_get_num_threads() == 1;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto a = run_all_ops(attn);
  omp_set_num_threads(2);
  const auto b = run_all_ops(attn);
  omp_set_num_threads(saved);
  expect_bitwise_equal(a, b);
}

namespace {

// One pass of the LLaMA / BERT ops (no position embedding + token types, RMSNorm, RoPE on a
// grouped-K/V qkv, bidirectional masked attention with dropout, SwiGLU, exact GELU, dropout,
// first token + tanh) forward and backward, on sizes that take the OpenMP paths; returns all
// buffers written.
std::vector<std::vector<float>> run_new_ops() {
  const int B = 2, T = 320, NH = 4, NKV = 2, hs = 32, C = NH * hs, W = (NH + 2 * NKV) * hs;
  const int N = B * T, V = 50, F = 256;
  const auto tok = random_ints(N, 230, 0, V), types = random_ints(N, 231, 0, 2);
  auto mask = std::vector<int32_t>(N, 1);
  for (int t = 250; t < T; t++) mask[T + t] = 0;
  const auto wte = random_floats(V * C, 232), wtt = random_floats(2 * C, 233);
  const auto nw = random_floats(C, 234);
  const auto wqkv = random_floats(static_cast<size_t>(W) * C, 235, -0.2f, 0.2f);
  const auto wup = random_floats(static_cast<size_t>(2 * F) * C, 236, -0.2f, 0.2f);
  std::vector<float> emb(N * C), nrm(N * C), rstd(N), qkv(static_cast<size_t>(N) * W),
      ao(N * C), att(static_cast<size_t>(B) * NH * T * T), scratch(att.size()), up(N * 2 * F),
      sw(N * F), ge(N * F), cls(B * C), pool(B * C);
  ops().embedding_forward(emb.data(), tok.data(), wte.data(), nullptr, B, T, C);
  ops().embedding_add_forward(emb.data(), types.data(), wtt.data(), N, C);
  ops().rmsnorm_forward(nrm.data(), rstd.data(), emb.data(), nw.data(), N, C, 1e-6f, nullptr);
  ops().matmul_forward(qkv.data(), nrm.data(), wqkv.data(), nullptr, N, C, W, GemmPrecision::fp32);
  ops().rope_forward(qkv.data(), B, T, NH, hs, W, 10000.0f);
  ops().rope_forward(qkv.data() + NH * hs, B, T, NKV, hs, W, 10000.0f);
  ops().attention_forward(ao.data(), att.data(), qkv.data(), mask.data(), B, T, NH, NKV, hs, false,
                          0.1f, 31);
  ops().dropout_forward(ao.data(), ao.data(), ao.size(), 0.1f, 32);
  ops().matmul_forward(up.data(), ao.data(), wup.data(), nullptr, N, C, 2 * F, GemmPrecision::fp32);
  ops().swiglu_forward(sw.data(), up.data(), N, F, nullptr);
  ops().gelu_erf_forward(ge.data(), sw.data(), ge.size(), nullptr);
  ops().first_token_forward(cls.data(), emb.data(), B, T, C);
  ops().tanh_forward(pool.data(), cls.data(), pool.size());

  const auto dge = random_floats(ge.size(), 237), dpool = random_floats(pool.size(), 238);
  std::vector<float> dsw(N * F), dup(N * 2 * F), dao(N * C), dwup(wup.size()), dqkv(qkv.size()),
      dnrm(N * C), dwqkv(wqkv.size()), demb(N * C), dnw(C), dwte(wte.size()), dwtt(wtt.size()),
      dcls(B * C);
  ops().gelu_erf_backward(dsw.data(), sw.data(), dge.data(), dsw.size());
  ops().swiglu_backward(dup.data(), up.data(), dsw.data(), N, F);
  std::vector<float> dao_drop(N * C);
  ops().matmul_backward(dao_drop.data(), dwup.data(), nullptr, dup.data(), ao.data(), wup.data(), N,
                        C, 2 * F, GemmPrecision::fp32);
  ops().dropout_backward(dao.data(), dao_drop.data(), dao.size(), 0.1f, 32);
  ops().attention_backward(dqkv.data(), scratch.data(), dao.data(), qkv.data(), att.data(),
                           mask.data(), B, T, NH, NKV, hs, false, 0.1f, 31);
  ops().rope_backward(dqkv.data(), B, T, NH, hs, W, 10000.0f);
  ops().rope_backward(dqkv.data() + NH * hs, B, T, NKV, hs, W, 10000.0f);
  ops().matmul_backward(dnrm.data(), dwqkv.data(), nullptr, dqkv.data(), nrm.data(), wqkv.data(), N,
                        C, W, GemmPrecision::fp32);
  ops().rmsnorm_backward(demb.data(), dnw.data(), dnrm.data(), emb.data(), nw.data(), rstd.data(), N,
                         C);
  ops().tanh_backward(dcls.data(), pool.data(), dpool.data(), dcls.size());
  ops().first_token_backward(demb.data(), dcls.data(), B, T, C);
  ops().embedding_add_backward(dwtt.data(), demb.data(), types.data(), N, C);
  ops().embedding_backward(dwte.data(), nullptr, demb.data(), tok.data(), B, T, C);
  return {emb, nrm, rstd, qkv, ao, att, up, sw, ge, cls, pool, dsw, dup, dao, dwup, dqkv,
          dnrm, dwqkv, demb, dnw, dwte, dwtt, dcls};
}

}  // namespace

TEST(CpuOps, NewOpsDeterministicAcrossThreadCounts) {
  // OpenBLAS held to one thread in every run, so that only the OpenMP split differs.
  const int saved_omp = omp_get_max_threads(), saved_blas = openblas_get_num_threads();
  openblas_set_num_threads(1);
  omp_set_num_threads(2);
  const auto a = run_new_ops();
  const auto b = run_new_ops();
  omp_set_num_threads(1);
  const auto c = run_new_ops();
  omp_set_num_threads(saved_omp);
  openblas_set_num_threads(saved_blas);
  expect_bitwise_equal(a, b);
  expect_bitwise_equal(a, c);
  for (const auto& buf : a)
    for (float x : buf) ASSERT_FALSE(std::isnan(x));
}
