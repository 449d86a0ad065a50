// NCCL passes on the communication stream (API, ordering and the bf16 path: src/comm/nccl.h).
#include <cuda_bf16.h>
#include <nccl.h>

#include <cstring>
#include <vector>

#include "comm/nccl.h"
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

struct NcclComm::Impl {
  __nv_bfloat16* wire = nullptr;  // bf16 staging of the largest pass (bf16 only)
  size_t wire_n = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  std::vector<cudaEvent_t> events;  // one per pass since the last compute_waits, reused afterwards
  size_t next_event = 0;
  cudaEvent_t event() {
    if (next_event == events.size()) {
      cudaEvent_t e;
      LLMPI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events.push_back(e);
    }
    return events[next_event++];
  }
  // The comm stream waits for the compute stream's work so far.
  void after_compute() {
    cudaEvent_t ev = event();
    LLMPI_CUDA_CHECK(cudaEventRecord(ev, cuda::compute_stream()));
    LLMPI_CUDA_CHECK(cudaStreamWaitEvent(stream, ev, 0));
  }
};

NcclId NcclComm::make_id() {
  ncclUniqueId id;
  LLMPI_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.bytes, &id, sizeof id);
  return out;
}

NcclComm::NcclComm(const NcclId& id, int rank, int world)
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

NcclComm::~NcclComm() {
  if (!impl_) return;
  (void)cudaStreamSynchronize(impl_->stream);
  for (cudaEvent_t e : impl_->events) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(impl_->done);
  (void)cudaStreamDestroy(impl_->stream);
  if (impl_->comm) (void)ncclCommDestroy(impl_->comm);
  if (impl_->wire) (void)cudaFree(impl_->wire);
}

void NcclComm::allreduce_avg(float* data, size_t n, bool bf16) {
  if (n == 0) return;
  if (bf16 && impl_->wire_n < n) {  // grown before it is used: the stream is idle or ordered after the free
    LLMPI_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    if (impl_->wire) LLMPI_CUDA_CHECK(cudaFree(impl_->wire));
    impl_->wire = nullptr;
    impl_->wire_n = 0;
    LLMPI_CUDA_CHECK(cudaMalloc(&impl_->wire, n * sizeof(__nv_bfloat16)));
    impl_->wire_n = n;
  }
  impl_->after_compute();
  if (!bf16) {
    LLMPI_NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat32, ncclAvg, impl_->comm, impl_->stream));
  } else {
    __nv_bfloat16* w = impl_->wire;
    const unsigned blocks = cuda::grid_for(n, 256);
    to_bf16_kernel<<<blocks, 256, 0, impl_->stream>>>(w, data, n);
    LLMPI_LAUNCH_CHECK("nccl to_bf16");
    LLMPI_NCCL_CHECK(ncclAllReduce(w, w, n, ncclBfloat16, ncclAvg, impl_->comm, impl_->stream));
    from_bf16_kernel<<<blocks, 256, 0, impl_->stream>>>(data, w, n);
    LLMPI_LAUNCH_CHECK("nccl from_bf16");
  }
  passes_++;
}

void NcclComm::compute_waits() {
  LLMPI_CUDA_CHECK(cudaEventRecord(impl_->done, impl_->stream));
  LLMPI_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), impl_->done, 0));
  impl_->next_event = 0;
}

void NcclComm::synchronize() { LLMPI_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

}  // namespace llmpi
