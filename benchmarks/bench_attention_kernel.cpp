// Single-thread speed of the fused attention kernel alone (backends/cpu flash_attention_f32),
// one head, against a register-only FMA peak measured in the same run.
//
// Layout as MultiheadAttention hands it over: one packed QKV buffer [T, 3 E] (E = 512, 8 heads
// of 64), head 0 read through row stride 3E, output [T, E]; the query tiles the core would
// form are run one after another on this thread. FLOPs = 4 T^2 head_dim per head (Q.K and P.V,
// 2 each per multiply-add), dense even when causal, so causal GFLOP/s is proportional to 1/time.
//
// --contiguous instead gives each of q, k, v its own [T, head_dim] block (row stride 64), the
// layout of a head-major [B, H, T, d] tensor.
//
// --target AVX2 (any hwy::TargetName) runs that compiled target instead of the best one.
//
//   bench_attention_kernel [--tile-rows R] [--min-ms M] [--contiguous] [--target NAME] [--t T]...
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "benchmarks/bench_attention_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "benchmarks/fma_loop-inl.h"
#include "benchmarks/force_target.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>


#if HWY_ONCE
#include "backends/cpu/flash_attention.h"
#include "core/attention_tile.h"

namespace tessera::bench {
HWY_EXPORT(FmaLoop);
HWY_EXPORT(ThisTarget);

namespace {

// This thread's CPU time, not wall time: on a machine shared with builds the scheduler takes
// the core away for whole time slices, which wall time would count against the kernel (and
// against the probe by a different amount). On an idle machine the two agree.
double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best GFLOP/s over a few rounds of at least `min_ms` each.
double PeakGflops(double min_ms) {
  float sink = 0.0f;
  double best = 0.0;
  for (int round = 0; round < 5; ++round) {
    int64_t iters = 1 << 20;
    for (;;) {
      const double t0 = ThreadSeconds();
      const double flops = HWY_DYNAMIC_DISPATCH(FmaLoop)(iters, 1.0f + round, &sink);
      const double s = ThreadSeconds() - t0;
      if (s * 1e3 >= min_ms) {
        best = std::max(best, flops / s * 1e-9);
        break;
      }
      iters *= 2;
    }
  }
  if (sink == 12345.0f) std::printf(" ");  // keep sink observable
  return best;
}

struct Shape {
  int64_t t;
  bool causal;
};

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  using namespace tessera;
  using namespace tessera::bench;
  int64_t tile_rows = 256;
  double min_ms = 200.0;
  std::vector<int64_t> lengths;
  bool contiguous = false;
  std::string target_name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tile-rows" && i + 1 < argc) {
      tile_rows = std::atoll(argv[++i]);
    } else if (a == "--min-ms" && i + 1 < argc) {
      min_ms = std::atof(argv[++i]);
    } else if (a == "--target" && i + 1 < argc) {
      target_name = argv[++i];
    } else if (a == "--contiguous") {
      contiguous = true;
    } else if (a == "--t" && i + 1 < argc) {
      lengths.push_back(std::atoll(argv[++i]));
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--tile-rows R] [--min-ms M] [--contiguous] [--target NAME] [--t T]...\n",
          argv[0]);
      return 2;
    }
  }
  if (lengths.empty()) lengths = {128, 512, 2048, 4096};
  if (!target_name.empty() && !force_target(target_name)) return 2;
  if (tile_rows <= 0) tile_rows = 256;

  constexpr int64_t kEmbed = 512, kHeadDim = 64;
  const int64_t max_t = *std::max_element(lengths.begin(), lengths.end());
  // Allocated and touched once (first touch runs at ~0.33 GB/s here: never inside a timing).
  std::vector<float> qkv(static_cast<size_t>(max_t * 3 * kEmbed));
  std::vector<float> out(static_cast<size_t>(max_t * kEmbed), 0.0f);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : qkv) x = dist(rng);
  const int64_t scratch_floats =
      cpu::flash_attention_scratch_floats_cpu(tile_rows, kHeadDim, kHeadDim);
  float* scratch = static_cast<float*>(
      std::aligned_alloc(64, static_cast<size_t>((scratch_floats * 4 + 63) / 64 * 64)));
  std::memset(scratch, 0, static_cast<size_t>(scratch_floats) * sizeof(float));

  const auto run = [&](int64_t T, bool causal) {
    FlashAttentionTile tile;
    tile.head_dim = kHeadDim;
    tile.v_head_dim = kHeadDim;
    tile.scale = 0.125f;
    tile.kv_len = T;
    // Packed QKV: head 0's q, k, v at columns 0, E, 2E of each [3E] row. Contiguous: three
    // [T, 64] blocks.
    const int64_t stride = contiguous ? kHeadDim : 3 * kEmbed;
    const float* q = qkv.data();
    tile.k = contiguous ? qkv.data() + T * kHeadDim : qkv.data() + kEmbed;
    tile.v = contiguous ? qkv.data() + 2 * T * kHeadDim : qkv.data() + 2 * kEmbed;
    tile.k_stride = stride;
    tile.v_stride = stride;
    tile.q_stride = stride;
    tile.out_stride = contiguous ? kHeadDim : kEmbed;
    tile.causal = causal;
    tile.scratch = scratch;
    for (int64_t l0 = 0; l0 < T; l0 += tile_rows) {
      tile.rows = std::min(tile_rows, T - l0);
      tile.q_pos0 = l0;
      tile.q = q + l0 * stride;
      tile.out = out.data() + l0 * tile.out_stride;
      cpu::flash_attention_f32_dispatch(tile);
    }
  };

  std::printf("target %s, tile rows %lld, head_dim %lld, %s, 1 thread, thread CPU time\n",
              hwy::TargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)()),
              static_cast<long long>(tile_rows), static_cast<long long>(kHeadDim),
              contiguous ? "contiguous q/k/v [T, 64]" : "packed QKV [T, 1536]");
  const double peak_before = PeakGflops(min_ms / 4);
  std::printf("FMA peak probe: %.1f GFLOP/s\n", peak_before);
  std::printf("%6s %7s %10s %10s %8s\n", "T", "causal", "ms", "GFLOP/s", "% peak");
  double peak = peak_before;
  for (const int64_t T : lengths) {
    for (const bool causal : {false, true}) {
      run(T, causal);  // warm-up: caches, page tables
      const double flops = 4.0 * static_cast<double>(T) * static_cast<double>(T) * kHeadDim;
      double best = 1e30;
      double total = 0.0;
      int reps = 0;
      while (total * 1e3 < min_ms || reps < 3) {
        const double t0 = ThreadSeconds();
        run(T, causal);
        const double s = ThreadSeconds() - t0;
        best = std::min(best, s);
        total += s;
        ++reps;
      }
      const double gflops = flops / best * 1e-9;
      std::printf("%6lld %7s %10.3f %10.1f %7.1f%%\n", static_cast<long long>(T),
                  causal ? "yes" : "no", best * 1e3, gflops, 100.0 * gflops / peak);
    }
  }
  const double peak_after = PeakGflops(min_ms / 4);
  std::printf(
      "FMA peak probe again: %.1f GFLOP/s (%% above use the first; machine noise shows as "
      "a difference)\n",
      peak_after);
  std::free(scratch);
  return 0;
}
#endif  // HWY_ONCE
