// The CUDA side of a training step without host synchronisation (CPU side and contracts:
// test_step_sync.cpp, backend/op_list.h): every non-waiting op against the CPU op, and the host
// waits of a Model forward and of a trainer step counted. Skipped without a GPU (never run yet).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

constexpr double kOpTol = 1e-5;  // the op tolerance of test_cuda_ops.cpp (fp32, other summation order)

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
      cpu().softmax_xent_record(rz.data(), rl.data(), y.data(), N, V, gs, &rbad, row0);
      Dev gz(z), gl(nans(N)), gy(y), gbad(std::vector<uint64_t>{0});
      const uint64_t waits = cuda_host_waits();
      gpu().softmax_xent_record(gz.f(), gl.f(), gy.i(), N, V, gs, static_cast<uint64_t*>(gbad.p), row0);
      EXPECT_EQ(cuda_host_waits(), waits) << "softmax_xent_record must not wait";
      EXPECT_EQ(get_one<uint64_t>(gbad.p), rbad) << "the same first bad row and target";
      if (with_bad) {
        EXPECT_EQ(bad_target_row(rbad), row0 + 20);
      }
      auto l = gl.get(), zz = gz.get();
      for (int n = 0; n < N; n++) {
        if (y[n] < 0 || y[n] >= V) {
          EXPECT_TRUE(std::isnan(l[n])) << "bad row " << n;
          EXPECT_EQ(0, std::memcmp(&zz[(size_t)n * V], &z[(size_t)n * V], V * sizeof(float))) << "bad row untouched";
          l[n] = rl[n] = 0;  // leave the bad rows out of the comparison below
          std::memcpy(&zz[(size_t)n * V], &rz[(size_t)n * V], V * sizeof(float));
        }
      }
      EXPECT_LT(rel(l, rl), kOpTol) << "grad_scale " << gs;
      if (gs == 0.0f)
        EXPECT_TRUE(same_bits(zz, rz)) << "logits untouched without a gradient";
      else
        EXPECT_LT(rel(zz, rz), kOpTol);
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
    EXPECT_EQ(std::memcmp(&got[0], &ss, sizeof ss), 0) << "0 + the sum: sum_squares' double, n=" << n;
    const double shifted = 1.5 + ss;
    EXPECT_EQ(std::memcmp(&got[1], &shifted, sizeof ss), 0) << "accumulates, n=" << n;
    EXPECT_LT(std::fabs(got[0] - cpu().sum_squares(x.data(), n)) / got[0], 1e-10) << n;
    double ref = 0;
    cpu().sum_to_double(&ref, x.data(), n);
    EXPECT_LT(std::fabs(got[2] - ref), 1e-10 * (std::fabs(ref) + n)) << n;  // doubles, other order
    gpu().sum_to_double(d + 2, gx.f(), n);
    EXPECT_EQ(get_one<double>(d + 2), got[2]) << "deterministic, n=" << n;
  }
}

TEST(CudaStepSync, SegmentUpdatesMatchCpuAndScaleThenUpdate) {
  REQUIRE_GPU();
  const ModelDesc d = desc_of("gpt2", 2, 2, 64, 16, 4800);  // a 307200-float embedding: several segments
  const ParamTable t = build_param_table(d);
  const size_t n = t.numel;
  const auto segs = update_segments(t, 0, n, 0);
  TrainConfig tc;
  tc.weight_decay = 0.1;
  for (bool sgd : {false, true})
    for (float clip : {1.0f, 0.37f}) {
      const auto p0 = random_floats(n, 64);
      std::vector<float> cp = p0, cm(n), cv(n);
      const std::vector<float> zeros(n, 0.0f);
      Dev gp(p0), gm(zeros), gv(zeros);  // the segment ops
      Dev rp(p0), rm(zeros), rv(zeros);  // scale() then the per-segment op
      Dev table(segs);
      for (int step = 1; step <= 3; step++) {
        const auto g = random_floats(n, 65 + step, -2.0f, 2.0f);
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
      EXPECT_LT(rel(gp.get(), cp), kOpTol) << what << " clip " << clip;
      EXPECT_TRUE(same_bits(gp.get(), rp.get())) << what << " clip " << clip << ": not the bits of scale() + update";
      if (!sgd) {
        EXPECT_LT(rel(gm.get(), cm), kOpTol);
        EXPECT_LT(rel(gv.get(), cv), kOpTol);
        EXPECT_TRUE(same_bits(gv.get(), rv.get()));
      }
    }
}

TEST(CudaStepSync, ForwardQueuedWaitsOnlyForTheBatchUpload) {
  REQUIRE_GPU();
  ModelDesc d = desc_of("gpt2", 2, 2, 64, 32, 500);
  d.lm_head_chunk_rows = 24;  // several chunks: once one host wait per chunk
  Model mg(d, gpu()), mc(d, cpu());
  mg.init_params(5);
  mc.init_params(5);
  RandomBatch rb(d, 3, 32, 6);
  Activations ag, ac;
  // A first pass allocates (activations, backward scratch: alloc waits); not part of a step.
  mg.forward_queued(ag, rb.b, true);
  mg.zero_grads();
  mg.backward(ag);
  mg.read_scalars(ag);
  mg.zero_grads();
  const uint64_t waits = cuda_host_waits(), reads = gpu().readback_count();
  mg.forward_queued(ag, rb.b, true);
  EXPECT_EQ(cuda_host_waits() - waits, 2u) << "only the uploads of tokens and targets (load_batch)";
  mg.backward(ag);
  EXPECT_EQ(cuda_host_waits() - waits, 2u) << "backward (the head's recomputed chunks included) waits for nothing";
  const StepScalars s = mg.read_scalars(ag);
  EXPECT_EQ(cuda_host_waits() - waits, 3u) << "one readback";
  EXPECT_EQ(gpu().readback_count() - reads, 1u);
  const float lg = mg.loss_of(s, ag), lc = mc.forward(ac, rb.b, true);
  EXPECT_LT(std::fabs(lg - lc) / lc, 1e-5) << lg << " vs " << lc;
  EXPECT_EQ(s.bad_target, 0u);
}

// The trainer's single-model step on the GPU: per step the uploads of tokens and targets, the one
// readback (loss, gradient norm, bad-target flag) and the wait at the step's end, counted over the
// steps of two runs that differ only in length.
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
      EXPECT_EQ(waits[1] - waits[0], 4u * 4u) << "per step: 2 uploads, the readback, the step's end";
      ASSERT_EQ(losses.size(), cpu_losses.size());
      for (size_t i = 0; i < losses.size(); i++)
        EXPECT_LT(std::fabs(losses[i] - cpu_losses[i]) / cpu_losses[i], 1e-4) << "step " << i;
    } else {
      cpu_losses = losses;
    }
  }
}
