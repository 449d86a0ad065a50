// CUDA backend ops run on the CPU, whole: the kernels of kernels/softmax_xent.cu, gelu.cu,
// layernorm.cu, matmul.cu, flash_attention.cu and flash_attention_mma.cu AND their host launchers
// (which kernel, which grid, how much shared memory and its opt-in, the 16-byte paths and their
// alignment checks), compiled with g++ after tools/cuda_cpu_sim/rewrite_cu.pl, against the CPU
// backend's op (the oracle the CUDA tests use) at the CUDA tests' tolerances
// (tools/cuda_cpu_sim/README.md). What it adds to sim-flash_mma: the non-attention kernels written
// since the last GPU run, and the ops' dispatch. It does not run cuBLAS: the GEMMs are a plain CPU
// product (include/cublas_v2.h, sim_runtime.cpp), so it checks the code around them.
//
//   build/sim-cuda_ops [group ...]   every case (or those of the groups named: softmax, gelu, norms,
//                                    matmul, attention); exit 0 when all are within the tolerances
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/bf16.h"
#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "backend/step_scalars.h"
#include "cuda_common.cuh"
#include "runtime/error.h"
#include "sim_runtime.h"

using namespace llmpi;
using llmpi::sim::uniform;

namespace {

constexpr double kOpTol = 1e-5;  // tests/test_cuda_ops.cpp: ‖gpu − cpu‖ / ‖cpu‖ of an op

int g_failed = 0, g_checks = 0;

void check(bool ok, const std::string& what, const std::string& detail = "") {
  g_checks++;
  if (!ok) g_failed++;
  std::printf("  %-4s %s%s%s\n", ok ? "ok" : "FAIL", what.c_str(), detail.empty() ? "" : "  ", detail.c_str());
}

// ‖a − ref‖ / ‖ref‖ over [0, n); a non-finite value where ref has a finite one is infinitely wrong
double rel(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t k = 0; k < n; k++) {
    if (!std::isfinite(ref[k])) {
      if (std::isnan(ref[k]) != std::isnan(a[k]) || (!std::isnan(ref[k]) && a[k] != ref[k])) return INFINITY;
      continue;
    }
    if (!std::isfinite(a[k])) return INFINITY;
    const double e = static_cast<double>(a[k]) - ref[k];
    num += e * e;
    den += static_cast<double>(ref[k]) * ref[k];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
double rel(const std::vector<float>& a, const std::vector<float>& ref) { return rel(a.data(), ref.data(), ref.size()); }

std::string fmt(double e) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", e);
  return b;
}

// bf16 bits more than one unit in the last place from the rounding of ref (NaN where ref is NaN)
size_t bf16_off(const uint16_t* got, const float* ref, size_t n) {
  size_t off = 0;
  for (size_t k = 0; k < n; k++) {
    const uint16_t r = float_to_bf16_bits(ref[k]);
    if (std::isnan(ref[k])) {
      off += !std::isnan(bf16_bits_to_float(got[k]));
      continue;
    }
    off += std::abs(static_cast<int>(got[k]) - static_cast<int>(r)) > 1;
  }
  return off;
}

// ---- softmax + cross-entropy --------------------------------------------------------------------
// Rows of V logits ld apart (the padding holds a sentinel that must stay), every kind of row: plain
// (logits in [-8, 8]), one with a NaN among -inf (row 1, when N > 2, at a position only one thread
// reads), one with many -inf (row 2), and a target out of range (the last row, when bad).
struct XentCase {
  const char* name;
  int N, V, ld;
  bool bad;
};

void fill_xent(const XentCase& c, std::vector<float>& logits, std::vector<int32_t>& targets) {
  logits = uniform(static_cast<size_t>(c.N) * c.ld, 100 + c.V, -8, 8);
  for (int n = 0; n < c.N; n++)
    for (int j = c.V; j < c.ld; j++) logits[static_cast<size_t>(n) * c.ld + j] = 1234.5f;  // padding
  targets.resize(c.N);
  std::mt19937 g(7 + c.V);
  for (int n = 0; n < c.N; n++) targets[n] = static_cast<int32_t>(g() % c.V);
  if (c.N > 2) {
    float* r1 = &logits[static_cast<size_t>(c.ld)];
    for (int j = 0; j < c.V; j++) r1[j] = -INFINITY;
    r1[targets[1]] = 0.5f;
    r1[c.V - 1 == targets[1] ? 0 : c.V - 1] = NAN;
    float* r2 = &logits[2 * static_cast<size_t>(c.ld)];
    for (int j = 0; j < c.V; j += 3) r2[j] = j == targets[2] ? r2[j] : -INFINITY;
  }
  if (c.bad) targets[c.N - 1] = c.V + 3;
}

void xent_case(const XentCase& c) {
  std::printf("softmax_xent %s: N %d, V %d, ld %d%s\n", c.name, c.N, c.V, c.ld, c.bad ? ", a bad target" : "");
  std::vector<float> logits;
  std::vector<int32_t> targets;
  fill_xent(c, logits, targets);
  const float scale = 1.0f / 3;
  const Ops& cpu = cpu_ops();
  // in place (fp32 gradient)
  std::vector<float> rl = logits, gl = logits, rloss(c.N, -1.0f), gloss(c.N, -1.0f);
  uint64_t rbad = 0, gbad = 0;
  cpu.softmax_xent_record(rl.data(), c.ld, rloss.data(), targets.data(), c.N, c.V, scale, &rbad, 5);
  cuda::softmax_xent_record(gl.data(), c.ld, gloss.data(), targets.data(), c.N, c.V, scale, &gbad, 5);
  check(rel(gloss, rloss) < kOpTol, "losses (in place)", fmt(rel(gloss, rloss)));
  check(rel(gl, rl) < kOpTol, "logits gradient and untouched padding / bad row", fmt(rel(gl, rl)));
  check(gbad == rbad && (rbad != 0) == c.bad, "bad-target key",
        c.bad ? "row " + std::to_string(bad_target_row(gbad)) + " target " + std::to_string(bad_target_value(gbad))
              : "none");
  // the loss only (grad_scale 0): the logits are not written
  std::vector<float> g0 = logits, l0(c.N, -1.0f);
  uint64_t bad0 = 0;
  cuda::softmax_xent_record(g0.data(), c.ld, l0.data(), targets.data(), c.N, c.V, 0.0f, &bad0, 0);
  check(rel(l0, rloss) < kOpTol && std::memcmp(g0.data(), logits.data(), logits.size() * 4) == 0,
        "grad_scale 0: the same losses, logits unchanged");
  // bf16 gradient into another buffer (padding columns zero), logits read only
  std::vector<uint16_t> grad(logits.size(), 0x7777);
  std::vector<float> bl = logits, bloss(c.N, -1.0f);
  uint64_t bbad = 0;
  cuda::softmax_xent_bf16_grad(bl.data(), c.ld, bloss.data(), targets.data(), c.N, c.V, scale, grad.data(), &bbad, 5);
  size_t off = 0, pad = 0, bad_row_written = 0;
  for (int n = 0; n < c.N; n++) {
    const size_t r = static_cast<size_t>(n) * c.ld;
    if (c.bad && n == c.N - 1) {
      for (int j = 0; j < c.ld; j++) bad_row_written += grad[r + j] != 0x7777;
      continue;
    }
    off += bf16_off(&grad[r], &rl[r], c.V);
    for (int j = c.V; j < c.ld; j++) pad += grad[r + j] != 0;
  }
  check(rel(bloss, rloss) < kOpTol && bbad == rbad && std::memcmp(bl.data(), logits.data(), logits.size() * 4) == 0,
        "bf16 gradient: the same losses and key, logits unchanged");
  check(off == 0 && pad == 0 && bad_row_written == 0, "bf16 gradient: the fp32 one rounded (within 1 ulp), padding 0",
        std::to_string(off) + " off, " + std::to_string(pad) + " padding not 0, " + std::to_string(bad_row_written) +
            " written in the bad row");
}

void xent_checked() {
  std::printf("softmax_xent (checked): a target outside [0, V)\n");
  std::vector<float> logits = uniform(3 * 40, 5, -1, 1), losses(3);
  std::vector<int32_t> targets = {1, 40, 2};
  std::string msg;
  try {
    cuda::softmax_xent(logits.data(), losses.data(), targets.data(), 3, 40, 1.0f);
  } catch (const Error& e) {
    msg = e.what();
  }
  check(msg.find("target 40 at row 1") != std::string::npos, "throws naming the row and target", msg);
}

// ---- GELU (tanh) --------------------------------------------------------------------------------
void gelu_cases() {
  const Ops& cpu = cpu_ops();
  for (size_t n : {size_t(10000), size_t(10007)})
    for (int offset : {0, 1}) {  // offset 1: the pointers 4-byte aligned only (the scalar kernels)
      std::printf("gelu: n %zu, pointer offset %d floats\n", n, offset);
      const auto x = uniform(n + 1, 40 + n, -6, 6), d = uniform(n + 1, 41 + n, -1, 1);
      std::vector<float> ro(n), go(n + 1, NAN);
      cpu.gelu_forward(ro.data(), x.data() + offset, n);
      cuda::gelu_forward(go.data() + offset, x.data() + offset, n);
      check(rel(go.data() + offset, ro.data(), n) < kOpTol, "gelu_forward", fmt(rel(go.data() + offset, ro.data(), n)));
      std::vector<float> go2(n + 1, NAN);
      std::vector<uint16_t> g16(n + 1, 0x7777);
      cuda::gelu_forward_to(go2.data() + offset, g16.data() + offset, x.data() + offset, n);
      check(std::memcmp(go2.data() + offset, go.data() + offset, n * 4) == 0 && bf16_off(g16.data() + offset, ro.data(), n) == 0,
            "gelu_forward_to: the same fp32 bits and their bf16 rounding");
      std::vector<uint16_t> h16(n + 1, 0x7777);
      cuda::gelu_forward_to(nullptr, h16.data() + offset, x.data() + offset, n);
      check(h16 == g16, "gelu_forward_to, bf16 only: the same bits");
      std::vector<float> rd(n, 0.5f), gd(n + 1, 0.5f);
      cpu.gelu_backward(rd.data(), x.data() + offset, d.data() + offset, n);
      cuda::gelu_backward(gd.data() + offset, x.data() + offset, d.data() + offset, n);
      check(rel(gd.data() + offset, rd.data(), n) < kOpTol, "gelu_backward (adds)", fmt(rel(gd.data() + offset, rd.data(), n)));
      std::vector<float> rm(n, 0.0f), gm(d.begin(), d.end());
      cpu.gelu_backward(rm.data(), x.data() + offset, d.data() + offset, n);
      cuda::gelu_grad_multiply(gm.data() + offset, x.data() + offset, n);
      check(rel(gm.data() + offset, rm.data(), n) < kOpTol, "gelu_grad_multiply", fmt(rel(gm.data() + offset, rm.data(), n)));
    }
}

// ---- norms' backward (column sums through add_partial_sums) -------------------------------------
void norm_cases() {
  const Ops& cpu = cpu_ops();
  for (int C : {96, 770}) {
    const int N = 1100;  // several row chunks
    std::printf("layernorm / rmsnorm backward: N %d, C %d\n", N, C);
    const size_t nc = static_cast<size_t>(N) * C;
    const auto x = uniform(nc, 60 + C, -2, 2), dout = uniform(nc, 61 + C, -1, 1), w = uniform(C, 62, 0.5f, 1.5f),
               b = uniform(C, 63, -0.5f, 0.5f), dx0 = uniform(nc, 64, -1, 1), dw0 = uniform(C, 65, -1, 1),
               db0 = uniform(C, 66, -1, 1);
    std::vector<float> out(nc), mean(N), rstd(N);
    cpu.layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f, nullptr);
    std::vector<float> rdx = dx0, rdw = dw0, rdb = db0, gdx = dx0, gdw = dw0, gdb = db0;
    cpu.layernorm_backward(rdx.data(), rdw.data(), rdb.data(), dout.data(), x.data(), w.data(), mean.data(),
                           rstd.data(), N, C);
    cuda::layernorm_backward(gdx.data(), gdw.data(), gdb.data(), dout.data(), x.data(), w.data(), mean.data(),
                             rstd.data(), N, C);
    check(rel(gdx, rdx) < kOpTol && rel(gdw, rdw) < kOpTol && rel(gdb, rdb) < kOpTol, "layernorm_backward",
          fmt(rel(gdx, rdx)) + " " + fmt(rel(gdw, rdw)) + " " + fmt(rel(gdb, rdb)));
    std::vector<float> rs(N);
    cpu.rmsnorm_forward(out.data(), rs.data(), x.data(), w.data(), N, C, 1e-5f, nullptr);
    rdx = dx0, rdw = dw0, gdx = dx0, gdw = dw0;
    cpu.rmsnorm_backward(rdx.data(), rdw.data(), dout.data(), x.data(), w.data(), rs.data(), N, C);
    cuda::rmsnorm_backward(gdx.data(), gdw.data(), dout.data(), x.data(), w.data(), rs.data(), N, C);
    check(rel(gdx, rdx) < kOpTol && rel(gdw, rdw) < kOpTol, "rmsnorm_backward", fmt(rel(gdx, rdx)) + " " + fmt(rel(gdw, rdw)));
  }
}

// ---- dense layers in bf16: the operand conversions, the bias gradient summed in dout's ---------
void dense_cases() {
  const Ops& cpu = cpu_ops();
  const int N = 150, C = 40, OC = 72;
  for (bool epilogues : {true, false})
    for (int dout_pad : {0, 11}) {
      sim::g_epilogues = epilogues;
      std::printf("matmul bf16: N %d, C %d, OC %d, epilogues %s, dout rows of %d\n", N, C, OC, epilogues ? "on" : "off",
                  OC + dout_pad);
      GemmMode gemm;
      gemm.prec = GemmPrecision::bf16;
      const int ldd = OC + dout_pad;
      const auto inp = uniform(static_cast<size_t>(N) * C, 80, -1, 1), w = uniform(static_cast<size_t>(OC) * C, 81, -1, 1),
                 bias = uniform(OC, 82, -1, 1);
      auto dout = uniform(static_cast<size_t>(N) * ldd, 83, -1, 1);
      std::vector<float> dense(static_cast<size_t>(N) * OC);  // the CPU op's contiguous rows
      for (int n = 0; n < N; n++)
        for (int j = 0; j < ldd; j++)
          if (j < OC) dense[static_cast<size_t>(n) * OC + j] = dout[static_cast<size_t>(n) * ldd + j];
          else dout[static_cast<size_t>(n) * ldd + j] = NAN;  // padding: never read
      const auto dx0 = uniform(static_cast<size_t>(N) * C, 84, -1, 1), dw0 = uniform(w.size(), 85, -1, 1),
                 db0 = uniform(OC, 86, -1, 1);
      std::vector<float> rdx = dx0, rdw = dw0, rdb = db0, gdx = dx0, gdw = dw0, gdb = db0;
      cpu.matmul_backward(rdx.data(), rdw.data(), rdb.data(), dense.data(), inp.data(), w.data(), N, C, OC, gemm);
      GemmMode g = gemm;
      g.dout_ld = ldd;
      const long long before = sim::g_lt_counts[static_cast<int>(cuda::LtCount::colsum_in_conversion)];
      cuda::matmul_backward(gdx.data(), gdw.data(), gdb.data(), dout.data(), inp.data(), w.data(), N, C, OC, g);
      const long long fused = sim::g_lt_counts[static_cast<int>(cuda::LtCount::colsum_in_conversion)] - before;
      check(rel(gdx, rdx) < kOpTol && rel(gdw, rdw) < kOpTol && rel(gdb, rdb) < kOpTol, "matmul_backward",
            fmt(rel(gdx, rdx)) + " " + fmt(rel(gdw, rdw)) + " " + fmt(rel(gdb, rdb)) + (fused ? ", dbias summed in the conversion" : ""));
      // forward + GELU with the activation in bf16 (GPT-2's MLP)
      std::vector<float> rpre(static_cast<size_t>(N) * OC), ract(rpre.size()), gpre(rpre.size(), NAN),
          gact(rpre.size(), NAN);
      std::vector<uint16_t> g16(rpre.size(), 0x7777);
      cpu.matmul_gelu_forward(rpre.data(), ract.data(), inp.data(), w.data(), bias.data(), N, C, OC, gemm, nullptr);
      cuda::matmul_gelu_forward(gpre.data(), gact.data(), inp.data(), w.data(), bias.data(), N, C, OC, gemm, g16.data());
      check(rel(gpre, rpre) < kOpTol && rel(gact, ract) < kOpTol && bf16_off(g16.data(), ract.data(), ract.size()) == 0,
            "matmul_gelu_forward with act_bf16", fmt(rel(gpre, rpre)) + " " + fmt(rel(gact, ract)));
    }
  sim::g_epilogues = true;
}

// ---- fused attention through the op (the kernel choice, D by flash_rowdot_kernel) -----------------
void attention_cases() {
  const Ops& cpu = cpu_ops();
  struct A {
    int B, T, NH, NKV, hs;
    bool causal;
    GemmPrecision prec;
    double out_tol, grad_tol;  // tests/test_cuda_flash_bf16.cpp's (fp32: kOpTol)
  };
  for (const A& a : {A{2, 37, 4, 2, 40, true, GemmPrecision::fp32, kOpTol, kOpTol},
                     A{1, 70, 2, 1, 64, false, GemmPrecision::bf16, 2e-4, 5e-4}}) {
    std::printf("flash_attention %s: B %d, T %d, NH %d, NKV %d, hs %d, %s\n", gemm_precision_name(a.prec), a.B, a.T,
                a.NH, a.NKV, a.hs, a.causal ? "causal" : "bidirectional");
    const int W = (a.NH + 2 * a.NKV) * a.hs, C = a.NH * a.hs;
    const auto qkv = uniform(static_cast<size_t>(a.B) * a.T * W, 90 + a.T, -2, 2),
               dout = uniform(static_cast<size_t>(a.B) * a.T * C, 91 + a.T, -1, 1),
               d0 = uniform(qkv.size(), 92, -1, 1);
    std::vector<float> ro(dout.size()), rl(static_cast<size_t>(a.B) * a.NH * a.T), go(ro.size(), NAN), gl(rl.size(), NAN);
    std::vector<float> rd = d0, gd = d0;
    cpu.flash_attention_forward(ro.data(), rl.data(), qkv.data(), nullptr, a.B, a.T, a.NH, a.NKV, a.hs, a.causal, 0.0f,
                                1, a.prec);
    cpu.flash_attention_backward(rd.data(), dout.data(), ro.data(), rl.data(), qkv.data(), nullptr, a.B, a.T, a.NH,
                                 a.NKV, a.hs, a.causal, 0.0f, 1, a.prec);
    cuda::flash_attention_forward(go.data(), gl.data(), qkv.data(), nullptr, a.B, a.T, a.NH, a.NKV, a.hs, a.causal,
                                  0.0f, 1, a.prec);
    cuda::flash_attention_backward(gd.data(), dout.data(), go.data(), gl.data(), qkv.data(), nullptr, a.B, a.T, a.NH,
                                   a.NKV, a.hs, a.causal, 0.0f, 1, a.prec);
    for (size_t k = 0; k < gd.size(); k++) gd[k] -= d0[k], rd[k] -= d0[k];
    check(rel(go, ro) < a.out_tol && rel(gl, rl) < kOpTol && rel(gd, rd) < a.grad_tol,
          std::string("forward and backward (") + cuda_flash_attention_kernel(a.prec, a.hs) + ")",
          fmt(rel(go, ro)) + " " + fmt(rel(gl, rl)) + " " + fmt(rel(gd, rd)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // build/sim-cuda_ops [group ...]: only these of softmax, gelu, norms, matmul, attention
  auto run = [&](const char* group) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; i++)
      if (std::strcmp(argv[i], group) == 0) return true;
    return false;
  };
  const XentCase xent[] = {
      {"tiny", 4, 5, 5, true},
      {"odd V, unaligned rows", 5, 3001, 3001, true},
      {"GPT-2 head, padded rows (row kernel, 201 KB shared)", 3, 50257, 50304, false},
      {"V over the row kernel's shared memory (two-pass kernel)", 3, 60000, 60000, true},
  };
  try {
    if (run("softmax")) {
      for (const XentCase& c : xent) xent_case(c);
      xent_checked();
    }
    if (run("gelu")) gelu_cases();
    if (run("norms")) norm_cases();
    if (run("matmul")) dense_cases();
    if (run("attention")) attention_cases();
  } catch (const std::exception& e) {
    std::printf("sim-cuda_ops: an op threw: %s\n", e.what());
    return 1;
  }
  std::printf("sim-cuda_ops: %d of %d checks failed (%lld launches, %lld blocks)\n", g_failed, g_checks,
              sim::launch_stats().launches, sim::launch_stats().blocks);
  return g_failed == 0 ? 0 : 1;
}
