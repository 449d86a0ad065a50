// The 128-bit (float4) paths of the row and elementwise CUDA kernels (kernels/vector_access.cuh)
// against their scalar paths and the CPU backend. The kernels take float4 accesses when the row
// length is a multiple of 4 and every row pointer is 16-byte aligned, and fall back to one float
// per access otherwise. test_cuda_ops.cpp covers aligned rows (C = 768) and odd widths (C = 37);
// these tests add what only a pointer offset shows: the same op on the same values at an aligned
// address (float4) and one float further (scalar) must agree with the CPU within the ops' rounding
// bounds (cuda_test_util.h; the two paths sum a row in different orders, so their bits may differ,
// each within its side's bound), and the fused residual + norm must keep its contract — the bits of
// residual_forward then the norm — when its inputs a and b are misaligned but the residual and the
// output are not (float4 order, a and b read one float at a time).
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "grad_check.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

// A device copy of h placed `shift` floats into its allocation (allocations are 64-byte aligned,
// so shift 1 gives a 4-byte-aligned, not 16-byte-aligned, pointer).
struct Shifted {
  Dev buf;
  int shift;
  Shifted(const std::vector<float>& h, int s) : buf((h.size() + 4) * sizeof(float)), shift(s) {
    gpu().copy_to_device(buf.f() + shift, h.data(), h.size() * sizeof(float));
  }
  float* f() { return buf.f() + shift; }
  std::vector<float> get(size_t n) const {
    std::vector<float> h(n);
    gpu().copy_to_host(h.data(), static_cast<const float*>(buf.p) + shift, n * sizeof(float));
    return h;
  }
};

}  // namespace

TEST(CudaVectorAccess, LayerNormAlignedAndShiftedRowsMatchCpu) {
  REQUIRE_GPU();
  const int N = 67, C = 768;
  const auto x = random_floats(static_cast<size_t>(N) * C, 201, -2.0f, 2.0f);
  const auto w = random_floats(C, 202), b = random_floats(C, 203), dout = random_floats(x.size(), 204);
  const auto dx0 = random_floats(x.size(), 205), dw0 = random_floats(C, 206), db0 = random_floats(C, 207);
  std::vector<float> ro(x.size()), rm(N), rr(N);
  cpu().layernorm_forward(ro.data(), rm.data(), rr.data(), x.data(), w.data(), b.data(), N, C, 1e-5f, nullptr);
  auto rdx = dx0, rdw = dw0, rdb = db0;
  cpu().layernorm_backward(rdx.data(), rdw.data(), rdb.data(), dout.data(), x.data(), w.data(), rm.data(),
                           rr.data(), N, C);
  // Bound: norm_bounds, the GPU's backward reading its own forward's mean and rstd (their
  // differences from the CPU's carried through); the two GPU paths against each other the same
  const NormBounds nb = norm_bounds(true, x, w, b, N, C, 1e-5f, dout, dx0, dw0, db0, true);
  std::vector<float> outs[2], dxs[2];
  for (int shift : {0, 1}) {
    SCOPED_TRACE(shift ? "shifted rows (scalar path)" : "aligned rows (float4 path)");
    Shifted gx(x, shift), gw(w, shift), gb(b, shift), gout(nans(x.size()), shift), gdout(dout, shift),
        gdx(dx0, shift);
    Dev gm(nans(N)), gr(nans(N)), gdw(dw0), gdb(db0);
    gpu().layernorm_forward(gout.f(), gm.f(), gr.f(), gx.f(), gw.f(), gb.f(), N, C, 1e-5f, nullptr);
    outs[shift] = gout.get(x.size());
    EXPECT_LT(rel_to_magnitude(outs[shift], ro, nb.out), 1.0);
    EXPECT_LT(rel_to_magnitude(gm.get(), rm, nb.mean), 1.0);
    EXPECT_LT(rel_to_magnitude(gr.get(), rr, nb.rstd), 1.0);
    gpu().layernorm_backward(gdx.f(), gdw.f(), gdb.f(), gdout.f(), gx.f(), gw.f(), gm.f(), gr.f(), N, C);
    dxs[shift] = added(gdx.get(x.size()), dx0);
    EXPECT_LT(rel_to_magnitude(dxs[shift], added(rdx, dx0), nb.dinp), 1.0);
    EXPECT_LT(rel_to_magnitude(added(gdw.get(), dw0), added(rdw, dw0), nb.dweight), 1.0);
    EXPECT_LT(rel_to_magnitude(added(gdb.get(), db0), added(rdb, db0), nb.dbias), 1.0);
  }
  EXPECT_LT(rel_to_magnitude(outs[1], outs[0], nb.out), 1.0) << "float4 and scalar paths";
  EXPECT_LT(rel_to_magnitude(dxs[1], dxs[0], nb.dinp), 1.0) << "float4 and scalar paths";
}

TEST(CudaVectorAccess, RmsNormAlignedAndShiftedRowsMatchCpu) {
  REQUIRE_GPU();
  const int N = 67, C = 768;
  const auto x = random_floats(static_cast<size_t>(N) * C, 211, -2.0f, 2.0f);
  const auto w = random_floats(C, 212), dout = random_floats(x.size(), 213);
  const auto dx0 = random_floats(x.size(), 214), dw0 = random_floats(C, 215);
  std::vector<float> ro(x.size()), rr(N);
  cpu().rmsnorm_forward(ro.data(), rr.data(), x.data(), w.data(), N, C, 1e-6f, nullptr);
  auto rdx = dx0, rdw = dw0;
  cpu().rmsnorm_backward(rdx.data(), rdw.data(), dout.data(), x.data(), w.data(), rr.data(), N, C);
  // Bound: norm_bounds, the GPU's backward reading its own forward's rstd
  const NormBounds nb = norm_bounds(false, x, w, {}, N, C, 1e-6f, dout, dx0, dw0, {}, true);
  for (int shift : {0, 1}) {
    SCOPED_TRACE(shift ? "shifted rows (scalar path)" : "aligned rows (float4 path)");
    Shifted gx(x, shift), gw(w, shift), gout(nans(x.size()), shift), gdout(dout, shift), gdx(dx0, shift);
    Dev gr(nans(N)), gdw(dw0);
    gpu().rmsnorm_forward(gout.f(), gr.f(), gx.f(), gw.f(), N, C, 1e-6f, nullptr);
    EXPECT_LT(rel_to_magnitude(gout.get(x.size()), ro, nb.out), 1.0);
    EXPECT_LT(rel_to_magnitude(gr.get(), rr, nb.rstd), 1.0);
    gpu().rmsnorm_backward(gdx.f(), gdw.f(), gdout.f(), gx.f(), gw.f(), gr.f(), N, C);
    EXPECT_LT(rel_to_magnitude(added(gdx.get(x.size()), dx0), added(rdx, dx0), nb.dinp), 1.0);
    EXPECT_LT(rel_to_magnitude(added(gdw.get(), dw0), added(rdw, dw0), nb.dweight), 1.0);
  }
}

// Elementwise ops: the float4 body with its n % 4 tail (aligned), and one float at a time (shifted).
// Exact: a float add rounds once on both backends, so the residual is compared bit for bit. Bound:
// GELU as CudaOps.Gelu (16u |x|; backward 76u |dout| + 2u |d0|).
TEST(CudaVectorAccess, ElementwiseAlignedAndShiftedMatchCpu) {
  REQUIRE_GPU();
  const size_t n = 4099;  // 1024 quads and a tail of 3
  const auto a = random_floats(n, 221, -6.0f, 6.0f), b = random_floats(n, 222), d0 = random_floats(n, 223);
  std::vector<float> rsum(n), rg(n);
  cpu().residual_forward(rsum.data(), a.data(), b.data(), n);
  cpu().gelu_forward(rg.data(), a.data(), n);
  auto rd = d0;
  cpu().gelu_backward(rd.data(), a.data(), b.data(), n);
  for (int shift : {0, 1}) {
    SCOPED_TRACE(shift ? "shifted (scalar path)" : "aligned (float4 path)");
    Shifted ga(a, shift), gb(b, shift), gsum(nans(n), shift), gg(nans(n), shift), gd(d0, shift);
    gpu().residual_forward(gsum.f(), ga.f(), gb.f(), n);
    EXPECT_SAME_BITS(gsum.get(n), rsum);
    gpu().gelu_forward(gg.f(), ga.f(), n);
    EXPECT_LT(rel_to_magnitude(gg.get(n), rg, abs_d(a)), 16 * kU);
    gpu().gelu_backward(gd.f(), ga.f(), gb.f(), n);
    EXPECT_LT(rel_to_magnitude(added(gd.get(n), d0), added(rd, d0), plus_abs(abs_d(b, 76 * kU), d0, 2 * kU)), 1.0);
  }
}

// residual_layernorm_forward / residual_rmsnorm_forward with a and b one float off alignment while
// res, out and the weights are aligned: the float4 summation order with a and b read one float at a
// time; still the bits of residual_forward followed by the norm op on the same (aligned) buffers
// (Exact: the fused kernel finishes each row with the norm's own row code, in its order).
TEST(CudaVectorAccess, FusedResidualNormKeepsItsBitsWithShiftedInputs) {
  REQUIRE_GPU();
  const int N = 65, C = 768;
  const size_t NC = static_cast<size_t>(N) * C;
  const auto a = random_floats(NC, 231, -2.0f, 2.0f), b = random_floats(NC, 232);
  const auto w = random_floats(C, 233), bias = random_floats(C, 234);
  for (bool layernorm : {true, false})
    for (int ab_shift : {0, 1}) {
      SCOPED_TRACE(std::string(layernorm ? "layernorm" : "rmsnorm") + (ab_shift ? ", a and b shifted" : ""));
      Shifted ga(a, ab_shift), gb(b, ab_shift);
      Dev gw(w), gbias(bias);
      Dev fres(nans(NC)), fout(nans(NC)), fmean(nans(N)), frstd(nans(N));
      Dev ures(nans(NC)), uout(nans(NC)), umean(nans(N)), urstd(nans(N));
      gpu().residual_forward(ures.f(), ga.f(), gb.f(), NC);
      if (layernorm) {
        gpu().residual_layernorm_forward(fres.f(), fout.f(), fmean.f(), frstd.f(), ga.f(), gb.f(), gw.f(),
                                         gbias.f(), N, C, 1e-5f, nullptr);
        gpu().layernorm_forward(uout.f(), umean.f(), urstd.f(), ures.f(), gw.f(), gbias.f(), N, C, 1e-5f, nullptr);
        EXPECT_SAME_BITS(fmean.get(), umean.get());
      } else {
        gpu().residual_rmsnorm_forward(fres.f(), fout.f(), frstd.f(), ga.f(), gb.f(), gw.f(), N, C, 1e-6f, nullptr);
        gpu().rmsnorm_forward(uout.f(), urstd.f(), ures.f(), gw.f(), N, C, 1e-6f, nullptr);
      }
      EXPECT_SAME_BITS(fres.get(), ures.get());
      EXPECT_SAME_BITS(fout.get(), uout.get());
      EXPECT_SAME_BITS(frstd.get(), urstd.get());
    }
}
