// Memory for the CPU backend: host memory, zero-filled, 64-byte aligned (one cache line; also
// enough for AVX-512 loads), so the vector loops start on a line boundary.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace llmpi::cpu {

// aligned_alloc wants a size that is a multiple of the alignment; a 0-byte request still gets a
// valid, unique pointer (one line) so that free() is always fine.
void* alloc(size_t bytes) {
  constexpr size_t kAlign = 256;  // (as cudaMalloc: op_list.h's contract)
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded == 0 ? kAlign : rounded);
  return p;
}

void free(void* p) { std::free(p); }

void zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}

// Host to "device", "device" to host and within the backend: the same host memory here, so all
// three are a plain memcpy (dst and src do not overlap, except that dst == src is a no-op).
void copy_to_device(void* dst, const void* src_host, size_t bytes) {
  if (bytes && dst != src_host) std::memcpy(dst, src_host, bytes);
}

// No staging and nothing to wait for on the CPU: the same memcpy.
void copy_to_device_async(void* dst, const void* src_host, size_t bytes) { copy_to_device(dst, src_host, bytes); }

namespace {
std::atomic<uint64_t> readbacks{0};
}  // namespace

void count_readback() { readbacks.fetch_add(1, std::memory_order_relaxed); }
uint64_t readback_count() { return readbacks.load(std::memory_order_relaxed); }

void copy_to_host(void* dst_host, const void* src, size_t bytes) {
  count_readback();
  if (bytes && dst_host != src) std::memcpy(dst_host, src, bytes);
}

float* thread_scratch(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

void copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memcpy(dst, src, bytes);
}

}  // namespace llmpi::cpu
