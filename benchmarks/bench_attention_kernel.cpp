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
// --windows MAP,C,HEADS instead times Swin's shifted-window attention core (attention_forward_f32,
// one thread) as swin_t runs it: a MAP x MAP map in 7 x 7 windows shifted by 3, C channels in
// HEADS heads, q | k | v read from the packed [tokens, 3C] projection, the relative-position bias
// and the shift's region ids. swin_t's stages: 56,96,3  28,192,6  14,384,12  7,768,24 (the last
// unshifted: its one window covers the map).
//
//   bench_attention_kernel [--tile-rows R] [--min-ms M] [--contiguous] [--target NAME] [--t T]...
// --core T,E,HEADS times the core (attention_forward_f32, one thread) over MultiheadAttention's
// packed [T, 3E] projection, no mask: the fused path with its K/V handling. The projection
// comes from the host allocator, like the layer's workspace (see RunCore).
//
//   bench_attention_kernel --windows MAP,C,HEADS [--windows ...] [--min-ms M] [--target NAME]
//   bench_attention_kernel --core T,E,HEADS [--core ...] [--causal] [--min-ms M] [--target NAME]
// (--causal: the core with the causal cut; FLOPs still counted dense)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "benchmarks/bench_attention_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "benchmarks/fma_loop-inl.h"
#include "benchmarks/force_target.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>


#if HWY_ONCE
#include "backends/cpu/cpu_device.h"
#include "backends/cpu/flash_attention.h"
#include "core/allocator.h"
#include "core/attention_tile.h"
#include "core/parallel.h"
#include "core/workspace.h"
#include "layers/attention_core.h"

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

struct WindowShape {
  int64_t map = 0, channels = 0, heads = 0;
};

// Best seconds of fn() over runs totalling at least min_ms (and at least 3), after one warm-up.
template <class Fn>
double BestSeconds(double min_ms, Fn&& fn) {
  fn();
  double best = 1e30, total = 0.0;
  int reps = 0;
  while (total * 1e3 < min_ms || reps < 3) {
    const double t0 = ThreadSeconds();
    fn();
    const double s = ThreadSeconds() - t0;
    best = std::min(best, s);
    total += s;
    ++reps;
  }
  return best;
}

// The core's scratch for `a`, sized by a counting pass and held in one aligned block.
struct CoreScratch {
  explicit CoreScratch(const AttentionArgs& a) {
    Workspace counter;
    attention_scratch(cpu_device(), a, counter);
    const size_t bytes = (counter.peak() + 63) / 64 * 64;
    base = std::aligned_alloc(64, std::max<size_t>(bytes, 64));
    std::memset(base, 0, bytes);
    Workspace ws(base, bytes);
    scratch = attention_scratch(cpu_device(), a, ws);
  }
  ~CoreScratch() { std::free(base); }
  CoreScratch(const CoreScratch&) = delete;
  CoreScratch& operator=(const CoreScratch&) = delete;
  void* base = nullptr;
  AttentionScratch scratch;
};

// swin_t's window attention core at one stage (see the header): returns 0 after printing a row.
int RunWindows(const std::vector<WindowShape>& shapes, double min_ms) {
  constexpr int64_t kWindow = 7, kShift = 3;
  set_num_threads(1);
  const double peak = PeakGflops(min_ms / 4);
  std::printf("target %s, Swin window attention core, 7 x 7 windows, 1 thread, thread CPU time\n",
              hwy::TargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)()));
  std::printf("FMA peak probe: %.1f GFLOP/s\n", peak);
  std::printf("%5s %5s %5s %8s %8s %10s %10s %8s\n", "map", "C", "heads", "windows", "shifted",
              "ms", "GFLOP/s", "% peak");
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const WindowShape& w : shapes) {
    const int64_t C = w.channels, H = w.heads, hd = C / H, N = kWindow * kWindow;
    const int64_t per_side = (w.map + kWindow - 1) / kWindow, windows = per_side * per_side;
    const int64_t pad = per_side * kWindow, tokens = windows * N;
    const bool shifted = kWindow < pad;
    std::vector<float> qkv(static_cast<size_t>(tokens * 3 * C)),
        out(static_cast<size_t>(tokens * C));
    const int64_t entries = (2 * kWindow - 1) * (2 * kWindow - 1);
    std::vector<float> table(static_cast<size_t>(entries * H));
    for (float& x : qkv) x = dist(rng);
    for (float& x : table) x = 0.02f * dist(rng);
    std::vector<int32_t> region(static_cast<size_t>(tokens));
    for (int64_t win = 0; win < windows; ++win)
      for (int64_t t = 0; t < N; ++t) {
        const int64_t Y = (win / per_side) * kWindow + t / kWindow;
        const int64_t X = (win % per_side) * kWindow + t % kWindow;
        region[static_cast<size_t>(win * N + t)] = static_cast<int32_t>(
            3 * shifted_window_region(Y, pad, kWindow, shifted ? kShift : 0) +
            shifted_window_region(X, pad, kWindow, shifted ? kShift : 0));
      }
    AttentionArgs a;
    a.batch = windows;
    a.heads = H;
    a.q_len = a.kv_len = N;
    a.head_dim = a.v_head_dim = hd;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    a.q_batch_stride = a.k_batch_stride = a.v_batch_stride = N * 3 * C;
    a.q_row_stride = a.k_row_stride = a.v_row_stride = 3 * C;
    a.q_head_stride = a.k_head_stride = a.v_head_stride = hd;
    a.out_batch_stride = N * C;
    a.out_row_stride = C;
    a.out_head_stride = hd;
    a.rel_head_stride = entries;
    a.grid_h = a.grid_w = kWindow;
    if (shifted) a.region_groups = windows;
    const CoreScratch core_scratch(a);
    const AttentionScratch& scratch = core_scratch.scratch;
    a.q = qkv.data();
    a.k = qkv.data() + C;
    a.v = qkv.data() + 2 * C;
    a.out = out.data();
    // The table as the layer hands it over: one row of entries per head.
    std::vector<float> per_head(table.size());
    for (int64_t i = 0; i < entries; ++i)
      for (int64_t h = 0; h < H; ++h)
        per_head[static_cast<size_t>(h * entries + i)] = table[static_cast<size_t>(i * H + h)];
    a.rel_table = per_head.data();
    if (shifted) a.region = region.data();
    const double s = BestSeconds(min_ms, [&] { attention_forward_f32(cpu_device(), a, scratch); });
    const double flops = 4.0 * static_cast<double>(windows * H * N * N * hd);
    const double gflops = flops / s * 1e-9;
    std::printf("%5lld %5lld %5lld %8lld %8s %10.3f %10.1f %7.1f%%\n",
                static_cast<long long>(w.map), static_cast<long long>(C),
                static_cast<long long>(H), static_cast<long long>(windows),
                shifted ? "yes" : "no", s * 1e3, gflops, 100.0 * gflops / peak);
  }
  return 0;
}

}  // namespace
}  // namespace tessera::bench

namespace tessera::bench {
namespace {

// The core over MultiheadAttention's packed [B*T, 3E] projection, no mask (ViT-B/16: 197,768,12),
// one thread: what the fused path costs with its K/V handling, not the kernel alone.
int RunCore(const std::vector<WindowShape>& shapes, double min_ms, bool causal) {
  set_num_threads(1);
  const double peak = PeakGflops(min_ms / 4);
  std::printf("target %s, attention core over packed QKV, 1 thread, thread CPU time\n",
              hwy::TargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)()));
  std::printf("FMA peak probe: %.1f GFLOP/s\n", peak);
  std::printf("%6s %5s %5s %10s %10s %8s\n", "T", "E", "heads", "ms", "GFLOP/s", "% peak");
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const WindowShape& w : shapes) {
    const int64_t T = w.map, E = w.channels, H = w.heads, hd = E / H;
    // QKV from the host allocator, as the layers' workspaces: from 1 MiB on, blocks advised
    // onto transparent huge pages. On 4 KiB pages every strided K and V row (6 KiB apart at
    // E = 512) sits on a page of its own: TLB misses a layer has only where THP is refused.
    const size_t qkv_floats = static_cast<size_t>(T * 3 * E);
    const std::unique_ptr<float, void (*)(float*)> qkv_block(
        static_cast<float*>(host_allocator().allocate(qkv_floats * sizeof(float))),
        [](float* p) { host_allocator().deallocate(p); });
    float* const qkv = qkv_block.get();
    std::vector<float> out(static_cast<size_t>(T * E));
    for (size_t i = 0; i < qkv_floats; ++i) qkv[i] = dist(rng);
    AttentionArgs a;
    a.batch = 1;
    a.heads = H;
    a.causal = causal;
    a.q_len = a.kv_len = T;
    a.head_dim = a.v_head_dim = hd;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    a.q_batch_stride = a.k_batch_stride = a.v_batch_stride = T * 3 * E;
    a.q_row_stride = a.k_row_stride = a.v_row_stride = 3 * E;
    a.q_head_stride = a.k_head_stride = a.v_head_stride = hd;
    a.out_batch_stride = T * E;
    a.out_row_stride = E;
    a.out_head_stride = hd;
    const CoreScratch core_scratch(a);
    const AttentionScratch& scratch = core_scratch.scratch;
    a.q = qkv;
    a.k = qkv + E;
    a.v = qkv + 2 * E;
    a.out = out.data();
    const double s = BestSeconds(min_ms, [&] { attention_forward_f32(cpu_device(), a, scratch); });
    const double gflops = 4.0 * static_cast<double>(H * T * T * hd) / s * 1e-9;
    std::printf("%6lld %5lld %5lld %10.3f %10.1f %7.1f%%\n", static_cast<long long>(T),
                static_cast<long long>(E), static_cast<long long>(H), s * 1e3, gflops,
                100.0 * gflops / peak);
  }
  return 0;
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  using namespace tessera;
  using namespace tessera::bench;
  int64_t tile_rows = 256;
  double min_ms = 200.0;
  std::vector<int64_t> lengths;
  bool contiguous = false, causal = false;
  std::string target_name;
  std::vector<WindowShape> windows, core;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    WindowShape w;
    if (a == "--windows" && i + 1 < argc &&
        std::sscanf(argv[i + 1], "%lld,%lld,%lld", reinterpret_cast<long long*>(&w.map),
                    reinterpret_cast<long long*>(&w.channels),
                    reinterpret_cast<long long*>(&w.heads)) == 3 &&
        w.map > 0 && w.heads > 0 && w.channels % w.heads == 0) {
      windows.push_back(w);
      ++i;
    } else if (a == "--core" && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%lld,%lld,%lld", reinterpret_cast<long long*>(&w.map),
                           reinterpret_cast<long long*>(&w.channels),
                           reinterpret_cast<long long*>(&w.heads)) == 3 &&
               w.map > 0 && w.heads > 0 && w.channels % w.heads == 0) {
      core.push_back(w);
      ++i;
    } else if (a == "--tile-rows" && i + 1 < argc) {
      tile_rows = std::atoll(argv[++i]);
    } else if (a == "--min-ms" && i + 1 < argc) {
      min_ms = std::atof(argv[++i]);
    } else if (a == "--target" && i + 1 < argc) {
      target_name = argv[++i];
    } else if (a == "--contiguous") {
      contiguous = true;
    } else if (a == "--causal") {
      causal = true;
    } else if (a == "--t" && i + 1 < argc) {
      lengths.push_back(std::atoll(argv[++i]));
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--tile-rows R] [--min-ms M] [--contiguous] [--target NAME] [--t T]...\n"
          "       %s --windows MAP,C,HEADS [--windows ...] [--min-ms M] [--target NAME]\n"
          "       %s --core T,E,HEADS [--core ...] [--causal] [--min-ms M] [--target NAME]\n",
          argv[0], argv[0], argv[0]);
      return 2;
    }
  }
  if (!windows.empty() || !core.empty()) {
    if (!target_name.empty() && !force_target(target_name)) return 2;
    if (!windows.empty()) RunWindows(windows, min_ms);
    if (!core.empty()) RunCore(core, min_ms, causal);
    return 0;
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
