// MPI transfers of any length, in pieces of at most mpi_max_count() elements (runtime/large_count.h).
#include "runtime/large_count.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/error.h"

namespace llmpi {

namespace {

constexpr size_t kIntMax = (size_t)INT_MAX;

std::atomic<size_t> limit_set{0};  // set_mpi_max_count's value; 0: none

size_t limit_from_env() {
  static const size_t limit = [] {
    const char* s = std::getenv("LLMPI_MPI_MAX_COUNT");
    if (!s || !*s) return kIntMax;
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || s[0] == '-' || v < 1 || v > kIntMax)
      fail("LLMPI_MPI_MAX_COUNT=", s, " is not a count in [1, ", kIntMax,
           "]: set it to the most elements one MPI call may move, or unset it");
    return (size_t)v;
  }();
  return limit;
}

// Bytes per element of a datatype the pieces are cut from: its extent, which must be its size.
size_t element_bytes(MPI_Datatype type) {
  MPI_Aint lb = 0, extent = 0;
  int size = 0;
  MPI_Type_get_extent(type, &lb, &extent);
  MPI_Type_size(type, &size);
  if (lb != 0 || extent != (MPI_Aint)size || size <= 0)
    fail("internal: large MPI transfers need a contiguous datatype (extent ", extent, ", size ", size, ")");
  return (size_t)size;
}

// p advanced by `elements` of `bytes` each; a null pointer (a buffer not significant here) stays null.
void* at(void* p, size_t elements, size_t bytes) {
  return p ? static_cast<char*>(p) + elements * bytes : nullptr;
}
const void* at(const void* p, size_t elements, size_t bytes) {
  if (p == MPI_IN_PLACE) return MPI_IN_PLACE;
  return p ? static_cast<const char*>(p) + elements * bytes : nullptr;
}

// How many pieces of at most `limit` cover n (one, empty, for n = 0), and the size of piece k
// (at most mpi_max_count() <= INT_MAX: the (int) casts below cannot wrap).
size_t pieces(size_t n, size_t limit) { return n == 0 ? 1 : (n + limit - 1) / limit; }
size_t piece(size_t n, size_t k, size_t limit) { return n > k * limit ? std::min(limit, n - k * limit) : 0; }

// The blocking call, or with poll_us > 0 the nonblocking one polled to completion.
template <class Blocking, class Nonblocking>
void run(int poll_us, Blocking blocking, Nonblocking start) {
  if (poll_us > 0) {
    MPI_Request req;
    start(&req);
    large::wait_polling(&req, poll_us);
  } else {
    blocking();
  }
}

// c elements of `type`, with the extent of a whole block of n: piece k of every rank's block at
// once (rank r's lands r blocks further on).
struct BlockPiece {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  BlockPiece(size_t c, size_t n, size_t bytes, MPI_Datatype element) {
    MPI_Datatype run_of_c;
    MPI_Type_contiguous(mpi_count(c, "a piece of a large transfer"), element, &run_of_c);
    MPI_Type_create_resized(run_of_c, 0, (MPI_Aint)(n * bytes), &type);
    MPI_Type_commit(&type);
    MPI_Type_free(&run_of_c);
  }
  ~BlockPiece() { MPI_Type_free(&type); }
  BlockPiece(const BlockPiece&) = delete;
  BlockPiece& operator=(const BlockPiece&) = delete;
};

struct Group {
  int rank = 0, size = 1;
  explicit Group(MPI_Comm comm) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
};

void check_per_rank(const std::vector<size_t>& v, const Group& g, const char* what) {
  if (v.size() != (size_t)g.size)
    fail("internal: ", what, " lists ", v.size(), " ranks, the communicator has ", g.size);
}

std::vector<int> ints(const std::vector<size_t>& v, const char* what) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = mpi_count(v[i], what);
  return out;
}

// The piece size of the staged collectives: their packed round of every rank's piece (and its
// int displacements) stays within INT_MAX elements.
size_t staged_limit(const Group& g) { return std::max<size_t>(1, std::min(mpi_max_count(), kIntMax / g.size)); }

}  // namespace

size_t mpi_max_count() {
  const size_t set = limit_set.load(std::memory_order_relaxed);
  return set ? set : limit_from_env();
}

void set_mpi_max_count(size_t n) { limit_set.store(std::min(n, kIntMax), std::memory_order_relaxed); }

int mpi_count(size_t n, const char* what) {
  if (n > kIntMax)
    fail(what, ": ", n, " elements in one MPI call, more than its limit of ", kIntMax,
         " (a 32-bit count); this transfer was expected to stay far below it");
  return (int)n;
}

MPI_Datatype mpi_size_type() {
  static_assert(sizeof(size_t) == sizeof(uint64_t), "size_t is moved as MPI_UINT64_T");
  return MPI_UINT64_T;
}

namespace large {

void wait_polling(MPI_Request* req, int poll_us) {
  int done = 0;
  MPI_Test(req, &done, MPI_STATUS_IGNORE);
  while (!done) {
    std::this_thread::sleep_for(std::chrono::microseconds(poll_us));
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
  }
}

void bcast(void* buf, size_t n, MPI_Datatype type, int root, MPI_Comm comm) {
  const size_t L = mpi_max_count(), B = element_bytes(type);
  for (size_t k = 0, K = pieces(n, L); k < K; k++)
    MPI_Bcast(at(buf, k * L, B), (int)piece(n, k, L), type, root, comm);
}

void allreduce(const void* send, void* recv, size_t n, MPI_Datatype type, MPI_Op op, MPI_Comm comm, int poll_us) {
  const size_t L = mpi_max_count(), B = element_bytes(type);
  for (size_t k = 0, K = pieces(n, L); k < K; k++) {
    const void* s = at(send, k * L, B);
    void* r = at(recv, k * L, B);
    const int c = (int)piece(n, k, L);
    run(poll_us, [&] { MPI_Allreduce(s, r, c, type, op, comm); },
        [&](MPI_Request* q) { MPI_Iallreduce(s, r, c, type, op, comm, q); });
  }
}

void send(const void* buf, size_t n, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
  const size_t L = mpi_max_count(), B = element_bytes(type);
  for (size_t k = 0, K = pieces(n, L); k < K; k++)
    MPI_Send(at(buf, k * L, B), (int)piece(n, k, L), type, dest, tag, comm);
}

void recv(void* buf, size_t n, MPI_Datatype type, int source, int tag, MPI_Comm comm) {
  const size_t L = mpi_max_count(), B = element_bytes(type);
  for (size_t k = 0, K = pieces(n, L); k < K; k++)
    MPI_Recv(at(buf, k * L, B), (int)piece(n, k, L), type, source, tag, comm, MPI_STATUS_IGNORE);
}

void send_with_length(const void* buf, size_t n, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
  const uint64_t len = n;
  MPI_Send(&len, 1, MPI_UINT64_T, dest, tag, comm);
  send(buf, n, type, dest, tag, comm);
}

size_t recv_length(int source, int tag, MPI_Comm comm) {
  uint64_t len = 0;
  MPI_Recv(&len, 1, MPI_UINT64_T, source, tag, comm, MPI_STATUS_IGNORE);
  return (size_t)len;
}

void isend(const void* buf, size_t n, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
           std::vector<MPI_Request>& reqs) {
  const size_t L = mpi_max_count(), B = element_bytes(type);
  for (size_t k = 0, K = pieces(n, L); k < K; k++) {
    reqs.push_back(MPI_REQUEST_NULL);
    MPI_Isend(at(buf, k * L, B), (int)piece(n, k, L), type, dest, tag, comm, &reqs.back());
  }
}

void irecv(void* buf, size_t n, MPI_Datatype type, int source, int tag, MPI_Comm comm,
           std::vector<MPI_Request>& reqs) {
  const size_t L = mpi_max_count(), B = element_bytes(type);
  for (size_t k = 0, K = pieces(n, L); k < K; k++) {
    reqs.push_back(MPI_REQUEST_NULL);
    MPI_Irecv(at(buf, k * L, B), (int)piece(n, k, L), type, source, tag, comm, &reqs.back());
  }
}

void wait_all(std::vector<MPI_Request>& reqs) {
  MPI_Waitall(mpi_count(reqs.size(), "requests of a message"), reqs.data(), MPI_STATUSES_IGNORE);
}

bool test_all(std::vector<MPI_Request>& reqs) {
  int flag = 0;
  MPI_Testall(mpi_count(reqs.size(), "requests of a message"), reqs.data(), &flag, MPI_STATUSES_IGNORE);
  return flag != 0;
}

namespace {

// Gather, scatter and allgather move one part of n elements per rank; past mpi_max_count they move
// piece k of every part at once. `call(s, r, c, whole_count, whole_type)` runs one such transfer:
// s and r at element k·L of send and recv, c elements of `type` on the side of one part, and on
// the side of every rank's parts whole_count of whole_type (c of `type` when n is one piece, else
// one BlockPiece: c elements, the next rank's n elements further on).
template <class Call>
void per_part_pieces(const void* send, void* recv, size_t n, MPI_Datatype type, Call call) {
  const size_t L = mpi_max_count(), B = element_bytes(type);
  if (n <= L) {
    call(send, recv, (int)n, (int)n, type);
    return;
  }
  for (size_t k = 0, K = pieces(n, L); k < K; k++) {
    const size_t c = piece(n, k, L);
    const BlockPiece block(c, n, B, type);
    call(at(send, k * L, B), at(recv, k * L, B), (int)c, 1, block.type);
  }
}

}  // namespace

void gather(const void* send, size_t n, MPI_Datatype type, void* recv, int root, MPI_Comm comm, int poll_us) {
  per_part_pieces(send, recv, n, type, [&](const void* s, void* r, int c, int wc, MPI_Datatype wt) {
    run(poll_us, [&] { MPI_Gather(s, c, type, r, wc, wt, root, comm); },
        [&](MPI_Request* q) { MPI_Igather(s, c, type, r, wc, wt, root, comm, q); });
  });
}

void scatter(const void* send, size_t n, MPI_Datatype type, void* recv, int root, MPI_Comm comm, int poll_us) {
  per_part_pieces(send, recv, n, type, [&](const void* s, void* r, int c, int wc, MPI_Datatype wt) {
    run(poll_us, [&] { MPI_Scatter(s, wc, wt, r, c, type, root, comm); },
        [&](MPI_Request* q) { MPI_Iscatter(s, wc, wt, r, c, type, root, comm, q); });
  });
}

void allgather(const void* send, size_t n, MPI_Datatype type, void* recv, MPI_Comm comm, int poll_us) {
  per_part_pieces(send, recv, n, type, [&](const void* s, void* r, int c, int wc, MPI_Datatype wt) {
    run(poll_us, [&] { MPI_Allgather(s, c, type, r, wc, wt, comm); },
        [&](MPI_Request* q) { MPI_Iallgather(s, c, type, r, wc, wt, comm, q); });
  });
}

void gatherv(const void* send, const std::vector<size_t>& counts, const std::vector<size_t>& displs,
             MPI_Datatype type, void* recv, int root, MPI_Comm comm, int poll_us) {
  const Group g(comm);
  check_per_rank(counts, g, "gatherv's counts");
  check_per_rank(displs, g, "gatherv's displacements");
  const size_t L = mpi_max_count(), B = element_bytes(type);
  const size_t most = *std::max_element(counts.begin(), counts.end());
  const bool one_call = most <= L && *std::max_element(displs.begin(), displs.end()) <= kIntMax;
  if (one_call) {
    const std::vector<int> c = ints(counts, "gatherv's counts"), d = ints(displs, "gatherv's displacements");
    run(poll_us,
        [&] { MPI_Gatherv(send, c[g.rank], type, recv, c.data(), d.data(), type, root, comm); },
        [&](MPI_Request* q) { MPI_Igatherv(send, c[g.rank], type, recv, c.data(), d.data(), type, root, comm, q); });
    return;
  }
  // Piece k of every rank's block, packed on root in rank order, then copied into place.
  const size_t Lr = staged_limit(g);
  size_t staged = 0;
  for (size_t c : counts) staged += std::min(c, Lr);
  std::vector<char> staging(g.rank == root ? staged * B : 0);
  std::vector<int> ck(g.size), dk(g.size);
  for (size_t k = 0, K = pieces(most, Lr); k < K; k++) {
    size_t off = 0;
    for (int r = 0; r < g.size; r++) {
      ck[r] = (int)piece(counts[r], k, Lr);
      dk[r] = (int)off;
      off += ck[r];
    }
    const void* s = ck[g.rank] > 0 ? at(send, k * Lr, B) : send;
    run(poll_us, [&] { MPI_Gatherv(s, ck[g.rank], type, staging.data(), ck.data(), dk.data(), type, root, comm); },
        [&](MPI_Request* q) {
          MPI_Igatherv(s, ck[g.rank], type, staging.data(), ck.data(), dk.data(), type, root, comm, q);
        });
    if (g.rank != root) continue;
    for (int r = 0; r < g.size; r++)
      if (ck[r] > 0)
        std::memcpy(at(recv, displs[r] + k * Lr, B), staging.data() + (size_t)dk[r] * B, (size_t)ck[r] * B);
  }
}

namespace {

// Reduce-scatter in rounds: round k packs piece k of every rank's part (counts[r] elements at
// first[r] of send) and reduce-scatters it into piece k of recv. `block`: the parts are equal
// (MPI_Reduce_scatter_block).
void staged_reduce_scatter(const void* send, void* recv, const std::vector<size_t>& counts,
                           const std::vector<size_t>& first, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                           int poll_us, bool block) {
  const Group g(comm);
  const size_t B = element_bytes(type), Lr = staged_limit(g);
  const size_t most = *std::max_element(counts.begin(), counts.end());
  size_t staged = 0;
  for (size_t c : counts) staged += std::min(c, Lr);
  std::vector<char> staging(staged * B);
  std::vector<int> ck(g.size);
  for (size_t k = 0, K = pieces(most, Lr); k < K; k++) {
    size_t off = 0;
    for (int r = 0; r < g.size; r++) {
      ck[r] = (int)piece(counts[r], k, Lr);
      if (ck[r] > 0) std::memcpy(staging.data() + off * B, at(send, first[r] + k * Lr, B), (size_t)ck[r] * B);
      off += ck[r];
    }
    void* r = ck[g.rank] > 0 ? at(recv, k * Lr, B) : recv;
    if (block)
      run(poll_us, [&] { MPI_Reduce_scatter_block(staging.data(), r, ck[0], type, op, comm); },
          [&](MPI_Request* q) { MPI_Ireduce_scatter_block(staging.data(), r, ck[0], type, op, comm, q); });
    else
      run(poll_us, [&] { MPI_Reduce_scatter(staging.data(), r, ck.data(), type, op, comm); },
          [&](MPI_Request* q) { MPI_Ireduce_scatter(staging.data(), r, ck.data(), type, op, comm, q); });
  }
}

}  // namespace

void reduce_scatter(const void* send, void* recv, const std::vector<size_t>& counts, MPI_Datatype type, MPI_Op op,
                    MPI_Comm comm, int poll_us) {
  const Group g(comm);
  check_per_rank(counts, g, "reduce_scatter's counts");
  if (send == MPI_IN_PLACE) fail("internal: large::reduce_scatter does not take MPI_IN_PLACE");
  if (*std::max_element(counts.begin(), counts.end()) <= mpi_max_count()) {
    const std::vector<int> c = ints(counts, "reduce_scatter's counts");
    run(poll_us, [&] { MPI_Reduce_scatter(send, recv, c.data(), type, op, comm); },
        [&](MPI_Request* q) { MPI_Ireduce_scatter(send, recv, c.data(), type, op, comm, q); });
    return;
  }
  std::vector<size_t> first(g.size, 0);
  for (int r = 1; r < g.size; r++) first[r] = first[r - 1] + counts[r - 1];
  staged_reduce_scatter(send, recv, counts, first, type, op, comm, poll_us, false);
}

void reduce_scatter_block(const void* send, void* recv, size_t n, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                          int poll_us) {
  if (send == MPI_IN_PLACE) fail("internal: large::reduce_scatter_block does not take MPI_IN_PLACE");
  if (n <= mpi_max_count()) {
    const int c = (int)n;
    run(poll_us, [&] { MPI_Reduce_scatter_block(send, recv, c, type, op, comm); },
        [&](MPI_Request* q) { MPI_Ireduce_scatter_block(send, recv, c, type, op, comm, q); });
    return;
  }
  const Group g(comm);
  std::vector<size_t> counts(g.size, n), first(g.size);
  for (int r = 0; r < g.size; r++) first[r] = (size_t)r * n;
  staged_reduce_scatter(send, recv, counts, first, type, op, comm, poll_us, true);
}

}  // namespace large

}  // namespace llmpi
