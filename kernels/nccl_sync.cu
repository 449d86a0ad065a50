// NCCL all-reduce of gradient buckets (API and usage: src/backend/nccl_sync.h).
//
// Ordering, per bucket [a, b):
//   compute stream:  ... backward kernels that finish grads[a, b) ... record ev_i
//   comm stream:     wait ev_i; ncclAllReduce(grads + a, b - a, float, avg), in place
// finish(): comm stream records `done`; the compute stream waits on it, so the optimizer kernels
// enqueued next see averaged gradients, and the host never blocks. The comm stream is
// non-blocking (it does not serialise with the legacy default stream), at the highest priority so
// that its small kernels get SMs while backward keeps the card busy.
// bf16 (begin(..., bf16 = true)), per bucket on the comm stream after the same event:
//   wire[a, b) = bf16_rn(grads[a, b));  ncclAllReduce(wire + a, b - a, bfloat16, avg), in place;
//   grads[a, b) = float(wire[a, b))
// wire is a device buffer of `total` bf16 values, grown (cudaMalloc) in begin() before backward.
// STATUS: compile-only (no GPU was available); see docs/GPU.md.
#include <cuda_bf16.h>
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

namespace {

__global__ void to_bf16_kernel(__nv_bfloat16* __restrict__ out, const float* __restrict__ in,
                               size_t n) {
  for (size_t i = cuda::grid_first(); i < n; i += cuda::grid_stride())
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void from_bf16_kernel(float* __restrict__ out, const __nv_bfloat16* __restrict__ in,
                                 size_t n) {
  for (size_t i = cuda::grid_first(); i < n; i += cuda::grid_stride())
    out[i] = __bfloat162float(in[i]);
}

}  // namespace

struct NcclSync::Impl {
  __nv_bfloat16* wire = nullptr;  // bf16 staging of the whole gradient (bf16 only)
  size_t wire_n = 0;
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
  if (impl_->wire) (void)cudaFree(impl_->wire);
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

void NcclSync::launch_bucket(size_t begin, size_t count) {
  if (!bf16_) {
    allreduce_avg(grads_ + begin, count);
    return;
  }
  if (count == 0) return;
  cudaEvent_t ev = impl_->event();
  LLMPI_CUDA_CHECK(cudaEventRecord(ev, cuda::compute_stream()));
  LLMPI_CUDA_CHECK(cudaStreamWaitEvent(impl_->stream, ev, 0));
  __nv_bfloat16* w = impl_->wire + begin;
  const unsigned blocks = cuda::grid_for(count, 256);
  to_bf16_kernel<<<blocks, 256, 0, impl_->stream>>>(w, grads_ + begin, count);
  LLMPI_LAUNCH_CHECK("nccl to_bf16");
  LLMPI_NCCL_CHECK(ncclAllReduce(w, w, count, ncclBfloat16, ncclAvg, impl_->comm, impl_->stream));
  from_bf16_kernel<<<blocks, 256, 0, impl_->stream>>>(grads_ + begin, w, count);
  LLMPI_LAUNCH_CHECK("nccl from_bf16");
  buckets_++;
  bytes_ += count * sizeof(__nv_bfloat16);
}

void NcclSync::begin(float* grads, size_t total, size_t bucket_floats, bool bf16) {
  bf16_ = bf16;
  if (bf16 && impl_->wire_n < total) {
    if (impl_->wire) LLMPI_CUDA_CHECK(cudaFree(impl_->wire));
    impl_->wire = nullptr;
    impl_->wire_n = 0;
    LLMPI_CUDA_CHECK(cudaMalloc(&impl_->wire, total * sizeof(__nv_bfloat16)));
    impl_->wire_n = total;
  }
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
    launch_bucket(start_, k - start_);
    start_ = k;
  }
}

void NcclSync::finish() {
  if (start_ < total_) {
    launch_bucket(start_, total_ - start_);
    start_ = total_;
  }
  LLMPI_CUDA_CHECK(cudaEventRecord(impl_->done, impl_->stream));
  LLMPI_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), impl_->done, 0));
}

void NcclSync::synchronize() { LLMPI_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

}  // namespace llmpi
