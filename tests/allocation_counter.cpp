// The hooks behind allocation_counter.h. Each replaces a process-wide entry point by symbol
// interposition (the executable's definition wins over every shared library's), counts while a
// scope is open and forwards to the real allocator, so the rest of the process behaves as before.
// Nothing here may allocate on the counting path, and nothing needs dynamic initialisation: the
// hooks run from the first allocation of the process on, before any constructor of this file.
#include "tests/allocation_counter.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>

#include "core/allocator.h"

// ASan (scripts/sanitize.sh, the fuzz build) owns malloc and operator new; so do the other
// allocation-tracking sanitizers. Replacing them there would hide every allocation from it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TESSERA_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define TESSERA_SANITIZER_ALLOCATOR 1
#endif
#endif

namespace tessera::testing {
namespace {

enum Kind { kHeap, kTbb, kMmap, kKinds };
const char* const kKindNames[kKinds] = {"heap", "tbb", "mmap"};

// Stacks kept for the first kMaxSites counted allocations of a scope, kFrames deep.
constexpr int kMaxSites = 4;
constexpr int kFrames = 24;

struct Site {
  Kind kind = kHeap;
  size_t bytes = 0;
  int depth = 0;
  void* frames[kFrames] = {};
  std::atomic<bool> ready{false};  // set once the fields above are complete
};

constinit std::atomic<bool> g_scope_open{false};
constinit std::atomic<bool> g_counting{false};
constinit std::atomic<int> g_in_flight{0};  // note() calls between their two g_counting checks
constinit std::atomic<uint64_t> g_counts[kKinds] = {};
constinit std::atomic<uint64_t> g_excluded{0};
constinit std::atomic<int> g_sites_taken{0};
constinit Site g_sites[kMaxSites];

constinit thread_local int t_exclude_depth = 0;
constinit thread_local bool t_in_counter = false;  // backtrace() may allocate: not counted

// Records one allocation of `kind` if a scope is counting. Not inlined, so that a stack's frame
// 1 is the hook that called it.
[[gnu::noinline]] void note(Kind kind, size_t bytes) noexcept {
  if (!g_counting.load(std::memory_order_relaxed)) return;  // the path of every other allocation
  if (t_in_counter) return;
  // In flight from here: AllocationScope::result() stops counting, then waits for zero, so every
  // allocation it reports has been fully recorded and none is recorded after it returns.
  g_in_flight.fetch_add(1);
  if (g_counting.load()) {
    if (t_exclude_depth > 0) {
      g_excluded.fetch_add(1, std::memory_order_relaxed);
    } else {
      g_counts[kind].fetch_add(1, std::memory_order_relaxed);
      if (g_sites_taken.load(std::memory_order_relaxed) < kMaxSites) {
        const int i = g_sites_taken.fetch_add(1, std::memory_order_relaxed);
        if (i < kMaxSites) {
          Site& s = g_sites[i];
          s.kind = kind;
          s.bytes = bytes;
          t_in_counter = true;
          s.depth = backtrace(s.frames, kFrames);
          t_in_counter = false;
          s.ready.store(true, std::memory_order_release);
        }
      }
    }
  }
  g_in_flight.fetch_sub(1);
}

// "heap 64 bytes" then one frame a line: module(symbol+offset) [address], symbols demangled.
// Frame 0 (note) is left out. Frames in the test binary itself show as tessera_tests(+offset):
// its functions are not exported; `addr2line -fCe build/tests/tessera_tests offset` names them.
std::string format_sites() {
  std::string out;
  const int n = std::min(g_sites_taken.load(), kMaxSites);
  for (int i = 0; i < n; ++i) {
    const Site& s = g_sites[i];
    if (!s.ready.load(std::memory_order_acquire)) continue;
    out += "allocation " + std::to_string(i + 1) + ": " + kKindNames[s.kind] + ", " +
           std::to_string(s.bytes) + " bytes\n";
    char** symbols = backtrace_symbols(s.frames, s.depth);
    for (int f = 1; f < s.depth; ++f) {
      std::string line = symbols ? symbols[f] : "?";
      const size_t open = line.find('('), plus = line.find('+', open);
      if (open != std::string::npos && plus != std::string::npos && plus > open + 1) {
        int status = 0;
        char* name = abi::__cxa_demangle(line.substr(open + 1, plus - open - 1).c_str(), nullptr,
                                         nullptr, &status);
        if (status == 0 && name) line.replace(open + 1, plus - open - 1, name);
        std::free(name);
      }
      out += "  #" + std::to_string(f) + " " + line + "\n";
    }
    std::free(static_cast<void*>(symbols));
  }
  return out;
}

#ifdef TESSERA_SANITIZER_ALLOCATOR
// ASan calls these on every allocation its allocator serves: the malloc family and operator new
// alike (compiler-rt's sanitizer/allocator_interface.h; GCC 12 ships the runtime, not the header).
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*,
                                                                             size_t),
                                                         void (*free_hook)(const volatile void*));
void sanitizer_malloc_hook(const volatile void*, size_t bytes) { note(kHeap, bytes); }
void sanitizer_free_hook(const volatile void*) {}
#endif

// Done once, before the first scope counts: the first backtrace() loads libgcc_s (dlopen,
// which allocates), and ASan's hook is installed.
void prepare_once() {
  static const bool prepared = [] {
    void* frame[1];
    backtrace(frame, 1);
#ifdef TESSERA_SANITIZER_ALLOCATOR
    if (__sanitizer_install_malloc_and_free_hooks(&sanitizer_malloc_hook, &sanitizer_free_hook) ==
        0) {
      std::fputs("allocation_counter: cannot install the sanitizer allocation hook\n", stderr);
      std::abort();
    }
#endif
    return true;
  }();
  (void)prepared;
}

}  // namespace

std::string Allocations::str() const {
  std::string s = std::to_string(total()) + " allocations (heap " + std::to_string(heap) +
                  ", tbb " + std::to_string(tbb) + ", mmap " + std::to_string(mmap) + ", device " +
                  std::to_string(device) + ")";
  if (excluded > 0) s += ", " + std::to_string(excluded) + " excluded";
  if (!sites.empty()) s += "\n" + sites;
  return s;
}

AllocationScope::AllocationScope() {
  if (g_scope_open.exchange(true)) {
    std::fputs("allocation_counter: an AllocationScope is already open\n", stderr);
    std::abort();
  }
  prepare_once();
  for (auto& c : g_counts) c.store(0);
  g_excluded.store(0);
  for (auto& s : g_sites) s.ready.store(false);
  g_sites_taken.store(0);
  device_start_ = host_allocation_count();
  g_counting.store(true);
}

AllocationScope::~AllocationScope() { result(); }

Allocations AllocationScope::result() {
  if (!open_) return result_;
  g_counting.store(false);
  while (g_in_flight.load() != 0) std::this_thread::yield();
  result_.device = host_allocation_count() - device_start_;
  result_.heap = g_counts[kHeap].load();
  result_.tbb = g_counts[kTbb].load();
  result_.mmap = g_counts[kMmap].load();
  result_.excluded = g_excluded.load();
  result_.sites = format_sites();
  open_ = false;
  g_scope_open.store(false);
  return result_;
}

Allocations count_allocations(FunctionRef<void()> fn) {
  AllocationScope scope;
  fn();
  return scope.result();
}

uint64_t allocations_during(FunctionRef<void()> fn) { return count_allocations(fn).total(); }

ExcludeAllocations::ExcludeAllocations(const char*) { ++t_exclude_depth; }
ExcludeAllocations::~ExcludeAllocations() { --t_exclude_depth; }

}  // namespace tessera::testing

using tessera::testing::kHeap;
using tessera::testing::kMmap;
using tessera::testing::kTbb;
using tessera::testing::note;

namespace {

// The next definition of a symbol after this executable's (libc's, libtbb's, or under ASan its
// interceptor), found once.
template <typename Fn>
Fn next_definition(const char* symbol) {
  void* f = dlsym(RTLD_NEXT, symbol);
  if (f == nullptr) {
    std::fprintf(stderr, "allocation_counter: no definition of %s after the test binary\n", symbol);
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

}  // namespace

// ---- oneTBB. It loads libtbbmalloc and hands its task objects, arenas and internal containers
// to it through two exported functions (the small-object pool behind every task refills through
// cache_aligned_allocate), which libtbb calls through its PLT: defining them here puts the
// counter in front of both, whatever allocator oneTBB picked. Its few direct malloc and operator
// new calls are counted as heap.
namespace tbb::detail::r1 {

void* cache_aligned_allocate(std::size_t size) {
  using Fn = void* (*)(std::size_t);
  static const Fn next = next_definition<Fn>("_ZN3tbb6detail2r122cache_aligned_allocateEm");
  void* p = next(size);
  note(kTbb, size);
  return p;
}

void* allocate_memory(std::size_t size) {
  using Fn = void* (*)(std::size_t);
  static const Fn next = next_definition<Fn>("_ZN3tbb6detail2r115allocate_memoryEm");
  void* p = next(size);
  note(kTbb, size);
  return p;
}

}  // namespace tbb::detail::r1

// ---- mmap, as called from outside glibc (glibc's own malloc maps through an internal alias, so
// a large malloc counts once, as heap). <sys/mman.h> is not included: under
// _FILE_OFFSET_BITS=64 it renames mmap to mmap64, and both names are defined here.
namespace {
using MmapFn = void* (*)(void*, size_t, int, int, int, long);
void* const kMapFailed = reinterpret_cast<void*>(-1);
}  // namespace

extern "C" void* mmap(void* addr, size_t length, int prot, int flags, int fd,
                      long offset) noexcept {
  static const MmapFn next = next_definition<MmapFn>("mmap");
  void* p = next(addr, length, prot, flags, fd, offset);
  if (p != kMapFailed) note(kMmap, length);
  return p;
}

extern "C" void* mmap64(void* addr, size_t length, int prot, int flags, int fd,
                        long offset) noexcept {
  static const MmapFn next = next_definition<MmapFn>("mmap64");
  void* p = next(addr, length, prot, flags, fd, offset);
  if (p != kMapFailed) note(kMmap, length);
  return p;
}

#ifndef TESSERA_SANITIZER_ALLOCATOR
// ---- The malloc family and operator new, forwarded to glibc's allocator under its own names
// (exported for exactly this use), so memory from either side can be freed by the other.
extern "C" {
void* __libc_malloc(size_t size) noexcept;
void* __libc_calloc(size_t count, size_t size) noexcept;
void* __libc_realloc(void* p, size_t size) noexcept;
void __libc_free(void* p) noexcept;
void* __libc_memalign(size_t alignment, size_t size) noexcept;
void* __libc_valloc(size_t size) noexcept;
void* __libc_pvalloc(size_t size) noexcept;

void* malloc(size_t size) noexcept {
  void* p = __libc_malloc(size);
  note(kHeap, size);
  return p;
}

void free(void* p) noexcept { __libc_free(p); }

void* calloc(size_t count, size_t size) noexcept {
  void* p = __libc_calloc(count, size);
  note(kHeap, count * size);
  return p;
}

void* realloc(void* p, size_t size) noexcept {
  void* q = __libc_realloc(p, size);
  if (size > 0) note(kHeap, size);  // realloc(p, 0) frees
  return q;
}

void* reallocarray(void* p, size_t count, size_t size) noexcept {
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(p, bytes);
}

// glibc 2.36's aligned_alloc is memalign under another name.
void* aligned_alloc(size_t alignment, size_t size) noexcept {
  void* p = __libc_memalign(alignment, size);
  note(kHeap, size);
  return p;
}

void* memalign(size_t alignment, size_t size) noexcept {
  void* p = __libc_memalign(alignment, size);
  note(kHeap, size);
  return p;
}

int posix_memalign(void** out, size_t alignment, size_t size) noexcept {
  // glibc's checks: a power of two, and a multiple of sizeof(void*).
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0 || alignment == 0)
    return EINVAL;
  void* p = __libc_memalign(alignment, size);
  note(kHeap, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(size_t size) noexcept {
  void* p = __libc_valloc(size);
  note(kHeap, size);
  return p;
}

void* pvalloc(size_t size) noexcept {
  void* p = __libc_pvalloc(size);
  note(kHeap, size);
  return p;
}
}  // extern "C"

namespace {

// operator new's contract: never null; on failure call the new-handler and retry, or throw.
// Counted once here, not again through malloc.
void* new_bytes(size_t size, size_t alignment) {
  if (size == 0) size = 1;
  for (;;) {
    void* p = alignment > 0 ? __libc_memalign(alignment, size) : __libc_malloc(size);
    if (p != nullptr) {
      note(kHeap, size);
      return p;
    }
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

void* new_bytes_nothrow(size_t size, size_t alignment) noexcept {
  try {
    return new_bytes(size, alignment);
  } catch (...) {
    return nullptr;
  }
}

size_t alignment_of(std::align_val_t a) { return static_cast<size_t>(a); }

}  // namespace

void* operator new(size_t size) { return new_bytes(size, 0); }
void* operator new[](size_t size) { return new_bytes(size, 0); }
void* operator new(size_t size, const std::nothrow_t&) noexcept {
  return new_bytes_nothrow(size, 0);
}
void* operator new[](size_t size, const std::nothrow_t&) noexcept {
  return new_bytes_nothrow(size, 0);
}
void* operator new(size_t size, std::align_val_t a) { return new_bytes(size, alignment_of(a)); }
void* operator new[](size_t size, std::align_val_t a) { return new_bytes(size, alignment_of(a)); }
void* operator new(size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  return new_bytes_nothrow(size, alignment_of(a));
}
void* operator new[](size_t size, std::align_val_t a, const std::nothrow_t&) noexcept {
  return new_bytes_nothrow(size, alignment_of(a));
}

void operator delete(void* p) noexcept { __libc_free(p); }
void operator delete[](void* p) noexcept { __libc_free(p); }
void operator delete(void* p, size_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t) noexcept { __libc_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { __libc_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { __libc_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  __libc_free(p);
}
#endif  // !TESSERA_SANITIZER_ALLOCATOR
