// tools/cuda_cpu_sim's stand-in for <cuda.h>: the driver's virtual memory management that
// kernels/device_pages.cu calls (through cudaGetDriverEntryPointByVersion, cuda_runtime.h), with
// CUDA's names and signatures. An address range is reserved without access (mmap PROT_NONE), so a
// kernel touching a chunk that is not mapped faults as on a card; cuMemMap makes a chunk readable
// and writable, cuMemUnmap gives its pages back (MADV_DONTNEED) and takes the access away again.
// A physical allocation is only a size: the pages are the reserved range's own.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

using CUresult = int;
constexpr CUresult CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2;
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
enum CUmemAllocationType { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum CUmemLocationType { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum CUmemAllocationGranularity_flags { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1 };
enum CUmemAccess_flags { CU_MEM_ACCESS_FLAGS_PROT_NONE = 0, CU_MEM_ACCESS_FLAGS_PROT_READ = 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };
struct CUmemLocation {
  CUmemLocationType type;
  int id;
};
struct CUmemAllocationProp {
  CUmemAllocationType type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  CUmemAccess_flags flags;
};

namespace llmpi::sim {
// 2 MiB, a current card's granularity
constexpr size_t kPageChunk = size_t(2) << 20;
inline CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *g = kPageChunk;
  return CUDA_SUCCESS;
}
inline CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr, unsigned long long) {
  if (size == 0 || size % kPageChunk) return CUDA_ERROR_INVALID_VALUE;
  void* m = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<CUdeviceptr>(m);
  return CUDA_SUCCESS;
}
inline CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  return munmap(reinterpret_cast<void*>(p), size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
inline CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp*, unsigned long long) {
  if (size == 0 || size % kPageChunk) return CUDA_ERROR_INVALID_VALUE;
  *h = size;
  return CUDA_SUCCESS;
}
inline CUresult cuMemRelease(CUmemGenericAllocationHandle) { return CUDA_SUCCESS; }
inline CUresult cuMemMap(CUdeviceptr p, size_t size, size_t, CUmemGenericAllocationHandle h, unsigned long long) {
  if (size != h) return CUDA_ERROR_INVALID_VALUE;
  return mprotect(reinterpret_cast<void*>(p), size, PROT_READ | PROT_WRITE) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
inline CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  void* q = reinterpret_cast<void*>(p);
  if (madvise(q, size, MADV_DONTNEED) != 0) return CUDA_ERROR_INVALID_VALUE;
  return mprotect(q, size, PROT_NONE) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
inline CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) { return CUDA_SUCCESS; }
}  // namespace llmpi::sim
