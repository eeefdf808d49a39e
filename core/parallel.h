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

// parallel_for with every index a chunk of its own, for tasks that each outweigh the scheduling
// by far (an attention tile: 0.05-3.5 ms). parallel_for bundles up to n / (16 * threads)
// indices per chunk, and the last chunk of a loop runs while the other thread waits: at
// T = 4096 (128 tiles of 3.4 ms, 4 per chunk) a 13.6 ms chunk in a 124 ms loop on two threads.
void parallel_for_each(int64_t begin, int64_t end, FunctionRef<void(int64_t, int64_t)> fn);

// While one lives, parallel_for and parallel_for_each called on this thread run inline, as one
// chunk: for work a caller has already split across the threads at a coarser grain (Swin's
// groups of windows, each taken by one thread from its projection to its scatter, so that what
// one op writes the next reads from that core's L2). Nests.
class SerialScope {
 public:
  SerialScope();
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;
};

}  // namespace tessera
