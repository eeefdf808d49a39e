// The host allocator: 64-byte aligned host memory, with large blocks cached for reuse.
#include "core/allocator.h"

#include <sanitizer/asan_interface.h>  // no-op poisoning macros unless ASan is on
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/error.h"

namespace tessera {

void* Allocator::allocate_zeroed(size_t bytes) {
  void* p = allocate(bytes);
  std::memset(p, 0, bytes);
  return p;
}

namespace {

// Every allocate/allocate_zeroed call, cached blocks included (host_allocation_count()).
std::atomic<uint64_t> g_allocation_calls{0};

// A transparent huge page (x86-64): large blocks and map_huge_page_aligned align to it.
constexpr size_t kHugePage = size_t{2} << 20;


// True in the ASan builds (scripts/sanitize.sh with GCC, the fuzz build with clang).
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

// Errors name "cpu" as where they arose: the message format of the CPU device that owned this
// allocator before (tests and callers match on it).
class HostAllocator final : public Allocator {
 public:
  // The cached blocks go back at exit: LeakSanitizer checks after static destructors, and would
  // report blocks that only the (destroyed) cache pointed to.
  ~HostAllocator() override {
    for (const auto& [size, p] : cache_) release_large(p, size);
  }

  void* allocate(size_t bytes) override {
    g_allocation_calls.fetch_add(1, std::memory_order_relaxed);
    check_size(bytes);
    if (bytes >= kLargeBlock) return allocate_large(bytes, false);
    return allocate_small(bytes);
  }

  void* allocate_zeroed(size_t bytes) override {
    g_allocation_calls.fetch_add(1, std::memory_order_relaxed);
    check_size(bytes);
    if (bytes >= kLargeBlock) return allocate_large(bytes, true);
    void* p = allocate_small(bytes);
    std::memset(p, 0, bytes);
    return p;
  }

  void deallocate(void* p) noexcept override {
    if (p == nullptr) return;
    size_t unmap = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = large_sizes_.find(p);
      if (it != large_sizes_.end()) {
        const size_t size = it->second;
        // Keep the block (its pages stay mapped) unless the cache would grow past its cap.
        if (cached_bytes_ + size <= kCacheCapBytes) {
          ASAN_POISON_MEMORY_REGION(p, size);  // a use after free is a report
          cache_.emplace(size, p);
          cached_bytes_ += size;
          return;
        }
        large_sizes_.erase(it);
        unmap = size;
      }
    }
    if (unmap > 0)
      release_large(p, unmap);  // outside the lock: returning a large block's pages takes a while
    else
      std::free(p);
  }

 private:
  // Large blocks (>= 1 MiB: QKV buffers, attention outputs, plan intermediates) are cached
  // on free and reused: first touch of fresh pages runs at about 0.33 GB/s here
  // (toolchain_notes.md), so a layer that got fresh memory per call would spend 150 ms
  // faulting in a 50 MB QKV buffer (T=8192, D=512) against ~20 ms of arithmetic.
  static constexpr size_t kLargeBlock = size_t{1} << 20;
  // The cache holds at most 512 MiB of free blocks; past that, freed blocks go back to the OS.
  static constexpr size_t kCacheCapBytes = size_t{512} << 20;

  void* allocate_small(size_t bytes) {
    constexpr size_t kAlignment = 64;  // a cache line, and one AVX-512 vector
    // aligned_alloc wants a multiple of the alignment, and aligned_alloc(64, 0) may return
    // null, which the Allocator contract forbids: round up, to at least one line.
    const size_t rounded =
        bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) out_of_memory(bytes);
    return p;
  }

  static void check_size(size_t bytes) {
    if (bytes > SIZE_MAX / 2) {
      throw Error(ErrorCode::Internal, "cpu",
                  "cannot allocate " + std::to_string(bytes) + " bytes: size overflows");
    }
  }

  void* allocate_large(size_t bytes, bool zeroed) {
    // Round up to 1/8 of the power of two at or below `bytes` (at most 12.5% waste) so that
    // slightly different sizes share cached blocks.
    size_t pow2 = size_t{1} << (63 - __builtin_clzll(bytes));
    const size_t step = std::max<size_t>(pow2 / 8, 4096);
    const size_t rounded = (bytes + step - 1) / step * step;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Best fit among cached blocks no more than 25% larger than asked.
      auto it = cache_.lower_bound(rounded);
      if (it != cache_.end() && it->first <= rounded + rounded / 4) {
        void* p = it->second;
        const size_t size = it->first;
        cached_bytes_ -= size;
        cache_.erase(it);
        poison_tail(p, bytes, size);
        if (zeroed) std::memset(p, 0, bytes);  // a reused block holds its last user's data
        return p;
      }
    }
    if (kAddressSanitizer) {
      // From the sanitized heap instead of mmap, so that ASan and the fuzzer's -malloc_limit_mb
      // see every block (the first-touch cost below does not matter there).
      void* p = nullptr;
      if (posix_memalign(&p, kHugePage, rounded) != 0) out_of_memory(bytes);
      poison_tail(p, bytes, rounded);
      if (zeroed) std::memset(p, 0, bytes);
      std::lock_guard<std::mutex> lock(mutex_);
      large_sizes_[p] = rounded;
      return p;
    }
    // Fresh blocks come straight from mmap: zero pages the kernel supplies on first touch, so
    // allocate_zeroed needs no memset. A zeroed parameter that a checkpoint then replaces (a
    // 64 MB weight) is never touched at all, where a memset would cost ~0.2 s of first-touch
    // faults and 64 MB of RSS. 2 MiB-aligned and advised for huge pages (transparent huge pages
    // are madvise-only here): fewer TLB misses on strided K/V rows, 512x fewer faults.
    void* p = map_huge_page_aligned(rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                    -1);
    if (p == MAP_FAILED) out_of_memory(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    large_sizes_[p] = rounded;
    return p;
  }

  static void release_large(void* p, size_t size) {
    if (kAddressSanitizer) {
      ASAN_UNPOISON_MEMORY_REGION(p, size);
      std::free(p);
    } else {
      munmap(p, size);
    }
  }

  // Under ASan a large block is one chunk of its rounded size: poisoning what lies past the
  // request makes an overflow into the rounding slack a report too. No-op in other builds.
  static void poison_tail(void* p, size_t bytes, size_t size) {
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(p) + bytes, size - bytes);
  }

  [[noreturn]] static void out_of_memory(size_t bytes) {
    throw Error(ErrorCode::Internal, "cpu",
                "out of memory allocating " + std::to_string(bytes) + " bytes");
  }

  std::mutex mutex_;
  std::unordered_map<void*, size_t> large_sizes_;  // every live or cached large block
  std::multimap<size_t, void*> cache_;             // free large blocks by size
  size_t cached_bytes_ = 0;
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator allocator;
  return allocator;
}

uint64_t host_allocation_count() { return g_allocation_calls.load(std::memory_order_relaxed); }

void* map_huge_page_aligned(size_t bytes, int prot, int flags, int fd) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t span = (bytes + page - 1) / page * page;
  // Reserve 2 MiB more than the span, map at its first 2 MiB boundary, give back the ends.
  void* area = mmap(nullptr, span + kHugePage, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* p = nullptr;
  if (area == MAP_FAILED) {
    p = mmap(nullptr, bytes, prot, flags, fd, 0);
    if (p == MAP_FAILED) return p;
  } else {
    const uintptr_t base = reinterpret_cast<uintptr_t>(area);
    const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
    p = mmap(reinterpret_cast<void*>(aligned), bytes, prot, flags | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      munmap(area, span + kHugePage);
      errno = err;
      return p;
    }
    if (aligned > base) munmap(area, aligned - base);
    const uintptr_t end = aligned + span, area_end = base + span + kHugePage;
    if (area_end > end) munmap(reinterpret_cast<void*>(end), area_end - end);
  }
  madvise(p, bytes, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return p;
}

void release_file_pages(const void* p, size_t bytes) noexcept {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace tessera
