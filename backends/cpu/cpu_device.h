// The CPU device: the kernel table of backends/cpu over host memory (host_allocator()).
#pragma once

#include "core/device.h"

namespace tessera {

// The process-wide CPU device. Its construction pins OpenBLAS to one thread (cpu_device.cpp),
// so every kernel reached through it runs single-threaded inside the oneTBB workers.
Device& cpu_device();

}  // namespace tessera
