// The projections (y = x w^T + bias) at the shapes real models run, through the layer entry
// every op uses (linear_forward_f32: packing, task split, kernel choice) with the weight packed
// as a model holds it ("tessera") and with its rows read in place ("rows"), against OpenBLAS
// sgemm + bias split by rows the same way, and against the register-only FMA ceiling
// (fma_loop-inl.h) on the same Highway target and thread count, in the same run.
//
//   bench_linear [--threads N] [--target NAME] [--shapes M,N,K/M,N,K...] [--reps R] [--cold]
//                [--json]
//
// --cold: the packed way reads a different copy of its panels on every call, enough copies for
// 96 MiB (three times an L3 of 32 MiB), so its weights come from memory as in a whole model,
// whose weights (90-330 MB here) do not stay in the L3 between one layer's calls.
//
// Shapes are rows x out_features x in_features. Default: the list (ViT-B's QKV and MLP at
// 197 tokens, Swin-T's first-stage QKV over 3136 tokens, a 512-token LM head over 8192 words)
// and MultiheadAttention's at T = 128 and 2048. Per shape: median ms over R timed runs after
// one warm-up and the best run, GFLOP/s (2 m n k), the best as % of the FMA ceiling measured at
// N threads.
// Buffers are touched before timing (first touch runs at ~0.3 GB/s on these machines).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "benchmarks/bench_linear.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "benchmarks/fma_loop-inl.h"
#include "benchmarks/fma_ceiling.h"
#include "benchmarks/force_target.h"

#if HWY_ONCE
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/kernels.h"
#include "core/parallel.h"
#include "core/random.h"
#include "layers/linear.h"

namespace tessera::bench {
HWY_EXPORT(FmaLoop);
HWY_EXPORT(ThisTarget);

namespace {

double DispatchedFmaLoop(int64_t iters, float seed, float* sink) {
  return HWY_DYNAMIC_DISPATCH(FmaLoop)(iters, seed, sink);
}

// Aggregate GFLOP/s of `threads` threads running the FMA loop together for ~0.2 s, best of 3.
double fma_ceiling(int threads) {
  const int64_t iters = calibrate_fma_loop(DispatchedFmaLoop, 200.0);
  double best = 0.0;
  for (int round = 0; round < 3; ++round)
    best = std::max(best, fma_round_gflops(DispatchedFmaLoop, threads, iters, round));
  return best;
}

struct Times {
  double median_ms, best_ms;
};

// The best run is the kernel's own speed on a host whose neighbours come and go (runs of one
// binary here vary by 20% from minute to minute); the median is what a caller gets.
// Each rep runs every way once, in turn (one warm-up round first); median and best per way.
std::vector<Times> time_in_turn(int reps, const std::vector<std::function<void()>>& ways) {
  for (const auto& fn : ways) fn();
  std::vector<std::vector<double>> ms(ways.size());
  for (int i = 0; i < reps; ++i)
    for (size_t w = 0; w < ways.size(); ++w) {
      const double t0 = fma_now_s();
      ways[w]();
      ms[w].push_back((fma_now_s() - t0) * 1e3);
    }
  std::vector<Times> out;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    out.push_back({v[v.size() / 2], v.front()});
  }
  return out;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(gen.normal());
  return v;
}

struct LinearShape {
  int64_t m, n, k;
};

std::vector<LinearShape> parse_shapes(const std::string& text) {
  std::vector<LinearShape> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = std::min(text.find('/', pos), text.size());
    LinearShape s{};
    if (std::sscanf(text.substr(pos, end - pos).c_str(), "%ld,%ld,%ld", &s.m, &s.n, &s.k) != 3 ||
        s.m <= 0 || s.n <= 0 || s.k <= 0) {
      std::fprintf(stderr, "bad shape '%s' (want M,N,K)\n", text.substr(pos, end - pos).c_str());
      std::exit(2);
    }
    out.push_back(s);
    pos = end + 1;
  }
  return out;
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  using namespace tessera;
  using namespace tessera::bench;
  int threads = 1, reps = 0;
  bool json = false, cold = false;
  std::string target, shapes_text =
                          "197,2304,768/197,3072,768/197,768,3072/3136,288,96/3136,96,288/"
                          "512,8192,512/128,1536,512/128,512,512/2048,2304,768/49,288,96";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--target" && i + 1 < argc) {
      target = argv[++i];
    } else if (a == "--shapes" && i + 1 < argc) {
      shapes_text = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json") {
      json = true;
    } else if (a == "--cold") {
      cold = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--target NAME] [--shapes M,N,K/...] [--reps R] "
                   "[--cold] [--json]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!target.empty() && !force_target(target)) return 2;
  set_num_threads(threads);
  const Device& dev = cpu_device();
  const KernelTable& k = dev.kernels();
  const double ceiling = fma_ceiling(threads);
  if (!json)
    std::printf("bench_linear: target %s (FMA loop: %s), %d thread(s), FMA ceiling %.1f GFLOP/s\n",
                dev.simd_target(), hwy::TargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)()), threads,
                ceiling);

  for (const LinearShape& s : parse_shapes(shapes_text)) {
    const std::vector<float> x = random_floats(static_cast<size_t>(s.m * s.k), 1),
                             w = random_floats(static_cast<size_t>(s.n * s.k), 2),
                             bias = random_floats(static_cast<size_t>(s.n), 3);
    std::vector<float> y(static_cast<size_t>(s.m * s.n), 0.0f);
    const int64_t ws = linear_workspace_floats(dev, s.m, s.k, s.n);
    std::vector<float> workspace(static_cast<size_t>(ws + 16), 0.0f);
    float* wsp = workspace.data() +
                 (16 - reinterpret_cast<uintptr_t>(workspace.data()) / 4 % 16) % 16;
    const double flops = 2.0 * static_cast<double>(s.m) * s.n * s.k;
    const int r = reps > 0 ? reps : std::clamp(static_cast<int>(2e9 / flops), 5, 301);
    // The weight packed as a model's layers hold it (ParameterSet::pack_projections).
    const LinearKernels& lk = *k.linear(DType::F32);
    const int64_t n_panels = (s.n + lk.weight_panel - 1) / lk.weight_panel;
    const int64_t panel_floats = (lk.weight_panel_floats(s.n, s.k) + 15) / 16 * 16;
    const int64_t copies =
        cold ? std::max<int64_t>(1, ((int64_t{96} << 20) / 4 + panel_floats - 1) / panel_floats)
             : 1;
    std::vector<float> panel_store(static_cast<size_t>(copies * panel_floats + 16));
    float* panels = panel_store.data() +
                    (16 - reinterpret_cast<uintptr_t>(panel_store.data()) / 4 % 16) % 16;
    for (int64_t c = 0; c < copies; ++c)
      lk.pack_weights(s.n, s.k, w.data(), s.k, 0, n_panels, panels + c * panel_floats);
    int64_t copy = 0;
    // Three ways, timed in turn within every rep so that the host's drift hits them alike:
    // the weight packed (what a model's projections run), the weight's rows read in place (the
    // C++ layers, tied weights), OpenBLAS the way the layer would call it without its own
    // kernels (one sgemm per row block).
    const std::vector<std::function<void()>> ways = {
        [&] {
          const float* p = panels + copy * panel_floats;
          copy = (copy + 1) % copies;
          linear_forward_f32(dev, s.m, s.k, s.n, x.data(), s.k, {w.data(), p}, bias.data(),
                             y.data(), s.n, wsp);
        },
        [&] {
          linear_forward_f32(dev, s.m, s.k, s.n, x.data(), s.k, w.data(), bias.data(), y.data(),
                             s.n, wsp);
        },
        [&] {
          const int64_t grain = std::max<int64_t>(16, (s.m + threads - 1) / threads);
          parallel_for(0, s.m, grain, [&](int64_t r0, int64_t r1) {
            k.gemm_f32(false, true, r1 - r0, s.n, s.k, 1.0f, x.data() + r0 * s.k, s.k, w.data(),
                       s.k, 0.0f, y.data() + r0 * s.n, s.n);
            k.add_bias_rows_f32(r1 - r0, s.n, y.data() + r0 * s.n, s.n, bias.data());
          });
        }};
    const std::vector<Times> t = time_in_turn(r, ways);
    auto gflops = [&](double ms) { return flops / ms * 1e-6; };
    const char* names[] = {"tessera", "rows", "openblas"};
    if (json) {
      std::printf("{\"m\":%ld,\"n\":%ld,\"k\":%ld,\"threads\":%d,\"target\":\"%s\","
                  "\"ceiling_gflops\":%.2f",
                  static_cast<long>(s.m), static_cast<long>(s.n), static_cast<long>(s.k), threads,
                  dev.simd_target(), ceiling);
      for (size_t i = 0; i < t.size(); ++i)
        std::printf(",\"%s_ms\":%.4f,\"%s_gflops\":%.2f,\"%s_best_gflops\":%.2f", names[i],
                    t[i].median_ms, names[i], gflops(t[i].median_ms), names[i],
                    gflops(t[i].best_ms));
      std::printf("}\n");
    } else {
      std::printf("%5ld x %5ld x %5ld", static_cast<long>(s.m), static_cast<long>(s.n),
                  static_cast<long>(s.k));
      for (size_t i = 0; i < t.size(); ++i)
        std::printf("  %s %8.3f ms %6.1f (best %6.1f = %5.1f%%)", names[i], t[i].median_ms,
                    gflops(t[i].median_ms), gflops(t[i].best_ms),
                    100.0 * gflops(t[i].best_ms) / ceiling);
      std::printf("\n");
    }
  }
  return 0;
}
#endif  // HWY_ONCE
