// The fused residual + norm ops (residual_layernorm_forward, residual_rmsnorm_forward): on the CPU
// bit for bit the two ops they fuse (residual_forward, then layernorm_forward / rmsnorm_forward),
// also with the residual written over its first input (Exact: the same loops on the same values);
// on a GPU (skipped without one) the CUDA kernels against the CPU: the residual bit for bit (one
// float add), the norm's output, mean and rstd element by element within twice the norms' rounding
// bound (ref_transformer.h layernorm_err / rmsnorm_err: the kernels compute the same operations,
// their sums in other orders), at a width below a warp, a ragged one and GPT-2's 768, and 65 rows
// (a partial block).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "ref_transformer.h"
#include "runtime/rng.h"

using namespace llmpi;

namespace {

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * (float)(rng.uniform() * 2 - 1);
  return v;
}

struct Out {
  std::vector<float> res, out, mean, rstd, w, bias;
};

// The fused op (or the two ops) on `o`, layernorm or rmsnorm; in_place: res written over a.
Out run(const Ops& o, bool layernorm, bool fused, bool in_place, int N, int C) {
  const size_t NC = (size_t)N * C;
  const std::vector<float> a = random_floats(NC, 1, 2.0f), b = random_floats(NC, 2), w = random_floats(C, 3),
                           bias = random_floats(C, 4);
  auto dev = [&](const std::vector<float>& h) {
    float* p = static_cast<float*>(o.alloc(h.size() * sizeof(float)));
    o.copy_to_device(p, h.data(), h.size() * sizeof(float));
    return p;
  };
  float *da = dev(a), *db = dev(b), *dw = dev(w), *dbias = dev(bias);
  float* dres = in_place ? da : static_cast<float*>(o.alloc(NC * sizeof(float)));
  float* dout = static_cast<float*>(o.alloc(NC * sizeof(float)));
  float* dmean = static_cast<float*>(o.alloc(N * sizeof(float)));
  float* drstd = static_cast<float*>(o.alloc(N * sizeof(float)));
  const float eps = 1e-5f;
  if (fused) {
    if (layernorm)
      o.residual_layernorm_forward(dres, dout, dmean, drstd, da, db, dw, dbias, N, C, eps, nullptr);
    else
      o.residual_rmsnorm_forward(dres, dout, drstd, da, db, dw, N, C, eps, nullptr);
  } else {
    o.residual_forward(dres, da, db, NC);
    if (layernorm)
      o.layernorm_forward(dout, dmean, drstd, dres, dw, dbias, N, C, eps, nullptr);
    else
      o.rmsnorm_forward(dout, drstd, dres, dw, N, C, eps, nullptr);
  }
  Out r{std::vector<float>(NC), std::vector<float>(NC), std::vector<float>(N), std::vector<float>(N), w, bias};
  o.copy_to_host(r.res.data(), dres, NC * sizeof(float));
  o.copy_to_host(r.out.data(), dout, NC * sizeof(float));
  if (layernorm) o.copy_to_host(r.mean.data(), dmean, N * sizeof(float));
  o.copy_to_host(r.rstd.data(), drstd, N * sizeof(float));
  for (float* p : {da, db, dw, dbias, dout, dmean, drstd}) o.free(p);
  if (!in_place) o.free(dres);
  return r;
}

struct Shape {
  int N, C;
};
const Shape kShapes[] = {{65, 7}, {65, 100}, {33, 768}};

}  // namespace

TEST(ResidualNorm, CpuFusedEqualsTheTwoOps) {
  for (bool layernorm : {true, false})
    for (bool in_place : {false, true})
      for (Shape s : kShapes) {
        SCOPED_TRACE(std::string(layernorm ? "layernorm" : "rmsnorm") + (in_place ? " in place " : " ") +
                     std::to_string(s.N) + "x" + std::to_string(s.C));
        const Out f = run(cpu_ops(), layernorm, true, in_place, s.N, s.C);
        const Out t = run(cpu_ops(), layernorm, false, in_place, s.N, s.C);
        EXPECT_EQ(f.res, t.res);  // Exact (see the top)
        EXPECT_EQ(f.out, t.out);
        EXPECT_EQ(f.mean, t.mean);
        EXPECT_EQ(f.rstd, t.rstd);
        // and it did normalise: a LayerNorm row with unit weight would have mean 0; here, rstd > 0
        for (float r : f.rstd) EXPECT_GT(r, 0.0f);
      }
}

TEST(ResidualNorm, CudaMatchesCpu) {
  std::string why;
  if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (bool layernorm : {true, false})
    for (bool in_place : {false, true})
      for (Shape s : kShapes) {
        SCOPED_TRACE(std::string(layernorm ? "layernorm" : "rmsnorm") + (in_place ? " in place " : " ") +
                     std::to_string(s.N) + "x" + std::to_string(s.C));
        const Out g = run(cuda_ops(), layernorm, true, in_place, s.N, s.C);
        const Out c = run(cpu_ops(), layernorm, true, in_place, s.N, s.C);
        EXPECT_EQ(g.res, c.res);
        // Bound: each side within the norm's bound of the exact norm of res (the same bits on
        // both), so the two within twice it.
        const test::NormErr e = layernorm ? test::layernorm_err(c.res, c.w, c.bias, s.N, s.C, 1e-5f)
                                          : test::rmsnorm_err(c.res, c.w, s.N, s.C, 1e-5f);
        auto twice = [](const std::vector<test::Err>& x) {
          std::vector<double> b = test::errors(x);
          for (double& v : b) v *= 2.0;
          return b;
        };
        EXPECT_TRUE(test::within_bound(g.out, test::to_double(c.out), twice(e.out), "out"));
        if (layernorm) {
          EXPECT_TRUE(test::within_bound(g.mean, test::to_double(c.mean), twice(e.mean), "mean"));
        }
        EXPECT_TRUE(test::within_bound(g.rstd, test::to_double(c.rstd), twice(e.rstd), "rstd"));
      }
}
