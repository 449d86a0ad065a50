// The tensor-core fused-attention kernels of kernels/flash_attention_mma.cu (forward, dK/dV, dQ;
// bf16 and tf32) run on the CPU through cuda_shim.h, against the CPU backend's
// flash_attention_forward / backward in the same precision (the oracle the CUDA tests use), with
// the CUDA tests' tolerances. It executes the kernels'
// own source: tile loops, masking, the online softmax, the mma fragment layouts, barriers, GQA
// head mapping, dropout indices; not the hardware (tools/cuda_cpu_sim/README.md).
//
//   build/sim-flash_mma            every case; exit 0 when all are within the tolerances
//
// The kernels' part of the .cu (from `namespace llmpi::cuda {` up to its "---- launch" line) is
// extracted by the Makefile into $(BUILD)/cuda_cpu_sim/flash_mma_kernels.inc, included below.
#include "cuda_shim.h"
#include "launch.h"

#include <string>
#include <vector>

#include "backend/dropout_hash.h"
#include "backend/flash_bf16.h"
#include "backend/ops.h"
#include "flash_attention_args.cuh"

#ifdef LLMPI_SIM_PERTURB_EXP2
// The device's exp2f is within 2 ulp; this moves each result by -2..+2 ulp (a hash of x).
inline float perturbed_exp2f(float x) {
  float y = std::exp2(x);
  if (y == 0.0f || !std::isfinite(y)) return y;
  uint32_t u, v;
  std::memcpy(&u, &x, 4);
  uint32_t h = u * 2654435761u;
  h ^= h >> 15;
  std::memcpy(&v, &y, 4);
  v += static_cast<uint32_t>(static_cast<int>(h % 5) - 2);
  std::memcpy(&y, &v, 4);
  return y;
}
#define exp2f perturbed_exp2f
#endif

namespace llmpi::cuda {
namespace {
// What the kernels' `extern __shared__` arrays name: one buffer, blocks running one at a time.
alignas(256) unsigned char smem[240 * 1024];
}  // namespace
}  // namespace llmpi::cuda

#include "flash_mma_kernels.inc"

#ifdef exp2f
#undef exp2f
#endif

using namespace llmpi;
using namespace llmpi::cuda;
using llmpi::sim::uniform;

namespace {

constexpr size_t kSmemLimit = 232448;  // an H100's opt-in shared memory per block (227 KB)
// tests/test_cuda_flash_bf16.cpp's tolerances (tf32's out and dqkv bounds are half of bf16's)
constexpr double kOutTol = 2e-4, kLseTol = 1e-5, kGradTol = 5e-4;
constexpr double kOutTolTf32 = 1e-4, kGradTolTf32 = 2.5e-4;

// A grid of gx x gy blocks of 128 threads, one block after another.
template <class F>
void launch(unsigned gx, unsigned gy, size_t smem_bytes, F kernel) {
  if (smem_bytes > kSmemLimit) sim::die("a kernel asks for more shared memory than an H100 has");
  for (unsigned by = 0; by < gy; by++)
    for (unsigned bx = 0; bx < gx; bx++) {
      std::memset(smem, 0xff, sizeof smem);  // NaN bytes: a read of unwritten shared memory shows
      sim::BlockContext block(sim::kBlockThreads);
      sim::run_block(block, dim3(sim::kBlockThreads), bx, by, 0, kernel);
    }
}

struct Case {
  const char* name;
  int B, T, NH, NKV, hs;
  bool causal, masked;
  float p;
};

// ‖a − ref‖ / ‖ref‖; a non-finite a is infinitely wrong
double rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t k = 0; k < a.size(); k++) {
    if (!std::isfinite(a[k])) return INFINITY;
    const double e = static_cast<double>(a[k]) - ref[k];
    num += e * e;
    den += static_cast<double>(ref[k]) * ref[k];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

template <class Op, int HS>
void run_kernels(const Case& c, const FlashArgs& a, std::vector<float>& out, std::vector<float>& lse,
                 std::vector<float>& dqkv, const std::vector<float>& qkv, const std::vector<float>& dout,
                 const int32_t* mask) {
  const unsigned tiles = static_cast<unsigned>((c.T + 63) / 64);
  launch(c.B * c.NH, tiles, forward_smem<Op, HS>(),
         [&] { flash_mma_forward_kernel<Op, HS>(out.data(), lse.data(), qkv.data(), mask, a); });
  // D_i = Σ_d dO_id out_id, what the launcher's row-dot kernel computes (it adds over a warp's lanes:
  // another order of the same sum)
  std::vector<float> D(static_cast<size_t>(c.B) * c.NH * c.T);
  for (int b = 0; b < c.B; b++)
    for (int h = 0; h < c.NH; h++)
      for (int i = 0; i < c.T; i++) {
        const size_t off = (static_cast<size_t>(b) * c.T + i) * a.C + static_cast<size_t>(h) * c.hs;
        float s = 0;
        for (int d = 0; d < c.hs; d++) s += dout[off + d] * out[off + d];
        D[(static_cast<size_t>(b) * c.NH + h) * c.T + i] = s;
      }
  launch(c.B * c.NKV, tiles, dkdv_smem<Op, HS>(), [&] {
    flash_mma_dkdv_kernel<Op, HS>(dqkv.data(), dout.data(), lse.data(), D.data(), qkv.data(), mask, a);
  });
  launch(c.B * c.NH, tiles, dq_smem<Op, HS>(), [&] {
    flash_mma_dq_kernel<Op, HS>(dqkv.data(), dout.data(), lse.data(), D.data(), qkv.data(), mask, a);
  });
}

template <int HS>
void run_case(GemmPrecision prec, const Case& c, const FlashArgs& a, std::vector<float>& out, std::vector<float>& lse,
              std::vector<float>& dqkv, const std::vector<float>& qkv, const std::vector<float>& dout,
              const int32_t* mask) {
  if (prec == GemmPrecision::bf16) run_kernels<Bf16Operands, HS>(c, a, out, lse, dqkv, qkv, dout, mask);
  else run_kernels<Tf32Operands, HS>(c, a, out, lse, dqkv, qkv, dout, mask);
}

}  // namespace

int main() {
  // Tails (T = 1, 5, 67, 130, 200, 1023), every head-size case (16 and 48 padded up), GQA and MQA,
  // causal and bidirectional, padding masks (a sequence with a masked first key, one with its
  // second half masked, one fully masked), dropout.
  const Case cases[] = {
      {"T5_bidir_mask", 3, 5, 4, 4, 64, false, true, 0.0f},
      {"T1_causal_gqa", 2, 1, 4, 2, 64, true, false, 0.0f},
      {"hs48_T67_causal_mqa", 2, 67, 4, 1, 48, true, false, 0.0f},
      {"hs32_T130_bidir_mask_drop", 3, 130, 2, 1, 32, false, true, 0.1f},
      {"hs64_T130_causal_mask_drop", 3, 130, 2, 2, 64, true, true, 0.1f},
      {"hs128_T200_causal_mqa", 1, 200, 2, 1, 128, true, false, 0.0f},
      {"hs16_T67_causal", 1, 67, 2, 2, 16, true, false, 0.0f},
      {"gqa42_T67_causal_mask_drop", 3, 67, 4, 2, 64, true, true, 0.1f},
      {"gqa42_T100_bidir", 2, 100, 4, 2, 32, false, false, 0.0f},
      {"T1023_causal_mask_drop", 1, 1023, 2, 1, 64, true, true, 0.1f},
      {"T1024_bidir_mask", 2, 1024, 1, 1, 64, false, true, 0.0f},
  };
  const uint64_t key = 0x5eedbf16;
  int failed = 0;
  // bf16: every case; tf32 (twice the mma instructions: each sums 8 terms) the ones marked
  const bool in_tf32[] = {true, true, true, false, true, true, false, false, true, true, false};
  static_assert(std::size(in_tf32) == std::size(cases));
  int runs = 0;
  std::printf("%-33s %10s %10s %10s  (tolerances %.2g %.2g %.2g; tf32 %.2g %.2g %.2g)\n", "case", "out", "lse",
              "dqkv", kOutTol, kLseTol, kGradTol, kOutTolTf32, kLseTol, kGradTolTf32);
  for (GemmPrecision prec : {GemmPrecision::bf16, GemmPrecision::tf32})
  for (size_t ci = 0; ci < std::size(cases); ci++) {
    const Case& c = cases[ci];
    if (prec == GemmPrecision::tf32 && !in_tf32[ci]) continue;
    runs++;
    const int W = (c.NH + 2 * c.NKV) * c.hs, C = c.NH * c.hs;
    const auto qkv = uniform(static_cast<size_t>(c.B) * c.T * W, 11 + c.T, -2, 2);
    const auto dout = uniform(static_cast<size_t>(c.B) * c.T * C, 12 + c.T, -1, 1);
    const auto d0 = uniform(qkv.size(), 13 + c.T, -1, 1);  // the gradient before (backward adds)
    std::vector<int32_t> mask;
    if (c.masked) {
      mask.assign(static_cast<size_t>(c.B) * c.T, 1);
      const auto r = uniform(c.T, 700 + c.T, 0, 1);
      for (int t = 0; t < c.T; t++) mask[t] = r[t] < 0.3f ? 0 : 1;
      mask[0] = 0;
      if (c.B > 1)
        for (int t = (c.T + 1) / 2; t < c.T; t++) mask[c.T + t] = 0;
      if (c.B > 2)
        for (int t = 0; t < c.T; t++) mask[2 * static_cast<size_t>(c.T) + t] = 0;
    }
    const int32_t* m = mask.empty() ? nullptr : mask.data();
    const float nan = std::nanf("");
    std::vector<float> ro(dout.size(), nan), rl(static_cast<size_t>(c.B) * c.NH * c.T, nan), rd = d0;
    const Ops& cpu = cpu_ops();
    cpu.flash_attention_forward(ro.data(), rl.data(), qkv.data(), m, c.B, c.T, c.NH, c.NKV, c.hs, c.causal, c.p, key,
                                prec);
    cpu.flash_attention_backward(rd.data(), dout.data(), ro.data(), rl.data(), qkv.data(), m, c.B, c.T, c.NH, c.NKV,
                                 c.hs, c.causal, c.p, key, prec);
    std::vector<float> go(dout.size(), nan), gl(rl.size(), nan), gd = d0;
    FlashArgs a = make_flash_args(c.B, c.T, c.NH, c.NKV, c.hs, c.causal, c.p, key);
    a.c = flash_bf16_score_scale(c.hs);
    switch (c.hs <= 32 ? 32 : c.hs <= 64 ? 64 : 128) {
      case 32: run_case<32>(prec, c, a, go, gl, gd, qkv, dout, m); break;
      case 64: run_case<64>(prec, c, a, go, gl, gd, qkv, dout, m); break;
      default: run_case<128>(prec, c, a, go, gl, gd, qkv, dout, m); break;
    }
    // lse: -inf (a row with no visible key) where the CPU has it, else within kLseTol
    int inf_mismatch = 0, nan_lse = 0;
    double lse_err = 0;
    for (size_t k = 0; k < rl.size(); k++) {
      if (std::isnan(gl[k])) {
        nan_lse++;
        continue;
      }
      if (rl[k] == -INFINITY || gl[k] == -INFINITY) {
        inf_mismatch += rl[k] != gl[k];
        continue;
      }
      lse_err = std::max(lse_err, std::fabs(static_cast<double>(gl[k]) - rl[k]) / std::max(1.0, std::fabs(double(rl[k]))));
    }
    std::vector<float> g_added(gd.size()), r_added(rd.size());
    for (size_t k = 0; k < gd.size(); k++) g_added[k] = gd[k] - d0[k], r_added[k] = rd[k] - d0[k];
    const double out_err = rel(go, ro), grad_err = rel(g_added, r_added);
    const bool tf32 = prec == GemmPrecision::tf32;
    const bool ok = out_err < (tf32 ? kOutTolTf32 : kOutTol) && lse_err < kLseTol &&
                    grad_err < (tf32 ? kGradTolTf32 : kGradTol) && inf_mismatch == 0 && nan_lse == 0;
    failed += !ok;
    std::printf("%-28s %-4s %10.2e %10.2e %10.2e  %s", c.name, gemm_precision_name(prec), out_err, lse_err, grad_err,
                ok ? "ok" : "FAIL");
    if (inf_mismatch || nan_lse) std::printf(" (lse: %d -inf mismatches, %d NaN)", inf_mismatch, nan_lse);
    std::printf("\n");
  }
  std::printf("sim-flash_mma: %d of %d runs (cases x precisions) outside the tolerances\n", failed, runs);
  return failed == 0 ? 0 : 1;
}
