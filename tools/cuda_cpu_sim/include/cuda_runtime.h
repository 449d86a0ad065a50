// tools/cuda_cpu_sim's stand-in for <cuda_runtime.h>: what the CUDA backend's .cu files name of
// the runtime API, for their kernels and launchers to run on the CPU (README.md there). "Device"
// memory is host memory; a stream is nothing (every launch runs to its end before it returns).
#pragma once
#include <cstring>

#include "cuda_shim.h"
#include "launch.h"

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor, cudaDevAttrComputeCapabilityMinor, cudaDevAttrMaxSharedMemoryPerBlockOptin };
enum cudaDataType_t { CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F };

inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t = nullptr) {
  std::memmove(dst, src, n);
  return cudaSuccess;
}
template <class K>
cudaError_t cudaFuncSetAttribute(K kernel, cudaFuncAttribute, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > llmpi::sim::kSmemPerBlock) return 1;
  llmpi::sim::smem_opt_in()[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(bytes);
  return cudaSuccess;
}
// an H100 (sm_90, 227 KB of opt-in shared memory a block)
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrComputeCapabilityMajor ? 9 : a == cudaDevAttrComputeCapabilityMinor ? 0
                                                                                     : static_cast<int>(llmpi::sim::kSmemPerBlock);
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "(simulated)"; }
