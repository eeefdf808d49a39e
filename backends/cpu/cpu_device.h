// The CPU device: the kernel table of backends/cpu over host memory (host_allocator()).
#pragma once

#include <string>

#include "core/device.h"

namespace tessera {

// The process-wide CPU device. Its construction pins OpenBLAS to one thread (cpu_device.cpp),
// so every kernel reached through it runs single-threaded inside the oneTBB workers.
Device& cpu_device();

// Restricts the kernels' run-time dispatch to one compiled Highway target, by its
// hwy::TargetName ("AVX3", "AVX2", "SSE4", ...), so that one machine can measure the code paths
// of smaller CPUs. False when that target is not compiled in or this CPU lacks it; then
// `available` lists the names that would work.
bool restrict_simd_target(const std::string& name, std::string& available);

}  // namespace tessera
