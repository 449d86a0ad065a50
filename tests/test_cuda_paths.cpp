// The switches of the CUDA backend's unverified paths (backend/cuda_ops.h "Paths",
// kernels/cuda_paths.cu): the list and its errors (no GPU needed), and each switched-off path
// against the path it replaces on the same inputs (on a GPU, or on the CPU simulator: the bits
// where the two promise the same bits, the rounding bound of cuda_test_util.h where their
// summation orders differ: two sides of the same op, each within its bound of the exact value). The verified fallbacks are also run whole by tools/gpu_verify.sh's `verified` step
// (the CUDA suites with LLMPI_CUDA_OFF=all).
#include <gtest/gtest.h>

#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda_ops.h"
#include "cuda_test_util.h"
#include "flash_bf16_test_util.h"
#include "runtime/error.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

#ifdef LLMPI_HAVE_CUDA
constexpr bool kCuda = true;
#else
constexpr bool kCuda = false;
#endif

}  // namespace

TEST(CudaPaths, ListsEveryPathWithWhatItChangesAndWhatRunsInstead) {
  const auto paths = cuda_paths();
  const std::string line = cuda_paths_description();
  std::printf("%s\n", line.c_str());
  if (!kCuda) {
    EXPECT_TRUE(paths.empty());
    EXPECT_NE(line.find("without CUDA"), std::string::npos) << line;
    return;
  }
  std::set<std::string> names;
  for (const CudaPath& p : paths) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name << " twice";
    EXPECT_FALSE(p.change.empty()) << p.name;
    EXPECT_FALSE(p.fallback.empty()) << p.name;
    EXPECT_EQ(p.on, p.why_off.empty()) << p.name << ": off needs a reason, on none";
    EXPECT_NE(line.find(p.name), std::string::npos) << p.name << " missing from: " << line;
  }
  for (const char* n : {"mma_attention", "tf32_attention", "softmax_row_smem", "cudnn_attention"})
    EXPECT_EQ(names.count(n), 1u) << n;
}

TEST(CudaPaths, OffListSwitchesPathsOffAndNamesWhy) {
  if (!kCuda) GTEST_SKIP() << "built without CUDA: no paths";
  const ScopedCudaPathsOff all("all", true);
  for (const CudaPath& p : cuda_paths()) {
    EXPECT_FALSE(p.on) << p.name;
    EXPECT_FALSE(p.why_off.empty()) << p.name;
    EXPECT_FALSE(cuda_path_enabled(p.name)) << p.name;
  }
  cuda_set_paths_off(" softmax_row_smem ,mma_attention");
  EXPECT_FALSE(cuda_path_enabled("softmax_row_smem"));
  EXPECT_FALSE(cuda_path_enabled("mma_attention"));
  EXPECT_TRUE(cuda_path_enabled("rowdot_warp"));
  cuda_set_paths_off("");
  for (const CudaPath& p : cuda_paths()) {  // cuDNN's may be off for want of the library, with its reason
    if (p.name != "cudnn_attention") {
      EXPECT_TRUE(p.on) << p.name;
    }
  }
}

TEST(CudaPaths, UnknownNameIsAnErrorListingTheKnownOnes) {
  if (!kCuda) GTEST_SKIP() << "built without CUDA: no paths";
  const ScopedCudaPathsOff keep("");
  try {
    cuda_set_paths_off("mma_attention,no_such_path");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no_such_path"), std::string::npos) << m;
    EXPECT_NE(m.find("mma_attention"), std::string::npos) << m;
    EXPECT_NE(m.find("all"), std::string::npos) << m;
  }
  EXPECT_THROW(cuda_path_enabled("no_such_path"), Error);
}

// ---- each fallback against the path it replaces (GPU or simulator) ---------------------------------

namespace {

// Runs f with the path named on, then off, and returns both results.
template <typename F>
auto both_ways(const char* path, F f) {
  std::pair<decltype(f()), decltype(f())> r;
  {
    const ScopedCudaPathsOff on("", true);
    r.first = f();
  }
  {
    const ScopedCudaPathsOff off(path, true);
    r.second = f();
  }
  return r;
}

// The contents of device buffers one after another: what a run hands both_ways to compare.
std::vector<float> contents(std::initializer_list<const Dev*> bufs) {
  std::vector<float> r;
  for (const Dev* b : bufs) {
    const std::vector<float> h = b->get();
    r.insert(r.end(), h.begin(), h.end());
  }
  return r;
}

}  // namespace

// The row kernel (1024 threads) and the two-pass one (512) compute each element's exponential the
// same way but sum a row's in another order: losses and gradients within xent_bounds (both kernels'
// online sums; the rows' padding untouched by either; each is held to the CPU by CudaOps.SoftmaxXent*).
TEST(CudaPathsFallback, SoftmaxXentTwoPassKernelMatchesTheRowKernel) {
  REQUIRE_GPU();
  const int N = 5, V = 3001, ld = 3008;
  const auto logits = random_floats(static_cast<size_t>(N) * ld, 41, -8.0f, 8.0f);
  std::vector<int32_t> targets = {0, 17, 3000, 1500, 2};
  auto run = [&] {
    Dev l(logits), losses(nans(N)), t(targets), bad(std::vector<float>(2, 0.0f));
    gpu().softmax_xent_record(l.f(), ld, losses.f(), t.i(), N, V, 1.0f / N, static_cast<uint64_t*>(bad.p), 0);
    return contents({&losses, &l});
  };
  const auto [on, off] = both_ways("softmax_row_smem", run);
  ASSERT_TRUE(all_finite(on));
  ASSERT_TRUE(all_finite(off));
  const XentBounds xb = xent_bounds(logits.data(), ld, targets.data(), N, V, 1.0f / N);
  EXPECT_LT(rel_to_magnitude(std::vector<float>(off.begin(), off.begin() + N), std::vector<float>(on.begin(), on.begin() + N),
                             xb.loss),
            1.0);
  EXPECT_LT(rel_to_magnitude(std::vector<float>(off.begin() + N, off.end()), std::vector<float>(on.begin() + N, on.end()),
                             pad_rows(xb.grad, N, V, ld, 0.0)),
            1.0);
}

// bf16 dense backward: the bias gradient summed in dout's conversion or after it, the same bits;
// and the bf16 dGELU's multiply four floats or one at a time, the same bits.
TEST(CudaPathsFallback, Bf16BackwardConversionAndDgeluGiveTheSameBits) {
  REQUIRE_GPU();
  const int N = 67, C = 48, OC = 96;
  const auto dout = random_floats(static_cast<size_t>(N) * OC, 51), inp = random_floats(static_cast<size_t>(N) * C, 52);
  const auto w = random_floats(static_cast<size_t>(OC) * C, 53), pre = random_floats(static_cast<size_t>(N) * C, 54);
  auto backward = [&] {
    Dev d(dout), x(inp), wt(w), dinp(std::vector<float>(static_cast<size_t>(N) * C, 0.5f)),
        dw(std::vector<float>(static_cast<size_t>(OC) * C, 0.25f)), db(std::vector<float>(OC, 0.125f));
    gpu().matmul_backward(dinp.f(), dw.f(), db.f(), d.f(), x.f(), wt.f(), N, C, OC, GemmMode(GemmPrecision::bf16));
    return contents({&dinp, &dw, &db});
  };
  const auto [on, off] = both_ways("colsum_in_conversion", backward);
  EXPECT_SAME_BITS(off, on);  // Exact: one order of the column sums either way, the same bf16 operands
  auto dgelu = [&] {
    Dev d(dout), wt(w), p(pre), dpre(nans(static_cast<size_t>(N) * C));
    gpu().matmul_dgelu_backward(dpre.f(), d.f(), wt.f(), p.f(), N, C, OC, GemmMode(GemmPrecision::bf16));
    return dpre.get();
  };
  const auto [von, voff] = both_ways("gelu_grad_vec4", dgelu);
  ASSERT_TRUE(all_finite(von));
  EXPECT_SAME_BITS(voff, von);  // Exact: the same expression per element, four at a time or one
}

// The column sums' second pass: 16 lanes of chunks or a thread per column, another order of the
// same fp32 sums: LayerNorm's parameter gradients within norm_bounds of the CPU either way.
TEST(CudaPathsFallback, ColumnSumsSerialPassMatchesTheLanesAndTheCpu) {
  REQUIRE_GPU();
  const int N = 1100, C = 72;  // 35 chunks of 32 rows
  const auto x = random_floats(static_cast<size_t>(N) * C, 61), dout = random_floats(static_cast<size_t>(N) * C, 62);
  const auto w = random_floats(C, 63), b = random_floats(C, 64);
  std::vector<float> out(static_cast<size_t>(N) * C), mean(N), rstd(N);
  cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f, nullptr);
  std::vector<float> ref_dw(C, 0.0f), ref_db(C, 0.0f), ref_dx(static_cast<size_t>(N) * C, 0.0f);
  cpu().layernorm_backward(ref_dx.data(), ref_dw.data(), ref_db.data(), dout.data(), x.data(), w.data(), mean.data(),
                           rstd.data(), N, C);
  auto run = [&] {
    Dev dx(std::vector<float>(static_cast<size_t>(N) * C, 0.0f)), dw(std::vector<float>(C, 0.0f)),
        db(std::vector<float>(C, 0.0f)), gd(dout), gx(x), gw(w), gm(mean), gr(rstd);
    gpu().layernorm_backward(dx.f(), dw.f(), db.f(), gd.f(), gx.f(), gw.f(), gm.f(), gr.f(), N, C);
    return contents({&dw, &db});
  };
  const auto [on, off] = both_ways("partial_sums_lanes", run);
  std::vector<float> ref = ref_dw;
  ref.insert(ref.end(), ref_db.begin(), ref_db.end());
  NormBounds nb = norm_bounds(true, x, w, b, N, C, 1e-5f, dout);  // (the same mean and rstd on both sides)
  nb.dweight.insert(nb.dweight.end(), nb.dbias.begin(), nb.dbias.end());
  EXPECT_LT(rel_to_magnitude(on, ref, nb.dweight), 1.0);
  EXPECT_LT(rel_to_magnitude(off, ref, nb.dweight), 1.0);
}

// Fused attention (fp32 kernels): the tile order changes which block starts first, not a bit
// (Exact); the thread-per-row D sums hs products in another order than the warp's: out and lse the
// same bits (the forward has no D), dqkv within attention_bounds (each variant within its own
// side's bound of the exact values).
TEST(CudaPathsFallback, AttentionTileOrderAndRowDot) {
  REQUIRE_GPU();
  const FlashCase c{"paths", 2, 130, 4, 2, 64, true, false, 0.0f};
  const auto qkv = flash_qkv(c);
  auto run = [&] {
    Dev g(qkv), out(nans(c.n_out())), lse(nans(c.n_lse())), dout(flash_dout(c)), dqkv(flash_dqkv0(c));
    gpu().flash_attention_forward(out.f(), lse.f(), g.f(), nullptr, c.B, c.T, c.NH, c.NKV, c.hs, c.causal, 0.0f, 0,
                                  GemmPrecision::fp32);
    gpu().flash_attention_backward(dqkv.f(), dout.f(), out.f(), lse.f(), g.f(), nullptr, c.B, c.T, c.NH, c.NKV, c.hs,
                                   c.causal, 0.0f, 0, GemmPrecision::fp32);
    return contents({&out, &lse, &dqkv});
  };
  const auto [on, first_first] = both_ways("attention_tile_order", run);
  ASSERT_TRUE(all_finite(on));
  EXPECT_SAME_BITS(first_first, on);
  const auto [warp, thread] = both_ways("rowdot_warp", run);
  const size_t fwd = c.n_out() + c.n_lse();
  const AttnBounds ab = attention_bounds(qkv, {}, c.B, c.T, c.NH, c.NKV, c.hs, c.causal, 0.0f, 0, flash_dout(c),
                                         flash_dqkv0(c));
  EXPECT_SAME_BITS(std::vector<float>(thread.begin(), thread.begin() + fwd), std::vector<float>(warp.begin(), warp.begin() + fwd));
  EXPECT_LT(rel_to_magnitude(std::vector<float>(thread.begin() + fwd, thread.end()), std::vector<float>(warp.begin() + fwd, warp.end()),
                             ab.dqkv),
            1.0);
}

// GPT-2's bf16 GELU: our kernel writing act in bf16, or cuBLASLt's GELU epilogue in fp32 then
// converted. Bound: pre two tensor-core GEMMs, gemm_bound(bf16, C) of its magnitude; act_bf16 the
// bf16 roundings of two fp32 GELUs a, b of pre values that differ by that: |a − b| <= D =
// (1.13 gemm_bound + 16u + kLtGeluTol) |pre|'s magnitude (|gelu'| <= 1.13; ours 8u a side; cuBLASLt's
// GELU an estimate from an H100's measurement, 2.9e-6 of the norm: test_cuda_epilogues.cpp
// kLtGeluTol, to confirm), and each rounding moves a value by at most 2^-8 of it, so
// |rnd(a) − rnd(b)| <= D + 2^-8 (|a| + |b|) <= D + 2^-8 (1 + 2^-8)(|lt| + |ours|). Where GELU is near
// 0 (x well below 0: cuBLASLt's GELU gave 6.6e-11 where ours gave 0 or the reverse) D holds it.
TEST(CudaPathsFallback, Bf16GeluOutputThroughTheEpilogueThenConverted) {
  REQUIRE_GPU();
  const int N = 40, C = 64, OC = 256;
  const auto inp = random_floats(static_cast<size_t>(N) * C, 71), w = random_floats(static_cast<size_t>(OC) * C, 72);
  const auto b = random_floats(OC, 73);
  auto run = [&] {
    Dev x(inp), wt(w), bias(b), pre(nans(static_cast<size_t>(N) * OC));
    Dev act16(static_cast<size_t>(N) * OC * sizeof(uint16_t));
    gpu().matmul_gelu_forward(pre.f(), nullptr, x.f(), wt.f(), bias.f(), N, C, OC, GemmMode(GemmPrecision::bf16),
                              static_cast<uint16_t*>(act16.p));
    std::vector<uint16_t> bits(static_cast<size_t>(N) * OC);
    gpu().copy_to_host(bits.data(), act16.p, bits.size() * sizeof(uint16_t));
    std::vector<float> r = pre.get();
    for (uint16_t v : bits) r.push_back(bf16_bits_to_float(v));
    return r;
  };
  const auto [ours, lt] = both_ways("bf16_gelu_kernel", run);
  const size_t n = static_cast<size_t>(N) * OC;
  ASSERT_TRUE(all_finite(ours));
  ASSERT_TRUE(all_finite(lt));
  const std::vector<double> mag = matmul_out_magnitude(inp, w, b.data(), N, C, OC);
  const double gb = gemm_bound(GemmPrecision::bf16, C), kLtGeluTol = 1e-5;
  EXPECT_LT(rel_to_magnitude(std::vector<float>(lt.begin(), lt.begin() + n), std::vector<float>(ours.begin(), ours.begin() + n),
                             mag),
            gb);
  for (size_t k = n; k < 2 * n; k++)
    ASSERT_LE(std::fabs(lt[k] - ours[k]), (1.13 * gb + 16 * kU + kLtGeluTol) * mag[k - n] +
                                              0x1p-8 * (1 + 0x1p-8) * (std::fabs(lt[k]) + std::fabs(ours[k])))
        << "act " << k - n;
}

// AdamW's segment update four elements at a time or one: the same expression per element, so the
// same bits (parameters and both moments, over three steps). The table mixes segments whose four
// pointers are 16-byte aligned (n a multiple of 4 and not: the four-wide loop, then the tail) with
// segments whose parameter or state offset is not (the one-wide loop either way), and one with
// weight decay off.
TEST(CudaPathsFallback, AdamwSegmentsFourAtATimeGiveTheSameBits) {
  REQUIRE_GPU();
  //                                  offset state  n     decay
  const std::vector<UpdateSegment> segs = {{0, 0, 4096, 1},       {4096, 4096, 1027, 0}, {5124, 5124, 999, 1},
                                           {6125, 6128, 64, 1},   {6192, 6193, 33, 0}};
  const size_t np = 6225, ns = 6226;
  const auto p0 = random_floats(np, 81), m0 = random_floats(ns, 82, 0.0f, 0.1f);
  const auto v0 = random_floats(ns, 83, 0.0f, 0.01f);
  auto run = [&] {
    Dev p(p0), m(m0), v(v0), table(segs);
    for (int step = 1; step <= 3; step++) {
      Dev g(random_floats(np, 90 + step, -2.0f, 2.0f));
      gpu().adamw_update_segments(p.f(), g.f(), m.f(), v.f(), static_cast<UpdateSegment*>(table.p),
                                  static_cast<int>(segs.size()), 0.37f, nullptr, 0.0, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                  step);
    }
    return contents({&p, &m, &v});
  };
  const auto [on, off] = both_ways("adamw_vec4", run);
  ASSERT_TRUE(all_finite(on));
  EXPECT_NE(bit_difference(std::vector<float>(on.begin(), on.begin() + np), p0), "") << "no update";
  EXPECT_SAME_BITS(off, on);  // Exact: the same adamw_element per element, four at a time or one
}
