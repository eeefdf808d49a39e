// A Device is a kernel table and the allocator its kernels' memory comes from. Only the CPU
// device exists today (cpu_device(), in the CPU backend); layers reach kernels through
// device.kernels() so another backend plugs in without touching them.
#pragma once

#include "core/allocator.h"
#include "core/kernels.h"

namespace tessera {

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // Memory the kernels can address (the host allocator for the CPU device).
  virtual Allocator& allocator() const = 0;
  virtual const KernelTable& kernels() const = 0;
  // The SIMD target the kernels dispatched to ("AVX3_ZEN4", "AVX2", ...), for logs.
  virtual const char* simd_target() const = 0;
};

}  // namespace tessera
