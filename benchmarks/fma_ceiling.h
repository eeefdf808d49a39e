// Drives the register-only FMA loop (fma_loop-inl.h) for the FMA ceiling: how many iterations
// take a given time, and the aggregate GFLOP/s of N threads running it at once. Shared by
// fma_probe and bench_linear; each passes its own dispatching wrapper of FmaLoop (the
// HWY_EXPORT lives in the including file), so this header needs nothing from Highway.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace tessera::bench {

// FmaLoop's signature: runs `iters` iterations from `seed`, stores a result in *sink, returns
// the FLOPs done.
using FmaLoopFn = double (*)(int64_t iters, float seed, float* sink);

inline double fma_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Iterations for about `ms` milliseconds on one thread.
inline int64_t calibrate_fma_loop(FmaLoopFn loop, double ms) {
  float sink = 0.0f;
  int64_t iters = 1 << 16;
  for (;;) {
    const double t0 = fma_now_s();
    loop(iters, 1.0f, &sink);
    const double s = fma_now_s() - t0;
    if (s * 1e3 >= ms / 4 || iters > (int64_t{1} << 40)) {
      return std::max<int64_t>(1,
                               static_cast<int64_t>(static_cast<double>(iters) * ms / (s * 1e3)));
    }
    iters *= 2;
  }
}

// Aggregate GFLOP/s of `threads` threads running `iters` iterations each, started together:
// all FLOPs over the wall time from the common start to the last thread's finish.
inline double fma_round_gflops(FmaLoopFn loop, int threads, int64_t iters, int round) {
  std::vector<double> flops(static_cast<size_t>(threads)), end(static_cast<size_t>(threads));
  std::vector<float> sinks(static_cast<size_t>(threads) * 16);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  double start = 0.0;
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      flops[static_cast<size_t>(i)] =
          loop(iters, 1.0f + static_cast<float>(round + i), &sinks[static_cast<size_t>(i) * 16]);
      end[static_cast<size_t>(i)] = fma_now_s();
    });
  }
  while (ready.load() < threads) {
  }
  start = fma_now_s();
  go.store(true, std::memory_order_release);
  for (auto& t : pool) t.join();
  double total = 0.0, last = start;
  for (int i = 0; i < threads; ++i) {
    total += flops[static_cast<size_t>(i)];
    last = std::max(last, end[static_cast<size_t>(i)]);
  }
  if (sinks[0] == 12345.0f) std::printf(" ");  // keep the results observable
  return total / std::max(last - start, 1e-9) * 1e-9;
}

}  // namespace tessera::bench
