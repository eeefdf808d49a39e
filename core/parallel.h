// The one place that decides thread counts. oneTBB owns all worker threads; OpenBLAS is pinned
// to one thread and only ever called from inside our own parallel loops, so the two never
// oversubscribe the cores (two thread pools on 2 cores cost 2-5x on GEMM-heavy layers).
#pragma once

#include <cstdint>

#include "core/function_ref.h"

namespace tessera {

// n >= 1 caps the worker threads; n == 0 means all cores (the default).
void set_num_threads(int n);
int num_threads();
int hardware_threads();

// Calls fn(begin_i, end_i) over disjoint chunks covering [begin, end), chunks at least `grain`
// long, possibly in parallel. Runs inline when the range is one chunk. fn must not throw.
// Allocates nothing once oneTBB's workers and task pools are warm (the allocations suite): fn is
// referenced, not copied, and oneTBB recycles its task objects.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  FunctionRef<void(int64_t, int64_t)> fn);

}  // namespace tessera
