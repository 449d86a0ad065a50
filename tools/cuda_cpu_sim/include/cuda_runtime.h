// tools/cuda_cpu_sim's stand-in for <cuda_runtime.h>: what the CUDA backend's .cu files name of
// the runtime API, for their kernels and launchers to run on the CPU (README.md there). "Device"
// memory is host memory; a launch, copy or memset runs to its end before it returns, after what
// its stream holds (NCCL operations, waits on events: stream.h).
#pragma once
#include <cstdlib>
#include <cstring>

#include "cuda_shim.h"
#include "launch.h"

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
                      cudaErrorNotReady = 600, cudaErrorCudartUnloading = 4;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor, cudaDevAttrComputeCapabilityMinor, cudaDevAttrMaxSharedMemoryPerBlockOptin };
enum cudaDataType_t { CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F };
constexpr unsigned cudaEventDisableTiming = 2;
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
using cudaEvent_t = CUevent_st*;
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem, sharedMemPerBlockOptin;
  int multiProcessorCount;
};

namespace llmpi::sim {
// the simulated card: an H100 (sm_90), one device, 80 GB
constexpr size_t kDeviceBytes = size_t(80) << 30;
}  // namespace llmpi::sim

inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t stream = nullptr) {
  llmpi::sim::reach(stream);
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t stream = nullptr) {
  llmpi::sim::reach(stream);
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, n, kind, nullptr);  // the legacy stream, which the host then waits for
}
inline cudaError_t cudaDeviceSynchronize() {
  llmpi::sim::device_sync();
  return cudaSuccess;
}
template <class K>
cudaError_t cudaFuncSetAttribute(K kernel, cudaFuncAttribute, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > llmpi::sim::kSmemPerBlock) return cudaErrorInvalidValue;
  llmpi::sim::smem_opt_in()[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(bytes);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrComputeCapabilityMajor ? 9 : a == cudaDevAttrComputeCapabilityMinor ? 0
                                                                                     : static_cast<int>(llmpi::sim::kSmemPerBlock);
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  *p = {};
  std::strcpy(p->name, "simulated H100 (tools/cuda_cpu_sim)");
  p->major = 9;
  p->totalGlobalMem = llmpi::sim::kDeviceBytes;
  p->sharedMemPerBlockOptin = llmpi::sim::kSmemPerBlock;
  p->multiProcessorCount = 132;
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  *free_bytes = *total = llmpi::sim::kDeviceBytes;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "(simulated)"; }
inline const char* cudaGetErrorName(cudaError_t) { return "cudaError (simulated)"; }
// memory: host memory, 256-byte aligned as cudaMalloc's
inline cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256 + 256 * (n == 0));
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <class T>
cudaError_t cudaMalloc(T** p, size_t n) {
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}
inline cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
inline cudaError_t cudaFree(void* p) {  // waits for the device, as CUDA's does
  llmpi::sim::device_sync();
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  llmpi::sim::reach(stream);
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
template <class T>
cudaError_t cudaMallocHost(T** p, size_t n) {
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }  // waits for the device too
// streams and events (stream.h)
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = llmpi::sim::new_stream((flags & cudaStreamNonBlocking) == 0);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}
inline cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {  // an H100's
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidValue;
  llmpi::sim::destroy_stream(s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s)
    llmpi::sim::sync_stream(s);
  else
    llmpi::sim::reach(nullptr);  // the legacy stream comes after every blocking stream's work
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
  llmpi::sim::wait_event(s, e);
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
  llmpi::sim::record(e, s);
  return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  return !e->stream || llmpi::sim::reached(e->stream, e->seq) ? cudaSuccess : cudaErrorNotReady;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e->stream) llmpi::sim::sync_to(e->stream, e->seq);
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return cudaSuccess;
}

// The driver's entry points by name (kernels/device_pages.cu): the stand-ins of cuda.h.
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };
constexpr unsigned long long cudaEnableDefault = 0;
#include "cuda.h"
#include <cstring>
inline cudaError_t cudaGetDriverEntryPointByVersion(const char* name, void** fn, unsigned, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* found) {
  namespace s = llmpi::sim;
  struct Entry {
    const char* name;
    void* fn;
  };
  static const Entry entries[] = {
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&s::cuMemGetAllocationGranularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&s::cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&s::cuMemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&s::cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&s::cuMemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&s::cuMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&s::cuMemUnmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&s::cuMemSetAccess)},
  };
  for (const Entry& e : entries)
    if (std::strcmp(e.name, name) == 0) {
      *fn = e.fn;
      if (found) *found = cudaDriverEntryPointSuccess;
      return cudaSuccess;
    }
  *fn = nullptr;
  if (found) *found = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
