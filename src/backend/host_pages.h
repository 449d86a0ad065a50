// Host memory that is resident only where it has been written and that can give pages back
// while the allocation stays. ZeRO-2 (comm/grad_sync.h) keeps the gradient's full flat layout on
// every rank but only this rank's pieces of it in physical memory: backward writes a bucket, the
// bucket is reduce-scattered, and the rest of it is released. On the CPU backend only; a GPU's
// buffers come from cudaMalloc.
#pragma once
#include <cstddef>

namespace llmpi {

// bytes of zeros, page-aligned, of which nothing is resident until written. Throws
// std::bad_alloc when the address space cannot be had.
void* host_pages_alloc(size_t bytes);
// Frees what host_pages_alloc returned (p may be null); bytes as allocated.
void host_pages_free(void* p, size_t bytes);
// [p, p + bytes) becomes zero. The pages wholly inside go back to the system (MADV_DONTNEED on
// private anonymous memory: zero-filled when next touched); the partial pages at either end are
// cleared with memset, so bytes of neighbouring data on them are untouched. Works on any private
// anonymous host memory (host_pages_alloc's or the heap's), and from any thread for disjoint
// ranges.
void host_pages_release(void* p, size_t bytes);
// Bytes of the pages overlapping [p, p + bytes) that are resident now (mincore), or -1 when the
// system cannot say.
double host_pages_resident(const void* p, size_t bytes);

}  // namespace llmpi
