// Counts the memory allocations a piece of code makes, on every thread (oneTBB's workers too), for
// the tests that prove a steady-state run allocates nothing. Linked into the test binary only:
// allocation_counter.cpp replaces the allocation entry points of the whole process.
//
//   const Allocations a = count_allocations([&] { plan.run(inputs, outputs); });
//   BOOST_TEST(a.total() == 0, a.str());      // a.str(): the counts and where they came from
//
// What is counted (each kind is a different allocator, and one request can show in two kinds,
// e.g. a small device block is a device allocation and an aligned_alloc; test total() == 0):
// - heap: global operator new/new[] (every variant) and the malloc family (malloc, calloc,
//   realloc, aligned_alloc, posix_memalign, memalign, valloc, pvalloc). Under AddressSanitizer
//   ASan owns malloc and operator new; there the counter uses ASan's allocation hook instead,
//   which sees the same calls.
// - tbb: oneTBB's allocator entry points. oneTBB loads libtbbmalloc and takes its task objects
//   and arenas from it, so they never reach malloc.
// - mmap: mmap/mmap64 calls made outside glibc: OpenBLAS's GEMM buffers, libtbbmalloc's and the
//   CPU device's fresh large blocks, mapped files.
// - device: cpu_device() allocate/allocate_zeroed calls, a reused cached block too.
// Frees are never counted.
#pragma once

#include <cstdint>
#include <string>

#include "core/function_ref.h"

namespace tessera::testing {

struct Allocations {
  uint64_t heap = 0;
  uint64_t tbb = 0;
  uint64_t mmap = 0;
  uint64_t device = 0;
  // Made on a thread inside an ExcludeAllocations; in no count above and not in total().
  uint64_t excluded = 0;
  // The stacks of the first few counted allocations (kind, bytes, frames), empty when none.
  std::string sites;

  uint64_t total() const { return heap + tbb + mmap + device; }
  // "3 allocations (heap 2, tbb 0, mmap 0, device 1)" and the sites, for a failing check.
  std::string str() const;
};

// Counts from construction until result() (or destruction). One scope at a time in the process:
// a second one while another is open aborts. Counting is process-wide, so nothing else should
// run meanwhile (the Boost.Test runner is single-threaded).
class AllocationScope {
 public:
  AllocationScope();
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;

  // Stops counting (later calls return the same counts) and returns what was counted. Waits for
  // allocations in flight on other threads to finish being recorded.
  Allocations result();

 private:
  bool open_ = true;
  uint64_t device_start_ = 0;
  Allocations result_;
};

// Runs fn once inside an AllocationScope. Binding the callable costs nothing: a lambda passed
// here is referenced, not copied into a std::function.
Allocations count_allocations(FunctionRef<void()> fn);
// count_allocations(fn).total().
uint64_t allocations_during(FunctionRef<void()> fn);

// While one is alive, the allocations its thread makes are tallied in Allocations::excluded
// instead of being counted. For one named allocation we cannot remove (a library's per-call
// buffer): wrap exactly that call, and say in `reason` what allocates and why it stays (it is
// for the reader; nothing prints it). Device allocations are still counted.
class ExcludeAllocations {
 public:
  explicit ExcludeAllocations(const char* reason);
  ~ExcludeAllocations();
  ExcludeAllocations(const ExcludeAllocations&) = delete;
  ExcludeAllocations& operator=(const ExcludeAllocations&) = delete;
};

}  // namespace tessera::testing
