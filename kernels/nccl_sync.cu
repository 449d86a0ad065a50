// NCCL all-reduce of gradient buckets (API and usage: src/backend/nccl_sync.h).
//
// Ordering, per bucket [a, b):
//   compute stream:  ... backward kernels that finish grads[a, b) ... record ev_i
//   comm stream:     wait ev_i; ncclAllReduce(grads + a, b - a, float, avg), in place
// finish(): comm stream records `done`; the compute stream waits on it, so the optimizer kernels
// enqueued next see averaged gradients, and the host never blocks. The comm stream is
// non-blocking (it does not serialise with the legacy default stream), at the highest priority so
// that its small kernels get SMs while backward keeps the card busy.
// STATUS: compile-only (no GPU was available); see docs/GPU.md.
#include <nccl.h>

#include <cstring>
#include <vector>

#include "backend/nccl_sync.h"
#include "cuda_common.cuh"
#include "runtime/error.h"

#define LLMPI_NCCL_CHECK(call)                                                                 \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess)                                                                     \
      ::llmpi::fail("NCCL error ", ncclGetErrorString(r_), " in ", #call, " at ", __FILE__, ":", \
                    __LINE__);                                                                 \
  } while (0)

namespace llmpi {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "ncclUniqueId size changed");

struct NcclSync::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  std::vector<cudaEvent_t> events;  // one per bucket of the current step, reused across steps
  size_t next_event = 0;
  cudaEvent_t event() {
    if (next_event == events.size()) {
      cudaEvent_t e;
      LLMPI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events.push_back(e);
    }
    return events[next_event++];
  }
};

NcclId NcclSync::make_id() {
  ncclUniqueId id;
  LLMPI_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.bytes, &id, sizeof id);
  return out;
}

NcclSync::NcclSync(const NcclId& id, int rank, int world)
    : impl_(new Impl), rank_(rank), world_(world) {
  ncclUniqueId nid;
  std::memcpy(&nid, id.bytes, sizeof nid);
  (void)cuda::compute_stream();  // the compute stream exists on the bound device
  LLMPI_NCCL_CHECK(ncclCommInitRank(&impl_->comm, world, nid, rank));
  int lo = 0, hi = 0;
  LLMPI_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  LLMPI_CUDA_CHECK(cudaStreamCreateWithPriority(&impl_->stream, cudaStreamNonBlocking, hi));
  LLMPI_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->done, cudaEventDisableTiming));
}

NcclSync::~NcclSync() {
  if (!impl_) return;
  (void)cudaStreamSynchronize(impl_->stream);
  for (cudaEvent_t e : impl_->events) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(impl_->done);
  (void)cudaStreamDestroy(impl_->stream);
  if (impl_->comm) (void)ncclCommDestroy(impl_->comm);
}

void NcclSync::allreduce_avg(float* data, size_t count) {
  if (count == 0) return;
  cudaEvent_t ev = impl_->event();
  LLMPI_CUDA_CHECK(cudaEventRecord(ev, cuda::compute_stream()));
  LLMPI_CUDA_CHECK(cudaStreamWaitEvent(impl_->stream, ev, 0));
  LLMPI_NCCL_CHECK(
      ncclAllReduce(data, data, count, ncclFloat32, ncclAvg, impl_->comm, impl_->stream));
  buckets_++;
  bytes_ += count * sizeof(float);
}

void NcclSync::begin(float* grads, size_t total, size_t bucket_floats) {
  grads_ = grads;
  total_ = total;
  bucket_floats_ = bucket_floats;
  start_ = 0;
  buckets_ = 0;
  bytes_ = 0;
  impl_->next_event = 0;
}

void NcclSync::ready(size_t k) {
  if (k > total_) fail("NcclSync::ready(", k, ") beyond the gradient's ", total_, " floats");
  if (k <= start_) return;
  if (k - start_ >= bucket_floats_ || k == total_) {
    allreduce_avg(grads_ + start_, k - start_);
    start_ = k;
  }
}

void NcclSync::finish() {
  if (start_ < total_) {
    allreduce_avg(grads_ + start_, total_ - start_);
    start_ = total_;
  }
  LLMPI_CUDA_CHECK(cudaEventRecord(impl_->done, impl_->stream));
  LLMPI_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), impl_->done, 0));
}

void NcclSync::synchronize() { LLMPI_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

}  // namespace llmpi
