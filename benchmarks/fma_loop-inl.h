// A register-only FMA loop, the machine's ceiling for every GFLOP/s the benchmarks quote:
// fma_probe runs it alone on 1..N threads, bench_attention_kernel beside the kernel it times.
// Highway per-target header (included once per target from inside HWY_NAMESPACE).
#if defined(TESSERA_BENCH_FMA_LOOP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_BENCH_FMA_LOOP_INL_H_
#undef TESSERA_BENCH_FMA_LOOP_INL_H_
#else
#define TESSERA_BENCH_FMA_LOOP_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace tessera::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 12 independent FMA chains: covers a 4-cycle FMA latency at 2 FMA pipes with margin. `seed`
// is opaque to the compiler and the accumulators' sum is stored, so nothing folds away.
// Returns the FLOPs done (2 per lane per FMA).
double FmaLoop(int64_t iters, float seed, float* sink) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V a0 = hn::Set(d, seed), a1 = hn::Set(d, seed * 2), a2 = hn::Set(d, seed * 3);
  V a3 = hn::Set(d, seed * 4), a4 = hn::Set(d, seed * 5), a5 = hn::Set(d, seed * 6);
  V a6 = hn::Set(d, seed * 7), a7 = hn::Set(d, seed * 8), a8 = hn::Set(d, seed * 9);
  V a9 = hn::Set(d, seed * 10), a10 = hn::Set(d, seed * 11), a11 = hn::Set(d, seed * 12);
  const V m = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  const V s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                      hn::Add(hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)),
                              hn::Add(hn::Add(a8, a9), hn::Add(a10, a11))));
  *sink = hn::GetLane(hn::SumOfLanes(d, s));
  return 2.0 * 12.0 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iters);
}

// The Highway target this copy was compiled for (HWY_TARGET), to print which one ran.
int64_t ThisTarget() { return HWY_TARGET; }

}  // namespace tessera::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TESSERA_BENCH_FMA_LOOP_INL_H_
