// The fused residual + norm ops (residual_layernorm_forward, residual_rmsnorm_forward): on the CPU
// bit for bit the two ops they fuse (residual_forward, then layernorm_forward / rmsnorm_forward),
// also with the residual written over its first input; on a GPU (skipped without one) the CUDA
// kernels against the CPU: the residual bit for bit (one float add), the norm's output, mean and
// rstd within 1e-5 relative (the op tests' tolerance: test_cuda_ops.cpp kOpTol; the sums run in
// another order), at a width below a warp, a ragged one and GPT-2's 768, and 65 rows (a partial block).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cuda_ops.h"
#include "backend/ops.h"
#include "runtime/rng.h"

using namespace llmpi;

namespace {

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * (float)(rng.uniform() * 2 - 1);
  return v;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

struct Out {
  std::vector<float> res, out, mean, rstd;
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
  Out r{std::vector<float>(NC), std::vector<float>(NC), std::vector<float>(N), std::vector<float>(N)};
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
        EXPECT_EQ(f.res, t.res);
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
        EXPECT_LT(rel(g.out, c.out), 1e-5);
        if (layernorm) {
          EXPECT_LT(rel(g.mean, c.mean), 1e-5);
        }
        EXPECT_LT(rel(g.rstd, c.rstd), 1e-5);
      }
}
