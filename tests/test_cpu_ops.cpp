// CPU backend ops (src/backend/cpu/) against plain double-precision references written here. A
// comparison is exact (the same operations on the same values) or bounded, element by element, by
// the op's own rounding: a running error analysis of the operations the op performs, in fp32
// (grad_check.h Err, u = 2^-24; the double references' own rounding is 2^-29 of it and left out).
// Backward gradients are held against central finite differences of the double reference forward,
// within that bound plus the differences' own error (fd_grad). Every backward starts its gradient
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
#include "ref_transformer.h"
#include "runtime/error.h"

extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);
}

using namespace llmpi;
using namespace llmpi::test;

namespace {

constexpr double kU = kUnitFp32;
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

// fp32 values as Errs (held exactly).
std::vector<Err> exact(const std::vector<float>& v) { return std::vector<Err>(v.begin(), v.end()); }

// k |ref_i|: k roundings relative to each value.
std::vector<double> relative(const std::vector<double>& ref, double k) {
  std::vector<double> b(ref.size());
  for (size_t i = 0; i < ref.size(); i++) b[i] = k * std::fabs(ref[i]);
  return b;
}

// The gradient an op added (after − before, in double: exact up to 2^-53 of it) against finite
// differences fd, at the indices idx (all when empty): within the op's rounding (op: Errs of the
// gradient buffer after the op, at every index) plus fd's own error.
::testing::AssertionResult grad_within(const std::vector<double>& added, const std::vector<double>& fd,
                                       const std::vector<double>& fd_err, const std::vector<Err>& op,
                                       const std::vector<size_t>& idx, const std::string& what) {
  std::vector<double> bound(fd.size());
  for (size_t k = 0; k < fd.size(); k++) bound[k] = op.at(idx.empty() ? k : idx[k]).e + fd_err[k];
  return within_bound(added, fd, bound, what);
}

// fd_grad's third derivatives for the indices idx (all when empty) out of a vector for all.
std::vector<double> pick(const std::vector<double>& all, const std::vector<size_t>& idx) {
  if (idx.empty()) return all;
  std::vector<double> r;
  for (size_t i : idx) r.push_back(all[i]);
  return r;
}

// f(x_i) for every i: an elementwise op's outputs.
template <typename F>
std::vector<double> elementwise(F f, const std::vector<double>& x) {
  std::vector<double> o(x.size());
  for (size_t i = 0; i < x.size(); i++) o[i] = f(x[i]);
  return o;
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

// 0.5 x (1 + tanh(u)) written as x / (1 + exp(-2u)), the same function: 1 + tanh(u) cancels in
// double for u below about -10 (at x = -6 its relative error is 4e-6).
double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return x / (1.0 + std::exp(-2.0 * k * (x + 0.044715 * x * x * x)));
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

// ---- the ops' rounding (grad_check.h Err), operation by operation as the ops compute ----------------

// embedding_forward's out (wte + wpe: one addition; wpe empty: a copy).
std::vector<Err> embedding_err(const std::vector<int32_t>& inp, const std::vector<float>& wte,
                               const std::vector<float>& wpe, int B, int T, int C) {
  std::vector<Err> out(static_cast<size_t>(B) * T * C);
  for (int n = 0; n < B * T; n++)
    for (int c = 0; c < C; c++)
      out[n * C + c] = wpe.empty() ? Err(wte[inp[n] * C + c]) : Err(wte[inp[n] * C + c]) + Err(wpe[(n % T) * C + c]);
  return out;
}

// A scatter-add's gradient: table row row_of(n) gets dout's row n added (any order) to g0.
std::vector<Err> scatter_err(const std::vector<float>& g0, const std::vector<float>& dout,
                             const std::function<int(int)>& row_of, int N, int C) {
  std::vector<std::vector<Err>> terms(g0.size());
  for (size_t e = 0; e < g0.size(); e++) terms[e].push_back(Err(g0[e]));
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) terms[static_cast<size_t>(row_of(n)) * C + c].push_back(Err(dout[n * C + c]));
  std::vector<Err> g(g0.size());
  for (size_t e = 0; e < g.size(); e++) g[e] = sum(terms[e]);
  return g;
}

// matmul_forward's out: each a dot product of C terms, with the bias as one more term (sgemm
// accumulates onto the bias rows).
std::vector<Err> matmul_err(const std::vector<float>& x, const std::vector<float>& w, const float* bias, int N,
                            int C, int OC) {
  std::vector<Err> out(static_cast<size_t>(N) * OC);
  std::vector<Err> t;
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      t.clear();
      if (bias) t.push_back(Err(bias[o]));
      for (int c = 0; c < C; c++) t.push_back(Err(x[n * C + c]) * Err(w[o * C + c]));
      out[n * OC + o] = sum(t);
    }
  return out;
}

// matmul_backward's dx, dw, db: dx0 + dout W, dw0 + dout^T x, db0 + Σ_n dout (sums in any order).
struct MatmulGrads {
  std::vector<Err> dx, dw, db;
};
MatmulGrads matmul_backward_err(const std::vector<float>& x, const std::vector<float>& w,
                                const std::vector<float>& dout, const std::vector<float>& dx0,
                                const std::vector<float>& dw0, const std::vector<float>& db0, int N, int C, int OC) {
  MatmulGrads g;
  std::vector<Err> t;
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      t = {Err(dx0[n * C + c])};
      for (int o = 0; o < OC; o++) t.push_back(Err(dout[n * OC + o]) * Err(w[o * C + c]));
      g.dx.push_back(sum(t));
    }
  for (int o = 0; o < OC; o++)
    for (int c = 0; c < C; c++) {
      t = {Err(dw0[o * C + c])};
      for (int n = 0; n < N; n++) t.push_back(Err(dout[n * OC + o]) * Err(x[n * C + c]));
      g.dw.push_back(sum(t));
    }
  for (int o = 0; o < OC; o++) {
    t = {Err(db0[o])};
    for (int n = 0; n < N; n++) t.push_back(Err(dout[n * OC + o]));
    g.db.push_back(sum(t));
  }
  return g;
}

// layernorm_backward from the forward's mean and rstd (Errs): with norm = (x − mean) rstd and g = w
// dout, dx = dx0 + rstd ((g − Σg/C) − norm Σ(g norm)/C), dw = dw0 + Σ_n norm dout, db = db0 + Σ_n dout.
struct NormGrads {
  std::vector<Err> dx, dw, db;
};
NormGrads layernorm_backward_err(const std::vector<float>& x, const std::vector<float>& w,
                                 const std::vector<float>& dout, const NormErr& fwd, const std::vector<float>& dx0,
                                 const std::vector<float>& dw0, const std::vector<float>& db0, int N, int C) {
  NormGrads g;
  std::vector<std::vector<Err>> tw(C), tb(C);
  for (int c = 0; c < C; c++) tw[c] = {Err(dw0[c])}, tb[c] = {Err(db0[c])};
  std::vector<Err> nrm(C), gg(C), gn(C);
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) {
      nrm[c] = (Err(x[n * C + c]) - fwd.mean[n]) * fwd.rstd[n];
      gg[c] = Err(w[c]) * Err(dout[n * C + c]);
      gn[c] = gg[c] * nrm[c];
    }
    const Err mg = sum(gg) / Err(C), mgn = sum(gn) / Err(C);
    for (int c = 0; c < C; c++) {
      g.dx.push_back(Err(dx0[n * C + c]) + fwd.rstd[n] * ((gg[c] - mg) - nrm[c] * mgn));
      tw[c].push_back(nrm[c] * Err(dout[n * C + c]));
      tb[c].push_back(Err(dout[n * C + c]));
    }
  }
  for (int c = 0; c < C; c++) g.dw.push_back(sum(tw[c])), g.db.push_back(sum(tb[c]));
  return g;
}

// fd_grad's third of f = Σ a_c norm_c (a = w dout) along x_i, for LayerNorm (centred) and RMSNorm.
// Along e_i the row's w = var + eps (RMSNorm: mean(x²) + eps) is quadratic, w' = 2 y_i / C, w'' =
// 2/C at the point (y = x − mean, or x), and f = (A + t B) rstd(t) with A = Σ a_c y_c, B = a_i − ā
// (RMSNorm: a_i): f‴ = A rstd‴ + 3 B rstd'', where for rstd = w^(−1/2), |rstd''| ≤ 3 r⁵ y_i²/C²
// + r³/C and |rstd‴| ≤ 15 r⁷ |y_i|³/C³ + 9 r⁵ |y_i|/C² (r = rstd). With ŷ = y r (the normalised
// value): |f‴| ≤ r³ [Σ|a||ŷ| (15|ŷ_i|³/C³ + 9|ŷ_i|/C²) + 3 (|a_i| + ā)(3 ŷ_i²/C² + 1/C)].
std::vector<double> norm_third(const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>& dout, int N, int C, double eps, bool centred) {
  std::vector<double> m3(x.size());
  for (int n = 0; n < N; n++) {
    double m = 0.0, v = 0.0, sa = 0.0, say = 0.0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m = centred ? m / C : 0.0;
    for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    const double r = 1.0 / std::sqrt(v / C + eps);
    for (int c = 0; c < C; c++) {
      const double a = std::fabs(static_cast<double>(w[c]) * dout[n * C + c]);
      sa += a;
      say += a * std::fabs(x[n * C + c] - m) * r;
    }
    const double abar = centred ? sa / C : 0.0;
    for (int c = 0; c < C; c++) {
      const double yh = std::fabs(x[n * C + c] - m) * r, a = std::fabs(static_cast<double>(w[c]) * dout[n * C + c]);
      m3[n * C + c] = r * r * r *
                      (say * (15.0 * yh * yh * yh / (C * C * C) + 9.0 * yh / (C * C)) +
                       3.0 * (a + abar) * (3.0 * yh * yh / (C * C) + 1.0 / C));
    }
  }
  return m3;
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

// Exact throughout: copies and zero fills.
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

// Bound (kFastExpRel = 2u): fast_expf(x) = p(r) 2^n with n = round(x log2 e) and r = x − n ln 2
// (|r| ≤ ln2/2 + 5e-6): r − n·0.693359375 is exact (Cody–Waite: n c_hi exact, the difference
// representable), adding n·2.12194440e-4 rounds once (u |r|) and c_lo's own rounding moves r by
// 127 u c_lo: together u (|r| + 0.027), a relative error of e^r. The degree-7 polynomial's own
// error on |r| ≤ 0.3466 is 0.045u (in double); its Horner evaluation (each fma rounding carried
// through the later powers of r) and the last fma at most 0.6u of e^r, the final + 1 u; the scaling
// by 2^n is exact (a normal result on [-87, 88]). Worst over r: 1.95u + 0.045u ≤ 2u. (Measured
// over every float of [-87, 88]: 1.42u.)
TEST(CpuOps, FastExpMatchesExp) {
  double worst = 0.0;
  for (int i = 0; i <= 2000000; i++) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(cpu::fast_expf(x) - ref) / ref);
  }
  EXPECT_LE(worst, kFastExpRel);
  // Exact: at 0, n = r = 0 and the polynomial is 1; below -87 the result is 0 by construction.
  EXPECT_EQ(cpu::fast_expf(0.0f), 1.0f);
  EXPECT_EQ(cpu::fast_expf(-100.0f), 0.0f);
  EXPECT_EQ(cpu::fast_expf(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::fast_expf(kNaN)));
  EXPECT_TRUE(std::isnan(cpu::fast_expf(-kNaN)));
  // Never a denormal: normal down to -87, exactly 0 below (Exact: by construction, the clamp and the
  // exponent field built from n).
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
  // Bound: out = wte + wpe, one fp32 addition: within u of the exact sum.
  const auto ref = ref_embedding(inp, to_double(wte), to_double(wpe), B, T, C);
  EXPECT_TRUE(within_bound(out, ref, relative(ref, kU), "out"));
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
  // Bound: each row of dwte gets the dout rows of its token added, each row of dwpe those of its
  // position: sums (scatter_err). f is linear in the tables (M3 = 0).
  const auto fwd = embedding_err(inp, wte, wpe, B, T, C);
  std::vector<double> e1, e2;
  const auto g_wte = fd_grad([&](const std::vector<double>& w) { return ref_embedding(inp, w, wped, B, T, C); }, dout,
                             wted, {}, {0.0}, fwd, &e1);
  const auto g_wpe = fd_grad([&](const std::vector<double>& w) { return ref_embedding(inp, wted, w, B, T, C); }, dout,
                             wped, {}, {0.0}, fwd, &e2);
  EXPECT_TRUE(grad_within(added(dwte, dwte0), g_wte, e1,
                          scatter_err(dwte0, dout, [&](int n) { return inp[n]; }, B * T, C), {}, "dwte"));
  EXPECT_TRUE(grad_within(added(dwpe, dwpe0), g_wpe, e2,
                          scatter_err(dwpe0, dout, [&](int n) { return n % T; }, B * T, C), {}, "dwpe"));
}

// No position embedding (LLaMA): wpe / dwpe null.
TEST(CpuOps, EmbeddingWithoutPositions) {
  const int B = 2, T = 5, C = 8, V = 11;
  auto inp = random_ints(B * T, 120, 0, V);
  inp[1] = inp[6] = 4;
  const auto wte = random_floats(V * C, 121);
  std::vector<float> out(B * T * C, kNaN);
  ops().embedding_forward(out.data(), inp.data(), wte.data(), nullptr, B, T, C);
  // Exact: each out row is its token's row of wte, copied.
  const auto ref = ref_embedding(inp, to_double(wte), {}, B, T, C);
  EXPECT_TRUE(within_bound(out, ref, std::vector<double>(ref.size(), 0.0), "out"));
  const auto dout = random_floats(B * T * C, 122);
  const auto dwte0 = random_floats(V * C, 123);
  auto dwte = dwte0;
  ops().embedding_backward(dwte.data(), nullptr, dout.data(), inp.data(), B, T, C);
  // Bound: as in EmbeddingBackward.
  std::vector<double> err;
  const auto g = fd_grad([&](const std::vector<double>& w) { return ref_embedding(inp, w, {}, B, T, C); }, dout,
                         to_double(wte), {}, {0.0}, embedding_err(inp, wte, {}, B, T, C), &err);
  EXPECT_TRUE(grad_within(added(dwte, dwte0), g, err,
                          scatter_err(dwte0, dout, [&](int n) { return inp[n]; }, B * T, C), {}, "dwte"));
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
    // Bound: out = base + table row, one fp32 addition.
    const auto ref = ref_embedding_add(base, ids, to_double(table), N, C);
    EXPECT_TRUE(within_bound(out, ref, relative(ref, kU), "out N=" + std::to_string(N)));
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
    // Bound: each table row gets the dout rows of its id added (scatter_err); f is linear in the
    // table (M3 = 0), its double evaluation adds base + row.
    std::vector<Err> fwd(base.size());
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) fwd[n * C + c] = Err(base[n * C + c]) + Err(table[ids[n] * C + c]);
    std::vector<double> err;
    const auto g = fd_grad([&](const std::vector<double>& t) { return ref_embedding_add(base, ids, t, N, C); }, dout,
                           to_double(table), {}, {0.0}, fwd, &err);
    EXPECT_TRUE(grad_within(added(dt, dt0), g, err, scatter_err(dt0, dout, [&](int n) { return ids[n]; }, N, C), {},
                            "dtable N=" + std::to_string(N)));
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
    ref_layernorm(to_double(x), to_double(w), to_double(b), N, C, &ro, &rm, &rr, 1e-5f);
    // Bound: layernorm_err (the mean a sum of C terms; rstd the two-pass variance's; out three
    // roundings more).
    const NormErr e = layernorm_err(x, w, b, N, C, 1e-5f);
    const std::string at = "C=" + std::to_string(C);
    EXPECT_TRUE(within_bound(out, ro, errors(e.out), "out " + at));
    EXPECT_TRUE(within_bound(mean, rm, errors(e.mean), "mean " + at));
    EXPECT_TRUE(within_bound(rstd, rr, errors(e.rstd), "rstd " + at));
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
    const double eps = 1e-5f;
    // Bound: layernorm_backward_err from the forward's mean and rstd (layernorm_err); f is linear in
    // w and b (M3 = 0), its third derivative in x norm_third's.
    const NormErr fe = layernorm_err(x, w, b, N, C, 1e-5f);
    const NormGrads ge = layernorm_backward_err(x, w, dout, fe, dx0, dw0, db0, N, C);
    std::vector<double> o, ex, ew, eb;
    const auto gx = fd_grad(
        [&](const std::vector<double>& v) { ref_layernorm(v, wd, bd, N, C, &o, nullptr, nullptr, eps); return o; }, dout,
        xd, {}, norm_third(x, w, dout, N, C, eps, true), fe.out, &ex);
    const auto gw = fd_grad(
        [&](const std::vector<double>& v) { ref_layernorm(xd, v, bd, N, C, &o, nullptr, nullptr, eps); return o; }, dout,
        wd, {}, {0.0}, fe.out, &ew);
    const auto gb = fd_grad(
        [&](const std::vector<double>& v) { ref_layernorm(xd, wd, v, N, C, &o, nullptr, nullptr, eps); return o; }, dout,
        bd, {}, {0.0}, fe.out, &eb);
    const std::string at = " C=" + std::to_string(C);
    EXPECT_TRUE(grad_within(added(dx, dx0), gx, ex, ge.dx, {}, "dx" + at));
    EXPECT_TRUE(grad_within(added(dw, dw0), gw, ew, ge.dw, {}, "dw" + at));
    EXPECT_TRUE(grad_within(added(db, db0), gb, eb, ge.db, {}, "db" + at));
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
    // Bound: layernorm_err.
    const NormErr e = layernorm_err(x, w, b, N, C, eps);
    EXPECT_TRUE(within_bound(out, ro, errors(e.out), "out eps " + std::to_string(eps)));
    EXPECT_TRUE(within_bound(rstd, rr, errors(e.rstd), "rstd eps " + std::to_string(eps)));
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

// rmsnorm_backward from the forward's rstd: with norm = x rstd and g = w dout, dx = dx0 + rstd (g −
// norm Σ(g norm)/C), dw = dw0 + Σ_n norm dout.
NormGrads rmsnorm_backward_err(const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>& dout, const NormErr& fwd, const std::vector<float>& dx0,
                               const std::vector<float>& dw0, int N, int C) {
  NormGrads g;
  std::vector<std::vector<Err>> tw(C);
  for (int c = 0; c < C; c++) tw[c] = {Err(dw0[c])};
  std::vector<Err> nrm(C), gg(C), gn(C);
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < C; c++) {
      nrm[c] = Err(x[n * C + c]) * fwd.rstd[n];
      gg[c] = Err(w[c]) * Err(dout[n * C + c]);
      gn[c] = gg[c] * nrm[c];
    }
    const Err mgn = sum(gn) / Err(C);
    for (int c = 0; c < C; c++) {
      g.dx.push_back(Err(dx0[n * C + c]) + fwd.rstd[n] * (gg[c] - nrm[c] * mgn));
      tw[c].push_back(nrm[c] * Err(dout[n * C + c]));
    }
  }
  for (int c = 0; c < C; c++) g.dw.push_back(sum(tw[c]));
  return g;
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
      // Bound: rmsnorm_err.
      const NormErr e = rmsnorm_err(x, w, N, C, eps);
      const std::string at = "C=" + std::to_string(C) + " eps " + std::to_string(eps);
      EXPECT_TRUE(within_bound(out, ro, errors(e.out), "out " + at));
      EXPECT_TRUE(within_bound(rstd, rr, errors(e.rstd), "rstd " + at));
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
    // Bound: rmsnorm_backward_err from the forward's rstd; f is linear in w (M3 = 0), its third
    // derivative in x norm_third's.
    const NormErr fe = rmsnorm_err(x, w, N, C, eps);
    const NormGrads ge = rmsnorm_backward_err(x, w, dout, fe, dx0, dw0, N, C);
    std::vector<double> o, ex, ew;
    const auto gx = fd_grad([&](const std::vector<double>& v) { ref_rmsnorm(v, wd, N, C, eps, &o); return o; }, dout,
                            xd, idx, pick(norm_third(x, w, dout, N, C, eps, false), idx), fe.out, &ex);
    const auto gw = fd_grad([&](const std::vector<double>& v) { ref_rmsnorm(xd, v, N, C, eps, &o); return o; }, dout,
                            wd, {}, {0.0}, fe.out, &ew);
    const std::string at = " C=" + std::to_string(C);
    EXPECT_TRUE(grad_within(added(dx, dx0, idx), gx, ex, ge.dx, idx, "dx" + at));
    EXPECT_TRUE(grad_within(added(dw, dw0), gw, ew, ge.dw, {}, "dw" + at));
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
    // Bound: each out a dot product of C terms plus the bias, in the order sgemm's kernel takes
    // (matmul_err).
    const std::string at = "N=" + std::to_string(s.N);
    EXPECT_TRUE(within_bound(out, ref_matmul(xd, wd, &bd, s.N, s.C, s.OC),
                             errors(matmul_err(x, w, bias.data(), s.N, s.C, s.OC)), "bias " + at));
    std::fill(out.begin(), out.end(), kNaN);  // without bias the old content must not leak in
    ops().matmul_forward(out.data(), x.data(), w.data(), nullptr, s.N, s.C, s.OC, GemmPrecision::fp32);
    EXPECT_TRUE(within_bound(out, ref_matmul(xd, wd, nullptr, s.N, s.C, s.OC),
                             errors(matmul_err(x, w, nullptr, s.N, s.C, s.OC)), "no bias " + at));
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
  // Bound: dx, dw, db sums of OC, N, N products (or values) onto the initial gradients
  // (matmul_backward_err); f is linear in each argument (M3 = 0).
  const MatmulGrads ge = matmul_backward_err(x, w, dout, dx0, dw0, db0, N, C, OC);
  const auto fwd = matmul_err(x, w, bias.data(), N, C, OC);
  std::vector<double> ex, ew, eb;
  const auto gx = fd_grad([&](const std::vector<double>& v) { return ref_matmul(v, wd, &bd, N, C, OC); }, dout, xd,
                          {}, {0.0}, fwd, &ex);
  const auto gw = fd_grad([&](const std::vector<double>& v) { return ref_matmul(xd, v, &bd, N, C, OC); }, dout, wd,
                          {}, {0.0}, fwd, &ew);
  const auto gb = fd_grad([&](const std::vector<double>& v) { return ref_matmul(xd, wd, &v, N, C, OC); }, dout, bd,
                          {}, {0.0}, fwd, &eb);
  EXPECT_TRUE(grad_within(added(dx, dx0), gx, ex, ge.dx, {}, "dx"));
  EXPECT_TRUE(grad_within(added(dw, dw0), gw, ew, ge.dw, {}, "dw"));
  EXPECT_TRUE(grad_within(added(db, db0), gb, eb, ge.db, {}, "db"));

  // dinp and dbias may be null: dweight is unchanged by skipping them.
  // Exact: the same dweight sgemm call on the same operands (the three outputs are independent).
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
  // Bound: matmul_backward_err (the double sums' own rounding is 2^-29 of it).
  const MatmulGrads ge = matmul_backward_err(x, w, dout, dx0, dw0, db0, N, C, OC);
  EXPECT_TRUE(within_bound(added(dx, dx0), gx, errors(ge.dx), "dx"));
  EXPECT_TRUE(within_bound(added(dw, dw0), gw, errors(ge.dw), "dw"));
  EXPECT_TRUE(within_bound(added(db, db0), gb, errors(ge.db), "db"));
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

// rope_forward (sign 1) or rope_backward (sign -1) on x: each pair (a, b) becomes (a c − b s,
// b c + a s) with c = cos, s = sign · sin of the angle, each rounded to fp32 from double (u).
std::vector<Err> rope_err(const std::vector<Err>& x, const RopeCase& r, double sign) {
  std::vector<Err> y = x;
  const int half = r.hs / 2;
  for (int n = 0; n < r.B * r.T; n++) {
    const int t = n % r.T;
    for (int h = 0; h < r.nh; h++)
      for (int i = 0; i < half; i++) {
        const double a = t * std::pow(static_cast<double>(r.theta), -2.0 * i / r.hs);
        const Err c = constant(std::cos(a)), s = constant(sign * std::sin(a));
        const size_t lo = static_cast<size_t>(n) * r.stride + h * r.hs + i, hi = lo + half;
        y[lo] = x[lo] * c - x[hi] * s;
        y[hi] = x[hi] * c + x[lo] * s;
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
    // Bound: rope_err (two products and a sum per element, from the rounded cos and sin).
    EXPECT_TRUE(within_bound(x, ref, errors(rope_err(exact(x0), r, 1.0)), "T=" + std::to_string(r.T)));
    for (size_t e = 0; e < n; e++)  // untouched columns keep their bits (Exact: never written)
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
  // Bound: rope_err, at most 3u (|a| + |b|) whatever t (a float32 angle alone would be off by
  // t · 2^-24 rad, 5e-4 at t = 8192).
  EXPECT_TRUE(within_bound(x, ref, errors(rope_err(exact(x0), r, 1.0)), "T=8192"));
}

// rope_backward transforms the gradient in place (not +=, by contract): dx = R(a)^T dx'.
TEST(CpuOps, RopeBackward) {
  for (const RopeCase& r : kRopeCases) {
    const size_t n = static_cast<size_t>(r.B) * r.T * r.stride;
    const auto x = random_floats(n, 145), dout = random_floats(n, 146);
    auto dx = dout;
    ops().rope_backward(dx.data(), r.B, r.T, r.nh, r.hs, r.stride, r.theta);
    const std::vector<size_t> idx = n > 2000 ? sample_indices(n, 500, 147) : std::vector<size_t>{};
    // Bound: rope_err of the inverse rotation of dout; f is linear in x (M3 = 0).
    std::vector<double> err;
    const auto g = fd_grad([&](const std::vector<double>& v) { return ref_rope(v, r); }, dout, to_double(x), idx,
                           {0.0}, rope_err(exact(x), r, 1.0), &err);
    std::vector<double> got;
    if (idx.empty()) got.assign(dx.begin(), dx.end());
    else for (size_t i : idx) got.push_back(dx[i]);
    EXPECT_TRUE(grad_within(got, g, err, rope_err(exact(dout), r, -1.0), idx, "T=" + std::to_string(r.T)));
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
    // Bound: rope_err of the rotation and of its inverse, whose product is the identity (the
    // rounded cos and sin are within u of a rotation's).
    EXPECT_TRUE(within_bound(x, to_double(x0), errors(rope_err(rope_err(exact(x0), r, 1.0), r, -1.0)),
                             "T=" + std::to_string(r.T)));
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

// The attention op's call as ref_transformer.h's error model takes it.
AttentionCall call_of(const AttnCase& a) {
  return AttentionCall{a.B, a.T, a.NH, a.NKV, a.hs, a.causal, a.mask_ptr(), a.p, a.key, false};
}

// Forward against the double reference, within the op's rounding (ref_transformer.h
// attention_err: the scores' dot products, fast_expf, the softmax's sum and scaling, the P V
// products); every att entry that the reference leaves at 0 (future keys when causal, masked keys,
// rows without a valid key) must be exactly 0, and the output rows of queries without any valid key
// exactly 0 (Exact: the op writes those zeros, it computes nothing there).
void check_attention_forward(const AttnCase& a, uint32_t seed, const char* what = "") {
  const auto qkv = random_floats(a.n_qkv(), seed, -1.5f, 1.5f);
  std::vector<float> out(a.n_out(), kNaN);
  std::vector<float> att(a.n_att(), kNaN);  // stale content must go
  run_attention_forward(a, qkv, &out, &att);
  std::vector<double> ro, ra;
  ref_attention(to_double(qkv), a, &ro, &ra);
  const AttentionErr ae = attention_err(call_of(a), qkv);
  const std::string at = std::string(what) + " T=" + std::to_string(a.T);
  EXPECT_TRUE(within_bound(out, ro, errors(ae.out), "out " + at));
  EXPECT_TRUE(within_bound(att, ra, errors(ae.P), "att " + at));
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

// Backward against finite differences of the reference over `samples` qkv elements (all when 0),
// within the op's rounding (attention_err, from the forward's P) plus the differences' own error
// (attention_third: their third derivatives). dqkv starts non-zero (the op adds), and the scratch
// buffer starts as NaN: any element read before it is written would poison the result.
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
  const AttentionErr ae = attention_err(call_of(a), qkv, dout, dqkv0);
  std::vector<double> o, err;
  const auto g = fd_grad([&](const std::vector<double>& v) { ref_attention(v, a, &o); return o; }, dout,
                         to_double(qkv), idx, pick(attention_third(call_of(a), qkv, dout, ae.P), idx), ae.out, &err);
  EXPECT_TRUE(grad_within(added(dqkv, dqkv0, idx), g, err, ae.dqkv, idx,
                          std::string(what) + " T=" + std::to_string(a.T)));
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
  // Exact: the same score GEMMs and softmax either way (dropout only scales a copy for P V).
  EXPECT_EQ(0, std::memcmp(att.data(), att0.data(), att.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(out.data(), out0.data(), out.size() * sizeof(float)));  // (dropout applied)
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
// enough (b, h) pairs for the OpenMP path. Exact: the path makes the legacy code's sgemm calls on
// the same blocks, with the same softmax loop.
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
// are the same bits, for every masking / dropout mode. Exact: a (b, h) pair, or (b, kv head) in
// the backward, is one thread's, its sums in a fixed order whatever the thread count.
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
  std::vector<double> ref(x.size()), bound(x.size());
  for (size_t i = 0; i < x.size(); i++) ref[i] = ref_gelu(x[i]), bound[i] = gelu_tanh_err(x[i]).e;
  // Bound: gelu_tanh_err, elementwise. a's five roundings (and kK's, kA's) move s by a relative
  // (1 − s)|a| times theirs, which grows in the left tail (46u of gelu at x = -3.3); below a = -87
  // fast_expf gives 0, and so does the op.
  EXPECT_TRUE(within_bound(out, ref, bound, "gelu"));
}

TEST(CpuOps, GeluBackward) {
  const auto x = gelu_inputs(71);
  const auto dout = random_floats(x.size(), 72);
  const auto dx0 = random_floats(x.size(), 73);
  auto dx = dx0;
  ops().gelu_backward(dx.data(), x.data(), dout.data(), x.size());
  // Bound: dx0 + gelu_tanh_grad_err · dout; f is separable, ∂³f/∂x_i³ = gelu‴(x_i) dout_i with
  // |gelu‴| ≤ 0.777 everywhere.
  std::vector<Err> op(x.size()), fwd(x.size());
  std::vector<double> m3(x.size()), err;
  for (size_t i = 0; i < x.size(); i++) {
    op[i] = Err(dx0[i]) + gelu_tanh_grad_err(x[i]) * Err(dout[i]);
    fwd[i] = gelu_tanh_err(x[i]);
    m3[i] = 0.777 * std::fabs(dout[i]);
  }
  const auto g = fd_grad([&](const std::vector<double>& v) { return elementwise(ref_gelu, v); }, dout, to_double(x),
                         {}, m3, fwd, &err);
  EXPECT_TRUE(grad_within(added(dx, dx0), g, err, op, {}, "dx"));
}

TEST(CpuOps, ResidualForward) {
  const auto a = random_floats(1001, 80), b = random_floats(1001, 81);
  std::vector<float> out(a.size(), kNaN);
  ops().residual_forward(out.data(), a.data(), b.data(), a.size());
  // Exact: one fp32 addition each, the same as a[i] + b[i] here.
  for (size_t i = 0; i < a.size(); i++) ASSERT_EQ(out[i], a[i] + b[i]);
  auto inplace = a;  // out may alias an input
  ops().residual_forward(inplace.data(), inplace.data(), b.data(), a.size());
  EXPECT_EQ(0, std::memcmp(inplace.data(), out.data(), out.size() * sizeof(float)));
}

// ---- exact GELU, SwiGLU, tanh --------------------------------------------------------------------

namespace {
double ref_gelu_erf(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

// normal_cdf (backend/cpu/activations.cpp): z = |x| kInvSqrt2, t = 1/(1 + z/2), P(t) the degree-9
// polynomial by Horner (fma: one rounding, counted as two), half_erfc = 0.5 t exp(−z² + P) with z²
// split exactly (zz + e) and the exponent's two parts through fast_expf; Phi = half_erfc (x < 0) or
// 1 − half_erfc. Numerical Recipes' erfcc, whose form this is, is within 1.2e-7 of erfc relatively
// in exact arithmetic (Press et al., Numerical Recipes, 2nd ed., §6.2); the exponent's condition
// z² multiplies z's 1.3u (kInvSqrt2's rounding and the product) into the far tail.
Err normal_cdf_err(float xf) {
  static const double coef[] = {0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807,
                                -0.18628806, 0.09678418, 0.37409196, 1.00002368, -1.26551223};
  const Err z = err_abs(Err(xf)) * constant(1.0 / std::sqrt(2.0));
  const Err t = Err(1.0) / (Err(1.0) + Err(0.5) * z);
  Err p = constant(coef[0]);
  for (int k = 1; k < 10; k++) p = p * t + constant(coef[k]);
  // exp(−zz) exp(P − e) = exp(−z² + P) for the computed z (zz + e = z² exactly), rounded in P − e
  // (u |P|), by the two fast_expf and by their product
  const Err arg{-z.v * z.v + p.v, 2.0 * z.v * z.e + p.e + kU * std::fabs(p.v)};
  Err ex = exp(arg, 2 * kFastExpRel + kU);
  if (z.v * z.v > 87.0 - 1e-3) ex.e = std::max(ex.e, ex.v);  // fast_expf(−zz) flushes to 0
  Err half = Err(0.5) * t * ex;
  half.e += 1.2e-7 * half.v;  // the formula's own error
  return xf < 0.0f ? half : Err(1.0) - half;
}

}  // namespace

TEST(CpuOps, GeluErfForward) {
  const auto x = gelu_inputs(150);
  std::vector<float> out(x.size(), kNaN);
  ops().gelu_erf_forward(out.data(), x.data(), x.size(), nullptr);
  std::vector<double> ref(x.size()), bound(x.size());
  for (size_t i = 0; i < x.size(); i++) ref[i] = ref_gelu_erf(x[i]), bound[i] = (Err(x[i]) * normal_cdf_err(x[i])).e;
  // Bound: x · normal_cdf_err, elementwise, tails included (erfc, no cancellation).
  EXPECT_TRUE(within_bound(out, ref, bound, "gelu_erf"));
  // The OpenMP path gives the same values (Exact: one elementwise function, no sum).
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
  // Bound: dx0 + (Phi + x phi) dout, Phi = normal_cdf_err, phi = kInvSqrt2Pi fast_expf(−x²/2); f is
  // separable with |gelu_erf‴| = |(x³ − 4x) phi| ≤ 0.779.
  std::vector<Err> op(x.size()), fwd(x.size());
  std::vector<double> m3(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const Err xi(x[i]), pdf = constant(1.0 / std::sqrt(2.0 * M_PI)) * fast_exp(Err(-0.5) * xi * xi);
    op[i] = Err(dx0[i]) + (normal_cdf_err(x[i]) + xi * pdf) * Err(dout[i]);
    fwd[i] = xi * normal_cdf_err(x[i]);
    m3[i] = 0.779 * std::fabs(dout[i]);
  }
  std::vector<double> err2;
  const auto g = fd_grad([&](const std::vector<double>& v) { return elementwise(ref_gelu_erf, v); }, dout,
                         to_double(x), {}, m3, fwd, &err2);
  EXPECT_TRUE(grad_within(added(dx, dx0), g, err2, op, {}, "dx"));
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

// swiglu_forward: e = fast_expf(−|g|), sigmoid = (g ≥ 0 ? 1 : e) / (1 + e), out = g sigmoid up.
std::vector<Err> swiglu_err(const std::vector<float>& inp, int N, int F) {
  std::vector<Err> out(static_cast<size_t>(N) * F);
  for (int n = 0; n < N; n++)
    for (int f = 0; f < F; f++) {
      const Err g(inp[n * 2 * F + f]), e = fast_exp(-err_abs(g));
      out[n * F + f] = g * ((g.v >= 0.0 ? Err(1.0) : e) / (Err(1.0) + e)) * Err(inp[n * 2 * F + F + f]);
    }
  return out;
}

// swiglu_backward: with r = 1/(1 + e), sig = (g ≥ 0 ? 1 : e) r, 1 − sig = (g ≥ 0 ? e : 1) r:
// dgate = dgate0 + dout up sig (1 + g (1 − sig)), dup = dup0 + dout g sig.
std::vector<Err> swiglu_backward_err(const std::vector<float>& inp, const std::vector<float>& dout,
                                     const std::vector<float>& d0, int N, int F) {
  std::vector<Err> d(d0.size());
  for (int n = 0; n < N; n++)
    for (int f = 0; f < F; f++) {
      const size_t gi = n * 2 * F + f, ui = gi + F;
      const Err g(inp[gi]), up(inp[ui]), dy(dout[n * F + f]), e = fast_exp(-err_abs(g)), r = Err(1.0) / (Err(1.0) + e);
      const Err sig = (g.v >= 0.0 ? Err(1.0) : e) * r, oms = (g.v >= 0.0 ? e : Err(1.0)) * r;
      d[gi] = Err(d0[gi]) + dy * up * sig * (Err(1.0) + g * oms);
      d[ui] = Err(d0[ui]) + dy * g * sig;
    }
  return d;
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
    // Bound: swiglu_err, elementwise (fast_expf's 2u reaching the sigmoid as (1 − sigmoid) of it,
    // five roundings).
    EXPECT_TRUE(within_bound(out, ref, errors(swiglu_err(inp, N, F)), "F=" + std::to_string(F)));
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
    // Bound: swiglu_backward_err; along a gate f‴ = silu‴(g) up dout with |silu‴| ≤ 0.309,
    // along an up value f is linear (0).
    std::vector<double> m3(inp.size(), 0.0), err;
    for (int n = 0; n < N; n++)
      for (int f = 0; f < F; f++)
        m3[n * 2 * F + f] = 0.309 * std::fabs(static_cast<double>(inp[n * 2 * F + F + f]) * dout[n * F + f]);
    const auto g = fd_grad([&](const std::vector<double>& v) { return ref_swiglu(v, N, F); }, dout, to_double(inp), {},
                           m3, swiglu_err(inp, N, F), &err);
    EXPECT_TRUE(grad_within(added(dx, dx0), g, err, swiglu_backward_err(inp, dout, dx0, N, F), {},
                            "F=" + std::to_string(F)));
  }
}

TEST(CpuOps, TanhForward) {
  auto x = random_floats(300, 159, -5.0f, 5.0f);
  for (float v : {0.0f, 1e-7f, -1e-6f, 20.0f, -20.0f}) x.push_back(v);
  std::vector<float> out(x.size(), kNaN);
  ops().tanh_forward(out.data(), x.data(), x.size());
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); i++) ref[i] = std::tanh(static_cast<double>(x[i]));
  // Bound: glibc's tanhf, kTanhfRel of the value, elementwise, small |x| included.
  EXPECT_TRUE(within_bound(out, ref, relative(ref, kTanhfRel), "tanh"));
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
  // Bound: dx0 + dout (1 − out²) with out within kTanhfRel of tanh x (its error reaches 1 − out² as
  // 2 out δ, large against it where tanh is near ±1); f is separable, |tanh‴| ≤ 2.
  std::vector<Err> op(x.size()), fwd(x.size());
  std::vector<double> m3(x.size()), err;
  for (size_t i = 0; i < x.size(); i++) {
    const double t = std::tanh(static_cast<double>(x[i]));
    fwd[i] = Err(t, kTanhfRel * std::fabs(t));
    op[i] = Err(dx0[i]) + Err(dout[i]) * (Err(1.0) - fwd[i] * fwd[i]);
    m3[i] = 2.0 * std::fabs(dout[i]);
  }
  const auto g = fd_grad([&](const std::vector<double>& v) { return elementwise([](double u) { return std::tanh(u); }, v); },
                         dout, to_double(x), {}, m3, fwd, &err);
  EXPECT_TRUE(grad_within(added(dx, dx0), g, err, op, {}, "dx"));
}

// ---- dropout -------------------------------------------------------------------------------------

// The vectorisable keep decision of the CPU backend is dropout_keep's, bit for bit. (The
// threshold checks: Exact, m 2^-24 is exact in float for m < 2^24.)
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
    std::vector<double> ref(n), bound(n);
    size_t kept = 0;
    // Bound: out = x · float(1 / (1 − p)): 1 − p, the division and the product round (Err).
    const Err scale = Err(1.0) / (Err(1.0) - Err(p));
    for (size_t i = 0; i < n; i++) {
      const bool keep = dropout_keep(key, i, p);
      kept += keep;
      ref[i] = keep ? x[i] / (1.0 - p) : 0.0;
      bound[i] = keep ? (Err(x[i]) * scale).e : 0.0;
    }
    EXPECT_TRUE(within_bound(out, ref, bound, "p " + std::to_string(p)));
    for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i] == 0.0f, ref[i] == 0.0) << i;
    // Bound: the kept count is Binomial(n, 1 − p) for a hash uniform on 2^24 levels: its standard
    // deviation over n is √(p (1 − p) / n) ≤ 1.6e-3, so 0.01 is 6 of them.
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01) << p;
    auto inplace = x;  // in place gives the same bits (Exact: the same elementwise products)
    ops().dropout_forward(inplace.data(), inplace.data(), n, p, key);
    EXPECT_EQ(0, std::memcmp(inplace.data(), out.data(), n * sizeof(float)));
  }
  std::vector<float> out(n, kNaN);  // p == 0: a copy (Exact)
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
    // Bound: dx0 + dout · float(1 / (1 − p)) (p = 0: dx0 + dout); f is linear in x (M3 = 0).
    const Err scale = Err(1.0) / (Err(1.0) - Err(p));
    std::vector<Err> op(n), fwd(n);
    for (size_t i = 0; i < n; i++) {
      const bool keep = dropout_keep(key, i, p);
      op[i] = Err(dx0[i]) + (p == 0.0f ? Err(dout[i]) : keep ? Err(dout[i]) * scale : Err(0.0));
      fwd[i] = keep ? Err(x[i]) * scale : Err(0.0);
    }
    std::vector<double> err;
    const auto g = fd_grad(
        [&](const std::vector<double>& v) {
          std::vector<double> o(n);
          for (size_t i = 0; i < n; i++) o[i] = dropout_keep(key, i, p) ? v[i] / (1.0 - p) : 0.0;
          return o;
        },
        dout, to_double(x), {}, {0.0}, fwd, &err);
    EXPECT_TRUE(grad_within(added(dx, dx0), g, err, op, {}, "p " + std::to_string(p)));
  }
  // The large (OpenMP) path agrees with the forward's mask: dinp += dropout_forward(dout).
  // Exact: each element is base + (the forward's product or 0), one addition, in both.
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
  // Exact: a copy of the rows at t = 0.
  const auto r0 = ref(to_double(x));
  EXPECT_TRUE(within_bound(out, r0, std::vector<double>(r0.size(), 0.0), "out"));
  const auto dout = random_floats(B * C, 170), dx0 = random_floats(B * T * C, 171);
  auto dx = dx0;
  ops().first_token_backward(dx.data(), dout.data(), B, T, C);
  // Bound: one addition at t = 0 (dx0 + dout), none elsewhere; f is linear (M3 = 0).
  std::vector<Err> op = exact(dx0), fwd = exact(out);
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++) op[b * T * C + c] = Err(dx0[b * T * C + c]) + Err(dout[b * C + c]);
  std::vector<double> err;
  const auto g = fd_grad(ref, dout, to_double(x), {}, {0.0}, fwd, &err);
  EXPECT_TRUE(grad_within(added(dx, dx0), g, err, op, {}, "dx"));
  for (int b = 0; b < B; b++)  // positions t > 0 are untouched (Exact)
    for (int e = C; e < T * C; e++) ASSERT_EQ(dx[b * T * C + e], dx0[b * T * C + e]);
}

// ---- softmax + cross-entropy ---------------------------------------------------------------------

namespace {
// softmax_xent's row (xent_row): mx = max z (exact, and the result does not depend on it),
// e_j = fast_expf(z_j − mx), S = Σ e_j, loss = logf(S) + (mx − z_y); gradient e_j (gs / S), minus gs
// at y. The losses and the gradient of rows [N, V].
struct XentErr {
  std::vector<Err> loss, grad;
};
XentErr xent_err(const std::vector<float>& z, const std::vector<int32_t>& y, int N, int V, float gs) {
  XentErr r;
  std::vector<Err> e(V);
  for (int n = 0; n < N; n++) {
    double mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = std::max(mx, static_cast<double>(z[n * V + j]));
    for (int j = 0; j < V; j++) e[j] = fast_exp(Err(z[n * V + j]) - Err(mx));
    const Err S = sum(e), f = Err(gs) / S;
    r.loss.push_back(log(S, kLogfRel) + (Err(mx) - Err(z[n * V + y[n]])));
    for (int j = 0; j < V; j++) r.grad.push_back(j == y[n] ? e[j] * f - Err(gs) : e[j] * f);
  }
  return r;
}
}  // namespace

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
    // Bound: xent_err (each exp's argument and value rounding, the sum of V terms, logf; S's
    // relative error is the loss's absolute one).
    const auto bound = errors(xent_err(z, y, s.N, s.V, 0.0f).loss);
    EXPECT_TRUE(within_bound(loss, ref, bound, "V=" + std::to_string(s.V)));
    // grad_scale == 0 leaves the logits alone (Exact: not written).
    EXPECT_EQ(0, std::memcmp(zc.data(), z.data(), z.size() * sizeof(float)));
    std::fill(loss.begin(), loss.end(), kNaN);
    ops().softmax_xent(zc.data(), loss.data(), y.data(), s.N, s.V, 0.5f);
    EXPECT_TRUE(within_bound(loss, ref, bound, "with the gradient, V=" + std::to_string(s.V)));
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
  // Bound: xent_err's gradient; ∂³/∂z_j³ of log Σ exp z is p_j (1 − p_j)(1 − 2 p_j), at most
  // 1/(6√3) < 0.0963 in magnitude.
  const XentErr xe = xent_err(z, y, N, V, gs);
  std::vector<double> err;
  const auto g = fd_grad([&](const std::vector<double>& v) { return ref_xent(v, y, N, V); }, std::vector<float>(N, gs),
                         to_double(z), {}, {0.0963 * gs}, xe.loss, &err);
  std::vector<double> bound(err.size());
  for (size_t i = 0; i < err.size(); i++) bound[i] = err[i] + xe.grad[i].e;
  EXPECT_TRUE(within_bound(grad, g, bound, "gradient"));
}

// Tensor parallelism: the vocabulary cut into shards [v0, v0 + Vn) of 37 (12, 13, 12 rows), the
// three passes with the shards' maxima and sums combined in between as the group does, give the
// whole cross-entropy's losses and, shard by shard, its gradient columns. Bound: the two compute
// the same operations but S's sum in another order (the shards' partial sums added), so each is
// within xent_err of the exact loss and gradient, and they are within twice that of each other.
TEST(CpuOps, VocabXentOverShardsEqualsTheWholeOne) {
  const int N = 6, V = 37, ld = 40;
  const int cuts[] = {0, 12, 25, 37};
  const auto zw = random_floats(static_cast<size_t>(N) * V, 94, -4.0f, 4.0f);
  const auto y = random_ints(N, 95, 0, V);
  const float gs = 0.25f;
  auto whole = zw;
  std::vector<float> whole_loss(N);
  ops().softmax_xent(whole.data(), whole_loss.data(), y.data(), N, V, gs);
  const XentErr xe = xent_err(zw, y, N, V, gs);
  auto twice = [](std::vector<double> b) {
    for (double& x : b) x *= 2.0;
    return b;
  };
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
    EXPECT_TRUE(within_bound(loss, to_double(whole_loss), twice(errors(xe.loss)), "loss, shard " + std::to_string(k)));
    std::vector<float> got;
    std::vector<double> want, bound;
    for (int n = 0; n < N; n++)
      for (int j = cuts[k]; j < cuts[k + 1]; j++) {
        got.push_back(z[k][n * ld + j - cuts[k]]);
        want.push_back(whole[n * V + j]);
        bound.push_back(2.0 * xe.grad[n * V + j].e);
      }
    EXPECT_TRUE(within_bound(got, want, bound, "gradient, shard " + std::to_string(k)));
  }
}

// The vocabulary shards' lookups sum to the whole lookup (the positions added by one shard), and
// each shard's scatter-add is its rows of the whole one. Exact: a token's row and its position
// meet in one addition either way (the other shard adds zeros, exactly), and a shard's scatter
// adds its rows' terms in the whole one's row order.
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

namespace {
// One adamw_update of an element as the op computes it: m = b1 m + a1 g, v = b2 v + a2 g g (a1 =
// 1 − b1, a2 = 1 − b2 in float), p = p − lr ((m c1) / (√(v c2) + eps) + wd p), with c1, c2 the
// bias corrections computed in double from the float betas and rounded to float. The
// hyperparameters are Errs: a decimal value and its float's distance from it (constant()), so the
// Errs' values are the update with the decimal hyperparameters.
struct AdamErr {
  Err p, m, v;
};
AdamErr adamw_err(const AdamErr& s, float g, const Err& lr, const Err& b1, const Err& b2, const Err& eps,
                  const Err& wd, int t) {
  auto correction = [t](const Err& b) {  // float(1 / (1 − float(b)^t)) against 1 / (1 − b^t)
    const double bf = static_cast<float>(b.v), exact = 1.0 / (1.0 - std::pow(b.v, t)),
                 got = 1.0 / (1.0 - std::pow(bf, t));
    return Err(exact, std::fabs(got - exact) + kU * std::fabs(got));
  };
  const Err a1 = Err(1.0) - b1, a2 = Err(1.0) - b2, c1 = correction(b1), c2 = correction(b2);
  AdamErr r;
  r.m = b1 * s.m + a1 * Err(g);
  r.v = b2 * s.v + a2 * Err(g) * Err(g);
  r.p = s.p - lr * ((r.m * c1) / (sqrt(r.v * c2) + eps) + wd * s.p);
  return r;
}
}  // namespace

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
  // Exact: m and v are products and sums of powers of two (and 1 − 2^-10), all held by float.
  EXPECT_EQ(m[0], 0.0625f);
  EXPECT_EQ(v[0], 0.000244140625f);
  // Bound: adamw_err of the step (its value is the hand computation above: checked to its last
  // digit, half a unit of the ninth).
  const AdamErr s1 = adamw_err({1.0, 0.0, 0.0}, 0.5f, constant(0.1), b1, b2, constant(1e-8), constant(0.01), 1);
  EXPECT_NEAR(s1.p.v, 0.899000002, 5e-10);
  EXPECT_TRUE(within_bound(p, {s1.p.v}, {s1.p.e}, "p, t = 1"));
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
  EXPECT_EQ(m[0], -0.001953125f);  // Exact: powers of two again
  // Bound: adamw_err (its values: the hand computation, to half a unit of its last digit).
  const AdamErr s3 =
      adamw_err({-2.0, 0.015625, 0.000244140625}, -0.125f, constant(0.01), b1, b2, constant(1e-8), 0.0, 3);
  EXPECT_NEAR(s3.v.v, 0.000259160995483, 5e-16);
  EXPECT_NEAR(s3.p.v, -1.99980114935, 5e-12);
  EXPECT_TRUE(within_bound(v, {s3.v.v}, {s3.v.e}, "v, t = 3"));
  EXPECT_TRUE(within_bound(p, {s3.p.v}, {s3.p.e}, "p, t = 3"));
}

// Bound: three steps of adamw_err, whose values are the AdamW recurrence in double with the decimal
// hyperparameters and whose errors carry every rounding of the three steps (and the float
// hyperparameters' distance from the decimal ones) from step to step.
TEST(CpuOps, AdamWMatchesReferenceOverSteps) {
  const size_t n = 1000;
  auto p = random_floats(n, 100), m = std::vector<float>(n, 0.0f), v = m;
  std::vector<AdamErr> ref(n);
  for (size_t i = 0; i < n; i++) ref[i] = {Err(p[i]), Err(0.0), Err(0.0)};
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int t = 1; t <= 3; t++) {
    const auto g = random_floats(n, 100 + t, -0.1f, 0.1f);
    ops().adamw_update(p.data(), g.data(), m.data(), v.data(), n, static_cast<float>(lr),
                       static_cast<float>(b1), static_cast<float>(b2), static_cast<float>(eps),
                       static_cast<float>(wd), t);
    for (size_t i = 0; i < n; i++)
      ref[i] = adamw_err(ref[i], g[i], constant(lr), constant(b1), constant(b2), constant(eps), constant(wd), t);
  }
  std::vector<Err> rp, rm, rv;
  for (const AdamErr& r : ref) rp.push_back(r.p), rm.push_back(r.m), rv.push_back(r.v);
  EXPECT_TRUE(within_bound(p, values(rp), errors(rp), "p"));
  EXPECT_TRUE(within_bound(m, values(rm), errors(rm), "m"));
  EXPECT_TRUE(within_bound(v, values(rv), errors(rv), "v"));
}

TEST(CpuOps, SumSquaresAndScale) {
  for (size_t n : {size_t{0}, size_t{7}, size_t{1000}, size_t{300001}}) {
    auto x = random_floats(n, 110, -3.0f, 3.0f);
    double ref = 0.0;
    for (float v : x) ref += static_cast<double>(v) * v;
    // Bound: both sum the same n squares (exact in double) in double, in other orders (chunks and
    // vector lanes; in index order here): each within gamma_(n−1) (u = 2^-53) of their sum, all terms
    // positive.
    EXPECT_NEAR(ops().sum_squares(x.data(), n), ref, 2.0 * gamma_n(n, kUnitFp64) * ref) << n;
    const auto x0 = x;
    ops().scale(x.data(), 0.37f, n);
    // Exact: one fp32 product each, the same here.
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

// Exact: the same calls on the same values, on the same threads.
TEST(CpuOps, DeterministicRunToRun) {
  const auto a = run_all_ops(true);
  const auto b = run_all_ops(true);
  expect_bitwise_equal(a, b);
  for (const auto& buf : a)
    for (float x : buf) ASSERT_FALSE(std::isnan(x));
}

TEST(CpuOps, SameResultsForOneAndTwoThreads) {
  // Exact: the loops split work in ways that do not change any summation order; attention is included
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
  // OpenBLAS held to one thread in every run, so that only the OpenMP split differs. Exact: no op
  // splits a sum across threads (the partial sums run over fixed chunks, in chunk order).
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
