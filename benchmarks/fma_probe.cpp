// The machine's FMA ceiling, measured: a register-only fused multiply-add loop (no memory
// traffic) on 1..N threads at once, on the best Highway target (or --target NAME). The peer
// runner (benchmarks/peers.py) runs it in the same session as the benchmarks and quotes every
// GFLOP/s as a percentage of it: clocks, SMT and the machine's load differ from day to day, so a
// ceiling copied from a document would be wrong (the docs say 305 GFLOP/s per thread; this
// machine, Zen 4 with AVX-512 executed on 256-bit units, measures about 116).
//
//   fma_probe [--threads N] [--ms M] [--rounds R] [--target NAME] [--json]
//
// Prints, for 1..N threads (or only N with --only), the best aggregate GFLOP/s over R rounds of
// at least M ms each: FLOPs of all threads / wall time of the slowest. --json prints one object:
// {"target": ..., "gflops": {"1": x, "2": y, ...}, "ms": M, "rounds": R}.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "benchmarks/fma_probe.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "benchmarks/fma_loop-inl.h"
#include "benchmarks/fma_ceiling.h"
#include "benchmarks/force_target.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>


#if HWY_ONCE
namespace tessera::bench {
HWY_EXPORT(FmaLoop);
HWY_EXPORT(ThisTarget);

namespace {

double DispatchedFmaLoop(int64_t iters, float seed, float* sink) {
  return HWY_DYNAMIC_DISPATCH(FmaLoop)(iters, seed, sink);
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  using namespace tessera::bench;
  int max_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double ms = 200.0;
  int rounds = 5;
  bool json = false, only = false;
  std::string target_name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      max_threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--ms" && i + 1 < argc) {
      ms = std::max(1.0, std::atof(argv[++i]));
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--target" && i + 1 < argc) {
      target_name = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "--only") {
      only = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--only] [--ms M] [--rounds R] [--target NAME] "
                   "[--json]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!target_name.empty() && !force_target(target_name)) return 2;
  const char* target = hwy::TargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)());
  const int64_t iters = calibrate_fma_loop(DispatchedFmaLoop, ms);
  std::vector<std::pair<int, double>> results;
  for (int n = only ? max_threads : 1; n <= max_threads; ++n) {
    double best = 0.0;
    for (int r = 0; r < rounds; ++r) best = std::max(best, fma_round_gflops(DispatchedFmaLoop, n, iters, r));
    results.emplace_back(n, best);
  }
  if (json) {
    std::printf("{\"target\": \"%s\", \"ms\": %g, \"rounds\": %d, \"gflops\": {", target, ms,
                rounds);
    for (size_t i = 0; i < results.size(); ++i)
      std::printf("%s\"%d\": %.2f", i ? ", " : "", results[i].first, results[i].second);
    std::printf("}}\n");
  } else {
    std::printf("FMA probe, target %s, best of %d rounds of ~%g ms\n", target, rounds, ms);
    for (const auto& [n, g] : results)
      std::printf("  %d thread%s: %8.1f GFLOP/s  (%.1f per thread)\n", n, n == 1 ? " " : "s", g,
                  g / n);
  }
  return 0;
}
#endif  // HWY_ONCE
