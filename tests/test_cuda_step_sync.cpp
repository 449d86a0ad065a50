// The CUDA side of a training step without host synchronisation (CPU side and contracts:
// test_step_sync.cpp, backend/op_list.h): every non-waiting op against the CPU op, and the host
// waits of a Model forward and of a trainer step counted. Skipped without a GPU (never run yet).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda_ops.h"
#include "cuda_test_util.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "mpi_test_data.h"
#include "optim/optimizer.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

// A device buffer of raw bytes (a StepScalars, a segment table).
template <typename T>
T get_one(const void* dev) {
  T v;
  gpu().copy_to_host(&v, dev, sizeof v);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Bound of the segment updates against the CPU op: adamw_bound / sgd_bound (cuda_test_util.h),
// element by element over the steps so far, from the gradients both sides read (the same floats
// g·clip, each rounded once on both sides) and each segment's weight decay.
struct UpdateBounds {
  std::vector<double> p, m, v;
};
UpdateBounds update_bounds(bool sgd, const std::vector<float>& p0, const std::vector<std::vector<float>>& g,
                           const std::vector<UpdateSegment>& segs, float wd) {
  UpdateBounds b;
  b.p.assign(p0.size(), 0.0), b.m.assign(p0.size(), 0.0), b.v.assign(p0.size(), 0.0);
  std::vector<double> gi(g.size());
  for (const UpdateSegment& sg : segs)
    for (size_t i = sg.offset; i < sg.offset + sg.n; i++) {
      for (size_t t = 0; t < g.size(); t++) gi[t] = g[t][i];
      const double w = sg.decay ? wd : 0.0f;
      if (sgd) {
        b.p[i] = sgd_bound(p0[i], gi.data(), static_cast<int>(g.size()), 1e-2f, w);
      } else {
        const OptBound o = adamw_bound(p0[i], gi.data(), static_cast<int>(g.size()), 1e-2f, 0.9f, 0.95f, 1e-8f, w);
        b.p[i] = o.p, b.m[i] = o.m, b.v[i] = o.v;
      }
    }
  return b;
}

// The gradient the segment ops read: g · clip rounded to float (g itself when clip is 1).
std::vector<float> clipped(const std::vector<float>& g, float clip) {
  std::vector<float> r(g.size());
  for (size_t i = 0; i < g.size(); i++) r[i] = g[i] * clip;  // a lone product: rounded once
  return r;
}

}  // namespace

TEST(CudaStepSync, SoftmaxXentRecordMatchesCpu) {
  REQUIRE_GPU();
  const int N = 37, V = 5003, row0 = 1000;
  auto z = random_floats((size_t)N * V, 61, -4.0f, 4.0f);
  z[7] = 60.0f;  // a dominant logit
  auto y = random_ints(N, 62, 0, V);
  for (bool with_bad : {false, true}) {
    if (with_bad) y[20] = V, y[30] = -1;  // the first bad row is 20
    for (float gs : {0.0f, 0.37f}) {
      auto rz = z;
      std::vector<float> rl(N);
      uint64_t rbad = 0;
      cpu().softmax_xent_record(rz.data(), V, rl.data(), y.data(), N, V, gs, &rbad, row0);
      Dev gz(z), gl(nans(N)), gy(y), gbad(std::vector<uint64_t>{0});
      const uint64_t waits = cuda_host_waits();
      gpu().softmax_xent_record(gz.f(), V, gl.f(), gy.i(), N, V, gs, static_cast<uint64_t*>(gbad.p), row0);
      EXPECT_EQ(cuda_host_waits(), waits) << "softmax_xent_record must not wait";
      EXPECT_EQ(get_one<uint64_t>(gbad.p), rbad) << "the same first bad row and target";
      if (with_bad) {
        EXPECT_EQ(bad_target_row(rbad), row0 + 20);
      }
      auto l = gl.get(), zz = gz.get();
      const XentBounds xb = xent_bounds(z.data(), V, y.data(), N, V, gs);  // Bound: xent_bounds
      for (int n = 0; n < N; n++) {
        if (y[n] < 0 || y[n] >= V) {
          EXPECT_TRUE(std::isnan(l[n])) << "bad row " << n;
          // Exact: untouched
          EXPECT_EQ(0, std::memcmp(&zz[(size_t)n * V], &z[(size_t)n * V], V * sizeof(float))) << "bad row untouched";
          l[n] = rl[n] = 0;  // leave the bad rows out of the comparison below
          std::memcpy(&zz[(size_t)n * V], &rz[(size_t)n * V], V * sizeof(float));
        }
      }
      EXPECT_LT(rel_to_magnitude(l, rl, xb.loss), 1.0) << "grad_scale " << gs;
      if (gs == 0.0f)
        EXPECT_TRUE(same_bits(zz, rz)) << "logits untouched without a gradient";  // Exact
      else
        EXPECT_LT(rel_to_magnitude(zz, rz, xb.grad), 1.0);
    }
  }
}

TEST(CudaStepSync, SumSquaresAddAndSumToDoubleMatchCpu) {
  REQUIRE_GPU();
  for (size_t n : {size_t(1), size_t(1000), size_t(3000017)}) {
    const auto x = random_floats(n, 63, -3.0f, 3.0f);
    Dev gx(x), acc(std::vector<double>{0.0, 1.5, -7.0});
    double* d = static_cast<double*>(acc.p);
    const uint64_t waits = cuda_host_waits();
    gpu().sum_squares_add(d, gx.f(), n);
    gpu().sum_squares_add(d + 1, gx.f(), n);
    gpu().sum_to_double(d + 2, gx.f(), n);
    EXPECT_EQ(cuda_host_waits(), waits) << "no host wait";
    double got[3];
    gpu().copy_to_host(got, d, sizeof got);
    const double ss = gpu().sum_squares(gx.f(), n);
    // Exact: the same two passes as sum_squares, then 0 + s, 1.5 + s in double on both
    EXPECT_EQ(std::memcmp(&got[0], &ss, sizeof ss), 0) << "0 + the sum: sum_squares' double, n=" << n;
    const double shifted = 1.5 + ss;
    EXPECT_EQ(std::memcmp(&got[1], &shifted, sizeof ss), 0) << "accumulates, n=" << n;
    // Bound: as CudaOps.SumSquaresAndScale (positive terms exact in double, chains of at most
    // 65536 + n/65536 + 64 additions)
    EXPECT_LT(std::fabs(got[0] - cpu().sum_squares(x.data(), n)) / got[0], 2 * gamma_n(65536.0 + n / 65536.0 + 64, 0x1p-53))
        << n;
    double ref = 0, sabs = 0;
    cpu().sum_to_double(&ref, x.data(), n);
    for (float v : x) sabs += std::fabs(v);
    // Bound: x exact in double, summed in double (u = 2^-53): the CPU in index order (a chain of n),
    // the card per thread (<= n/262144 + 1 terms) then two block trees (18 levels)
    EXPECT_LT(std::fabs(got[2] - ref), (gamma_n(n, 0x1p-53) + gamma_n(n / 262144.0 + 20, 0x1p-53)) * sabs) << n;
    gpu().sum_to_double(d + 2, gx.f(), n);
    EXPECT_EQ(get_one<double>(d + 2), got[2]) << "deterministic, n=" << n;  // Exact
  }
}

TEST(CudaStepSync, SegmentUpdatesMatchCpuAndScaleThenUpdate) {
  REQUIRE_GPU();
  const ModelDesc d = desc_of("gpt2", 2, 2, 64, 16, 4800);  // a 307200-float embedding: several segments
  const ParamTable t = build_param_table(d);
  const size_t n = t.numel;
  const auto segs = update_segments(t, 0, n, 0);
  for (bool sgd : {false, true})
    for (float clip : {1.0f, 0.37f}) {
      const auto p0 = random_floats(n, 64);
      std::vector<std::vector<float>> seen;  // the gradients the updates read
      std::vector<float> cp = p0, cm(n), cv(n);
      const std::vector<float> zeros(n, 0.0f);
      Dev gp(p0), gm(zeros), gv(zeros);  // the segment ops
      Dev rp(p0), rm(zeros), rv(zeros);  // scale() then the per-segment op
      Dev table(segs);
      for (int step = 1; step <= 3; step++) {
        const auto g = random_floats(n, 65 + step, -2.0f, 2.0f);
        seen.push_back(clipped(g, clip));
        Dev gg(g), rg(g);
        if (sgd) {
          cpu().sgd_update_segments(cp.data(), g.data(), segs.data(), (int)segs.size(), clip, nullptr, 0.0, 1e-2f,
                                    0.1f);
          gpu().sgd_update_segments(gp.f(), gg.f(), static_cast<UpdateSegment*>(table.p), (int)segs.size(), clip,
                                    nullptr, 0.0, 1e-2f, 0.1f);
        } else {
          cpu().adamw_update_segments(cp.data(), g.data(), cm.data(), cv.data(), segs.data(), (int)segs.size(), clip,
                                      nullptr, 0.0, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
          gpu().adamw_update_segments(gp.f(), gg.f(), gm.f(), gv.f(), static_cast<UpdateSegment*>(table.p),
                                      (int)segs.size(), clip, nullptr, 0.0, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        }
        if (clip != 1.0f) gpu().scale(rg.f(), clip, n);
        for (const UpdateSegment& s : segs) {
          const float wd = s.decay ? 0.1f : 0.0f;
          if (sgd)
            gpu().sgd_update(rp.f() + s.offset, rg.f() + s.offset, s.n, 1e-2f, wd);
          else
            gpu().adamw_update(rp.f() + s.offset, rg.f() + s.offset, rm.f() + s.offset, rv.f() + s.offset, s.n,
                               1e-2f, 0.9f, 0.95f, 1e-8f, wd, step);
        }
        EXPECT_TRUE(same_bits(gg.get(), g)) << "gradients are not written";
      }
      const char* what = sgd ? "sgd" : "adamw";
      const UpdateBounds ub = update_bounds(sgd, p0, seen, segs, 0.1f);
      EXPECT_LT(rel_to_magnitude(gp.get(), cp, ub.p), 1.0) << what << " clip " << clip;
      // Exact: each element's g·clip rounded on its own (never fused), then the same update
      EXPECT_TRUE(same_bits(gp.get(), rp.get())) << what << " clip " << clip << ": not the bits of scale() + update";
      if (!sgd) {
        EXPECT_LT(rel_to_magnitude(gm.get(), cm, ub.m), 1.0);
        EXPECT_LT(rel_to_magnitude(gv.get(), cv, ub.v), 1.0);
        EXPECT_TRUE(same_bits(gv.get(), rv.get()));
      }
    }
}

// adamw/sgd_update_segments given the step's scalars in device memory (the one-rank trainer's
// path): the clip factor computed by the kernel from the device's Σg² must be the host's float, so
// the update is the bits of the same kernel given clip_factor(sqrt(Σg²), max_norm) from the host;
// and it matches the CPU op (the oracle) within the op tolerance. Clipping off (max_norm 0),
// inactive and active; with and without weight decay; the moments carried over three steps.
TEST(CudaStepSync, DeviceScalarUpdateMatchesHostClipAndCpu) {
  REQUIRE_GPU();
  const ModelDesc d = desc_of("gpt2", 2, 2, 64, 16, 4800);  // several segments
  const ParamTable t = build_param_table(d);
  const size_t n = t.numel;
  const auto segs = update_segments(t, 0, n, 0);
  const int ns = (int)segs.size();
  Dev table(segs);
  const UpdateSegment* gsegs = static_cast<const UpdateSegment*>(table.p);
  for (bool sgd : {false, true})
    for (float wd : {0.0f, 0.1f})
      for (double max_norm : {0.0, 1e6, 1.0}) {
        const std::string what = std::string(sgd ? "sgd" : "adamw") + " wd " + std::to_string(wd) + " max_norm " +
                                 std::to_string(max_norm);
        const auto p0 = random_floats(n, 171);
        const std::vector<float> zeros(n, 0.0f);
        std::vector<float> cp = p0, cm(n), cv(n);  // the CPU op with the scalars
        Dev dp(p0), dm(zeros), dv(zeros);          // the GPU op with the scalars (device path)
        Dev hp(p0), hm(zeros), hv(zeros);          // the GPU op with the host's clip factor
        std::vector<std::vector<float>> seen;      // the gradients the updates read
        for (int step = 1; step <= 3; step++) {
          const auto g = random_floats(n, 172 + step, -2.0f, 2.0f);
          Dev gg(g);
          StepScalars start;
          start.loss_sum = 42.5;  // grad_sumsq 0: Σg² is added on the device below, as the trainer does
          Dev dsc(std::vector<StepScalars>{start});
          StepScalars* ds = static_cast<StepScalars*>(dsc.p);
          gpu().sum_squares_add(&ds->grad_sumsq, gg.f(), n);
          const StepScalars sc = get_one<StepScalars>(ds);  // what the host would have read back
          const float clip = clip_factor(std::sqrt(sc.grad_sumsq), max_norm);
          if (max_norm == 1.0) {
            EXPECT_LT(clip, 1.0f) << "the clip must be active here";
          }
          seen.push_back(clipped(g, clip));
          const UpdateBounds ub = update_bounds(sgd, p0, seen, segs, wd);
          const uint64_t waits = cuda_host_waits();
          if (sgd) {
            gpu().sgd_update_segments(dp.f(), gg.f(), gsegs, ns, 0.5f, ds, max_norm, 1e-2f, wd);
            gpu().sgd_update_segments(hp.f(), gg.f(), gsegs, ns, clip, nullptr, 0.0, 1e-2f, wd);
            cpu().sgd_update_segments(cp.data(), g.data(), segs.data(), ns, 0.5f, &sc, max_norm, 1e-2f, wd);
          } else {
            gpu().adamw_update_segments(dp.f(), gg.f(), dm.f(), dv.f(), gsegs, ns, 0.5f, ds, max_norm, 1e-2f, 0.9f,
                                        0.95f, 1e-8f, wd, step);
            gpu().adamw_update_segments(hp.f(), gg.f(), hm.f(), hv.f(), gsegs, ns, clip, nullptr, 0.0, 1e-2f, 0.9f,
                                        0.95f, 1e-8f, wd, step);
            cpu().adamw_update_segments(cp.data(), g.data(), cm.data(), cv.data(), segs.data(), ns, 0.5f, &sc,
                                        max_norm, 1e-2f, 0.9f, 0.95f, 1e-8f, wd, step);
          }
          EXPECT_EQ(cuda_host_waits(), waits) << "the device path reads nothing back";
          // Exact: the kernel's clip factor is the host's float, then the same kernel
          EXPECT_TRUE(same_bits(dp.get(), hp.get())) << what << " step " << step << ": not the host clip's bits";
          EXPECT_LT(rel_to_magnitude(dp.get(), cp, ub.p), 1.0) << what << " step " << step;  // Bound: update_bounds
          if (!sgd) {
            EXPECT_TRUE(same_bits(dm.get(), hm.get())) << what;
            EXPECT_TRUE(same_bits(dv.get(), hv.get())) << what;
            EXPECT_LT(rel_to_magnitude(dm.get(), cm, ub.m), 1.0) << what;
            EXPECT_LT(rel_to_magnitude(dv.get(), cv, ub.v), 1.0) << what;
          }
        }
      }
}

// A non-finite loss sum or Σg² (or a recorded bad target) in the device scalars: the update
// kernel writes nothing, bit for bit, as the CPU op.
TEST(CudaStepSync, DeviceScalarSkipMatchesCpu) {
  REQUIRE_GPU();
  const ModelDesc d = desc_of("gpt2", 1, 2, 32, 8, 300);
  const ParamTable t = build_param_table(d);
  const size_t n = t.numel;
  const auto segs = update_segments(t, 0, n, 0);
  const int ns = (int)segs.size();
  Dev table(segs);
  const UpdateSegment* gsegs = static_cast<const UpdateSegment*>(table.p);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  auto g = random_floats(n, 190, -1.0f, 1.0f);
  g[n / 3] = kNaN;
  Dev gg(g);
  const auto p0 = random_floats(n, 191), m0 = random_floats(n, 192), v0 = random_floats(n, 193, 0.0f, 1.0f);
  std::vector<StepScalars> bad(6);
  for (StepScalars& b : bad) b.loss_sum = 10.0, b.grad_sumsq = 4.0;
  bad[0].grad_sumsq = nan, bad[1].grad_sumsq = inf, bad[2].loss_sum = nan, bad[3].loss_sum = inf,
  bad[4].loss_sum = -inf, bad[5].bad_target = encode_bad_target(2, 7);
  for (bool sgd : {false, true})
    for (size_t k = 0; k < bad.size(); k++) {
      Dev dp(p0), dm(m0), dv(v0), dsc(std::vector<StepScalars>{bad[k]});
      const StepScalars* ds = static_cast<const StepScalars*>(dsc.p);
      if (sgd)
        gpu().sgd_update_segments(dp.f(), gg.f(), gsegs, ns, 1.0f, ds, 1.0, 1e-2f, 0.1f);
      else
        gpu().adamw_update_segments(dp.f(), gg.f(), dm.f(), dv.f(), gsegs, ns, 1.0f, ds, 1.0, 1e-2f, 0.9f, 0.95f,
                                    1e-8f, 0.1f, 3);
      // Exact: nothing written
      EXPECT_TRUE(same_bits(dp.get(), p0)) << (sgd ? "sgd" : "adamw") << " case " << k << ": parameters written";
      EXPECT_TRUE(same_bits(dm.get(), m0)) << "case " << k;
      EXPECT_TRUE(same_bits(dv.get(), v0)) << "case " << k;
    }
  // Finite scalars: the same call updates (the skip was the scalars' doing).
  StepScalars ok;
  ok.loss_sum = 10.0, ok.grad_sumsq = 4.0;
  const auto gf = random_floats(n, 194, -1.0f, 1.0f);
  Dev gfd(gf), dp(p0), dsc(std::vector<StepScalars>{ok});
  gpu().sgd_update_segments(dp.f(), gfd.f(), gsegs, ns, 1.0f, static_cast<const StepScalars*>(dsc.p), 1.0, 1e-2f,
                            0.1f);
  EXPECT_FALSE(same_bits(dp.get(), p0));
}

// copy_to_device_async: no host wait, and the host buffer may be overwritten as soon as the call
// returns — more uploads in a row than the staging ring has slots, each from the same host buffer
// refilled at once, all land intact; after a wait the ring's slots are free, so uploads then wait
// for nothing.
TEST(CudaStepSync, AsyncUploadMatchesCpuCopy) {
  REQUIRE_GPU();
  const size_t n = 70000;  // 280 KB: an upload of a B = 64, T = 1024 batch's tokens is 256 KB
  const int uploads = 21;
  Dev dst(static_cast<size_t>(uploads) * n * sizeof(int32_t));
  std::vector<int32_t> host(n), want(static_cast<size_t>(uploads) * n);
  for (int u = 0; u < uploads; u++) {
    for (size_t i = 0; i < n; i++) host[i] = static_cast<int32_t>(u * 1000003 + i);
    std::memcpy(&want[u * n], host.data(), n * sizeof(int32_t));
    gpu().copy_to_device_async(dst.i() + u * n, host.data(), n * sizeof(int32_t));
    std::fill(host.begin(), host.end(), -1);  // reused at once
  }
  std::vector<int32_t> got(want.size());
  gpu().copy_to_host(got.data(), dst.p, got.size() * sizeof(int32_t));
  EXPECT_EQ(got, want);
  cuda_synchronize();
  const uint64_t waits = cuda_host_waits();
  for (int u = 0; u < 8; u++) gpu().copy_to_device_async(dst.i() + u * n, host.data(), n * sizeof(int32_t));
  EXPECT_EQ(cuda_host_waits(), waits) << "after a wait, eight uploads (the ring) wait for nothing";
  gpu().copy_to_host(got.data(), dst.p, n * sizeof(int32_t));
  EXPECT_EQ(got[0], -1);
  EXPECT_EQ(got[n - 1], -1);
}

TEST(CudaStepSync, ForwardQueuedWaitsForNothing) {
  REQUIRE_GPU();
  ModelDesc d = desc_of("gpt2", 2, 2, 64, 32, 500);
  d.lm_head_chunk_rows = 24;  // several chunks: once one host wait per chunk
  Model mg(d, gpu()), mc(d, cpu());
  mg.init_params(5);
  mc.init_params(5);
  RandomBatch rb(d, 3, 32, 6);
  Activations ag, ac;
  // A first pass allocates (activations, backward scratch: alloc waits); not part of a step.
  mg.forward_queued(ag, rb.b, HeadMode::train);
  mg.zero_grads();
  mg.backward(ag);
  mg.read_scalars(ag);
  mg.zero_grads();
  const uint64_t waits = cuda_host_waits(), reads = gpu().readback_count();
  mg.forward_queued(ag, rb.b, HeadMode::train);
  EXPECT_EQ(cuda_host_waits() - waits, 0u) << "the uploads of tokens and targets (load_batch) do not wait";
  mg.backward(ag);
  EXPECT_EQ(cuda_host_waits() - waits, 0u) << "backward (the head's recomputed chunks included) waits for nothing";
  const StepScalars s = mg.read_scalars(ag);
  EXPECT_EQ(cuda_host_waits() - waits, 1u) << "one readback";
  EXPECT_EQ(gpu().readback_count() - reads, 1u);
  const float lg = mg.loss_of(s, ag), lc = mc.forward(ac, rb.b, HeadMode::train);
  // Bound: the whole-model estimate of CudaModel.LossAndEveryGradientMatchCpu (test_cuda_ops.cpp),
  // 2 gamma_n(L) with L < 4096 the summed lengths of the forward's sums (V = 500 here)
  EXPECT_LT(std::fabs(lg - lc) / lc, 2 * gamma_n(4096)) << lg << " vs " << lc;
  EXPECT_EQ(s.bad_target, 0u);
}

// The trainer's single-model step on the GPU at world size 1, counted over the steps of two runs
// that differ only in length: per step 2 host waits — the one readback (loss, gradient norm,
// bad-target flag), which now comes after the optimizer (the update computed the clip factor and
// the non-finite skip from the device's scalars itself), and the step-end cuda_synchronize (the
// step boundary; the stream is idle by then). The batch uploads (copy_to_device_async, staged
// through page-locked slots) and everything between them and the readback do not wait.
TEST(CudaStepSync, TrainerStepWaitsAtTheReadbackAndTheStepEnd) {
  REQUIRE_GPU();
  using namespace testing_support;
  const std::string dir = shared_temp_dir(MPI_COMM_SELF);
  const std::string tr = make_pattern_file(MPI_COMM_SELF, dir, "train.h5", 20000, 64, 7);
  std::vector<float> cpu_losses;
  for (const char* device : {"cpu", "cuda"}) {
    uint64_t waits[2] = {0, 0}, reads[2] = {0, 0};
    std::vector<float> losses;
    for (int k = 0; k < 2; k++) {
      const Config cfg = tiny_config(tr, {"model.vocab_size=0", "train.steps=" + std::to_string(k ? 7 : 3),
                                          "train.grad_clip=0.05", "train.warmup_steps=1",
                                          std::string("runtime.device=") + device});
      const bool on_gpu = std::string(device) == "cuda";
      const uint64_t w0 = on_gpu ? cuda_host_waits() : 0;
      const uint64_t r0 = on_gpu ? gpu().readback_count() : cpu().readback_count();
      const TrainResult r = train(cfg, MPI_COMM_SELF, quiet_options(false));
      waits[k] = on_gpu ? cuda_host_waits() - w0 : 0;
      reads[k] = (on_gpu ? gpu().readback_count() : cpu().readback_count()) - r0;
      losses = r.losses;
    }
    EXPECT_EQ(reads[1] - reads[0], 4u) << device << ": one readback per step";
    if (std::string(device) == "cuda") {
      EXPECT_EQ(waits[1] - waits[0], 4u * 2u) << "per step: the readback and the step's end";
      ASSERT_EQ(losses.size(), cpu_losses.size());
      // Bound (an estimate, to confirm on a card): training carries each step's difference on; the
      // loss curves' sensitivity to an fp32 ulp in every parameter, measured on the CPU with the
      // CudaModel models, is 3.7e-6 over 20 steps (docs/PRECISION.md): 1e-4 over these 7 leaves
      // room for a step's GPU-CPU difference of ~25 ulps.
      for (size_t i = 0; i < losses.size(); i++)
        EXPECT_LT(std::fabs(losses[i] - cpu_losses[i]) / cpu_losses[i], 1e-4) << "step " << i;
    } else {
      cpu_losses = losses;
    }
  }
}
