// One gradient-sync method's collectives over a data-parallel group: how one bucket (a contiguous
// range of the flat gradient or parameter buffer, params/buckets.h) is averaged, or with ZeRO-1
// reduce-scattered into this rank's piece and all-gathered back. The driver (comm/grad_sync.h)
// decides which bucket moves when — during backward as buckets fill, on its communication thread
// when overlapping, staged through host memory on a GPU — and counts the bytes; an Exchange only
// moves them. One small type per method:
//
//   allreduce       MPI_Allreduce(SUM) then × 1/W; ZeRO-1: MPI_Reduce_scatter of pieces of n/W
//                   floats (× 1/W) and MPI_Allgather of the pieces padded to ceil(n/W) floats
//                   (MPICH's Allgatherv is pathologically slow when ranks share cores). With bf16
//                   on the wire: each value rounded to bfloat16, summed by a user-defined MPI_Op
//                   that adds two bf16 values in fp32 and rounds the sum, then widened × 1/W.
//                   Also parameter averaging for "weights".
//   gather_scatter  through rank 0: MPI_Gather, the mean summed in rank order, MPI_Scatter of W
//                   copies (ZeRO-1: of the pieces, padded; then MPI_Gatherv of the updated pieces and
//                   MPI_Scatter of W copies of the bucket)
//   nccl            device memory: ncclAllReduce(avg) (fp32, or bf16 through a device staging
//                   buffer) enqueued on NCCL's stream after an event on the compute stream; the
//                   host never waits (comm/nccl.h). ZeRO-1: ncclReduceScatter (avg; fp32 or bf16)
//                   and ncclAllGather (fp32) of the pieces padded to ceil(n/W) floats in a device
//                   buffer
//
// The MPI collectives take any bucket size: one past INT_MAX elements (a bucket of one huge
// tensor) goes in pieces (runtime/large_count.h).
//
// Buffers are host memory, except where device_memory() says they are the device's. A poll_us > 0
// starts nonblocking MPI collectives and polls them with MPI_Test, sleeping poll_us between polls
// (comm/grad_sync.h "Overlap"); 0 calls the blocking ones.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>

#include "runtime/options.h"

namespace llmpi {

// What one pass moved, per rank, as the algorithm moves it.
struct Traffic {
  double sent = 0, received = 0;
  int collectives = 0;
};

struct Exchange {
  virtual ~Exchange() = default;
  virtual bool device_memory() const { return false; }
  // data[0, n) <- the mean over the group.
  virtual Traffic average(float* data, size_t n, int poll_us) = 0;
  // ZeRO-1: the mean of this rank's piece of data[0, n) (params/buckets.h piece_counts) into
  // that piece; the rest of data[0, n) is left as it was.
  virtual Traffic reduce_scatter_mean(float* data, size_t n, int poll_us) = 0;
  // ZeRO-1: every rank's piece of data[0, n) (final at its owner) into every rank's data[0, n).
  virtual Traffic all_gather(float* data, size_t n, int poll_us) = 0;
  // A device exchange's passes are enqueued: makes the compute stream wait for them (no host wait).
  virtual void order_compute_after() {}
  // A device exchange's stream (a cudaStream_t): what is enqueued on it next runs after the passes
  // enqueued so far. Null for host exchanges.
  virtual void* device_stream() { return nullptr; }
  // The bytes one rank sends per pass over n floats (zero: the reduce-scatter and the all-gather).
  virtual double expected_bytes_per_pass(size_t n, bool zero) const = 0;
};

// The exchange of `method` over comm (collective only where NCCL joins: call it on every rank of
// comm together, after set-up has succeeded everywhere). "weights" averages parameters with the
// allreduce exchange in fp32.
std::unique_ptr<Exchange> make_exchange(SyncMethod method, bool bf16, MPI_Comm comm);

}  // namespace llmpi
