// MPI transfers in pieces (runtime/large_count.h):
//   - LargeCount (serial): the checked conversion refuses a count past INT_MAX, naming it and the
//     limit; the piece limit is set and cleared;
//   - Mpi* / MpiN4*: with the limit at a few elements, every call (each root, lengths that the
//     limit does not divide, zero, blocking and polled) leaves the buffers the plain MPI call
//     leaves, and point-to-point messages really go in pieces;
//   - Mpi*: training in pieces of 7 floats (pipeline stages with the tied embedding, tensor and
//     sequence parallelism, ZeRO-1 with bf16 and polling, gather_scatter, weights), interrupted and
//     resumed from a checkpoint, gives the bits of training in whole messages: the losses, the
//     checkpoint's parameters and moments, the final parameters.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "runtime/large_count.h"
#include "mpi_test_data.h"
#include "runtime/error.h"
#include "train/trainer.h"

using namespace llmpi;
using namespace llmpi::testing_support;

namespace {

// The piece limit for a scope (every rank sets the same one).
struct PieceLimit {
  explicit PieceLimit(size_t n) { set_mpi_max_count(n); }
  ~PieceLimit() { set_mpi_max_count(0); }
  PieceLimit(const PieceLimit&) = delete;
  PieceLimit& operator=(const PieceLimit&) = delete;
};

// Distinct, exactly representable values: sums over a few ranks are exact in any order, so the
// plain call and the pieces must agree bit for bit whatever algorithm the library picks.
float value(int rank, size_t i, int salt) { return (float)(salt * 100000 + rank * 1000 + (int)i) + 0.25f; }

std::vector<float> values(int rank, size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = value(rank, i, salt);
  return v;
}

// A user-defined, commutative op on uint32: bitwise xor.
void xor_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint32_t* a = static_cast<const uint32_t*>(in);
  uint32_t* b = static_cast<uint32_t*>(inout);
  for (int i = 0; i < *len; i++) b[i] ^= a[i];
}

std::vector<int> ints(const std::vector<size_t>& v) { return std::vector<int>(v.begin(), v.end()); }

void collectives_equal_plain_calls(size_t n, int poll_us) {
  MPI_Comm comm = MPI_COMM_WORLD;
  const int W = world_size(), me = world_rank(), c = (int)n;
  // allreduce: fp32 sum (separate buffers and in place), fp64 max, a user op
  {
    const std::vector<float> mine = values(me, n, 1);
    std::vector<float> a(n, -1.0f), b(n, -2.0f), in_place = mine;
    large::allreduce(mine.data(), a.data(), n, MPI_FLOAT, MPI_SUM, comm, poll_us);
    MPI_Allreduce(mine.data(), b.data(), c, MPI_FLOAT, MPI_SUM, comm);
    large::allreduce(MPI_IN_PLACE, in_place.data(), n, MPI_FLOAT, MPI_SUM, comm, poll_us);
    EXPECT_EQ(a, b) << "allreduce fp32 sum";
    EXPECT_EQ(in_place, b) << "allreduce fp32 sum in place";
    std::vector<double> d(n), dmax(n);
    for (size_t i = 0; i < n; i++) d[i] = (double)((i * 7 + me * 13) % 29);
    std::vector<double> dref = d;
    large::allreduce(MPI_IN_PLACE, d.data(), n, MPI_DOUBLE, MPI_MAX, comm, poll_us);
    MPI_Allreduce(MPI_IN_PLACE, dref.data(), c, MPI_DOUBLE, MPI_MAX, comm);
    // Exact: a maximum is one of its operands, whatever the order.
    EXPECT_EQ(d, dref) << "allreduce fp64 max";
    MPI_Op x;
    MPI_Op_create(&xor_op, 1, &x);
    std::vector<uint32_t> u(n);
    for (size_t i = 0; i < n; i++) u[i] = (uint32_t)(0x9E3779B9u * (i + 1) + 0x85EBCA6Bu * (me + 1));
    std::vector<uint32_t> uref = u;
    large::allreduce(MPI_IN_PLACE, u.data(), n, MPI_UINT32_T, x, comm, poll_us);
    MPI_Allreduce(MPI_IN_PLACE, uref.data(), c, MPI_UINT32_T, x, comm);
    MPI_Op_free(&x);
    EXPECT_EQ(u, uref) << "allreduce user op";
  }
  // gather, scatter (every root), allgather
  for (int root = 0; root < W; root++) {
    const std::vector<float> mine = values(me, n, 2);
    std::vector<float> a(n * W, -1.0f), b(n * W, -1.0f);
    large::gather(mine.data(), n, MPI_FLOAT, me == root ? a.data() : nullptr, root, comm, poll_us);
    MPI_Gather(mine.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, root, comm);
    EXPECT_EQ(a, b) << "gather, root " << root;
    const std::vector<float> all = values(me, n * W, 3);
    std::vector<float> sa(n, -1.0f), sb(n, -1.0f);
    large::scatter(me == root ? all.data() : nullptr, n, MPI_FLOAT, sa.data(), root, comm, poll_us);
    MPI_Scatter(all.data(), c, MPI_FLOAT, sb.data(), c, MPI_FLOAT, root, comm);
    EXPECT_EQ(sa, sb) << "scatter, root " << root;
    for (size_t i = 0; i < n; i++)
      if (sa[i] != value(root, (size_t)me * n + i, 3)) {
        ADD_FAILURE() << "scatter, root " << root << ": element " << i << " is " << sa[i];
        break;
      }
  }
  {
    const std::vector<float> mine = values(me, n, 4);
    std::vector<float> a(n * W, -1.0f), b(n * W, -1.0f);
    large::allgather(mine.data(), n, MPI_FLOAT, a.data(), comm, poll_us);
    MPI_Allgather(mine.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, comm);
    EXPECT_EQ(a, b) << "allgather";
  }
  // gatherv: uneven counts (one of them zero when n allows), blocks in reverse rank order with gaps
  for (int root = 0; root < W; root++) {
    std::vector<size_t> counts(W), displs(W);
    for (int r = 0; r < W; r++) counts[r] = r == 1 ? n / 3 : n + (size_t)r * 5 % (n + 1);
    size_t at = 0;
    for (int r = W - 1; r >= 0; r--) displs[r] = at, at += counts[r] + 3;
    const std::vector<float> mine = values(me, counts[me], 5);
    std::vector<float> a(at, -1.0f), b(at, -1.0f);
    large::gatherv(mine.data(), counts, displs, MPI_FLOAT, me == root ? a.data() : nullptr, root, comm, poll_us);
    const std::vector<int> ic = ints(counts), id = ints(displs);
    MPI_Gatherv(mine.data(), ic[me], MPI_FLOAT, b.data(), ic.data(), id.data(), MPI_FLOAT, root, comm);
    EXPECT_EQ(a, b) << "gatherv, root " << root;
  }
  // reduce_scatter (uneven parts) and reduce_scatter_block
  {
    std::vector<size_t> counts(W);
    for (int r = 0; r < W; r++) counts[r] = n + (size_t)r * 3 % (n + 1);
    size_t total = 0;
    for (size_t k : counts) total += k;
    const std::vector<float> mine = values(me, total, 6);
    std::vector<float> a(counts[me], -1.0f), b(counts[me], -1.0f);
    large::reduce_scatter(mine.data(), a.data(), counts, MPI_FLOAT, MPI_SUM, comm, poll_us);
    const std::vector<int> ic = ints(counts);
    MPI_Reduce_scatter(mine.data(), b.data(), ic.data(), MPI_FLOAT, MPI_SUM, comm);
    EXPECT_EQ(a, b) << "reduce_scatter";
    const std::vector<float> blocks = values(me, n * W, 7);
    std::vector<float> ba(n, -1.0f), bb(n, -1.0f);
    large::reduce_scatter_block(blocks.data(), ba.data(), n, MPI_FLOAT, MPI_SUM, comm, poll_us);
    MPI_Reduce_scatter_block(blocks.data(), bb.data(), c, MPI_FLOAT, MPI_SUM, comm);
    EXPECT_EQ(ba, bb) << "reduce_scatter_block";
  }
}

void point_to_point_and_bcast(size_t n) {
  MPI_Comm comm = MPI_COMM_WORLD;
  const int W = world_size(), me = world_rank(), c = (int)n;
  const size_t limit = mpi_max_count(), expected_pieces = n == 0 ? 1 : (n + limit - 1) / limit;
  // Exact throughout: broadcasts and messages copy the values, no arithmetic.
  for (int root = 0; root < W; root++) {
    std::vector<float> a = me == root ? values(me, n, 8) : std::vector<float>(n, -1.0f), b = a;
    large::bcast(a.data(), n, MPI_FLOAT, root, comm);
    MPI_Bcast(b.data(), c, MPI_FLOAT, root, comm);
    EXPECT_EQ(a, b) << "bcast, root " << root;
    EXPECT_EQ(a, values(root, n, 8)) << "bcast, root " << root;
  }
  // blocking, every ordered pair; then with the length sent first
  for (int from = 0; from < W; from++)
    for (int to = 0; to < W; to++) {
      if (from == to) continue;
      if (me == from) {
        const std::vector<float> v = values(me, n, 9);
        large::send(v.data(), n, MPI_FLOAT, to, 7, comm);
        large::send_with_length(v.data(), n, MPI_FLOAT, to, 8, comm);
      } else if (me == to) {
        std::vector<float> v(n, -1.0f);
        large::recv(v.data(), n, MPI_FLOAT, from, 7, comm);
        EXPECT_EQ(v, values(from, n, 9)) << "send/recv " << from << " -> " << to;
        std::vector<float> w(large::recv_length(from, 8, comm), -1.0f);
        ASSERT_EQ(w.size(), n);
        large::recv(w.data(), w.size(), MPI_FLOAT, from, 8, comm);
        EXPECT_EQ(w, values(from, n, 9)) << "send_with_length " << from << " -> " << to;
      }
    }
  // nonblocking around the ring, two messages with one tag in flight at once: one request per piece
  const int next = (me + 1) % W, prev = (me + W - 1) % W;
  const std::vector<float> out1 = values(me, n, 10), out2 = values(me, n, 11);
  std::vector<float> in1(n, -1.0f), in2(n, -1.0f);
  std::vector<MPI_Request> r1, r2, s1, s2;
  large::irecv(in1.data(), n, MPI_FLOAT, prev, 5, comm, r1);
  large::irecv(in2.data(), n, MPI_FLOAT, prev, 5, comm, r2);
  large::isend(out1.data(), n, MPI_FLOAT, next, 5, comm, s1);
  large::isend(out2.data(), n, MPI_FLOAT, next, 5, comm, s2);
  EXPECT_EQ(r1.size(), expected_pieces);
  EXPECT_EQ(s2.size(), expected_pieces);
  while (!large::test_all(r2)) {
  }
  large::wait_all(r1);
  large::wait_all(s1);
  large::wait_all(s2);
  EXPECT_EQ(in1, values(prev, n, 10)) << "isend/irecv, first message";
  EXPECT_EQ(in2, values(prev, n, 11)) << "isend/irecv, second message";
}

const std::vector<size_t> kLengths = {0, 1, 6, 7, 8, 13, 14, 15, 300, 301};

void every_call_equals_the_plain_call(const std::vector<size_t>& limits, const std::vector<size_t>& lengths) {
  for (size_t limit : limits) {
    PieceLimit l(limit);
    ASSERT_EQ(mpi_max_count(), limit);
    for (size_t n : lengths) {
      SCOPED_TRACE("limit " + std::to_string(limit) + ", n " + std::to_string(n));
      point_to_point_and_bcast(n);
      for (int poll_us : {0, 1}) collectives_equal_plain_calls(n, poll_us);
    }
  }
}

}  // namespace

TEST(LargeCount, CheckedConversionRefusesWhatWouldWrap) {
  EXPECT_EQ(mpi_count(0, "x"), 0);
  EXPECT_EQ(mpi_count((size_t)INT_MAX, "x"), INT_MAX);
  for (size_t n : {(size_t)INT_MAX + 1, (size_t)8600000000ull}) {
    try {
      mpi_count(n, "a bucket");
      ADD_FAILURE() << "accepted " << n;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("a bucket"), std::string::npos) << m;
      EXPECT_NE(m.find(std::to_string(n)), std::string::npos) << m;
      EXPECT_NE(m.find("2147483647"), std::string::npos) << m;
    }
  }
}

TEST(LargeCount, TheLimitIsSetAndCleared) {
  const size_t before = mpi_max_count();
  EXPECT_GE(before, 1u);
  EXPECT_LE(before, (size_t)INT_MAX);
  set_mpi_max_count(5);
  EXPECT_EQ(mpi_max_count(), 5u);
  set_mpi_max_count((size_t)1 << 40);
  EXPECT_EQ(mpi_max_count(), (size_t)INT_MAX);
  set_mpi_max_count(0);
  EXPECT_EQ(mpi_max_count(), before);
  if (!std::getenv("LLMPI_MPI_MAX_COUNT")) {
    EXPECT_EQ(before, (size_t)INT_MAX);
  }
}

TEST(MpiLargeCount, EveryCallEqualsThePlainCall) {
  every_call_equals_the_plain_call({1, 7, (size_t)INT_MAX}, kLengths);
}
TEST(MpiN4LargeCount, EveryCallEqualsThePlainCall) { every_call_equals_the_plain_call({7}, {0, 6, 15, 301}); }

// Training in pieces of 7 floats, interrupted after 3 steps and resumed from the checkpoint, gives
// the bits of training in whole messages.
TEST(MpiLargeCount, TrainingInSmallPiecesGivesTheSameBits) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD);
  const std::string tr = make_pattern_file(MPI_COMM_WORLD, dir, "train.h5", 40000, 64, 41);
  struct Layout {
    const char* name;
    std::vector<std::string> sets;
  };
  const std::vector<Layout> layouts = {
      {"pp2-1f1b", {"parallel.pp_stages=2", "parallel.microbatches=4", "parallel.schedule=1f1b"}},
      {"tp2-sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
      {"zero-bf16-overlap", {"parallel.zero=1", "parallel.grad_dtype=bf16", "parallel.bucket_mb=0.02",
                             "parallel.overlap=true", "parallel.poll_us=20"}},
      {"gather_scatter-zero", {"parallel.sync=gather_scatter", "parallel.zero=1", "parallel.bucket_mb=0.02"}},
      {"weights", {"parallel.sync=weights", "parallel.average_every=2"}},
  };
  for (const Layout& lay : layouts) {
    struct Outcome {
      TrainResult first, second;
      CheckpointData saved;
    };
    auto run = [&](size_t limit) {
      PieceLimit l(limit);
      std::vector<std::string> sets = lay.sets;
      const std::string run_dir = dir + "/" + lay.name + "-" + std::to_string(limit);
      sets.insert(sets.end(), {"train.steps=6", "train.warmup_steps=2", "checkpoint.every=2", "run.dir=" + run_dir});
      const Config cfg = tiny_config(tr, sets);
      Outcome o;
      o.first = train(cfg, MPI_COMM_WORLD, train_options(true, "", 2), true);  // 3 steps, then a checkpoint
      o.second = train(cfg, MPI_COMM_WORLD, train_options(true, "auto"), true);
      if (world_rank() == 0) {
        o.saved.info = read_checkpoint_info(o.first.last_checkpoint);
        const size_t floats = o.saved.info.rows * o.saved.info.n;
        o.saved.params.resize(floats), o.saved.m.resize(floats), o.saved.v.resize(floats);
        for (int64_t r = 0; r < o.saved.info.rows; r++)
          read_checkpoint_row(o.saved.info, r, o.saved.params.data() + r * o.saved.info.n,
                              o.saved.m.data() + r * o.saved.info.n, o.saved.v.data() + r * o.saved.info.n);
      }
      return o;
    };
    const Outcome whole = run((size_t)INT_MAX), pieces = run(7);
    SCOPED_TRACE(lay.name);
    ASSERT_TRUE(whole.first.preempted);
    ASSERT_EQ(pieces.second.start_step, 3);
    // Exact: under -n 2 each reduced element is one addition of two values (the same bits in either
    // order, whole or in pieces, whatever algorithm MPI picks); everything else is copied.
    EXPECT_EQ(pieces.first.losses, whole.first.losses);
    EXPECT_EQ(pieces.second.losses, whole.second.losses);
    EXPECT_EQ(pieces.second.final_params, whole.second.final_params);
    EXPECT_FALSE(pieces.second.final_params.empty());
    if (world_rank() == 0) {
      ASSERT_EQ(whole.first.losses.size(), 3u);
      EXPECT_EQ(pieces.saved.info.step, whole.saved.info.step);
      EXPECT_EQ(pieces.saved.info.rows, whole.saved.info.rows);
      EXPECT_EQ(pieces.saved.params, whole.saved.params) << "the checkpoint's parameters";
      EXPECT_EQ(pieces.saved.m, whole.saved.m) << "the checkpoint's first moments";
      EXPECT_EQ(pieces.saved.v, whole.saved.v) << "the checkpoint's second moments";
      EXPECT_NE(whole.saved.m, std::vector<float>(whole.saved.m.size(), 0.0f)) << "moments never written";
    }
  }
}
