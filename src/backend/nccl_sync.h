// NCCL gradient averaging for the CUDA backend: a communicator made from an ncclUniqueId that rank
// 0 broadcasts over MPI, and bucketed in-place ncclAllReduce(ncclAvg) on a communication stream
// that is ordered after the compute stream by one event per bucket (DDP-style overlap: a bucket's
// all-reduce runs while backward computes the next gradients).
//
//   auto sync = nccl_sync_create(MPI_COMM_WORLD);   // collective; after cuda_bind_device
//   sync->begin(model.grads, model.table.numel, bucket_floats);
//   model.backward([&](size_t k) { sync->ready(k); });   // prefix [0, k) of the grads is final
//   sync->finish();        // remaining bucket; the compute stream waits for every all-reduce
//   optimizer step ...     // (enqueued on the compute stream, so it sees averaged gradients)
//
// STATUS: compile-only; no collective has been run (see docs/GPU.md). NCCL accepts one rank per
// GPU only. In a build without NCCL (or without CUDA) nccl_available() is false with the reason and
// the rest throws llmpi::Error (src/backend/nccl_host.cpp).
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

class NcclSync {
 public:
  static NcclId make_id();  // ncclGetUniqueId; on one rank, then broadcast
  // ncclCommInitRank on the current device (cuda_bind_device first); collective over the world.
  NcclSync(const NcclId& id, int rank, int world);
  ~NcclSync();
  NcclSync(const NcclSync&) = delete;
  NcclSync& operator=(const NcclSync&) = delete;

  // In place: data[0, count) <- the average over ranks, enqueued on the communication stream after
  // everything enqueued so far on the compute stream.
  void allreduce_avg(float* data, size_t count);

  // Bucketed averaging of a flat gradient of `total` floats whose prefixes become final in order.
  // ready(k): the prefix [0, k) is final; the pending range [start, k) is launched as one bucket
  // once it holds at least bucket_floats floats (0: at every call), and always when k == total.
  // bf16: each bucket is rounded to bfloat16 (RNE) into a device staging buffer on the
  // communication stream, averaged there as ncclBfloat16, and widened back into grads (half the
  // bytes; parallel.grad_dtype "bf16").
  void begin(float* grads, size_t total, size_t bucket_floats, bool bf16 = false);
  void ready(size_t k);
  // Launches what is left, then makes the compute stream wait for every bucket (no host wait).
  void finish();
  // Host waits for every enqueued all-reduce.
  void synchronize();

  int rank() const { return rank_; }
  int world() const { return world_; }
  size_t buckets_launched() const { return buckets_; }
  size_t bytes_reduced() const { return bytes_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_ = 1;
  float* grads_ = nullptr;
  size_t total_ = 0, bucket_floats_ = 0, start_ = 0, buckets_ = 0, bytes_ = 0;
  bool bf16_ = false;
  void launch_bucket(size_t begin, size_t count);  // grads_[begin, begin + count), fp32 or bf16
};

}  // namespace llmpi

#ifndef __CUDACC__
#include <mpi.h>
namespace llmpi {
// Rank 0 makes the id, MPI_Bcast gives it to every rank of comm, each joins. Collective.
std::unique_ptr<NcclSync> nccl_sync_create(MPI_Comm comm);
}  // namespace llmpi
#endif
