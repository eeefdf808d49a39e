// A Device owns memory and a kernel table. Only the CPU device exists today; layers reach
// kernels through device.kernels() so another backend plugs in without touching them.
#pragma once

#include <cstddef>
#include <cstring>

#include "core/kernels.h"

namespace tessera {

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // 64-byte aligned (one cache line, one AVX-512 vector); never returns null (throws on failure).
  virtual void* allocate(size_t bytes) = 0;
  // As allocate(), with every byte zero. A device that gets zeroed memory from the OS overrides
  // this to skip the memset: the pages are then not even touched until written.
  virtual void* allocate_zeroed(size_t bytes) {
    void* p = allocate(bytes);
    std::memset(p, 0, bytes);
    return p;
  }
  virtual void deallocate(void* p) noexcept = 0;
  virtual const KernelTable& kernels() const = 0;
  // The SIMD target the kernels dispatched to ("AVX3_ZEN4", "AVX2", ...), for logs.
  virtual const char* simd_target() const = 0;
};

// The process-wide CPU device (backends/cpu).
Device& cpu_device();

}  // namespace tessera
