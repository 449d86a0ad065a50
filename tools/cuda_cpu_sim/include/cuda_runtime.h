// tools/cuda_cpu_sim's stand-in for <cuda_runtime.h>: what the CUDA backend's .cu files name of
// the runtime API, for their kernels and launchers to run on the CPU (README.md there). "Device"
// memory is host memory; a stream is nothing (every launch runs to its end before it returns).
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
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem, sharedMemPerBlockOptin;
  int multiProcessorCount;
};

namespace llmpi::sim {
// the simulated card: an H100 (sm_90), one device, 80 GB; events hold nothing (every launch has
// finished when it returns)
constexpr size_t kDeviceBytes = size_t(80) << 30;
inline CUevent_st* new_event() { return reinterpret_cast<CUevent_st*>(new char(0)); }
}  // namespace llmpi::sim

inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t = nullptr) {
  if (n) std::memmove(dst, src, n);
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
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
template <class T>
cudaError_t cudaMallocHost(T** p, size_t n) {
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
// streams and events: every launch and copy is done when it returns
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(new char(0));
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = llmpi::sim::new_event();
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return cudaSuccess;
}
