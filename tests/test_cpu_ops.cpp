// CPU backend ops (src/backend/cpu/) against plain double-precision references written here:
// forward outputs by norm-wise relative error (< 1e-5), backward gradients against central finite
// differences of the double reference forward (< 1e-4). Every backward starts its gradient
// buffers from non-zero values to check the "+=" convention of backend/ops.h.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/ops.h"
#include "grad_check.h"
#include "runtime/error.h"

extern "C" int openblas_get_num_threads(void);

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

std::vector<double> ref_embedding(const std::vector<int32_t>& inp, const std::vector<double>& wte,
                                  const std::vector<double>& wpe, int B, int T, int C) {
  std::vector<double> out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++)
        out[(b * T + t) * C + c] = wte[inp[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

void ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                   const std::vector<double>& bias, int N, int C, std::vector<double>* out,
                   std::vector<double>* mean = nullptr, std::vector<double>* rstd = nullptr) {
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
    const double r = 1.0 / std::sqrt(v + 1e-5);
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

// Plain causal attention, one query row at a time.
void ref_attention(const std::vector<double>& qkv, int B, int T, int C, int NH,
                   std::vector<double>* out, std::vector<double>* att = nullptr) {
  const int hs = C / NH;
  const double sc = 1.0 / std::sqrt(static_cast<double>(hs));
  out->assign(static_cast<size_t>(B) * T * C, 0.0);
  if (att) att->assign(static_cast<size_t>(B) * NH * T * T, 0.0);
  std::vector<double> p(T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const double* q = &qkv[(static_cast<size_t>(b) * T + i) * 3 * C + h * hs];
        double mx = -INFINITY;
        for (int j = 0; j <= i; j++) {
          const double* k = &qkv[(static_cast<size_t>(b) * T + j) * 3 * C + C + h * hs];
          double s = 0.0;
          for (int d = 0; d < hs; d++) s += q[d] * k[d];
          p[j] = s * sc;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; j++) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= i; j++) p[j] /= sum;
        double* o = &(*out)[(static_cast<size_t>(b) * T + i) * C + h * hs];
        for (int j = 0; j <= i; j++) {
          const double* v = &qkv[(static_cast<size_t>(b) * T + j) * 3 * C + 2 * C + h * hs];
          for (int d = 0; d < hs; d++) o[d] += p[j] * v[d];
          if (att) (*att)[((static_cast<size_t>(b) * NH + h) * T + i) * T + j] = p[j];
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
  EXPECT_STREQ(o.name, "cpu");
  const void* ptrs[] = {reinterpret_cast<const void*>(o.alloc),
                        reinterpret_cast<const void*>(o.free),
                        reinterpret_cast<const void*>(o.zero),
                        reinterpret_cast<const void*>(o.copy_to_device),
                        reinterpret_cast<const void*>(o.copy_to_host),
                        reinterpret_cast<const void*>(o.embedding_forward),
                        reinterpret_cast<const void*>(o.embedding_backward),
                        reinterpret_cast<const void*>(o.layernorm_forward),
                        reinterpret_cast<const void*>(o.layernorm_backward),
                        reinterpret_cast<const void*>(o.matmul_forward),
                        reinterpret_cast<const void*>(o.matmul_backward),
                        reinterpret_cast<const void*>(o.attention_forward),
                        reinterpret_cast<const void*>(o.attention_backward),
                        reinterpret_cast<const void*>(o.gelu_forward),
                        reinterpret_cast<const void*>(o.gelu_backward),
                        reinterpret_cast<const void*>(o.residual_forward),
                        reinterpret_cast<const void*>(o.softmax_xent),
                        reinterpret_cast<const void*>(o.adamw_update),
                        reinterpret_cast<const void*>(o.sum_squares),
                        reinterpret_cast<const void*>(o.scale)};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) EXPECT_NE(ptrs[i], nullptr) << i;
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

// ---- layernorm -----------------------------------------------------------------------------------

TEST(CpuOps, LayerNormForward) {
  for (int C : {8, 37, 256}) {
    const int N = 10;
    auto x = random_floats(N * C, 12, -2.0f, 2.0f);
    for (int c = 0; c < C; c++) x[c] += 100.0f;  // a row with a large mean (variance by 2 passes)
    const auto w = random_floats(C, 13), b = random_floats(C, 14);
    std::vector<float> out(N * C, kNaN), mean(N, kNaN), rstd(N, kNaN);
    ops().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
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
    ops().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
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

// ---- matmul --------------------------------------------------------------------------------------

TEST(CpuOps, MatmulForward) {
  struct Shape { int N, C, OC; };
  for (const Shape s : {Shape{10, 8, 12}, Shape{37, 20, 33}, Shape{64, 96, 48}}) {
    const auto x = random_floats(s.N * s.C, 22), w = random_floats(s.OC * s.C, 23);
    const auto bias = random_floats(s.OC, 24);
    const auto xd = to_double(x), wd = to_double(w), bd = to_double(bias);
    std::vector<float> out(s.N * s.OC, kNaN);
    ops().matmul_forward(out.data(), x.data(), w.data(), bias.data(), s.N, s.C, s.OC);
    EXPECT_LT(rel_err(out, ref_matmul(xd, wd, &bd, s.N, s.C, s.OC)), kFwdTol);
    std::fill(out.begin(), out.end(), kNaN);  // without bias the old content must not leak in
    ops().matmul_forward(out.data(), x.data(), w.data(), nullptr, s.N, s.C, s.OC);
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
  ops().matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
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
  ops().matmul_backward(nullptr, dw2.data(), nullptr, dout.data(), x.data(), w.data(), N, C, OC);
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
  ops().matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
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

// ---- attention -----------------------------------------------------------------------------------

namespace {

void check_attention_forward(int B, int T, int C, int NH, uint32_t seed) {
  const auto qkv = random_floats(static_cast<size_t>(B) * T * 3 * C, seed, -1.5f, 1.5f);
  std::vector<float> out(static_cast<size_t>(B) * T * C, kNaN);
  std::vector<float> att(static_cast<size_t>(B) * NH * T * T, kNaN);  // stale content must go
  ops().attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  std::vector<double> ro, ra;
  ref_attention(to_double(qkv), B, T, C, NH, &ro, &ra);
  EXPECT_LT(rel_err(out, ro), kFwdTol) << "T=" << T;
  EXPECT_LT(rel_err(att, ra), kFwdTol) << "T=" << T;
  for (int bh = 0; bh < B * NH; bh++)
    for (int i = 0; i < T; i++)
      for (int j = i + 1; j < T; j++)
        ASSERT_EQ(att[(static_cast<size_t>(bh) * T + i) * T + j], 0.0f) << bh << " " << i << " " << j;
}

// Backward against finite differences over `samples` qkv elements (all when 0). The scratch
// buffer starts as NaN: any element read before it is written would poison the result.
void check_attention_backward(int B, int T, int C, int NH, size_t samples, uint32_t seed) {
  const size_t n_qkv = static_cast<size_t>(B) * T * 3 * C;
  const auto qkv = random_floats(n_qkv, seed, -1.5f, 1.5f);
  const auto dout = random_floats(static_cast<size_t>(B) * T * C, seed + 1);
  std::vector<float> out(static_cast<size_t>(B) * T * C);
  std::vector<float> att(static_cast<size_t>(B) * NH * T * T);
  ops().attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const auto dqkv0 = random_floats(n_qkv, seed + 2);
  auto dqkv = dqkv0;
  std::vector<float> scratch(att.size(), kNaN);
  ops().attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T,
                           C, NH);
  const std::vector<size_t> idx = samples ? sample_indices(n_qkv, samples, seed + 3)
                                          : std::vector<size_t>{};
  std::vector<double> o;
  const auto g = fd_grad(
      [&](const std::vector<double>& v) { ref_attention(v, B, T, C, NH, &o); return dot(o, dout); },
      to_double(qkv), idx);
  EXPECT_LT(rel_err(added(dqkv, dqkv0, idx), g), kBwdTol) << "T=" << T;
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
  ops().layernorm_forward(ln.data(), mean.data(), rstd.data(), emb.data(), lw.data(), lb.data(), N, C);
  ops().matmul_forward(qkv.data(), ln.data(), w.data(), bias.data(), N, C, OC);
  if (with_attention) ops().attention_forward(att_out.data(), att.data(), qkv.data(), B, T, C, NH);
  else att_out = ln;
  ops().gelu_forward(gl.data(), att_out.data(), gl.size());
  ops().residual_forward(res.data(), gl.data(), emb.data(), res.size());
  // Logits: the residual stream against wte (tied output), then softmax + xent.
  std::vector<float> logits(static_cast<size_t>(N) * V), losses(N);
  ops().matmul_forward(logits.data(), res.data(), wte.data(), nullptr, N, C, V);
  ops().softmax_xent(logits.data(), losses.data(), tgt.data(), N, V, 1.0f / N);
  std::vector<float> dres(N * C), dwte(V * C), dwpe(T * C), dgl(N * C), datt(N * C),
      dqkv(N * OC), dln(N * C), dw(OC * C), db(OC), dlw(C), dlb(C);
  ops().matmul_backward(dres.data(), dwte.data(), nullptr, logits.data(), res.data(), wte.data(), N,
                        C, V);
  ops().gelu_backward(datt.data(), att_out.data(), dres.data(), datt.size());
  if (with_attention)
    ops().attention_backward(dqkv.data(), scratch.data(), datt.data(), qkv.data(), att.data(), B,
                             T, C, NH);
  else dqkv.assign(dqkv.size(), 0.25f);
  ops().matmul_backward(dln.data(), dw.data(), db.data(), dqkv.data(), ln.data(), w.data(), N, C, OC);
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
