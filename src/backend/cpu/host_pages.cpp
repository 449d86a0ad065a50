#include "backend/host_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

namespace llmpi {

namespace {

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t whole_pages(size_t bytes) {
  const size_t page = page_bytes();
  return (bytes == 0 ? 1 : (bytes + page - 1) / page) * page;
}

}  // namespace

void* host_pages_alloc(size_t bytes) {
  void* p = mmap(nullptr, whole_pages(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

void host_pages_free(void* p, size_t bytes) {
  if (p != nullptr) munmap(p, whole_pages(bytes));
}

void host_pages_release(void* p, size_t bytes) {
  if (bytes == 0) return;
  const size_t page = page_bytes();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), e = a + bytes;
  const uintptr_t pa = (a + page - 1) / page * page, pe = e / page * page;  // the whole pages inside
  if (pa >= pe) {
    std::memset(p, 0, bytes);
    return;
  }
  std::memset(p, 0, pa - a);
  // (an error leaves the pages as they are, which only costs memory: zero them instead)
  if (madvise(reinterpret_cast<void*>(pa), pe - pa, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(pa), 0, pe - pa);
  std::memset(reinterpret_cast<void*>(pe), 0, e - pe);
}

double host_pages_resident(const void* p, size_t bytes) {
  if (bytes == 0) return 0;
  const size_t page = page_bytes();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) / page * page, e = reinterpret_cast<uintptr_t>(p) + bytes;
  const size_t pages = (e - a + page - 1) / page;
  std::vector<unsigned char> in(pages);
  if (mincore(reinterpret_cast<void*>(a), pages * page, in.data()) != 0) return -1;
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return (double)n * (double)page;
}

}  // namespace llmpi
