// Throughput of the CPU kernel table, one thread (the layers run kernels one per worker).
// Memory-bound kernels report GB/s counting every byte read and written once; GEMM reports
// GFLOP/s (2 m n k per product) and the percentage of a register-only AVX-512 FMA loop measured
// in the same run (the single-thread FLOP ceiling, ~305 GFLOP/s on this Zen 5).
// Each figure is the median of several timed runs after one warm-up run; buffers are allocated
// and touched once up front (first touch of fresh memory runs at ~0.3 GB/s here). Rates are
// given twice: by wall time (std::chrono::steady_clock) and by this thread's CPU time. On an
// idle machine they agree; on a shared one the CPU-time rate is the kernel's own speed (it
// excludes time the thread spent descheduled), so the gap shows how loaded the machine was.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/dtype.h"
#include "core/kernels.h"
#include "core/random.h"

namespace {

using Clock = std::chrono::steady_clock;

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timing {
  double wall = 0.0;  // median seconds, wall clock
  double cpu = 0.0;   // median seconds, thread CPU time
};

template <class Fn>
Timing median_time(int reps, Fn&& fn) {
  fn();  // warm-up: caches, page tables, OpenBLAS buffers
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps; ++i) {
    const double cpu_start = thread_cpu_seconds();
    const auto start = Clock::now();
    fn();
    wall.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    cpu.push_back(thread_cpu_seconds() - cpu_start);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

std::vector<float> random_floats(size_t n, double sigma, uint64_t seed) {
  tessera::Generator gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(sigma * gen.normal());
  return v;
}

// 12 independent FMA chains of 16 lanes: with a 4-cycle FMA latency and 2 FMA pipes, 8 chains
// already saturate; 12 leave slack. 2 flops per lane per FMA.
__attribute__((target("avx512f"))) double fma_peak_gflops() {
  constexpr int kChains = 12;
  constexpr int64_t kIters = 20'000'000;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 0.001f * c);
  const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-7f);
  const double cpu_start = thread_cpu_seconds();
  for (int64_t i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], mul, add);
  }
  const double seconds = thread_cpu_seconds() - cpu_start;  // CPU time: immune to preemption
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  // Keeps the loop alive. (_mm512_reduce_add_ps trips GCC 12's -Wuninitialized.)
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return 2.0 * 16 * kChains * kIters / seconds * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  // bench_kernels [TARGET]: run on that compiled Highway target (AVX2 on an AVX-512 machine).
  if (argc > 1) {
    std::string available;
    if (!tessera::restrict_simd_target(argv[1], available)) {
      std::fprintf(stderr, "target %s is not compiled in or not supported (available: %s)\n",
                   argv[1], available.c_str());
      return 2;
    }
  }
  tessera::Device& dev = tessera::cpu_device();
  const tessera::KernelTable& k = dev.kernels();
  std::printf("tessera kernel benchmark, 1 thread, SIMD target %s\n", dev.simd_target());

  double peak = 0.0;
  if (__builtin_cpu_supports("avx512f")) {
    peak = fma_peak_gflops();
    std::printf("%-44s %8.1f GFLOP/s\n", "AVX-512 FMA register loop (ceiling)", peak);
  }

  // Row-wise kernels on 4096 x 1024 floats (16 MiB in, 16 MiB out).
  const int64_t rows = 4096, cols = 1024, n = rows * cols;
  std::vector<float> x = random_floats(n, 3.0, 1), y(n, 0.0f), mask = random_floats(cols, 1.0, 2);
  const std::vector<float> gamma = random_floats(cols, 1.0, 3), beta = random_floats(cols, 1.0, 4);
  const double row_bytes = 2.0 * n * sizeof(float);
  const auto report_gbs = [](const char* what, double bytes, Timing t) {
    std::printf("%-44s %8.2f GB/s wall %8.2f GB/s cpu  (%.3f ms)\n", what, bytes / t.wall * 1e-9,
                bytes / t.cpu * 1e-9, t.wall * 1e3);
  };

  report_gbs("softmax_rows_f32 4096x1024", row_bytes, median_time(9, [&] {
               k.softmax_rows_f32(rows, cols, x.data(), cols, 0.125f, nullptr, 0, y.data(), cols);
             }));
  report_gbs("softmax_rows_f32 4096x1024, shared mask row", row_bytes, median_time(9, [&] {
               k.softmax_rows_f32(rows, cols, x.data(), cols, 0.125f, mask.data(), 0, y.data(),
                                  cols);
             }));
  report_gbs("layer_norm_rows_f32 4096x1024, affine", row_bytes, median_time(9, [&] {
               k.layer_norm_rows_f32(rows, cols, x.data(), cols, y.data(), cols, gamma.data(),
                                     beta.data(), 1e-5f);
             }));
  report_gbs("gelu_f32 erf, 4M", row_bytes,
             median_time(9, [&] { k.gelu_f32(n, x.data(), y.data(), false); }));
  report_gbs("gelu_f32 tanh, 4M", row_bytes,
             median_time(9, [&] { k.gelu_f32(n, x.data(), y.data(), true); }));
  // In place on 48K floats (192 KiB, L2): what a linear+gelu epilogue meets, a task's block of
  // rows x 192 features just written by the GEMM. Compute-bound, unlike the 4M runs above.
  {
    constexpr int64_t kL2 = 48 * 1024, kPasses = 64;
    std::vector<float> z(x.begin(), x.begin() + kL2);
    for (const bool tanh_form : {false, true}) {
      const Timing t = median_time(9, [&] {
        for (int64_t p = 0; p < kPasses; ++p) {
          std::copy(x.begin(), x.begin() + kL2, z.begin());
          k.gelu_f32(kL2, z.data(), z.data(), tanh_form);
        }
      });
      std::printf(
          "%-44s %8.2f G values/s (%.2f ns per value, copy included)\n",
          tanh_form ? "gelu_f32 tanh, 48K in place (L2)" : "gelu_f32 erf, 48K in place (L2)",
          kL2 * kPasses / t.cpu * 1e-9, t.cpu / (kL2 * kPasses) * 1e9);
    }
  }
  report_gbs("add_f32 4M", 3.0 * n * sizeof(float),
             median_time(9, [&] { k.add_f32(n, x.data(), y.data(), y.data()); }));

  // A transformer block's residual then its norm: nn.Transformer's 128 x 512 (256 KiB per
  // operand, L2) and vit_b_16's 197 x 768 (591 KiB: the four operands spill to L3). add_f32 and
  // layer_norm_rows_f32 one after the other, against add_layer_norm_rows_f32 (the plan's
  // fusion), with the sum kept and with y as its scratch.
  for (const auto& [kRows, kCols] : {std::pair<int64_t, int64_t>{128, 512}, {197, 768}}) {
    const int64_t kN = kRows * kCols, kPasses = 200;
    std::vector<float> a(x.begin(), x.begin() + kN), b(x.begin() + kN, x.begin() + 2 * kN);
    std::vector<float> s(kN), out(kN);
    const auto per_pass = [&](const char* what, auto&& fn) {
      const Timing t = median_time(9, [&] {
        for (int64_t p = 0; p < kPasses; ++p) fn();
      });
      std::printf("%-44s %8.2f us per pass\n", what, t.cpu / kPasses * 1e6);
    };
    const std::string shape = std::to_string(kRows) + "x" + std::to_string(kCols);
    per_pass(("add_f32 + layer_norm_rows_f32 " + shape).c_str(), [&] {
      k.add_f32(kN, a.data(), b.data(), s.data());
      k.layer_norm_rows_f32(kRows, kCols, s.data(), kCols, out.data(), kCols, gamma.data(),
                            beta.data(), 1e-5f);
    });
    per_pass(("add_layer_norm_rows_f32 " + shape + ", sum kept").c_str(), [&] {
      k.add_layer_norm_rows_f32(kRows, kCols, a.data(), kCols, b.data(), kCols, s.data(), kCols,
                                out.data(), kCols, gamma.data(), beta.data(), 1e-5f);
    });
    per_pass(("add_layer_norm_rows_f32 " + shape + ", no sum").c_str(), [&] {
      k.add_layer_norm_rows_f32(kRows, kCols, a.data(), kCols, b.data(), kCols, out.data(),
                                kCols, out.data(), kCols, gamma.data(), beta.data(), 1e-5f);
    });
  }

  // Rotary: 2048 positions x 16 heads x 64 dims in place (8 MiB read and written), plus the
  // cos/sin tables (2048 x 32 x 2 floats, read once).
  {
    const int64_t positions = 2048, heads = 16, head_dim = 64, half = head_dim / 2;
    std::vector<float> cos_t(positions * half), sin_t(positions * half);
    for (int64_t i = 0; i < positions * half; ++i) {
      cos_t[i] = std::cos(0.001f * static_cast<float>(i));
      sin_t[i] = std::sin(0.001f * static_cast<float>(i));
    }
    const double bytes = (2.0 * positions * heads * head_dim + 2.0 * positions * half) * 4;
    report_gbs("rope_rotate_half_f32 2048x16x64", bytes, median_time(9, [&] {
                 k.rope_rotate_half_f32(positions, heads, head_dim, x.data(), heads * head_dim,
                                        cos_t.data(), sin_t.data());
               }));
  }

  // Conversions, 4M elements (4 bytes + 2 bytes per element).
  {
    std::vector<uint16_t> h(n);
    report_gbs("convert_f32_to_f16 4M", 6.0 * n,
               median_time(9, [&] { tessera::convert_f32_to_f16(n, x.data(), h.data()); }));
    report_gbs("convert_f16_to_f32 4M", 6.0 * n,
               median_time(9, [&] { tessera::convert_f16_to_f32(n, h.data(), y.data()); }));
    report_gbs("convert_f32_to_bf16 4M", 6.0 * n,
               median_time(9, [&] { tessera::convert_f32_to_bf16(n, x.data(), h.data()); }));
    report_gbs("convert_bf16_to_f32 4M", 6.0 * n,
               median_time(9, [&] { tessera::convert_bf16_to_f32(n, h.data(), y.data()); }));
  }

  // GEMM m x n x k, row-major, no transposes, one thread.
  {
    struct Shape {
      int64_t m, n, k;
      int reps;
    };
    const Shape shapes[] = {{64, 512, 64, 301}, {512, 512, 512, 21}, {2048, 2048, 2048, 5}};
    std::vector<float> a = random_floats(2048 * 2048, 1.0, 5),
                       b = random_floats(2048 * 2048, 1.0, 6);
    std::vector<float> c(2048 * 2048, 0.0f);
    for (const Shape& s : shapes) {
      const Timing t = median_time(s.reps, [&] {
        k.gemm_f32(false, false, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n, 0.0f, c.data(),
                   s.n);
      });
      const double flops = 2.0 * s.m * s.n * s.k;
      char label[64];
      std::snprintf(label, sizeof label, "gemm_f32 %ldx%ldx%ld (m x n x k)", static_cast<long>(s.m),
                    static_cast<long>(s.n), static_cast<long>(s.k));
      std::printf("%-44s %8.1f GFLOP/s wall %6.1f GFLOP/s cpu", label, flops / t.wall * 1e-9,
                  flops / t.cpu * 1e-9);
      if (peak > 0.0) std::printf(" = %4.1f%% of ceiling", 100.0 * flops / t.cpu * 1e-9 / peak);
      std::printf("  (%.3f ms)\n", t.wall * 1e3);
    }
  }

  // Projections y = x w^T (+ bias), the layers' shapes (rows x out x in): OpenBLAS sgemm
  // (trans_b) against linear_f32 (x packed once, w read in place), one thread each.
  {
    struct Shape {
      int64_t m, n, k;
      int reps;
    };
    const Shape shapes[] = {{128, 1536, 512, 101}, {128, 512, 512, 201}, {1024, 8, 512, 201},
                            {512, 2304, 768, 21},  {2048, 2304, 768, 7}, {4096, 1536, 512, 5},
                            {7, 2304, 768, 201},   {8, 4096, 4096, 21}};
    std::vector<float> x = random_floats(4096 * 4096, 1.0, 7),
                       w = random_floats(4096 * 4096, 1.0, 8);
    std::vector<float> bias = random_floats(4096, 1.0, 9);
    std::vector<float> c(4096 * 2304, 0.0f);
    std::vector<float> packed(static_cast<size_t>(4096 * 4096 + 64));
    for (const Shape& s : shapes) {
      const double flops = 2.0 * s.m * s.n * s.k;
      const Timing blas = median_time(s.reps, [&] {
        k.gemm_f32(false, true, s.m, s.n, s.k, 1.0f, x.data(), s.k, w.data(), s.k, 0.0f, c.data(),
                   s.n);
        k.add_bias_rows_f32(s.m, s.n, c.data(), s.n, bias.data());
      });
      const tessera::LinearKernels& lin = *k.linear(tessera::DType::F32);
      const int64_t panels = (s.m + lin.panel_rows - 1) / lin.panel_rows;
      float* pk = packed.data() + (16 - reinterpret_cast<uintptr_t>(packed.data()) / 4 % 16) % 16;
      const Timing own = median_time(s.reps, [&] {
        lin.pack(s.m, s.k, x.data(), s.k, 0, panels, pk);
        lin.packed(s.m, s.k, pk, 0, panels, w.data(), s.k, 0, s.n, bias.data(), c.data(), s.n);
      });
      char label[64];
      std::snprintf(label, sizeof label, "linear %ldx%ldx%ld (rows x out x in)",
                    static_cast<long>(s.m), static_cast<long>(s.n), static_cast<long>(s.k));
      std::printf("%-44s openblas %6.1f GFLOP/s cpu  linear_f32 %6.1f GFLOP/s cpu", label,
                  flops / blas.cpu * 1e-9, flops / own.cpu * 1e-9);
      if (peak > 0.0) std::printf(" = %4.1f%% of ceiling", 100.0 * flops / own.cpu * 1e-9 / peak);
      std::printf("\n");
    }
  }
  return 0;
}
