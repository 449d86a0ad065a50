// Memory for the CUDA backend, and the state every op shares: the compute stream, the cuBLAS
// handle and the scratch workspace.
//
//   alloc           cudaMalloc (256-byte aligned) + memset 0, waited for: the buffer is zero when
//                   alloc returns, as the contract says.
//   free            cudaFree (it waits for the device); never throws (destructors call it).
//   zero            cudaMemsetAsync on the compute stream.
//   copy_to_device  cudaMemcpyAsync(cudaMemcpyDefault) + wait, so the host buffer may be reused
//                   or freed as soon as the call returns, pinned or not.
//   copy_to_device_async  no wait: the bytes are memcpy'd into one of kStagingSlots page-locked
//                   slots (taken in turn), copied from there by cudaMemcpyAsync on the compute
//                   stream, and an event recorded after it. A slot is written again only once its
//                   event has completed: cudaEventQuery, which after a step's end wait has (an LM
//                   step takes two slots, tokens and targets, so a slot comes round again four
//                   steps later); if not, the host waits for that event (counted). A slot grows
//                   (cudaFreeHost + cudaMallocHost, at the first upload of a size) when a larger
//                   upload comes.
//   copy_to_host    cudaMemcpyAsync + wait: the host data is there when the call returns.
//   (every wait is counted, cuda_host_waits: wait_for_stream, and the staging slot's event wait)
//   copy            device to device, cudaMemcpyAsync on the compute stream, not waited for (it
//                   is ordered with the ops before and after it like any kernel).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi::cuda {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in ", what, " at ",
       file, ":", line);
}

[[noreturn]] void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  fail("cuBLAS error ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ") in ", what,
       " at ", file, ":", line);
}

namespace {
std::atomic<uint64_t> waits{0}, readbacks{0};
}  // namespace

void wait_for_stream() {
  waits.fetch_add(1, std::memory_order_relaxed);
  LLMPI_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
}
uint64_t host_waits() { return waits.load(std::memory_order_relaxed); }
void count_readback() { readbacks.fetch_add(1, std::memory_order_relaxed); }
uint64_t readback_count() { return readbacks.load(std::memory_order_relaxed); }

namespace {
struct Shared {
  std::once_flag once;
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  void* ws[kWsSlots] = {};
  size_t ws_cap[kWsSlots] = {};
};
Shared& shared() {
  static Shared s;
  return s;
}
void init_shared() {
  Shared& s = shared();
  std::call_once(s.once, [&] {
    LLMPI_CUDA_CHECK(cudaStreamCreate(&s.stream));  // blocking: orders with the legacy stream
    LLMPI_CUBLAS_CHECK(cublasCreate(&s.handle));
    LLMPI_CUBLAS_CHECK(cublasSetStream(s.handle, s.stream));
    // Pure fp32 GEMMs (no TF32): the CPU backend is the reference at 1e-5.
    LLMPI_CUBLAS_CHECK(cublasSetMathMode(s.handle, CUBLAS_DEFAULT_MATH));
  });
}
}  // namespace

cudaStream_t compute_stream() {
  init_shared();
  return shared().stream;
}

cublasHandle_t cublas() {
  init_shared();
  return shared().handle;
}

void* workspace(WorkspaceSlot slot, size_t bytes) {
  init_shared();
  Shared& s = shared();
  if (bytes > s.ws_cap[slot]) {
    size_t want = bytes + bytes / 4;           // some headroom against repeated growth
    want = (want + 255) / 256 * 256;
    // Stream-ordered (cudaFreeAsync / cudaMallocAsync on the compute stream): the old buffer is
    // released only after the ops already enqueued that read it, and nothing waits for the whole
    // device. A plain cudaFree would synchronise the device in the middle of backward, stalling
    // (or, with NCCL kernels waiting for a peer, deadlocking) the buckets in flight.
    if (s.ws[slot] != nullptr) {
      LLMPI_CUDA_CHECK(cudaFreeAsync(s.ws[slot], s.stream));
      s.ws[slot] = nullptr;
      s.ws_cap[slot] = 0;
    }
    LLMPI_CUDA_CHECK(cudaMallocAsync(&s.ws[slot], want, s.stream));
    s.ws_cap[slot] = want;
  }
  return s.ws[slot];
}

size_t workspace_bytes() {
  size_t t = 0;
  for (size_t c : shared().ws_cap) t += c;
  return t;
}

void* alloc(size_t bytes) {
  init_shared();
  const size_t b = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, b);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    (void)cudaMemGetInfo(&fr, &tot);
    fail("CUDA: cannot allocate ", b / 1048576.0, " MiB of GPU memory (", cudaGetErrorName(e),
         "; ", fr / 1048576.0, " MiB free of ", tot / 1048576.0,
         " MiB); use a smaller batch or model");
  }
  LLMPI_CUDA_CHECK(cudaMemsetAsync(p, 0, b, compute_stream()));
  wait_for_stream();
  return p;
}

void free(void* p) {
  if (p == nullptr) return;
  const cudaError_t e = cudaFree(p);
  if (e != cudaSuccess && e != cudaErrorCudartUnloading)
    std::fprintf(stderr, "llmpi: cudaFree failed: %s\n", cudaGetErrorString(e));
}

void zero(void* p, size_t bytes) {
  if (bytes) LLMPI_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_stream()));
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  LLMPI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, compute_stream()));
  wait_for_stream();
}

namespace {
constexpr int kStagingSlots = 8;
struct StagingSlot {
  void* host = nullptr;  // page-locked, cap bytes
  size_t cap = 0;
  cudaEvent_t done = nullptr;  // recorded after the slot's last copy
  bool pending = false;        // done was recorded and not yet seen complete
};
struct Staging {
  std::mutex mu;
  StagingSlot slot[kStagingSlots];
  int next = 0;
};
Staging& staging() {
  static Staging* s = new Staging;  // never freed: the runtime may be gone at exit
  return *s;
}
}  // namespace

void copy_to_device_async(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  cudaStream_t stream = compute_stream();
  Staging& st = staging();
  std::lock_guard<std::mutex> lock(st.mu);
  StagingSlot& s = st.slot[st.next];
  st.next = (st.next + 1) % kStagingSlots;
  if (s.pending) {  // the stream may still read this slot: wait until it has passed its copy
    const cudaError_t q = cudaEventQuery(s.done);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is no error: do not leave it for the next check
      waits.fetch_add(1, std::memory_order_relaxed);
      LLMPI_CUDA_CHECK(cudaEventSynchronize(s.done));
    } else {
      LLMPI_CUDA_CHECK(q);
    }
    s.pending = false;
  }
  if (s.cap < bytes) {
    if (s.host != nullptr) LLMPI_CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr;
    s.cap = 0;
    const size_t want = (bytes + 4095) / 4096 * 4096;
    LLMPI_CUDA_CHECK(cudaMallocHost(&s.host, want));
    s.cap = want;
  }
  if (s.done == nullptr) LLMPI_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  std::memcpy(s.host, src, bytes);
  LLMPI_CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream));
  LLMPI_CUDA_CHECK(cudaEventRecord(s.done, stream));
  s.pending = true;
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  count_readback();
  if (bytes == 0 || dst == src) return;
  LLMPI_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, compute_stream()));
  wait_for_stream();
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  LLMPI_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_stream()));
}

}  // namespace llmpi::cuda
