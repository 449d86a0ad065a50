// Device memory backed only where it is used (backend/cuda_ops.h "Device pages"), through CUDA's
// virtual memory management: cuMemAddressReserve holds the address range, and each chunk of the
// allocation granularity is backed by its own physical allocation (cuMemCreate + cuMemMap) when
// cuda_pages_back asks, and given back (cuMemUnmap; the physical allocation kept for the next
// chunk backed) once the work that reads it has finished. The driver's entry points come through
// cudaGetDriverEntryPointByVersion, so the program does not link libcuda itself (a CPU-only
// machine runs the same binary).
//
// A chunk is unbacked, backed, or releasing: cuda_pages_release records an event on the stream
// that last reads it (the communication stream after a reduce-scatter) and the chunk is unmapped
// when the event has passed (polled at every call, or waited for when the backed bytes would pass
// the limit). Backing a releasing chunk takes it back: the compute stream waits for the event and
// zeroes it. Every chunk newly backed is zeroed on the compute stream, so the range reads as zero
// until written, as host_pages' released pages do.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cuda_ops.h"
#include "cuda_common.cuh"
#include "runtime/error.h"

namespace llmpi {

namespace {

struct Driver {
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
};

template <typename F>
void entry(const char* name, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !p)
    fail("device pages: the CUDA driver has no ", name, " (virtual memory management needs a driver of CUDA 12 or "
         "newer): use parallel.zero 1 on this machine");
  *fn = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    entry("cuMemGetAllocationGranularity", &r.granularity);
    entry("cuMemAddressReserve", &r.reserve);
    entry("cuMemAddressFree", &r.address_free);
    entry("cuMemCreate", &r.create);
    entry("cuMemRelease", &r.release);
    entry("cuMemMap", &r.map);
    entry("cuMemUnmap", &r.unmap);
    entry("cuMemSetAccess", &r.set_access);
    return r;
  }();
  return d;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) fail("device pages: ", what, " failed (CUresult ", (int)r, ")");
}

CUmemAllocationProp device_prop() {
  int dev = 0;
  LLMPI_CUDA_CHECK(cudaGetDevice(&dev));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

enum class State { unbacked, backed, releasing };

struct Chunk {
  State state = State::unbacked;
  CUmemGenericAllocationHandle handle = 0;
  cudaEvent_t event = nullptr;  // releasing: unmapped once it has passed
};

struct Region {
  char* base = nullptr;
  size_t bytes = 0, reserved = 0, chunk = 0;
  std::vector<Chunk> chunks;
  std::deque<size_t> releasing;  // chunk indices, oldest first
  std::vector<CUmemGenericAllocationHandle> pool;
  std::vector<cudaEvent_t> spare_events;
  size_t backed = 0, peak = 0, limit = SIZE_MAX;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};

  char* at(size_t c) const { return base + c * chunk; }
  void unmap(size_t c) {
    Chunk& k = chunks[c];
    check(driver().unmap(reinterpret_cast<CUdeviceptr>(at(c)), chunk), "cuMemUnmap");
    pool.push_back(k.handle);
    if (k.event) spare_events.push_back(k.event);
    k = Chunk{};
    backed -= chunk;
  }
  // Unmaps the releasing chunks whose event has passed; with wait, the oldest one whatever it takes.
  void reap(bool wait_for_oldest) {
    while (!releasing.empty()) {
      const size_t c = releasing.front();
      Chunk& k = chunks[c];
      if (k.state != State::releasing) {  // taken back meanwhile
        releasing.pop_front();
        continue;
      }
      if (wait_for_oldest) {
        LLMPI_CUDA_CHECK(cudaEventSynchronize(k.event));
        wait_for_oldest = false;
      } else {
        const cudaError_t e = cudaEventQuery(k.event);
        if (e == cudaErrorNotReady) return;
        LLMPI_CUDA_CHECK(e);
      }
      releasing.pop_front();
      unmap(c);
    }
  }
  cudaEvent_t take_event() {
    cudaEvent_t e = nullptr;
    if (!spare_events.empty()) {
      e = spare_events.back();
      spare_events.pop_back();
    } else {
      LLMPI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    return e;
  }
  bool any_releasing() const {
    for (size_t c : releasing)
      if (chunks[c].state == State::releasing) return true;
    return false;
  }
};

std::mutex mu;
std::map<const void*, Region*>& regions() {
  static std::map<const void*, Region*> r;
  return r;
}

Region& region_of(const void* p) {
  auto it = regions().find(p);
  if (it == regions().end()) fail("internal: device pages: ", p, " is not a cuda_pages_reserve allocation");
  return *it->second;
}

}  // namespace

void* cuda_pages_reserve(size_t bytes) {
  const Driver& d = driver();
  auto r = std::make_unique<Region>();
  r->prop = device_prop();
  check(d.granularity(&r->chunk, &r->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "cuMemGetAllocationGranularity");
  r->bytes = bytes;
  r->reserved = std::max<size_t>(1, (bytes + r->chunk - 1) / r->chunk) * r->chunk;
  CUdeviceptr p = 0;
  check(d.reserve(&p, r->reserved, r->chunk, 0, 0), "cuMemAddressReserve");
  r->base = reinterpret_cast<char*>(p);
  r->chunks.resize(r->reserved / r->chunk);
  r->access.location = r->prop.location;
  r->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::lock_guard<std::mutex> lock(mu);
  void* base = r->base;
  regions()[base] = r.release();
  return base;
}

void cuda_pages_free(void* p) {
  if (!p) return;
  std::unique_ptr<Region> r;
  {
    std::lock_guard<std::mutex> lock(mu);
    r.reset(&region_of(p));
    regions().erase(p);
  }
  LLMPI_CUDA_CHECK(cudaDeviceSynchronize());
  const Driver& d = driver();
  for (size_t c = 0; c < r->chunks.size(); c++)
    if (r->chunks[c].state != State::unbacked) r->unmap(c);
  for (CUmemGenericAllocationHandle h : r->pool) check(d.release(h), "cuMemRelease");
  for (cudaEvent_t e : r->spare_events) (void)cudaEventDestroy(e);
  check(d.address_free(reinterpret_cast<CUdeviceptr>(r->base), r->reserved), "cuMemAddressFree");
}

void cuda_pages_limit(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  region_of(p).limit = bytes;
}

void cuda_pages_back(void* p, size_t offset, size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mu);
  Region& r = region_of(p);
  if (offset + bytes > r.bytes) fail("internal: device pages: backing past the end");
  const Driver& d = driver();
  r.reap(false);
  cudaStream_t s = cuda::compute_stream();
  for (size_t c = offset / r.chunk; c <= (offset + bytes - 1) / r.chunk; c++) {
    Chunk& k = r.chunks[c];
    if (k.state == State::backed) continue;
    if (k.state == State::releasing) {  // taken back: zero once its last reader has finished
      LLMPI_CUDA_CHECK(cudaStreamWaitEvent(s, k.event, 0));
      r.spare_events.push_back(k.event);
      k.event = nullptr;
      k.state = State::backed;
      LLMPI_CUDA_CHECK(cudaMemsetAsync(r.at(c), 0, r.chunk, s));
      continue;
    }
    while (r.backed + r.chunk > r.limit && r.any_releasing()) r.reap(true);
    if (r.pool.empty()) {
      CUmemGenericAllocationHandle h = 0;
      check(d.create(&h, r.chunk, &r.prop, 0), "cuMemCreate (out of device memory?)");
      r.pool.push_back(h);
    }
    k.handle = r.pool.back();
    r.pool.pop_back();
    const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(r.at(c));
    check(d.map(at, r.chunk, 0, k.handle, 0), "cuMemMap");
    check(d.set_access(at, r.chunk, &r.access, 1), "cuMemSetAccess");
    k.state = State::backed;
    r.backed += r.chunk;
    r.peak = std::max(r.peak, r.backed);
    LLMPI_CUDA_CHECK(cudaMemsetAsync(r.at(c), 0, r.chunk, s));
  }
}

void cuda_pages_release(void* p, size_t offset, size_t bytes, void* stream) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mu);
  Region& r = region_of(p);
  if (offset + bytes > r.bytes) fail("internal: device pages: releasing past the end");
  cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : cuda::compute_stream();
  const size_t end = offset + bytes;
  const size_t first_whole = (offset + r.chunk - 1) / r.chunk, end_whole = end / r.chunk;
  // The bytes in partial chunks (or a range inside one chunk) zeroed after what s has enqueued.
  auto zero_part = [&](size_t a, size_t b) {
    if (b > a) LLMPI_CUDA_CHECK(cudaMemsetAsync(r.base + a, 0, b - a, s));
  };
  if (first_whole >= end_whole) {
    zero_part(offset, end);
  } else {
    zero_part(offset, first_whole * r.chunk);
    zero_part(end_whole * r.chunk, end);
  }
  for (size_t c = first_whole; c < end_whole; c++) {
    Chunk& k = r.chunks[c];
    if (k.state != State::backed) continue;
    k.event = r.take_event();
    LLMPI_CUDA_CHECK(cudaEventRecord(k.event, s));
    k.state = State::releasing;
    r.releasing.push_back(c);
  }
  r.reap(false);
}

size_t cuda_pages_backed(const void* p) {
  std::lock_guard<std::mutex> lock(mu);
  Region& r = region_of(p);
  r.reap(false);
  return r.backed;
}

size_t cuda_pages_peak(const void* p) {
  std::lock_guard<std::mutex> lock(mu);
  return region_of(p).peak;
}

size_t cuda_pages_chunk(const void* p) {
  std::lock_guard<std::mutex> lock(mu);
  return region_of(p).chunk;
}

void* cuda_event_new() {
  cudaEvent_t e = nullptr;
  LLMPI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return static_cast<void*>(e);
}

void cuda_event_free(void* e) {
  if (e) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void cuda_event_record(void* e, void* stream) {
  cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : cuda::compute_stream();
  LLMPI_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), s));
}

void cuda_compute_waits(void* e) {
  LLMPI_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), static_cast<cudaEvent_t>(e), 0));
}

}  // namespace llmpi
