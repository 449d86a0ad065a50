// NCCL gradient averaging across the ranks of MPI_COMM_WORLD (comm/nccl.h's NcclComm, and
// comm/grad_sync.h's parallel.sync = nccl), at whatever world size mpiexec gives: real NCCL on a
// machine with a GPU per rank; on the CPU, build/sim-cuda_tests, whose simulated card's NCCL runs
// over MPI (tools/cuda_cpu_sim/README.md, "NCCL"; tools/run_tests.sh runs these at 2 and 4 ranks).
// Without NCCL they skip; so do they when ranks would share a GPU (NCCL takes one rank per GPU).
//
//   NcclRanks.BucketedAverage         NcclComm::allreduce_avg over the ranges GradSync's buckets
//                                     make, of every size: each rank's gradient becomes the
//                                     ranks' average
//   NcclRanks.Bf16BucketedAverage     the same with the gradient sent as bf16
//   NcclRanks.GradSyncMatchesMpiAllreduce  GradSync nccl around a real backward of a small GPT-2
//                                     (buckets launched while backward runs) against GradSync's
//                                     MPI all-reduce of the same gradients, fp32 and bf16
//   NcclRanks.ZeroMatchesMpiZero      ZeRO-1: GradSync nccl's reduce-scatter of uneven pieces
//                                     and its all-gather of parameters against GradSync
//                                     allreduce's, fp32 and bf16 gradients
//
// Exact at one or two ranks, where an average has one rounding whatever the algorithm (x0/2 +
// x1/2 in fp32: the halvings are exact and the sum commutes; one bf16 rounding of it in bf16).
// Beyond two, NCCL's ring or tree sums in an order of its own, so the result is bounded instead:
// ncclAvg multiplies each term by 1/W rounded (exact when W is a power of 2), rounds that product,
// and adds W terms (a rounding at each step, in the wire type: u = 2^-24 in fp32, 2^-8 in bf16), so
// it is within gamma_n(W + 1, u) of Σ|x_r|/W of the exact average; MPI's all-reduce (GradSync
// allreduce: the sum, in bf16 a rounding at each step, then the product by 1/W) within the same.
// Every rank must hold the same bits in every case.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda_ops.h"
#include "comm/grad_sync.h"
#include "comm/nccl.h"
#include "cuda_test_util.h"
#include "model/transformer.h"
#include "model_test_util.h"

using namespace llmpi;
using namespace llmpi::test;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// "" when every rank can have a GPU of its own (the simulated card is one per process), else why not.
std::string gpus_shared() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0, local_n = 1;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_n);
  cuda_bind_device(local);
  std::vector<int> devices(local_n);
  const int mine = cuda_device();
  MPI_Allgather(&mine, 1, MPI_INT, devices.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  if (cuda_device_name().find("simulated") != std::string::npos) return "";
  for (int i = 0; i < local_n; i++)
    if (i != local && devices[i] == mine)
      return "ranks " + std::to_string(i) + " and " + std::to_string(local) + " of a node share GPU " +
             std::to_string(mine) + " (NCCL takes one rank per GPU)";
  return "";
}

#define REQUIRE_NCCL_PER_RANK()                                                  \
  do {                                                                           \
    std::string why_;                                                            \
    if (!nccl_available(&why_)) GTEST_SKIP() << "no GPU or no NCCL: " << why_;   \
    why_ = gpus_shared();                                                        \
    if (!why_.empty()) GTEST_SKIP() << why_;                                     \
  } while (0)

// Rank r's gradient: uniform floats in [-3, 3), a function of (r, index).
std::vector<float> rank_values(int r, size_t n, uint32_t seed) { return random_floats(n, seed + 1000 * r, -3.0f, 3.0f); }

// The same vector on every rank, bit for bit ("" if so).
std::string same_on_every_rank(const std::vector<float>& v) {
  std::vector<float> first(v);
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  const std::string d = bit_difference(v, first);
  return d.empty() ? "" : "rank " + std::to_string(world_rank()) + " differs from rank 0: " + d;
}

// got against the average of every rank's `inputs` (each widened from bf16 first when bf16): bit
// for bit at W <= 2 (x0/2 + x1/2, bf16 rounded once), else within the rounding bound
// gamma_n(W + 1, u) Σ|x_r|/W (see the header). "" when it holds.
std::string check_average(const std::vector<float>& got, const std::vector<std::vector<float>>& inputs, bool bf16) {
  const int W = static_cast<int>(inputs.size());
  const float inv = 1.0f / static_cast<float>(W);
  for (size_t i = 0; i < got.size(); i++) {
    float one_rounding = 0.0f;
    double exact = 0.0, size = 0.0;
    for (int r = 0; r < W; r++) {
      const float x = bf16 ? round_to_bf16(inputs[r][i]) : inputs[r][i];
      one_rounding = r == 0 ? x * inv : one_rounding + x * inv;
      exact += x;
      size += std::abs(x);
    }
    if (bf16) one_rounding = round_to_bf16(one_rounding);
    exact /= W;
    size /= W;
    const bool ok = W <= 2 ? std::memcmp(&got[i], &one_rounding, sizeof(float)) == 0
                           : std::abs(got[i] - exact) <= gamma_n(W + 1, bf16 ? kUBf16 : kU) * size;
    if (!ok || (bf16 && round_to_bf16(got[i]) != got[i]))
      return "element " + std::to_string(i) + ": " + std::to_string(got[i]) + ", the average is " +
             std::to_string(exact) + (W <= 2 ? " (one rounding: " + std::to_string(one_rounding) + ")" : "");
  }
  return "";
}

void bucketed_average(bool bf16) {
  const int W = world_size(), me = world_rank();
  auto nccl = nccl_comm_create(MPI_COMM_WORLD);
  ASSERT_TRUE(nccl);
  EXPECT_EQ(nccl->world(), W);
  EXPECT_EQ(nccl->rank(), me);
  const size_t total = 200003;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < W; r++) inputs.push_back(rank_values(r, total, bf16 ? 61 : 60));
  const std::vector<size_t> ready = {1, 7, 5000, 5001, 77777, 150000, total - 3, total};
  for (size_t bucket : {size_t(0), size_t(4099), size_t(65536), total}) {
    SCOPED_TRACE("bucket_floats " + std::to_string(bucket));
    Dev g(inputs[me]);
    const size_t before = nccl->passes();
    size_t start = 0, buckets = 0;
    for (size_t k : ready)  // a bucket closes once it holds `bucket` floats, or at the end
      if (k > start && (k - start >= bucket || k == total)) {
        nccl->allreduce_avg(g.f() + start, k - start, bf16);
        buckets++, start = k;
      }
    nccl->compute_waits();
    EXPECT_EQ(start, total);
    EXPECT_EQ(nccl->passes() - before, buckets);
    const std::vector<float> got = g.get();  // on the compute stream, which compute_waits() held
    EXPECT_EQ(check_average(got, inputs, bf16), "");
    EXPECT_EQ(same_on_every_rank(got), "");
  }
}

// The magnitude of what the ranks' averages sum: Σ_r |g_r| / W, g_r rank r's gradient of its own
// batch (a forward and backward of `m` without a sync; the caller zeroes the gradients after). In
// bf16 each is rounded first: magnitudes up to 1 + 2^-8 larger (the factor beside the checks).
std::vector<double> average_magnitude(Model& m, Activations& a, const Batch& batch) {
  m.zero_grads();
  m.forward(a, batch, HeadMode::train);
  m.backward(a);
  const std::vector<float> g = m.grads_host();
  std::vector<double> mag(g.size());
  for (size_t i = 0; i < g.size(); i++) mag[i] = std::fabs(static_cast<double>(g[i])) / world_size();
  MPI_Allreduce(MPI_IN_PLACE, mag.data(), static_cast<int>(mag.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  m.zero_grads();
  return mag;
}

}  // namespace

TEST(NcclRanks, BucketedAverage) {
  REQUIRE_NCCL_PER_RANK();
  bucketed_average(false);
}

TEST(NcclRanks, Bf16BucketedAverage) {
  REQUIRE_NCCL_PER_RANK();
  bucketed_average(true);
}

// The same model twice on the card with one GradSync each, built from the same options: `nccl`
// over NCCL, `mpi` over MPI's all-reduce (through host memory).
struct NcclBesideMpi {
  Model a, b;
  Activations aa, ab;
  std::unique_ptr<GradSync> nccl, mpi;
  NcclBesideMpi(const ModelDesc& d, int B, int T, uint64_t seed) : a(d, gpu()), b(d, gpu()), aa(a, B, T), ab(b, B, T) {
    a.init_params(seed);
    b.init_params(seed);
  }
  void make_syncs(SyncOptions o) {
    nccl.reset();
    mpi.reset();
    o.method = SyncMethod::nccl;
    nccl = std::make_unique<GradSync>(o, MPI_COMM_WORLD, gpu(), a.grads, a.table, nullptr);
    nccl->connect();
    o.method = SyncMethod::allreduce;
    mpi = std::make_unique<GradSync>(o, MPI_COMM_WORLD, gpu(), b.grads, b.table, nullptr);
    mpi->connect();
  }
  // One forward and backward of each on `batch`: a's buckets launched from its backward's ready
  // calls (counted in *calls), b's after its backward. Returns both losses.
  std::pair<float, float> step(const Batch& batch, size_t* calls) {
    a.zero_grads();
    nccl->begin_step();
    const float la = a.forward(aa, batch, HeadMode::train);
    a.backward(aa, [&](size_t k) {
      ++*calls;
      nccl->on_ready(k);
    });
    nccl->finish();
    b.zero_grads();
    mpi->begin_step();
    const float lb = b.forward(ab, batch, HeadMode::train);
    b.backward(ab);
    mpi->finish();
    return {la, lb};
  }
};

// Each rank's own batch through a small GPT-2; the gradients averaged by GradSync nccl (buckets
// launched from backward's ready calls, while backward goes on) and, from a copy of the same
// model and batch, by GradSync allreduce (MPI through host memory): the same averages, fp32 and
// bf16, every bucket size.
TEST(NcclRanks, GradSyncMatchesMpiAllreduce) {
  REQUIRE_NCCL_PER_RANK();
  const int W = world_size(), me = world_rank();
  const ModelDesc d = desc_of("gpt2", 2, 4, 64, 32, 97);
  const int B = 2, T = 32;
  RandomBatch rb(d, B, T, 900 + me);
  NcclBesideMpi m(d, B, T, 901);
  const std::vector<double> mag = average_magnitude(m.a, m.aa, rb.b);
  for (bool bf16 : {false, true})
    for (double bucket_mb : {0.0, 0.02, 25.0}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + ", bucket_mb " + std::to_string(bucket_mb));
      SyncOptions o;
      o.bucket_mb = bucket_mb;
      o.bf16 = bf16;
      m.make_syncs(o);
      size_t calls = 0;
      const auto [la, lb] = m.step(rb.b, &calls);
      EXPECT_EQ(la, lb);  // Exact: the same model and batch through the same kernels
      EXPECT_GT(calls, 1u);
      const std::vector<float> ga = m.a.grads_host(), gb = m.b.grads_host();
      if (W <= 2) {  // Exact (the header)
        EXPECT_SAME_BITS(ga, gb) << "at two ranks an average has one rounding";
      } else {  // Bound: each side within gamma_n(W + 1, u) of the magnitude (the header)
        EXPECT_LT(rel_to_magnitude(ga, gb, mag), 2 * gamma_n(W + 1, bf16 ? kUBf16 : kU) * (bf16 ? 1 + kUBf16 : 1.0));
      }
      EXPECT_EQ(same_on_every_rank(ga), "");
      if (W > 1) {
        // Exact: byte counts, integers held in doubles (far below 2^53)
        EXPECT_EQ(m.nccl->step.bytes_sent, m.mpi->expected_bytes_per_pass(m.a.table.numel));
        EXPECT_GE(m.nccl->step.collectives, 1);
      }
    }
}

// ZeRO-1 over NCCL (padded pieces: comm/nccl.h) against ZeRO-1 over MPI around the same backward:
// after finish() this rank's pieces of the averaged gradient, and after gather_params() (an
// update that leaves each rank's pieces as they were: rank-dependent values) every bucket of the
// parameters, on every rank. Buckets of 0.01 MB: most are uneven over W pieces.
TEST(NcclRanks, ZeroMatchesMpiZero) {
  REQUIRE_NCCL_PER_RANK();
  const int W = world_size(), me = world_rank();
  const ModelDesc d = desc_of("gpt2", 2, 2, 32, 16, 97);  // small: the simulated card is slow
  const int B = 2, T = 16;
  RandomBatch rb(d, B, T, 910 + me);
  NcclBesideMpi m(d, B, T, 911);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    SyncOptions o;
    o.bucket_mb = 0.01;
    o.bf16 = bf16;
    o.zero = true;
    m.make_syncs(o);
    GradSync& nccl = *m.nccl;
    GradSync& mpi = *m.mpi;
    ASSERT_GT(nccl.buckets.size(), 2u);
    const std::vector<double> mag = average_magnitude(m.a, m.aa, rb.b);  // (the parameters change below)
    size_t calls = 0;
    m.step(rb.b, &calls);
    const std::vector<float> ga = nccl.pieces_of(m.a.grads_host().data()), gb = mpi.pieces_of(m.b.grads_host().data());
    ASSERT_EQ(ga.size(), gb.size());
    if (W <= 2) {  // Exact (the header)
      EXPECT_SAME_BITS(ga, gb) << "at two ranks an average has one rounding";
    } else {  // Bound: each side within gamma_n(W + 1, u) of the magnitude (the header)
      const std::vector<float> mag_f(mag.begin(), mag.end());
      const std::vector<float> mp = nccl.pieces_of(mag_f.data());
      EXPECT_LT(rel_to_magnitude(ga, gb, std::vector<double>(mp.begin(), mp.end())),
                2 * gamma_n(W + 1, bf16 ? kUBf16 : kU) * (bf16 ? 1 + kUBf16 : 1.0));
    }
    double reduce_scatter_bytes = 0;  // NCCL's ring: W-1 padded pieces per bucket, in the wire type
    for (const Bucket& k : nccl.buckets)
      reduce_scatter_bytes += (W - 1) * (double)((k.end - k.begin + W - 1) / W) * (bf16 ? 2 : 4);
    EXPECT_EQ(nccl.step.bytes_sent, reduce_scatter_bytes);  // Exact: sums of integers in doubles, far below 2^53

    std::vector<float> p(m.a.table.numel);
    for (size_t i = 0; i < p.size(); i++) p[i] = 0.25f * (float)(i % 1000) + 1000.0f * (float)me;
    gpu().copy_to_device(m.a.params, p.data(), p.size() * sizeof(float));
    gpu().copy_to_device(m.b.params, p.data(), p.size() * sizeof(float));
    size_t updates = 0;
    nccl.gather_params(m.a.params, [&](size_t) { updates++; });
    mpi.gather_params(m.b.params, [](size_t) {});
    EXPECT_EQ(updates, nccl.buckets.size());
    const std::vector<float> pa = m.a.params_host(), pb = m.b.params_host();
    EXPECT_SAME_BITS(pa, pb);  // Exact: an all-gather moves bits
    EXPECT_EQ(same_on_every_rank(pa), "");
    if (W > 1) {  // each float from its owner: rank r's pieces hold 1000·r more (Exact: the same float expression)
      bool from_owners = true;
      for (size_t k = 0; k < nccl.buckets.size(); k++) {
        std::vector<size_t> counts, displs;
        piece_counts(nccl.buckets[k].end - nccl.buckets[k].begin, W, counts, displs);
        for (int r = 0; r < W; r++) {
          const size_t i = nccl.buckets[k].begin + displs[r];
          if (counts[r] > 0 && pa[i] != 0.25f * (float)(i % 1000) + 1000.0f * (float)r) from_owners = false;
        }
      }
      EXPECT_TRUE(from_owners);
    }
  }
}
