// The machine's read bandwidth, the floor of every memory-bound measurement: N threads each
// summing its share of a buffer many times the L3 (callers pass 512 MiB), best of 5 passes.
// Shared by bench_decode (the decode attention kernel) and bench_generate (whole decode steps),
// so their "% of bandwidth" figures use one definition.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <thread>
#include <vector>

namespace tessera::bench {

// Seconds on the steady clock.
inline double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sum of n floats with 8 independent accumulators (the compiler vectorises it; one accumulator
// would serialise on the add latency and measure that instead of memory).
inline float read_range(const float* p, size_t n) {
  float acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += p[i + static_cast<size_t>(j)];
  for (; i < n; ++i) acc[0] += p[i];
  float s = 0.0f;
  for (float a : acc) s += a;
  return s;
}

// GB/s of `threads` threads reading `buf` together (each its own contiguous share), best of 5.
// `buf` must already be touched: first touch runs at a fraction of the read speed.
inline double read_bandwidth_gbs(const std::vector<float>& buf, int threads) {
  double best = 0.0;
  // One sum per 64-byte line, so the threads do not share a cache line when they store it.
  std::vector<float> sinks(static_cast<size_t>(threads) * 16);
  for (int pass = 0; pass < 5; ++pass) {
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    const size_t share = buf.size() / static_cast<size_t>(threads);
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        while (!go.load(std::memory_order_acquire)) {
        }
        sinks[static_cast<size_t>(t) * 16] =
            read_range(buf.data() + static_cast<size_t>(t) * share, share);
      });
    const double t0 = steady_now_s();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    const double s = steady_now_s() - t0;
    best = std::max(best, static_cast<double>(share * static_cast<size_t>(threads)) * 4 / s * 1e-9);
  }
  if (sinks[0] == 12345.0f) std::printf(" ");  // keeps the sums observable
  return best;
}

}  // namespace tessera::bench
