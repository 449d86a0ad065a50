// NCCL on the CUDA backend: a communicator on the bound device with its own communication
// stream, made from an ncclUniqueId that rank 0 broadcasts over MPI (nccl_comm_create, host side:
// comm/nccl_exchange.cpp), and its collectives, each enqueued on that stream after an event
// recorded on the compute stream, so it reads what the compute stream wrote before the call and
// the host never waits (kernels/nccl_sync.cu). compute_waits() makes the compute stream wait for
// every pass enqueued so far: what is enqueued on it next sees their results.
//
// Ordering of one pass over data[0, n):
//   compute stream:  ... kernels that write data ... record ev_i
//   comm stream:     wait ev_i; ncclAllReduce(data, n, float, avg), in place
// bf16 (parallel.grad_dtype "bf16"), on the comm stream after the same event:
//   wire[0, n) = bf16_rn(data[0, n)); ncclAllReduce(wire, n, bfloat16, avg), in place;
//   data[0, n) = float(wire[0, n))
// wire is a device buffer grown (cudaMalloc) to the largest pass. The comm stream is non-blocking
// and at the highest priority, so its small kernels get SMs while backward keeps the card busy.
//
// ZeRO-1 (reduce_scatter_avg, all_gather): our pieces of data[0, n) are uneven
// (params/buckets.h piece_counts: the first n mod W ranks one float more), NCCL's are equal, so
// each pass goes through a device buffer of W pieces of c = ceil(n/W) floats, the short ones
// padded with zeros, in place as NCCL allows (this rank's piece at r·c):
//   reduce-scatter:  pad = pieces of data (bf16: rounded); ncclReduceScatter(pad, pad + r·c, c, avg);
//                    data's piece r = pad[r·c, r·c + count_r) (bf16: widened)
//   all-gather:      pad[r·c, ...) = data's piece r; ncclAllGather(pad + r·c, pad, c, float);
//                    every piece of data = its piece of pad
// both on the comm stream after an event on the compute stream, like allreduce_avg.
//
// Point to point (pipeline stages, comm/stage_link.h): send / recv enqueue one ncclSend /
// ncclRecv each on the comm stream after an event on the compute stream (a send reads what the
// compute stream wrote; a receive overwrites what it had read). Messages between two ranks match
// in the order they are posted (NCCL has no tags), and a send completes only once its receive has
// started: StageLink gives each direction between two stages a communicator of its own, so a
// stream never holds a send behind a receive (or the reverse) that could wait for it.
// NCCL accepts one rank per GPU. In a build without NCCL (or without CUDA) nccl_available() is
// false with the reason and the rest throws llmpi::Error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace llmpi {

bool nccl_available(std::string* why = nullptr);

struct NcclId {
  unsigned char bytes[128];  // an ncclUniqueId (NCCL_UNIQUE_ID_BYTES = 128)
};

class NcclComm {
 public:
  static NcclId make_id();  // ncclGetUniqueId; on one rank, then broadcast
  // ncclCommInitRank on the current device (cuda_bind_device first); collective over the group.
  NcclComm(const NcclId& id, int rank, int world);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // In place: data[0, n) <- the mean over ranks, fp32 or (bf16) through bf16 on the wire.
  void allreduce_avg(float* data, size_t n, bool bf16 = false);
  // In place, fp32: data[0, n) <- the sum (max = false) or the maximum over ranks (a
  // tensor-parallel group's collectives, comm/tensor_group.h).
  void allreduce(float* data, size_t n, bool max);
  // Equal pieces of n floats per rank, fp32 (sequence parallelism): whole[r·n, (r+1)·n) <- rank
  // r's piece on every rank; piece <- Σ over ranks of their whole[rank·n, (rank+1)·n).
  void all_gather_pieces(const float* piece, float* whole, size_t n);
  void reduce_scatter_pieces(const float* whole, float* piece, size_t n);
  // ZeRO-1, in place: this rank's piece of data[0, n) <- its mean over ranks (fp32, or bf16 on the
  // wire); the rest of data is left as it was.
  void reduce_scatter_avg(float* data, size_t n, bool bf16 = false);
  // ZeRO-1, in place: every rank's piece of data[0, n) (fp32) into every rank's data.
  void all_gather(float* data, size_t n);
  // Point to point, fp32 (above).
  void send(const float* data, size_t n, int peer);
  void recv(float* data, size_t n, int peer);
  // Whether every pass enqueued so far has finished (no host wait).
  bool finished();
  // The compute stream waits for every pass enqueued so far (no host wait).
  void compute_waits();
  // The host waits for every pass enqueued so far.
  void synchronize();
  // The communication stream (a cudaStream_t): work enqueued on it after a pass runs after it.
  void* stream();

  int rank() const { return rank_; }
  int world() const { return world_; }
  size_t passes() const { return passes_; }  // passes enqueued since construction

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_ = 1;
  size_t passes_ = 0;
};

}  // namespace llmpi

#ifndef __CUDACC__
#include <mpi.h>

#include "comm/exchange.h"
namespace llmpi {
// Rank 0 makes the id, MPI_Bcast gives it to every rank of comm, each joins. Collective; an error
// on any rank is thrown on every rank.
std::unique_ptr<NcclComm> nccl_comm_create(MPI_Comm comm);
// The nccl method's Exchange (comm/exchange.h) over comm: collective (nccl_comm_create).
std::unique_ptr<Exchange> make_nccl_exchange(bool bf16, MPI_Comm comm);
}  // namespace llmpi
#endif
