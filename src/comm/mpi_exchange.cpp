// The MPI exchanges (comm/exchange.h): allreduce (fp32 or bf16 on the wire) and gather_scatter.
#include <algorithm>
#include <vector>

#include "comm/exchange.h"
#include "comm/grad_sync.h"
#include "runtime/large_count.h"
#include "comm/nccl.h"
#include "params/buckets.h"
#include "runtime/error.h"

namespace llmpi {

namespace {

// MPI_Op for bf16 on the wire: inout[i] = bf16(float(in[i]) + float(inout[i])), over MPI_UINT16_T
// elements holding bfloat16 bits. Commutative (fp32 addition of two values is).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; i++) b[i] = bf16_round(bf16_widen(a[i]) + bf16_widen(b[i]));
}

struct GroupShape {
  MPI_Comm comm;
  int rank = 0, world = 1;
  explicit GroupShape(MPI_Comm c) : comm(c) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
  }
};

// Every collective here goes through runtime/large_count.h: a bucket may be one tensor of more than
// INT_MAX floats (params/buckets.h), moved in pieces.

// MPI_Allgather of equal pieces of c = ceil(n/W) floats (the shorter ones padded) into a W·c buffer,
// then each piece copied into place. Not MPI_Allgatherv: MPICH 4.0's Allgatherv took 4.4 s where
// Allgather took 44 ms for 24 MB on 4 ranks sharing 2 cores (its pipelined ring waits for the
// scheduler at every 32 kB piece).
Traffic padded_all_gather(const GroupShape& g, float* data, size_t n, int poll_us, std::vector<float>& send,
                          std::vector<float>& recv) {
  std::vector<size_t> counts, displs;
  piece_counts(n, g.world, counts, displs);
  const size_t c = (n + g.world - 1) / g.world;
  send.assign(c, 0.0f);
  recv.resize(c * g.world);
  std::copy(data + displs[g.rank], data + displs[g.rank] + counts[g.rank], send.begin());
  large::allgather(send.data(), c, MPI_FLOAT, recv.data(), g.comm, poll_us);
  for (int r = 0; r < g.world; r++)
    std::copy(recv.begin() + (size_t)r * c, recv.begin() + (size_t)r * c + counts[r], data + displs[r]);
  Traffic t;
  t.collectives = 1;
  t.sent = t.received = (g.world - 1) * (double)c * sizeof(float);
  return t;
}

// ---- allreduce ------------------------------------------------------------------------------------

struct AllreduceExchange final : Exchange {
  GroupShape g;
  bool bf16;
  MPI_Op bf16_sum_op = MPI_OP_NULL;
  std::vector<uint16_t> wire, wire_piece;  // bf16: a bucket, and the reduce-scatter's piece
  std::vector<float> piece, send, recv;

  AllreduceExchange(MPI_Comm comm, bool bf16_) : g(comm), bf16(bf16_) {
    if (bf16 && g.world > 1) MPI_Op_create(&bf16_sum, 1, &bf16_sum_op);
  }
  ~AllreduceExchange() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (bf16_sum_op != MPI_OP_NULL && !finalized) MPI_Op_free(&bf16_sum_op);
  }
  size_t wire_bytes() const { return bf16 ? 2 : sizeof(float); }
  // The buffer the collective moves: data in fp32, or its bf16 rounding in `wire`.
  void* to_wire(float* data, size_t n) {
    if (!bf16) return data;
    wire.resize(n);
    for (size_t i = 0; i < n; i++) wire[i] = bf16_round(data[i]);
    return wire.data();
  }

  Traffic average(float* data, size_t n, int poll_us) override {
    void* buf = to_wire(data, n);
    const MPI_Datatype type = bf16 ? MPI_UINT16_T : MPI_FLOAT;
    const MPI_Op sum = bf16 ? bf16_sum_op : MPI_SUM;
    large::allreduce(MPI_IN_PLACE, buf, n, type, sum, g.comm, poll_us);
    const float inv = 1.0f / (float)g.world;
    if (bf16)
      for (size_t i = 0; i < n; i++) data[i] = bf16_widen(wire[i]) * inv;
    else
      for (size_t i = 0; i < n; i++) data[i] *= inv;
    Traffic t;
    t.collectives = 1;
    t.sent = t.received = expected_bytes_per_pass(n, false);
    return t;
  }

  Traffic reduce_scatter_mean(float* data, size_t n, int poll_us) override {
    std::vector<size_t> counts, displs;
    piece_counts(n, g.world, counts, displs);
    const size_t mine = counts[g.rank], at = displs[g.rank];
    void* buf = to_wire(data, n);
    const MPI_Datatype type = bf16 ? MPI_UINT16_T : MPI_FLOAT;
    const MPI_Op sum = bf16 ? bf16_sum_op : MPI_SUM;
    if (bf16) wire_piece.resize(mine);
    else piece.resize(mine);
    void* out = bf16 ? static_cast<void*>(wire_piece.data()) : static_cast<void*>(piece.data());
    large::reduce_scatter(buf, out, counts, type, sum, g.comm, poll_us);
    const float inv = 1.0f / (float)g.world;
    for (size_t i = 0; i < mine; i++) data[at + i] = (bf16 ? bf16_widen(wire_piece[i]) : piece[i]) * inv;
    Traffic t;  // bandwidth-optimal reduce-scatter
    t.collectives = 1;
    t.sent = t.received = (g.world - 1) * ((double)n * wire_bytes()) / g.world;
    return t;
  }

  Traffic all_gather(float* data, size_t n, int poll_us) override {
    return padded_all_gather(g, data, n, poll_us, send, recv);  // parameters: fp32 whatever the wire type
  }

  double expected_bytes_per_pass(size_t n, bool zero) const override {
    if (g.world == 1) return 0;
    const double bytes = (double)n * sizeof(float), grad = (double)n * wire_bytes();
    // all-reduce (bandwidth-optimal algorithms), or reduce-scatter + all-gather: 2(W-1)/W of the bytes
    return (g.world - 1.0) / g.world * (zero ? grad + bytes : 2.0 * grad);
  }
};

// ---- gather_scatter -------------------------------------------------------------------------------

struct GatherScatterExchange final : Exchange {
  GroupShape g;
  std::vector<float> gathered, scattered, piece;
  explicit GatherScatterExchange(MPI_Comm comm) : g(comm) {}

  void gather(const float* data, size_t n, int poll_us) {
    if (g.rank == 0) {
      gathered.resize(n * g.world);
      scattered.resize(n * g.world);
    }
    float* gbuf = g.rank == 0 ? gathered.data() : nullptr;
    large::gather(data, n, MPI_FLOAT, gbuf, 0, g.comm, poll_us);
  }
  // Rank 0: the mean of the gathered rows, summed in rank order, into scattered[0, n).
  void mean_at_root(size_t n) {
    if (g.rank != 0) return;
    const float inv = 1.0f / (float)g.world;
    for (size_t i = 0; i < n; i++) {
      float s = 0;
      for (int r = 0; r < g.world; r++) s += gathered[(size_t)r * n + i];
      scattered[i] = s * inv;
    }
  }
  void scatter(float* recv, size_t count, int poll_us) {
    float* sbuf = g.rank == 0 ? scattered.data() : nullptr;
    large::scatter(sbuf, count, MPI_FLOAT, recv, 0, g.comm, poll_us);
  }

  Traffic average(float* data, size_t n, int poll_us) override {
    gather(data, n, poll_us);
    mean_at_root(n);
    if (g.rank == 0)
      for (int r = 1; r < g.world; r++)
        std::copy(scattered.begin(), scattered.begin() + n, scattered.begin() + (size_t)r * n);
    scatter(data, n, poll_us);
    const double bytes = (double)n * sizeof(float);
    Traffic t;  // root: (W−1)·B in, W−1 copies out; the others: B each way
    t.collectives = 2;
    t.sent = g.rank == 0 ? (g.world - 1) * bytes : bytes;
    t.received = g.rank == 0 ? (g.world - 1) * bytes : bytes;
    return t;
  }

  Traffic reduce_scatter_mean(float* data, size_t n, int poll_us) override {
    std::vector<size_t> counts, displs;
    piece_counts(n, g.world, counts, displs);
    const size_t mine = counts[g.rank], at = displs[g.rank];
    gather(data, n, poll_us);
    mean_at_root(n);
    // The pieces padded to c = ceil(n/W) floats each and scattered with MPI_Scatter (MPICH's
    // Scatterv is as slow as its Allgatherv when ranks share cores).
    const size_t c = (n + g.world - 1) / g.world;
    if (g.rank == 0)
      for (int r = g.world - 1; r >= 0; r--)  // in place, from the back: piece r moves to r·c ≥ displs[r]
        std::copy_backward(scattered.begin() + displs[r], scattered.begin() + displs[r] + counts[r],
                           scattered.begin() + (size_t)r * c + counts[r]);
    piece.resize(c);
    scatter(piece.data(), c, poll_us);
    std::copy(piece.begin(), piece.begin() + mine, data + at);
    const double bytes = (double)n * sizeof(float), back = (double)mine * sizeof(float);
    Traffic t;
    t.collectives = 2;
    t.sent = g.rank == 0 ? bytes - back : bytes;
    t.received = g.rank == 0 ? (g.world - 1) * bytes : back;
    return t;
  }

  Traffic all_gather(float* data, size_t n, int poll_us) override {
    // Through rank 0: gather the pieces, scatter W copies of the whole bucket.
    std::vector<size_t> counts, displs;
    piece_counts(n, g.world, counts, displs);
    const size_t mine = counts[g.rank], at = displs[g.rank];
    if (g.rank == 0) {
      gathered.resize(n * g.world);
      scattered.resize(n * g.world);
    }
    float* gbuf = g.rank == 0 ? gathered.data() : nullptr;
    large::gatherv(data + at, counts, displs, MPI_FLOAT, gbuf, 0, g.comm, poll_us);
    if (g.rank == 0)
      for (int r = 0; r < g.world; r++)
        std::copy(gathered.begin(), gathered.begin() + n, scattered.begin() + (size_t)r * n);
    scatter(data, n, poll_us);
    const double bytes = (double)n * sizeof(float);
    Traffic t;
    t.collectives = 2;
    t.sent = g.rank == 0 ? (g.world - 1) * bytes : mine * sizeof(float);
    t.received = g.rank == 0 ? bytes - mine * sizeof(float) : bytes;
    return t;
  }

  double expected_bytes_per_pass(size_t n, bool zero) const override {
    if (g.world == 1) return 0;
    const double bytes = (double)n * sizeof(float);
    // root: (W-1)·B in by gather, out by scatter; others B each way. Zero (sent): the root scatters
    // the others' pieces, ~(W-1)/W·B, and W-1 copies of the gathered bucket; the others send B and
    // their piece, ~B/W.
    if (zero) return g.rank == 0 ? (g.world - 1) * bytes / g.world + (g.world - 1) * bytes : bytes + bytes / g.world;
    return g.rank == 0 ? (g.world - 1) * bytes : bytes;
  }
};

}  // namespace

std::unique_ptr<Exchange> make_exchange(SyncMethod method, bool bf16, MPI_Comm comm) {
  switch (method) {
    case SyncMethod::gather_scatter: return std::make_unique<GatherScatterExchange>(comm);
    case SyncMethod::allreduce: return std::make_unique<AllreduceExchange>(comm, bf16);
    case SyncMethod::weights: return std::make_unique<AllreduceExchange>(comm, false);
    case SyncMethod::nccl: return make_nccl_exchange(bf16, comm);
  }
  fail("internal: no exchange for parallel.sync ", option_name(method));
}

}  // namespace llmpi
