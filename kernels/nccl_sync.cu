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

// ZeRO-1's pieces (params/buckets.h piece_counts): piece r of n floats over W ranks.
__device__ __forceinline__ size_t piece_count(size_t n, int W, size_t r) {
  return n / W + (r < n % W ? 1 : 0);
}
__device__ __forceinline__ size_t piece_start(size_t n, int W, size_t r) {
  return r * (n / W) + (r < n % W ? r : n % W);
}
__device__ __forceinline__ void store(float* out, float v) { *out = v; }
__device__ __forceinline__ void store(__nv_bfloat16* out, float v) { *out = __float2bfloat16_rn(v); }
__device__ __forceinline__ float load(const float* in) { return *in; }
__device__ __forceinline__ float load(const __nv_bfloat16* in) { return __bfloat162float(*in); }

// Between data's pieces and the padded layout, for r in [r0, r1): to_pad: pad[r·c + j] = piece r
// of data, element j (zero past the piece's end); else piece r of data = pad[r·c, r·c + count_r).
template <typename T, bool to_pad>
__global__ void move_pieces_kernel(T* __restrict__ pad, float* __restrict__ data, size_t n, int W, size_t c,
                                   size_t r0, size_t r1) {
  const size_t total = (r1 - r0) * c;
  for (size_t i = cuda::grid_first(); i < total; i += cuda::grid_stride()) {
    const size_t r = r0 + i / c, j = i % c;
    const bool in_piece = j < piece_count(n, W, r);
    if (to_pad) store(pad + r * c + j, in_piece ? data[piece_start(n, W, r) + j] : 0.0f);
    else if (in_piece) data[piece_start(n, W, r) + j] = load(pad + r * c + j);
  }
}

}  // namespace

struct NcclComm::Impl {
  __nv_bfloat16* wire = nullptr;  // bf16 staging of the largest pass (bf16 only)
  size_t wire_n = 0;
  float* pad = nullptr;           // ZeRO-1: W padded pieces of the largest pass
  size_t pad_n = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  cudaEvent_t probe = nullptr;    // finished()
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
  // buf holds at least n elements, grown (cudaMalloc) before its first use: the stream is idle
  // or ordered after the free.
  template <typename T>
  T* grow(T*& buf, size_t& cap, size_t n) {
    if (cap < n) {
      LLMPI_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (buf) LLMPI_CUDA_CHECK(cudaFree(buf));
      buf = nullptr;
      cap = 0;
      LLMPI_CUDA_CHECK(cudaMalloc(&buf, n * sizeof(T)));
      cap = n;
    }
    return buf;
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
  LLMPI_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->probe, cudaEventDisableTiming));
}

NcclComm::~NcclComm() {
  if (!impl_) return;
  (void)cudaStreamSynchronize(impl_->stream);
  for (cudaEvent_t e : impl_->events) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(impl_->done);
  (void)cudaEventDestroy(impl_->probe);
  (void)cudaStreamDestroy(impl_->stream);
  if (impl_->comm) (void)ncclCommDestroy(impl_->comm);
  if (impl_->wire) (void)cudaFree(impl_->wire);
  if (impl_->pad) (void)cudaFree(impl_->pad);
}

void NcclComm::allreduce_avg(float* data, size_t n, bool bf16) {
  if (n == 0) return;
  if (bf16) impl_->grow(impl_->wire, impl_->wire_n, n);
  impl_->after_compute();
  if (!bf16) {
    LLMPI_NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat32, ncclAvg, impl_->comm, impl_->stream));
  } else {
    __nv_bfloat16* w = impl_->wire;
    cuda::to_bf16_values(reinterpret_cast<uint16_t*>(w), data, n, impl_->stream);
    LLMPI_NCCL_CHECK(ncclAllReduce(w, w, n, ncclBfloat16, ncclAvg, impl_->comm, impl_->stream));
    cuda::from_bf16_values(data, reinterpret_cast<const uint16_t*>(w), n, false, impl_->stream);
  }
  passes_++;
}

void NcclComm::allreduce(float* data, size_t n, bool max) {
  if (n == 0) return;
  impl_->after_compute();
  LLMPI_NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat32, max ? ncclMax : ncclSum, impl_->comm, impl_->stream));
  passes_++;
}

void NcclComm::all_gather_pieces(const float* piece, float* whole, size_t n) {
  if (n == 0) return;
  impl_->after_compute();
  LLMPI_NCCL_CHECK(ncclAllGather(piece, whole, n, ncclFloat32, impl_->comm, impl_->stream));
  passes_++;
}

void NcclComm::reduce_scatter_pieces(const float* whole, float* piece, size_t n) {
  if (n == 0) return;
  impl_->after_compute();
  LLMPI_NCCL_CHECK(ncclReduceScatter(whole, piece, n, ncclFloat32, ncclSum, impl_->comm, impl_->stream));
  passes_++;
}

void NcclComm::reduce_scatter_avg(float* data, size_t n, bool bf16) {
  if (n == 0) return;
  const size_t W = (size_t)world_, r = (size_t)rank_, c = (n + W - 1) / W;
  const unsigned threads = 256, blocks = cuda::grid_for(W * c, threads), piece_blocks = cuda::grid_for(c, threads);
  if (bf16) impl_->grow(impl_->wire, impl_->wire_n, W * c);
  else impl_->grow(impl_->pad, impl_->pad_n, W * c);
  impl_->after_compute();
  cudaStream_t s = impl_->stream;
  if (!bf16) {
    float* pad = impl_->pad;
    move_pieces_kernel<float, true><<<blocks, threads, 0, s>>>(pad, data, n, world_, c, 0, W);
    LLMPI_LAUNCH_CHECK("nccl pad pieces");
    LLMPI_NCCL_CHECK(ncclReduceScatter(pad, pad + r * c, c, ncclFloat32, ncclAvg, impl_->comm, s));
    move_pieces_kernel<float, false><<<piece_blocks, threads, 0, s>>>(pad, data, n, world_, c, r, r + 1);
    LLMPI_LAUNCH_CHECK("nccl unpad piece");
  } else {
    __nv_bfloat16* w = impl_->wire;
    move_pieces_kernel<__nv_bfloat16, true><<<blocks, threads, 0, s>>>(w, data, n, world_, c, 0, W);
    LLMPI_LAUNCH_CHECK("nccl pad pieces bf16");
    LLMPI_NCCL_CHECK(ncclReduceScatter(w, w + r * c, c, ncclBfloat16, ncclAvg, impl_->comm, s));
    move_pieces_kernel<__nv_bfloat16, false><<<piece_blocks, threads, 0, s>>>(w, data, n, world_, c, r, r + 1);
    LLMPI_LAUNCH_CHECK("nccl unpad piece bf16");
  }
  passes_++;
}

void NcclComm::all_gather(float* data, size_t n) {
  if (n == 0) return;
  const size_t W = (size_t)world_, r = (size_t)rank_, c = (n + W - 1) / W;
  const unsigned threads = 256;
  float* pad = impl_->grow(impl_->pad, impl_->pad_n, W * c);
  impl_->after_compute();
  cudaStream_t s = impl_->stream;
  move_pieces_kernel<float, true><<<cuda::grid_for(c, threads), threads, 0, s>>>(pad, data, n, world_, c, r, r + 1);
  LLMPI_LAUNCH_CHECK("nccl pad piece");
  LLMPI_NCCL_CHECK(ncclAllGather(pad + r * c, pad, c, ncclFloat32, impl_->comm, s));
  move_pieces_kernel<float, false><<<cuda::grid_for(W * c, threads), threads, 0, s>>>(pad, data, n, world_, c, 0, W);
  LLMPI_LAUNCH_CHECK("nccl unpad pieces");
  passes_++;
}

void NcclComm::send(const float* data, size_t n, int peer) {
  impl_->after_compute();  // the values the compute stream wrote
  LLMPI_NCCL_CHECK(ncclSend(data, n, ncclFloat32, peer, impl_->comm, impl_->stream));
  passes_++;
}

void NcclComm::recv(float* data, size_t n, int peer) {
  impl_->after_compute();  // the compute stream has done with the buffer
  LLMPI_NCCL_CHECK(ncclRecv(data, n, ncclFloat32, peer, impl_->comm, impl_->stream));
  passes_++;
}

bool NcclComm::finished() {
  LLMPI_CUDA_CHECK(cudaEventRecord(impl_->probe, impl_->stream));
  const cudaError_t e = cudaEventQuery(impl_->probe);
  if (e == cudaErrorNotReady) return false;
  LLMPI_CUDA_CHECK(e);
  return true;
}

void NcclComm::compute_waits() {
  LLMPI_CUDA_CHECK(cudaEventRecord(impl_->done, impl_->stream));
  LLMPI_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), impl_->done, 0));
  impl_->next_event = 0;
}

void NcclComm::synchronize() { LLMPI_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

void* NcclComm::stream() { return impl_->stream; }

}  // namespace llmpi
