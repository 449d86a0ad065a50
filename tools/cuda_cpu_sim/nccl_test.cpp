// build/sim-nccl_tests: the NCCL stand-in (sim_nccl.cpp) called directly, on simulated streams,
// under mpiexec at any number of ranks (tools/run_tests.sh runs it at 2 and 4; at 1 the same
// checks hold). Every rank's inputs are a function of (rank, index), so each rank computes what
// every operation must give: reductions bit for bit as the stand-in documents them (fp32 sums in
// rank order, ncclAvg's terms multiplied by 1/nranks first, bf16 rounded once); that expectation
// is itself checked against a double-precision sum (within an fp32 rounding per term), in case
// it and the stand-in share a mistake.
//
//   NcclStandIn.*          the calls' results, the communicators (two at once, and one shared by
//                          two streams), stream order (events, the legacy stream, results that
//                          land only when waited for), and the calls it refuses
//   NcclStandInMismatch.*  DISABLED_: ranks that call different collectives stop the job
//                          (run_tests.sh runs it on purpose and expects the failure)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/bf16.h"
#include "cuda_runtime.h"
#include "nccl.h"

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

// A communicator of the ranks of `mc`: its rank 0 makes the id and broadcasts it (as
// nccl_sync_create does). Collective over mc.
ncclComm_t make_comm(MPI_Comm mc) {
  int r = 0, n = 0;
  MPI_Comm_rank(mc, &r);
  MPI_Comm_size(mc, &n);
  ncclUniqueId id;
  if (r == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mc);
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRank(&c, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
  return c;
}

// Rank r's value at index i: a few bits of a hash, in [-2, 2), so that sums round.
float value(int r, size_t i, uint64_t salt = 0) {
  uint64_t z = (static_cast<uint64_t>(r) + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + salt;
  z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
  z ^= z >> 29;
  return static_cast<float>(static_cast<double>(z >> 40) / 4194304.0 - 2.0);
}
uint16_t bf16_value(int r, size_t i, uint64_t salt = 0) { return llmpi::float_to_bf16_bits(value(r, i, salt)); }

// The stand-in's documented reduction of every rank's values at index i.
float expected_sum(int nranks, bool avg, const std::function<float(int)>& x) {
  const float scale = avg ? 1.0f / static_cast<float>(nranks) : 1.0f;
  float acc = 0.0f;
  for (int r = 0; r < nranks; r++) acc = r == 0 ? x(r) * scale : acc + x(r) * scale;
  return acc;
}
// |expected_sum - the exact sum| in units of Σ|x_r| (scaled as the sum is): at most one fp32
// rounding (2^-24) per term
double sum_error(int nranks, bool avg, const std::function<float(int)>& x) {
  double s = 0.0, size = 0.0;
  for (int r = 0; r < nranks; r++) s += x(r), size += std::abs(x(r));
  if (avg) s /= nranks, size /= nranks;
  return size == 0.0 ? 0.0 : std::abs(expected_sum(nranks, avg, x) - s) / size;
}

// Device buffers are host memory here; these copy through the runtime so the stream rules apply.
template <class T>
T* device(const std::vector<T>& h) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, h.size() * sizeof(T) + 1), cudaSuccess);
  cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}
template <class T>
std::vector<T> host(const T* p, size_t n, cudaStream_t after) {
  EXPECT_EQ(cudaStreamSynchronize(after), cudaSuccess);
  std::vector<T> h(n);
  std::memcpy(h.data(), p, n * sizeof(T));
  return h;
}
// The bytes as they are now, without waiting for anything.
template <class T>
std::vector<T> peek(const T* p, size_t n) {
  return std::vector<T>(p, p + n);
}

std::string first_difference(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); i++)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return "element " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
  return "";
}
std::string first_difference(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != want[i])
      return "element " + std::to_string(i) + ": bf16 " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
  return "";
}

__global__ void fill_kernel(float* p, size_t n, float v) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}
__global__ void scale_kernel(float* p, size_t n, float s) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= s;
}
__global__ void copy_kernel(float* out, const float* in, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}
unsigned blocks(size_t n) { return static_cast<unsigned>((n + 255) / 256); }

// Time for an operation just enqueued to finish its exchange with the peers, so that what keeps
// its result out of the buffer afterwards is only that nothing has waited for it (stream.h).
void give_the_exchange_time() {
  MPI_Barrier(MPI_COMM_WORLD);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

struct Streams {
  cudaStream_t blocking = nullptr, nonblocking = nullptr;
  Streams() {
    cudaStreamCreate(&blocking);
    cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking);
  }
  ~Streams() {
    cudaStreamDestroy(blocking);
    cudaStreamDestroy(nonblocking);
  }
};

}  // namespace

TEST(NcclStandIn, CommunicatorKnowsItsRankAndSize) {
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  ASSERT_NE(c, nullptr);
  int n = -1, r = -1, d = -1, v = 0;
  EXPECT_EQ(ncclCommCount(c, &n), ncclSuccess);
  EXPECT_EQ(ncclCommUserRank(c, &r), ncclSuccess);
  EXPECT_EQ(ncclCommCuDevice(c, &d), ncclSuccess);
  EXPECT_EQ(n, world_size());
  EXPECT_EQ(r, world_rank());
  EXPECT_EQ(d, 0);
  EXPECT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidArgument), "invalid argument");
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ncclAllReduce, fp32 and bf16, ncclSum and ncclAvg, in place and not, on a non-blocking stream.
TEST(NcclStandIn, AllReduceSumsInRankOrder) {
  const int W = world_size(), me = world_rank();
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  Streams s;
  const size_t n = 4099;
  for (ncclRedOp_t red : {ncclSum, ncclAvg}) {
    const bool avg = red == ncclAvg;
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(avg ? "avg" : "sum") + (in_place ? " in place" : ""));
      std::vector<float> x(n), want(n);
      std::vector<uint16_t> xb(n), wantb(n);
      double worst = 0.0;
      for (size_t i = 0; i < n; i++) {
        x[i] = value(me, i);
        xb[i] = bf16_value(me, i, 7);
        want[i] = expected_sum(W, avg, [&](int r) { return value(r, i); });
        wantb[i] = llmpi::float_to_bf16_bits(
            expected_sum(W, avg, [&](int r) { return llmpi::bf16_bits_to_float(bf16_value(r, i, 7)); }));
        worst = std::max(worst, sum_error(W, avg, [&](int r) { return value(r, i); }));
      }
      EXPECT_LE(worst, W * 0x1p-24);
      float* in = device(x);
      float* out = in_place ? in : device(std::vector<float>(n, NAN));
      uint16_t* inb = device(xb);
      uint16_t* outb = in_place ? inb : device(std::vector<uint16_t>(n, 0xFFFF));
      ASSERT_EQ(ncclAllReduce(in, out, n, ncclFloat32, red, c, s.nonblocking), ncclSuccess);
      ASSERT_EQ(ncclAllReduce(inb, outb, n, ncclBfloat16, red, c, s.nonblocking), ncclSuccess);
      EXPECT_EQ(first_difference(host(out, n, s.nonblocking), want), "");
      EXPECT_EQ(first_difference(host(outb, n, s.nonblocking), wantb), "");
      if (!in_place) {
        EXPECT_EQ(first_difference(peek(in, n), x), "") << "the input changed";
      }
      cudaFree(in);
      cudaFree(inb);
      if (!in_place) cudaFree(out), cudaFree(outb);
    }
  }
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ncclAllReduce with ncclMax (a tensor-parallel group's row maxima): every rank gets each
// element's largest value, exactly.
TEST(NcclStandIn, AllReduceMax) {
  const int W = world_size(), me = world_rank();
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  Streams s;
  const size_t n = 1001;
  std::vector<float> x(n), want(n);
  for (size_t i = 0; i < n; i++) {
    x[i] = value(me, i);
    want[i] = value(0, i);
    for (int r = 1; r < W; r++) want[i] = std::max(want[i], value(r, i));
  }
  float* buf = device(x);
  ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat32, ncclMax, c, s.nonblocking), ncclSuccess);
  EXPECT_EQ(first_difference(host(buf, n, s.nonblocking), want), "");
  cudaFree(buf);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// One ncclReduceScatter of x (this rank's W·count values, as T) on stream s; rank r's block of
// the result, read back.
template <class T>
std::vector<T> reduce_scatter(const std::vector<T>& x, size_t count, ncclDataType_t type, ncclRedOp_t red,
                              bool in_place, ncclComm_t c, cudaStream_t s) {
  T* in = device(x);
  std::vector<T> poison(count);
  std::memset(poison.data(), 0xFF, count * sizeof(T));  // NaN as fp32 and as bf16
  T* out = in_place ? in + world_rank() * count : device(poison);
  EXPECT_EQ(ncclReduceScatter(in, out, count, type, red, c, s), ncclSuccess);
  std::vector<T> got = host(out, count, s);
  cudaFree(in);
  if (!in_place) cudaFree(out);
  return got;
}

// ncclReduceScatter: rank r gets block r of the reduction; in place means recvbuff = sendbuff + r·count.
TEST(NcclStandIn, ReduceScatterGivesEachRankItsBlock) {
  const int W = world_size(), me = world_rank();
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  Streams s;
  const size_t count = 1031;
  for (ncclDataType_t type : {ncclFloat32, ncclBfloat16})
    for (ncclRedOp_t red : {ncclSum, ncclAvg})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(type == ncclBfloat16 ? "bf16 " : "fp32 ") + (red == ncclAvg ? "avg" : "sum") +
                     (in_place ? " in place" : ""));
        const bool bf16 = type == ncclBfloat16, avg = red == ncclAvg;
        auto v = [&](int r, size_t i) {
          return bf16 ? llmpi::bf16_bits_to_float(bf16_value(r, i, 3)) : value(r, i, 3);
        };
        std::vector<float> x(count * W), want(count);
        for (size_t i = 0; i < count * W; i++) x[i] = v(me, i);
        for (size_t i = 0; i < count; i++) want[i] = expected_sum(W, avg, [&](int r) { return v(r, me * count + i); });
        if (bf16) {
          std::vector<uint16_t> xb(x.size()), wantb(count);
          for (size_t i = 0; i < x.size(); i++) xb[i] = llmpi::float_to_bf16_bits(x[i]);
          for (size_t i = 0; i < count; i++) wantb[i] = llmpi::float_to_bf16_bits(want[i]);
          EXPECT_EQ(first_difference(reduce_scatter(xb, count, type, red, in_place, c, s.blocking), wantb), "");
        } else {
          EXPECT_EQ(first_difference(reduce_scatter(x, count, type, red, in_place, c, s.blocking), want), "");
        }
      }
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ncclAllGather (block r from rank r; in place: sendbuff = recvbuff + r·count) and ncclBroadcast
// (from the last rank; in place and not), on int32 and bf16 data, moved bit for bit.
TEST(NcclStandIn, AllGatherAndBroadcastMoveTheBits) {
  const int W = world_size(), me = world_rank();
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  Streams s;
  const size_t count = 777;
  auto iv = [](int r, size_t i) { return static_cast<int32_t>(r * 1000003 + static_cast<int>(i) * 7 - 5000); };
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    std::vector<int32_t> all(count * W, -1), want(count * W);
    for (int r = 0; r < W; r++)
      for (size_t i = 0; i < count; i++) want[r * count + i] = iv(r, i);
    std::vector<int32_t> mine(want.begin() + me * count, want.begin() + (me + 1) * count);
    if (in_place) std::copy(mine.begin(), mine.end(), all.begin() + me * count);
    int32_t* out = device(all);
    int32_t* in = in_place ? out + me * count : device(mine);
    ASSERT_EQ(ncclAllGather(in, out, count, ncclInt32, c, s.nonblocking), ncclSuccess);
    EXPECT_EQ(host(out, count * W, s.nonblocking), want);
    cudaFree(out);
    if (!in_place) cudaFree(in);

    const int root = W - 1;
    std::vector<uint16_t> b(count), wantb(count);
    for (size_t i = 0; i < count; i++) {
      b[i] = bf16_value(me, i, 11);
      wantb[i] = bf16_value(root, i, 11);
    }
    uint16_t* buf = device(b);
    uint16_t* dst = in_place ? buf : device(std::vector<uint16_t>(count, 0));
    ASSERT_EQ(ncclBroadcast(buf, dst, count, ncclBfloat16, root, c, s.nonblocking), ncclSuccess);
    EXPECT_EQ(first_difference(host(dst, count, s.nonblocking), wantb), "");
    cudaFree(buf);
    if (!in_place) cudaFree(dst);
  }
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// ncclSend/ncclRecv: a ring inside one group (each rank sends to the next, receives from the
// previous; at one rank, to itself), then pairs outside a group, each pair's even rank sending
// first (its receive waits, as a pipeline stage's would).
TEST(NcclStandIn, SendAndReceive) {
  const int W = world_size(), me = world_rank();
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  Streams s;
  const size_t n = 2053;
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  std::vector<float> x(n), want(n);
  for (size_t i = 0; i < n; i++) x[i] = value(me, i, 5), want[i] = value(prev, i, 5);
  std::vector<int64_t> xi(n), wanti(n);
  for (size_t i = 0; i < n; i++) xi[i] = (int64_t(me) << 40) + int64_t(i), wanti[i] = (int64_t(prev) << 40) + int64_t(i);
  float* in = device(x);
  float* out = device(std::vector<float>(n, NAN));
  int64_t* ini = device(xi);
  int64_t* outi = device(std::vector<int64_t>(n, -1));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(in, n, ncclFloat32, next, c, s.blocking), ncclSuccess);
  ASSERT_EQ(ncclRecv(out, n, ncclFloat32, prev, c, s.blocking), ncclSuccess);
  ASSERT_EQ(ncclSend(ini, n, ncclInt64, next, c, s.blocking), ncclSuccess);
  ASSERT_EQ(ncclRecv(outi, n, ncclInt64, prev, c, s.blocking), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(first_difference(host(out, n, s.blocking), want), "");
  EXPECT_EQ(host(outi, n, s.blocking), wanti);
  if (W % 2 == 0) {
    const int peer = me ^ 1;
    float* got = device(std::vector<float>(n, NAN));
    if (me % 2 == 0) {
      ASSERT_EQ(ncclSend(in, n, ncclFloat32, peer, c, s.blocking), ncclSuccess);
      ASSERT_EQ(ncclRecv(got, n, ncclFloat32, peer, c, s.blocking), ncclSuccess);
    } else {
      ASSERT_EQ(ncclRecv(got, n, ncclFloat32, peer, c, s.blocking), ncclSuccess);
      ASSERT_EQ(ncclSend(in, n, ncclFloat32, peer, c, s.blocking), ncclSuccess);
    }
    std::vector<float> from_peer(n);
    for (size_t i = 0; i < n; i++) from_peer[i] = value(peer, i, 5);
    EXPECT_EQ(first_difference(host(got, n, s.blocking), from_peer), "");
    cudaFree(got);
  }
  cudaFree(in), cudaFree(out), cudaFree(ini), cudaFree(outi);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Stream order, as a card keeps it:
//  - a kernel on stream A, an event, stream B waiting for it, an all-reduce and a kernel on B:
//    the all-reduce sees the first kernel's values, the second kernel the all-reduce's;
//  - two all-reduces on one stream: the second reduces the first's result;
//  - a result lands only when something waits for it: read with no wait, the buffer still holds
//    the input; a kernel on A after A waited for an event recorded on B after it sees the result;
//  - the legacy stream (cudaMemcpy) waits for a blocking stream, not for a non-blocking one.
TEST(NcclStandIn, StreamOrder) {
  const int W = world_size(), me = world_rank();
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  Streams s;
  cudaStream_t A = s.blocking, B = s.nonblocking;
  cudaEvent_t a_done, b_done;
  cudaEventCreateWithFlags(&a_done, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&b_done, cudaEventDisableTiming);
  const size_t n = 1000;
  const float sum_of_ranks = static_cast<float>(W * (W + 1) / 2);  // Σ (r + 1)
  float* buf = device(std::vector<float>(n, 0.0f));
  float* copy = device(std::vector<float>(n, NAN));

  llmpi::sim::launcher(fill_kernel, blocks(n), 256, 0, A)(buf, n, static_cast<float>(me + 1));
  cudaEventRecord(a_done, A);
  cudaStreamWaitEvent(B, a_done, 0);
  ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c, B), ncclSuccess);
  llmpi::sim::launcher(scale_kernel, blocks(n), 256, 0, B)(buf, n, 2.0f);
  EXPECT_EQ(host(buf, n, B), std::vector<float>(n, 2.0f * sum_of_ranks));

  ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c, B), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat32, ncclAvg, c, B), ncclSuccess);
  EXPECT_EQ(host(buf, n, B), std::vector<float>(n, 2.0f * sum_of_ranks * W));

  llmpi::sim::launcher(fill_kernel, blocks(n), 256, 0, B)(buf, n, static_cast<float>(me + 1));
  ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c, B), ncclSuccess);
  give_the_exchange_time();
  EXPECT_EQ(peek(buf, n), std::vector<float>(n, static_cast<float>(me + 1)))
      << "a result read without waiting for its stream must not be there yet";
  cudaEventRecord(b_done, B);
  cudaStreamWaitEvent(A, b_done, 0);
  llmpi::sim::launcher(copy_kernel, blocks(n), 256, 0, A)(copy, buf, n);
  EXPECT_EQ(host(copy, n, A), std::vector<float>(n, sum_of_ranks));

  // cudaEventQuery asks for the result: polling it ends
  ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c, B), ncclSuccess);
  cudaEventRecord(b_done, B);
  int polls = 0;
  while (cudaEventQuery(b_done) == cudaErrorNotReady) polls++;
  EXPECT_EQ(peek(buf, n), std::vector<float>(n, sum_of_ranks * W));

  // the legacy stream: cudaMemcpy waits for A (blocking) but not for B (non-blocking)
  std::vector<float> h(n);
  llmpi::sim::launcher(fill_kernel, blocks(n), 256, 0, A)(buf, n, 1.0f);
  ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c, A), ncclSuccess);
  cudaMemcpy(h.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(h, std::vector<float>(n, static_cast<float>(W)));
  llmpi::sim::launcher(fill_kernel, blocks(n), 256, 0, B)(buf, n, 1.0f);
  ASSERT_EQ(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c, B), ncclSuccess);
  give_the_exchange_time();
  cudaMemcpy(h.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(h, std::vector<float>(n, 1.0f)) << "cudaMemcpy does not wait for a non-blocking stream";
  EXPECT_EQ(host(buf, n, B), std::vector<float>(n, static_cast<float>(W)));

  cudaEventDestroy(a_done);
  cudaEventDestroy(b_done);
  cudaFree(buf);
  cudaFree(copy);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Two communicators at once (the world, and the even and the odd ranks, made from ids of
// different creators), used alternately on two streams; and the world's used from both streams,
// whose operations start in the order the host called them.
TEST(NcclStandIn, CommunicatorsCoexist) {
  const int W = world_size(), me = world_rank();
  MPI_Comm half_mpi;
  MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &half_mpi);
  int half_size = 0;
  MPI_Comm_size(half_mpi, &half_size);
  ncclComm_t world = make_comm(MPI_COMM_WORLD);
  ncclComm_t half = make_comm(half_mpi);
  Streams s;
  const size_t n = 513;
  float* a = device(std::vector<float>(n, static_cast<float>(me + 1)));
  float* b = device(std::vector<float>(n, static_cast<float>(10 * (me + 1))));
  float* c = device(std::vector<float>(n, 1.0f));
  float half_sum = 0.0f;
  for (int r = me % 2; r < W; r += 2) half_sum += static_cast<float>(10 * (r + 1));
  for (int round = 0; round < 3; round++) {
    ASSERT_EQ(ncclAllReduce(a, a, n, ncclFloat32, ncclAvg, world, s.blocking), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(b, b, n, ncclFloat32, ncclAvg, half, s.nonblocking), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(c, c, n, ncclFloat32, ncclSum, world, s.nonblocking), ncclSuccess);
  }
  EXPECT_EQ(host(a, n, s.blocking), std::vector<float>(n, static_cast<float>(W + 1) / 2.0f));
  EXPECT_EQ(host(b, n, s.nonblocking), std::vector<float>(n, half_sum / static_cast<float>(half_size)));
  EXPECT_EQ(host(c, n, s.nonblocking), std::vector<float>(n, static_cast<float>(W * W * W)));
  cudaFree(a), cudaFree(b), cudaFree(c);
  EXPECT_EQ(ncclCommDestroy(half), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(world), ncclSuccess);
  MPI_Comm_free(&half_mpi);
}

// What it refuses, each with NCCL's result code and a reason in ncclGetLastError; a group with a
// refused call runs none of its calls.
TEST(NcclStandIn, RefusesBadCalls) {
  const int W = world_size();
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  Streams s;
  const size_t n = 16;
  float* x = device(std::vector<float>(n, 3.0f));
  int32_t* xi = device(std::vector<int32_t>(n, 3));
  EXPECT_EQ(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, nullptr, s.blocking), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(xi, xi, n, ncclInt32, ncclSum, c, s.blocking), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c)).find("ncclFloat32 and ncclBfloat16"), std::string::npos)
      << ncclGetLastError(c);
  EXPECT_EQ(ncclAllReduce(x, x, n, ncclFloat32, ncclProd, c, s.blocking), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(x, x, n, ncclNumTypes, ncclSum, c, s.blocking), ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(x, x, n, ncclFloat32, W, c, s.blocking), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(x, n, ncclFloat32, -1, c, s.blocking), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c)).find("peer -1"), std::string::npos) << ncclGetLastError(c);
  EXPECT_EQ(ncclRecv(nullptr, n, ncclFloat32, 0, c, s.blocking), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  ncclUniqueId junk;
  std::memset(&junk, 7, sizeof junk);
  ncclComm_t bad = nullptr;
  EXPECT_EQ(ncclCommInitRank(&bad, 1, junk, 0), ncclInvalidArgument);
  EXPECT_EQ(bad, nullptr);
  // a group: the valid all-reduce before the refused one does not run either
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c, s.blocking), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(xi, xi, n, ncclInt32, ncclSum, c, s.blocking), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_EQ(host(x, n, s.blocking), std::vector<float>(n, 3.0f));
  // count 0 is nothing, as in NCCL
  EXPECT_EQ(ncclAllReduce(x, x, 0, ncclFloat32, ncclSum, c, s.blocking), ncclSuccess);
  // the communicator still works, every rank in step
  ASSERT_EQ(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c, s.blocking), ncclSuccess);
  EXPECT_EQ(host(x, n, s.blocking), std::vector<float>(n, 3.0f * W));
  EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, c, s.blocking), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  cudaFree(x);
  cudaFree(xi);
}

// Run on purpose at two ranks or more (tools/run_tests.sh): rank 0 reduces one float more than
// the others. The job must stop with every rank's call printed.
TEST(NcclStandInMismatch, DISABLED_DifferentCountsStopTheJob) {
  ncclComm_t c = make_comm(MPI_COMM_WORLD);
  Streams s;
  float* x = device(std::vector<float>(9, 1.0f));
  ASSERT_EQ(ncclAllReduce(x, x, world_rank() == 0 ? 9 : 8, ncclFloat32, ncclSum, c, s.blocking), ncclSuccess);
  host(x, 9, s.blocking);
  ADD_FAILURE() << "the job went on";
}
