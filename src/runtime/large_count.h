// MPI transfers of any length. An MPI-3 call takes its element counts (and a v-collective its
// displacements) as int, so a model of more than 2^31 - 1 floats, or one tensor or bucket that
// large, cannot go through one call: a cast count wraps. Everything here takes size_t counts and
// splits a transfer into pieces of at most mpi_max_count() elements, each moved by the plain MPI
// call (one call when the transfer fits: the common case costs nothing).
//
//   bcast, allreduce, send / recv         consecutive pieces of the buffer, one call each
//   send_with_length / recv_length        a message whose receiver does not know its length
//   isend / irecv                         one request per piece, appended to a list
//   gather, scatter, allgather            piece k of every rank's block per call, the block
//                                         layout at the root (or everywhere) kept by a datatype
//                                         of one piece whose extent is a whole block
//   gatherv, reduce_scatter(_block)       piece k of every rank's part per call, packed into a
//                                         staging buffer of at most INT_MAX elements (their
//                                         displacements are ints)
//
// Reductions are element-wise, so every piece reduced alone gives each element what the whole
// call gives it, with any datatype and any op, user-defined ones included. (An MPI library may
// pick its algorithm by message size, and with more than two ranks another algorithm may add a
// non-associative op's terms in another order; two ranks' sums are the same bits either way.)
//
// Every rank of a collective must pass the same count(s) and see the same mpi_max_count(): the
// pieces are matched call for call. Datatypes: predefined ones (or any contiguous type whose
// extent is its size); MPI_IN_PLACE is taken where the comment says so. poll_us > 0 starts each
// piece's nonblocking collective and polls it with MPI_Test, sleeping poll_us between polls
// (comm/grad_sync.h "Overlap"); 0 calls the blocking one. Errors of the MPI calls end the job, as
// MPI's default error handler does.
//
// Testing knob: the environment variable LLMPI_MPI_MAX_COUNT (read once, a count in
// [1, 2147483647]) or set_mpi_max_count() makes the pieces small, so that transfers of a few
// hundred elements take the same paths as one of billions.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llmpi {

// The most elements one MPI call here moves: set_mpi_max_count's value, else LLMPI_MPI_MAX_COUNT,
// else INT_MAX. Throws Error when LLMPI_MPI_MAX_COUNT is not a count in [1, INT_MAX].
size_t mpi_max_count();
// Tests: the limit from now on (clamped to INT_MAX); 0 returns to LLMPI_MPI_MAX_COUNT / INT_MAX.
// Call it on every rank alike, between transfers.
void set_mpi_max_count(size_t n);

// n as an MPI count, for calls whose counts are bounded by construction (small metadata, a
// message whose length the code caps): throws Error naming `what`, n and the limit INT_MAX when
// n does not fit, where a cast would wrap. Not affected by mpi_max_count().
int mpi_count(size_t n, const char* what);

// size_t as an MPI datatype (for moving lengths).
MPI_Datatype mpi_size_type();

namespace large {

// MPI_Bcast of n elements from root.
void bcast(void* buf, size_t n, MPI_Datatype type, int root, MPI_Comm comm);

// MPI_Allreduce of n elements; send may be MPI_IN_PLACE.
void allreduce(const void* send, void* recv, size_t n, MPI_Datatype type, MPI_Op op, MPI_Comm comm, int poll_us = 0);

// Blocking point-to-point of n elements; the receiver passes the sender's n.
void send(const void* buf, size_t n, MPI_Datatype type, int dest, int tag, MPI_Comm comm);
void recv(void* buf, size_t n, MPI_Datatype type, int source, int tag, MPI_Comm comm);
// A send whose receiver learns n first: recv_length (same source and tag), then recv of that many.
void send_with_length(const void* buf, size_t n, MPI_Datatype type, int dest, int tag, MPI_Comm comm);
size_t recv_length(int source, int tag, MPI_Comm comm);

// Nonblocking point-to-point of n elements: appends one request per piece to reqs (at least one),
// all of which must complete (MPI_Waitall / MPI_Testall) before buf is reused. Pieces of one
// message match in order (MPI's messages between two ranks with one tag do not overtake); both
// ends pass the same n.
void isend(const void* buf, size_t n, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
           std::vector<MPI_Request>& reqs);
void irecv(void* buf, size_t n, MPI_Datatype type, int source, int tag, MPI_Comm comm,
           std::vector<MPI_Request>& reqs);
// MPI_Waitall / MPI_Testall of a list (the list is left holding MPI_REQUEST_NULLs once complete).
void wait_all(std::vector<MPI_Request>& reqs);
bool test_all(std::vector<MPI_Request>& reqs);

// MPI_Gather of n elements per rank: rank r's block at recv[r·n, (r+1)·n) on root (recv is read
// on root only).
void gather(const void* send, size_t n, MPI_Datatype type, void* recv, int root, MPI_Comm comm, int poll_us = 0);
// MPI_Scatter of n elements per rank: send[r·n, (r+1)·n) on root to rank r's recv.
void scatter(const void* send, size_t n, MPI_Datatype type, void* recv, int root, MPI_Comm comm, int poll_us = 0);
// MPI_Allgather of n elements per rank: rank r's block at recv[r·n, (r+1)·n) on every rank.
void allgather(const void* send, size_t n, MPI_Datatype type, void* recv, MPI_Comm comm, int poll_us = 0);

// MPI_Gatherv: rank r sends counts[r] elements, which land at recv[displs[r], +counts[r]) on
// root. counts and displs are passed alike on EVERY rank (not only on root, as MPI asks): they
// decide the pieces. The blocks must not overlap.
void gatherv(const void* send, const std::vector<size_t>& counts, const std::vector<size_t>& displs,
             MPI_Datatype type, void* recv, int root, MPI_Comm comm, int poll_us = 0);

// MPI_Reduce_scatter: send holds every rank's part in rank order (counts[r] elements for rank r);
// recv gets this rank's part reduced over the group. counts alike on every rank.
void reduce_scatter(const void* send, void* recv, const std::vector<size_t>& counts, MPI_Datatype type,
                    MPI_Op op, MPI_Comm comm, int poll_us = 0);
// MPI_Reduce_scatter_block: n elements per rank.
void reduce_scatter_block(const void* send, void* recv, size_t n, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                          int poll_us = 0);

// Polls a started nonblocking call to completion with MPI_Test, sleeping poll_us between polls.
void wait_polling(MPI_Request* req, int poll_us);

}  // namespace large

}  // namespace llmpi
