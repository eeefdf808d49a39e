// Where a Tensor's bytes come from. Tensor factories take an Allocator (host_allocator() by
// default), so core needs no device to make a tensor, and a caller that owns memory (a plan's
// workspace, a device with memory of its own) hands its allocator to the factories instead.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // 64-byte aligned (one cache line, one AVX-512 vector); never returns null, also for 0 bytes
  // (throws Error on failure).
  virtual void* allocate(size_t bytes) = 0;
  // As allocate(), with every byte zero. An allocator that gets zeroed memory from the OS
  // overrides this to skip the memset: the pages are then not even touched until written.
  virtual void* allocate_zeroed(size_t bytes);
  // p from allocate/allocate_zeroed of this allocator, or null (ignored).
  virtual void deallocate(void* p) noexcept = 0;
};

// The process-wide host allocator: aligned_alloc below 1 MiB; from 1 MiB, 2 MiB-aligned mmap
// blocks on transparent huge pages, cached on free (up to 512 MiB) and reused. Thread-safe.
Allocator& host_allocator();
// allocate/allocate_zeroed calls the host allocator has served so far, cached blocks included.
// Its large blocks come from mmap, not malloc: tests/allocation_counter.h counts them by this.
uint64_t host_allocation_count();

// mmap(nullptr, bytes, prot, flags, fd, 0) at a 2 MiB-aligned address, advised MADV_HUGEPAGE:
// anonymous memory may then be backed by transparent huge pages (madvise-only here), and a file
// the page cache holds in 2 MiB folios is mapped one page-table entry per folio. Returns
// MAP_FAILED (errno set) on failure. Where no aligned range can be reserved, an unaligned
// mapping. Unmap with munmap(p, bytes).
void* map_huge_page_aligned(size_t bytes, int prot, int flags, int fd);

// Drops this process's resident pages wholly inside [p, p + bytes) (MADV_DONTNEED), which must
// lie in a private read-only file mapping (Tensor::file_mapped()): the pages stay in the page
// cache and are mapped again if touched. For a checkpoint's tensor whose values were copied
// elsewhere. (On anonymous memory MADV_DONTNEED zeroes the bytes: never call it there.
// MADV_PAGEOUT would be safe anywhere but evicts the file from the page cache, so the next
// process reads it from disk: +700 ms cold start for vit_b_16 here.)
void release_file_pages(const void* p, size_t bytes) noexcept;

}  // namespace tessera
