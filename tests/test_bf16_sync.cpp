// Gradient exchange in bfloat16 (parallel.grad_dtype "bf16", comm/grad_sync.h).
//   Bf16Sync.*     (serial) the rounding (nearest, ties to even; NaN, infinity, overflow), and
//                  the refusals: bf16 with gather_scatter / weights, an unknown grad_dtype
//   MpiBf16Sync.*  (-n 2) GradSync's average is exactly widen(bf16(bf16(g0) + bf16(g1))) / 2 on
//                  both ranks (all-reduce and ZeRO-1's reduce-scatter, with and without overlap)
//                  and counts half the bytes; 10 training steps with bf16 follow fp32's within the
//                  bound bf16 rounding gives, without being equal, at half the bytes per step
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "comm/grad_sync.h"
#include "grad_check.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "mpi_test_data.h"
#include "runtime/error.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

float widen_round(float x) { return bf16_widen(bf16_round(x)); }

Config bf16_config(const std::string& train, std::vector<std::string> extra) {
  extra.insert(extra.begin(), "train.steps=10");
  return tiny_config(train, extra);
}

}  // namespace

// ---- serial --------------------------------------------------------------------------------------------

// Exact throughout: the rounding is specified bit for bit, and every value here is a float exactly.
TEST(Bf16Sync, RoundsToNearestEven) {
  EXPECT_EQ(bf16_round(1.0f), 0x3f80);
  EXPECT_EQ(bf16_widen(0x3f80), 1.0f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to the even mantissa (1.0)
  EXPECT_EQ(widen_round(1.0f + 0x1p-8f), 1.0f);
  // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6 (even)
  EXPECT_EQ(widen_round(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
  // just above a tie rounds up, just below rounds down
  EXPECT_EQ(widen_round(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_EQ(widen_round(1.0f + 0x1p-8f - 0x1p-20f), 1.0f);
  EXPECT_EQ(widen_round(-2.5f), -2.5f);  // exact in bf16
  EXPECT_EQ(widen_round(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(widen_round(-0.0f)));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(widen_round(inf), inf);
  EXPECT_EQ(widen_round(-inf), -inf);
  EXPECT_EQ(widen_round(std::numeric_limits<float>::max()), inf) << "past bf16's largest: infinity";
  EXPECT_TRUE(std::isnan(widen_round(std::numeric_limits<float>::quiet_NaN())));
  uint32_t snan_bits = 0x7f800001u;  // a NaN whose payload would round to infinity: stays NaN
  float snan;
  std::memcpy(&snan, &snan_bits, sizeof snan);
  EXPECT_TRUE(std::isnan(widen_round(snan)));
  // relative error of the rounding at most 2^-8 (half an ulp of an 8-bit significand) over many
  // magnitudes, and it does reach 2^-9 (the rounding is not finer than bf16's); both sides exact
  // (a difference of two floats within a factor 2 of each other, a float times a power of two)
  float worst = 0.0f;
  for (float x = 1e-30f; x < 1e30f; x *= 1.37f) {
    EXPECT_LE(std::fabs(widen_round(x) - x), x * 0x1p-8f) << x;
    worst = std::max(worst, std::fabs(widen_round(x) - x) / x);
  }
  EXPECT_GT(worst, 0x1p-9f);
}

TEST(Bf16Sync, ConfigRefusesWhatIsNotImplemented) {
  auto parse = [](std::vector<std::string> sets) {
    sets.insert(sets.begin(), "data.train=-");
    return parse_config("{}", "test", sets);
  };
  EXPECT_EQ(parse({}).parallel.grad_dtype, GradDtype::fp32);
  EXPECT_EQ(parse({"parallel.grad_dtype=bf16"}).parallel.grad_dtype, GradDtype::bf16);
  EXPECT_EQ(parse({"parallel.grad_dtype=bf16", "parallel.sync=nccl"}).parallel.grad_dtype, GradDtype::bf16);
  EXPECT_EQ(parse({"parallel.grad_dtype=bf16", "parallel.zero=1"}).parallel.grad_dtype, GradDtype::bf16);
  for (const char* method : {"gather_scatter", "weights"}) {
    try {
      parse({"parallel.grad_dtype=bf16", std::string("parallel.sync=") + method});
      ADD_FAILURE() << "bf16 with " << method << " accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("parallel.grad_dtype"), std::string::npos) << m;
      EXPECT_NE(m.find(method), std::string::npos) << m;
      EXPECT_NE(m.find("\"allreduce\""), std::string::npos) << "names the fix: " << m;
    }
  }
  try {
    parse({"parallel.grad_dtype=fp16"});
    ADD_FAILURE() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"fp32\" or \"bf16\""), std::string::npos) << e.what();
  }
}

// GradSync built directly (as the pipeline does) refuses the same combinations.
TEST(Bf16Sync, GradSyncRefusesGatherScatterAndWeights) {
  const ModelDesc d = llmpi::test::desc_of("gpt2", 1, 2, 16, 8, 11);
  Model m(d, cpu_ops());
  for (SyncMethod method : {SyncMethod::gather_scatter, SyncMethod::weights}) {
    SyncOptions o;
    o.method = method;
    o.bf16 = true;
    EXPECT_THROW(GradSync(o, MPI_COMM_SELF, cpu_ops(), m.grads, m.table, nullptr), Error)
        << sync_method_name(method);
  }
}

// ---- -n 2 ------------------------------------------------------------------------------------------------

// Two ranks, known gradients: with 2 ranks the reduction applies the bf16 sum exactly once, so the
// average is exactly widen(bf16(widen(bf16(g0)) + widen(bf16(g1)))) · 0.5 on both ranks (with
// ZeRO-1: in each rank's pieces). Buckets of ~0.005 MB, with and without the communication thread.
TEST(MpiBf16Sync, AverageIsTheRoundedSumOnEveryRank) {
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 2);
  const ModelDesc d = llmpi::test::desc_of("gpt2", 2, 2, 32, 16, 64);
  Model m(d, cpu_ops());
  const size_t n = m.table.numel;
  // magnitudes over many decades, and both signs: g_r[i] = ±u · 10^e
  auto grads_of = [&](int r) {
    auto u = llmpi::test::random_floats(n, 900 + r, 0.5f, 1.5f);
    for (size_t i = 0; i < n; i++) u[i] *= std::pow(10.0f, (int)(i % 13) - 8) * ((i + r) % 3 == 0 ? -1 : 1);
    return u;
  };
  const auto g0 = grads_of(0), g1 = grads_of(1);
  std::vector<float> expect(n);
  for (size_t i = 0; i < n; i++) expect[i] = widen_round(widen_round(g0[i]) + widen_round(g1[i])) * 0.5f;
  for (bool zero : {false, true})
    for (bool overlap : {false, true}) {
      SyncOptions o;
      o.method = SyncMethod::allreduce;
      o.bf16 = true;
      o.zero = zero;
      o.overlap = overlap;
      o.bucket_mb = 0.005;
      o.first_bucket_mb = 0.001;
      const auto mine = rank == 0 ? g0 : g1;
      cpu_ops().copy_to_device(m.grads, mine.data(), n * sizeof(float));
      GradSync sync(o, MPI_COMM_WORLD, cpu_ops(), m.grads, m.table, nullptr);
      sync.connect();
      ASSERT_GT(sync.buckets.size(), 3u);
      sync.begin_step();
      for (const Bucket& b : sync.buckets) sync.on_ready(b.end);
      sync.finish();
      // Exact: with 2 ranks each element is the bf16 sum of the two rounded halves, once, halved.
      std::vector<float> got(m.grads, m.grads + n);
      size_t checked = 0, bad = 0, first_bad = 0;
      for (const ShardPiece& p : sync.shard)  // zero: this rank's pieces; else every bucket whole
        for (size_t i = p.begin; i < p.end; i++, checked++)
          if (std::memcmp(&got[i], &expect[i], sizeof(float)) != 0 && bad++ == 0) first_bad = i;
      EXPECT_EQ(bad, 0u) << "zero " << zero << " overlap " << overlap << ": first at " << first_bad << ": "
                         << got[first_bad] << " vs " << expect[first_bad];
      if (zero)  // half of every bucket, give or take one float
        EXPECT_LE(std::fabs((double)checked - n / 2.0), (double)sync.buckets.size());
      else
        EXPECT_EQ(checked, n);
      // Bytes: the gradient at 2 bytes a float; the all-reduce sends 2(W-1)/W of it, the
      // reduce-scatter (W-1)/W of it (finish() counts only the gradient exchange). Exact: integer
      // byte counts below 2^53, and their halves.
      EXPECT_DOUBLE_EQ(sync.step.bytes_sent, (zero ? 0.5 : 1.0) * 2.0 * n) << "zero " << zero;
      EXPECT_DOUBLE_EQ(sync.expected_bytes_per_pass(n), zero ? 0.5 * 2.0 * n + 0.5 * 4.0 * n : 2.0 * n);
    }
}

// 10 AdamW steps (lr 1e-3, clip 1.0) on 2 ranks, fp32 vs bf16 exchange, all-reduce and ZeRO-1.
// Bound: each averaged gradient element is within 3·2^-8 ≈ 1.2e-2 (relative, to first order) of
// the fp32 average (a rounding of each input, one of the sum; bf16's unit roundoff is 2^-8), and
// training_drift (mpi_test_data.h) carries that through AdamW's steps: |dp_e| <= 2·1.2e-2·sum(lr)
// for each element (sum(lr) = 6e-3 over the cosine schedule), |dp| / |p| <= that times
// sqrt(n) / |p| ≈ 13 (the parameters' root mean square, 0.077: the norms' weights of 1 with
// the 0.02 of the rest): 1.8e-3. The losses see the parameters through grad L · dp, terms of
// random sign: 3·|grad L|·|dp_e| <= 3·1.2·L·1.4e-4, 5.2e-4 of L, with the forward's own rounding
// (2·gamma(K)). And the runs must differ (the option is on), the ranks agree bit for bit, and the
// step sends half the gradient bytes.
TEST(MpiBf16Sync, TrainingFollowsFp32AtHalfTheBytes) {
  std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 31);
  const TrainOptions quiet = quiet_options(false);
  for (std::vector<std::string> v : {std::vector<std::string>{"parallel.sync=allreduce"},
                                     {"parallel.sync=allreduce", "parallel.zero=1"},
                                     {"parallel.sync=allreduce", "parallel.bucket_mb=0.02", "parallel.overlap=true"}}) {
    const std::string name = v.size() > 1 ? v[1] : v[0];
    const Config ref = bf16_config(tr, v);
    TrainResult f = train(ref, MPI_COMM_WORLD, quiet, true);
    const Drift bound = training_drift(ref, 0, 10, f.final_params, 3 * 0x1p-8);
    v.push_back("parallel.grad_dtype=bf16");
    TrainResult b = train(bf16_config(tr, v), MPI_COMM_WORLD, quiet, true);
    // ranks hold the same parameters
    std::vector<float> p0 = b.final_params;
    MPI_Bcast(p0.data(), (int)p0.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    EXPECT_TRUE(p0 == b.final_params) << name << ": ranks disagree";  // Exact: one average, every rank
    const double dp = rel_diff(b.final_params, f.final_params);
    double dl = 0;
    for (size_t s = 0; s < f.losses.size(); s++) dl = std::max(dl, (double)std::fabs(b.losses[s] - f.losses[s]) / f.losses[s]);
    if (world_rank() == 0)
      std::printf("bf16 vs fp32 exchange (%s): params %.2e relative (bound %.1e), losses %.2e (bound %.1e); bytes/step "
                  "%.0f vs %.0f\n", name.c_str(), dp, bound.params, dl, bound.loss, b.bytes_sent_last_step,
                  f.bytes_sent_last_step);
    EXPECT_GT(dp, 0.0) << name << ": bf16 gave fp32's parameters bit for bit: the option did nothing";
    EXPECT_LT(dp, bound.params) << name;
    EXPECT_LT(dl, bound.loss) << name;
    ASSERT_EQ(b.losses.size(), 10u);
    const double n = (double)f.n_params;
    // Exact: integer byte counts below 2^53, and their halves.
    if (name == "parallel.zero=1")  // the reduce-scatter halves ((W-1)/W · 2 bytes less a float), the all-gather not
      EXPECT_DOUBLE_EQ(f.bytes_sent_last_step - b.bytes_sent_last_step, 0.5 * 2.0 * n) << name;
    else
      EXPECT_DOUBLE_EQ(b.bytes_sent_last_step, 0.5 * f.bytes_sent_last_step) << name;
  }
}
