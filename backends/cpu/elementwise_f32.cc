// Element-wise and row-wise f32 kernels: rotary embedding, bias add, the broadcasting binary maps
// (add, sub, mul, div), GELU, ReLU, SiLU, sigmoid, tanh, layer norm, softmax down columns.
// All are a few vector ops per element over data that is read once, so they run at memory
// (or L2) bandwidth except GELU, whose erf costs about 30 vector ops per vector, and the
// exp-based maps (about 20).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/elementwise_f32.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// Per target too: Tanh (and the Expm1 it uses).
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>

#include "backends/cpu/math_f32-inl.h"
#include "core/simd_tail-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int64_t DispatchedTarget() { return HWY_TARGET; }

// ------------------------------------------------------------------------------------------
// Rotary embedding, rotate-half: (a, b) -> (a cos - b sin, b cos + a sin) for a = v[i],
// b = v[i + half]. The cos/sin row of position t serves every head of that position.
void RopeRotateHalfF32(int64_t positions, int64_t heads, int64_t head_dim, float* x,
                       int64_t row_stride, const float* cos, const float* sin) {
  if (head_dim < 2) return;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const size_t half = static_cast<size_t>(head_dim / 2);
  const auto rotate = [&](V a, V b, V c, V s, V& a_out, V& b_out) HWY_ATTR {
    a_out = hn::NegMulAdd(b, s, hn::Mul(a, c));
    b_out = hn::MulAdd(a, s, hn::Mul(b, c));
  };
  for (int64_t t = 0; t < positions; ++t) {
    const float* c = cos + t * static_cast<int64_t>(half);
    const float* s = sin + t * static_cast<int64_t>(half);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      size_t i = 0;
      for (; i + N <= half; i += N) {
        V a, b;
        rotate(hn::LoadU(d, v + i), hn::LoadU(d, v + half + i), hn::LoadU(d, c + i),
               hn::LoadU(d, s + i), a, b);
        hn::StoreU(a, d, v + i);
        hn::StoreU(b, d, v + half + i);
      }
      if (i < half) {
        const size_t count = half - i;
        V a, b;
        rotate(LoadTail(d, v + i, count, 0.0f), LoadTail(d, v + half + i, count, 0.0f),
               LoadTail(d, c + i, count, 0.0f), LoadTail(d, s + i, count, 0.0f), a, b);
        StoreTail(d, a, v + i, count);
        StoreTail(d, b, v + half + i, count);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Additions. Scalar tails: an IEEE add rounds the same in a lane or in a scalar register.
void AddBiasRowsF32(int64_t rows, int64_t cols, float* x, int64_t x_stride, const float* bias) {
  if (cols <= 0) return;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t n = static_cast<size_t>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * x_stride;
    size_t i = 0;
    for (; i + N <= n; i += N) {
      hn::StoreU(hn::Add(hn::LoadU(d, row + i), hn::LoadU(d, bias + i)), d, row + i);
    }
    for (; i < n; ++i) row[i] += bias[i];
  }
}

void AddF32(int64_t count, const float* a, const float* b, float* y) {
  if (count <= 0) return;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t n = static_cast<size_t>(count);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Add(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, y + i);
  }
  for (; i < n; ++i) y[i] = a[i] + b[i];
}

// The binary maps of the broadcasting ops: y[i] = a[i * a_step] op b[i * b_step], a step of 0
// stretching one value over the row (PyTorch broadcasting along the last dim). Each op is one
// IEEE operation, correctly rounded in a lane as in a scalar register (divps and the SCALAR
// target's `/` alike), so every target gives the bits a float loop would; add's bits are
// AddF32's. The tail's unused lanes are padded with 1 (no division by zero, though its lanes
// are never stored).
struct AddF32Op {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Add(a, b);
  }
};
struct SubF32Op {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Sub(a, b);
  }
};
struct MulF32Op {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Mul(a, b);
  }
};
struct DivF32Op {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Div(a, b);
  }
};

template <class Op>
HWY_INLINE void BinaryMapF32(int64_t count, const float* a, int64_t a_step, const float* b,
                             int64_t b_step, float* y) {
  if (count <= 0) return;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const size_t n = static_cast<size_t>(count);
  const Op op;
  const auto load = [d](const float* p, int64_t step, size_t i) HWY_ATTR -> V {
    return step != 0 ? hn::LoadU(d, p + i) : hn::Set(d, p[0]);
  };
  const auto load_tail = [d, n](const float* p, int64_t step, size_t i) HWY_ATTR -> V {
    return step != 0 ? LoadTail(d, p + i, n - i, 1.0f) : hn::Set(d, p[0]);
  };
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(op(load(a, a_step, i), load(b, b_step, i)), d, y + i);
  if (i < n) StoreTail(d, op(load_tail(a, a_step, i), load_tail(b, b_step, i)), y + i, n - i);
}

void AddMapF32(int64_t n, const float* a, int64_t a_step, const float* b, int64_t b_step,
               float* y) {
  BinaryMapF32<AddF32Op>(n, a, a_step, b, b_step, y);
}
void SubMapF32(int64_t n, const float* a, int64_t a_step, const float* b, int64_t b_step,
               float* y) {
  BinaryMapF32<SubF32Op>(n, a, a_step, b, b_step, y);
}
void MulMapF32(int64_t n, const float* a, int64_t a_step, const float* b, int64_t b_step,
               float* y) {
  BinaryMapF32<MulF32Op>(n, a, a_step, b, b_step, y);
}
void DivMapF32(int64_t n, const float* a, int64_t a_step, const float* b, int64_t b_step,
               float* y) {
  BinaryMapF32<DivF32Op>(n, a, a_step, b, b_step, y);
}

// ------------------------------------------------------------------------------------------
// GELU, exact form, where vectors have fewer than 8 lanes (SSE4, SCALAR; AVX2 and AVX-512 take
// the table form below, twice as fast): x * Phi(x), Phi(x) = 1 - erfc(x/sqrt2)/2 for x >= 0 and
// erfc(|x|/sqrt2)/2 for x < 0. Going through erfc keeps Phi relatively accurate in the negative
// tail, where PyTorch's 0.5 * x * (1 + erf(x/sqrt2)) cancels (to 0 below x ~ -5.5).
// erfc(t) = tau * exp(-t^2 + P(tau)), tau = 1 / (1 + t/2), is the Chebyshev fit of Numerical
// Recipes (erfcc, section 6.2): fractional error < 1.2e-7 for all t >= 0. The Eigen/XLA erf
// rational (x P(x^2) / Q(x^2) on [-4, 4]) is cheaper but, evaluated in float, is off by 3.7e-7
// near |x/sqrt2| = 3.6-4, which puts gelu 1.05e-6 off at |x| = 5.1.
// Cost: ~25 ops on the FMA pipes per vector, which bind it (Zen 4, AVX3: 512-bit ops take a
// 256-bit pipe for two cycles, so ~25 cycles per 16 values). What gelu needs is an absolute
// error, x Q(x) with Q = erfc / 2 at most 0.17 (x ~ 0.75), so the exp is ExpFastF32 (5.2e-7
// relative: < 1e-7 of gelu) and the 1/2 rides in P's constant (- ln 2). K vectors go through
// each step side by side (GeluLoopF32): one vector's ops form a single chain of ~100 cycles.
// bench_kernels "gelu_f32 erf, 4M", Zen 4: 2.96 -> 2.35 ms on AVX3, 4.16 -> 3.10 on AVX2
// against one vector at a time with a divide, ExpF32 and Estrin to tau^8. Error on [-15, 15]:
// 3.8e-7 absolute (tests/test_kernels.cpp), as before.
template <size_t K, class D, class V = hn::Vec<D>>
HWY_INLINE void GeluErfF32(D d, V (&x)[K]) {
  const V one = hn::Set(d, 1.0f);
  V t[K], tau[K], tau2[K], tau4[K], p[K];
  // t capped at 10, where exp(-t^2) is long 0 (ExpFastF32 flushes below -87.3), so that
  // tau stays finite for |x| = inf (the reciprocal's Newton step would make inf * 0 of it).
  // Min returns the cap for a NaN t: the NaN x still makes y NaN.
  for (size_t u = 0; u < K; ++u)
    t[u] = hn::Min(hn::Mul(hn::Abs(x[u]), hn::Set(d, 0.70710678118654752f)), hn::Set(d, 10.0f));
  // tau by the approximate reciprocal (12 bits on AVX2, 14 on AVX-512) and one Newton step
  // (~23 bits): two FMAs instead of a divide, which cost ~20% of the whole (Zen 4, AVX3 and
  // AVX2 alike: a 512-bit divide every ~7 cycles).
  for (size_t u = 0; u < K; ++u) {
    const V a = hn::MulAdd(hn::Set(d, 0.5f), t[u], one);
    const V r0 = hn::ApproximateReciprocal(a);
    tau[u] = hn::MulAdd(r0, hn::NegMulAdd(a, r0, one), r0);
  }
  // P(tau) - ln 2 by Estrin's scheme (pairs, then tau^2 and tau^4): 3 dependent FMAs after the
  // pairs instead of Horner's 9.
  for (size_t u = 0; u < K; ++u) tau2[u] = hn::Mul(tau[u], tau[u]);
  for (size_t u = 0; u < K; ++u) tau4[u] = hn::Mul(tau2[u], tau2[u]);
  for (size_t u = 0; u < K; ++u) {
    const V c67 = hn::MulAdd(hn::Set(d, 1.48851587f), tau[u], hn::Set(d, -1.13520398f));
    const V c89 = hn::MulAdd(hn::Set(d, 0.17087277f), tau[u], hn::Set(d, -0.82215223f));
    p[u] = hn::MulAdd(c89, tau2[u], c67);
  }
  for (size_t u = 0; u < K; ++u) {
    const V c45 = hn::MulAdd(hn::Set(d, 0.27886807f), tau[u], hn::Set(d, -0.18628806f));
    p[u] = hn::MulAdd(p[u], tau2[u], c45);
  }
  for (size_t u = 0; u < K; ++u) {
    // -1.26551223 - ln 2: exp(...) is then erfc / (2 tau).
    const V c01 = hn::MulAdd(hn::Set(d, 1.00002368f), tau[u], hn::Set(d, -1.95865941f));
    const V c23 = hn::MulAdd(hn::Set(d, 0.09678418f), tau[u], hn::Set(d, 0.37409196f));
    p[u] = hn::MulAdd(p[u], tau4[u], hn::MulAdd(c23, tau2[u], c01));
  }
  // The exponent peaks at t = 0 (-ln 2), inside ExpFastF32's domain; below -87.3 (|x| > 13.2,
  // Phi < 1e-39) ExpFastF32 flushes to 0.
  for (size_t u = 0; u < K; ++u) p[u] = hn::NegMulAdd(t[u], t[u], p[u]);
  ExpFastF32Interleaved(d, p);
  for (size_t u = 0; u < K; ++u) {
    const V q = hn::Mul(tau[u], p[u]);  // Q(|x|) = erfc(t) / 2
    x[u] = hn::Mul(x[u], hn::IfThenElse(hn::Lt(x[u], hn::Zero(d)), q, hn::Sub(one, q)));
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// GELU, exact form, by tables: gelu(x) = x / 2 + |x| erf(t) / 2, t = |x| / sqrt2 (erf is odd),
// with erf(t) / 2 piecewise polynomial on t in [0, 3.9], one interval per vector lane, so that
// every coefficient is one in-register table lookup (vpermps) by the lane's interval: 8
// intervals of degree 6 on AVX2, 16 of degree 5 on AVX-512, fitted (minimax, absolute error) by
// scripts/fit_gelu_erf_tables.py, which prints the tables below. Past t = 3.9, erf(t) =
// 1 - 3.5e-8 is 1 in float: the clamp makes the polynomial reach 1/2 there and min(p, 1/2)
// keeps it exactly 1/2, so that gelu(x) = x and gelu(-x) = 0 exactly for large x. The FMA
// computes |x| erf / 2 + x / 2 unrounded in between, so the negative side's cancellation costs
// no more than erf's own error: at most 2.1e-8 absolute for erf / 2, |x| 2.1e-8 for gelu
// (1.1e-7 at x = -5) plus the result's rounding; the test measures 3.6e-7 on [-15, 15], the
// erfc form 3.8e-7. Below x ~ -5.5 the result is 0, as PyTorch's float erf gives it. Per vector
// 7 (AVX-512: 6) table lookups, which Intel runs on port 5 beside its two FMA ports, and ~13
// FMA-pipe ops, against ~32 FMA-pipe ops for the erfc form. bench_kernels "gelu_f32 erf, 48K
// in place", Xeon family 6 model 207, pinned, 3 runs each: AVX2 1.03 -> 0.52 ns per value,
// AVX-512 0.63 -> 0.39; swin_t, one thread, alternating processes: AVX2 126.4 -> 122.9 ms
// (medians of 6), AVX-512 ~2% (GELU runs over 5.7 M values per forward). K (the vectors side
// by side) of 1, 2, 4 and 8 measured within 10% of each other; the loop keeps the erfc form's 4.
// Intervals: s = t / w with w = 3.9 / (lanes - 1/2), clamped below lanes - 1/2 and rounded to
// the nearest integer i (the table index); the polynomial's variable is f = s - i in [-1/2, 1/2].
namespace gelu_table {
alignas(64) constexpr float kErfTable8[7][8] = {
    {0x0.p+0f, 0x1.136772p-2f, 0x1.b7a0f8p-2f, 0x1.f1fc5p-2f,
     0x1.fe53f8p-2f, 0x1.ffe11p-2f, 0x1.fffea8p-2f, 0x1.fffff8p-2f},
    {0x1.2c6b7p-2f, 0x1.ca7c3p-3f, 0x1.976ecap-4f, 0x1.a5a58p-6f,
     0x1.fc2a1cp-9f, 0x1.649e8cp-12f, 0x1.237b7cp-16f, 0x1.15852cp-21f},
    {-0x1.4dff9ep-21f, -0x1.efe56ap-5f, -0x1.b8adfp-5f, -0x1.560a6ap-6f,
     -0x1.12d0b8p-8f, -0x1.e223cep-12f, -0x1.d8ddb6p-16f, -0x1.069818p-20f},
    {-0x1.b11cacp-6f, -0x1.2faeaep-7f, 0x1.559bd6p-7f, 0x1.25fdfcp-7f,
     0x1.5e9bc4p-9f, 0x1.923c5ep-12f, 0x1.e3dbf4p-16f, 0x1.3c775cp-20f},
    {-0x1.9abe52p-15f, 0x1.b78224p-8f, 0x1.0a15d6p-9f, -0x1.cc689cp-10f,
     -0x1.18254ap-10f, -0x1.c936cp-13f, -0x1.5e6d26p-16f, -0x1.1499c6p-20f},
    {0x1.2cc9aep-9f, 0x1.59341ap-15f, -0x1.48e8fep-10f, -0x1.64a554p-13f,
     0x1.f6f8bp-13f, 0x1.721252p-14f, 0x1.8d61dap-17f, 0x1.957ce8p-21f},
    {-0x1.dce37ap-13f, -0x1.eed5eep-12f, 0x1.44e154p-14f, 0x1.5e5e34p-13f,
     -0x1.33fa7ep-17f, -0x1.86454p-16f, -0x1.3d98e8p-18f, -0x1.a0ad24p-22f},
};
constexpr float kScale8 = 1.35982073f;  // s = |x| * 7.5 / (3.9 sqrt2)
constexpr float kClamp8 = 7.4999995f;   // the float below 7.5
alignas(64) constexpr float kErfTable16[6][16] = {
    {0x0.p+0f, 0x1.1cb55p-3f, 0x1.0bf1ecp-2f, 0x1.6db2dep-2f,
     0x1.b0d33ep-2f, 0x1.d97ddep-2f, 0x1.ef3a04p-2f, 0x1.f9799ap-2f,
     0x1.fdbcf2p-2f, 0x1.ff4d6ep-2f, 0x1.ffcf16p-2f, 0x1.fff41cp-2f,
     0x1.fffd7p-2f, 0x1.ffff82p-2f, 0x1.ffffeap-2f, 0x1.fffffep-2f},
    {0x1.22ba8cp-3f, 0x1.10e4bap-3f, 0x1.c3605ap-4f, 0x1.48e69ep-4f,
     0x1.a64f6ap-5f, 0x1.ddc23ap-6f, 0x1.dc3514p-7f, 0x1.a235aap-8f,
     0x1.43987p-9f, 0x1.b9374ep-11f, 0x1.090572p-12f, 0x1.1882f8p-14f,
     0x1.0598a8p-16f, 0x1.ade2d2p-19f, 0x1.37363ep-21f, 0x1.8d025p-24f},
    {0x1.f08b0cp-26f, -0x1.146b8ep-7f, -0x1.c9364ep-7f, -0x1.f3bbd8p-7f,
     -0x1.abc716p-7f, -0x1.2e77b6p-7f, -0x1.69c8cep-8f, -0x1.72ace6p-9f,
     -0x1.47c8dap-10f, -0x1.f6c79cp-12f, -0x1.4f8a1p-13f, -0x1.86a306p-15f,
     -0x1.8d5eacp-17f, -0x1.61a85ap-19f, -0x1.13aa7ap-21f, -0x1.78af1ep-24f},
    {-0x1.88b044p-9f, -0x1.41e54ep-9f, -0x1.2cdee2p-10f, 0x1.efdf3ep-13f,
     0x1.248f1p-10f, 0x1.5d511p-10f, 0x1.1e11dap-10f, 0x1.6f7348p-11f,
     0x1.84146ep-12f, 0x1.58bc44p-13f, 0x1.04e17p-14f, 0x1.531204p-16f,
     0x1.7c7a4p-18f, 0x1.7200dep-20f, 0x1.38b3bp-22f, 0x1.cc4fccp-25f},
    {0x1.d51b8p-21f, 0x1.0a2a2p-12f, 0x1.7e77d8p-12f, 0x1.389d62p-12f,
     0x1.19e9d8p-13f, -0x1.fa8f68p-17f, -0x1.78e90ep-14f, -0x1.8f5716p-14f,
     -0x1.1a628ap-14f, -0x1.35233ep-15f, -0x1.13dba2p-16f, -0x1.9b6084p-18f,
     -0x1.03f1ecp-19f, -0x1.18e466p-21f, -0x1.051a3ep-23f, -0x1.a3604p-26f},
    {0x1.d351ecp-15f, 0x1.4ecf6p-15f, 0x1.ba2c8p-19f, -0x1.c40156p-16f,
     -0x1.21d91ap-15f, -0x1.857f9cp-16f, -0x1.d6a218p-18f, 0x1.db87bcp-19f,
     0x1.b86d8ep-18f, 0x1.5f61f4p-18f, 0x1.8d19cap-19f, 0x1.60695ap-20f,
     0x1.fff4aep-22f, 0x1.36f034p-23f, 0x1.3fdf02p-25f, 0x1.19039cp-27f},
};
constexpr float kScale16 = 2.81029618f;  // 15.5 / (3.9 sqrt2)
constexpr float kClamp16 = 15.499999f;   // the float below 15.5
}  // namespace gelu_table

template <size_t K, class D, class V = hn::Vec<D>>
HWY_INLINE void GeluErfTableF32(D d, V (&x)[K]) {
  constexpr size_t kLanes = hn::MaxLanes(D());
  static_assert(kLanes == 8 || kLanes == 16, "one table entry per lane");
  constexpr size_t kDegree = kLanes == 8 ? 6 : 5;
  const float* table =
      kLanes == 8 ? &gelu_table::kErfTable8[0][0] : &gelu_table::kErfTable16[0][0];
  const V scale = hn::Set(d, kLanes == 8 ? gelu_table::kScale8 : gelu_table::kScale16);
  const V clamp = hn::Set(d, kLanes == 8 ? gelu_table::kClamp8 : gelu_table::kClamp16);
  const hn::RebindToSigned<D> di;
  // Adding 1.5 * 2^23 rounds s to an integer, left in t's low mantissa bits.
  const V shifter = hn::Set(d, 0x1.8p23f);
  using Idx = decltype(hn::IndicesFromVec(d, hn::Zero(di)));
  V a[K], f[K], p[K];
  Idx idx[K];
  for (size_t u = 0; u < K; ++u) {
    a[u] = hn::Abs(x[u]);
    // Min returns the clamp for a NaN x (its second operand): a valid index, and y stays NaN.
    const V s = hn::Min(hn::Mul(a[u], scale), clamp);
    const V t = hn::Add(s, shifter);
    f[u] = hn::Sub(s, hn::Sub(t, shifter));
    idx[u] = hn::IndicesFromVec(
        d, hn::And(hn::BitCast(di, t), hn::Set(di, static_cast<int32_t>(kLanes - 1))));
  }
  for (size_t u = 0; u < K; ++u)
    p[u] = hn::TableLookupLanes(hn::Load(d, table + kDegree * kLanes), idx[u]);
  for (size_t k = kDegree; k-- > 0;) {
    const V row = hn::Load(d, table + k * kLanes);
    for (size_t u = 0; u < K; ++u)
      p[u] = hn::MulAdd(p[u], f[u], hn::TableLookupLanes(row, idx[u]));
  }
  for (size_t u = 0; u < K; ++u)
    x[u] = hn::MulAdd(a[u], hn::Min(p[u], hn::Set(d, 0.5f)), hn::Mul(x[u], hn::Set(d, 0.5f)));
}
#endif

// GELU, tanh form: 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as
// x * sigmoid(2u) = x / (1 + exp(-2u)) (the same function, one exp and one divide). Where
// -2u > 88 (x < -10) the result is below 1e-37 in magnitude and is returned as 0.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V GeluTanhF32(D d, V x) {
  constexpr float kMinusTwoSqrt2OverPi = -1.5957691216057308f;  // -2 sqrt(2/pi)
  const V x2 = hn::Mul(x, x);
  const V poly = hn::MulAdd(hn::Set(d, kMinusTwoSqrt2OverPi * 0.044715f), x2,
                            hn::Set(d, kMinusTwoSqrt2OverPi));
  const V minus_two_u = hn::Mul(x, poly);
  const V y = hn::Div(x, hn::Add(hn::Set(d, 1.0f), ExpF32(d, minus_two_u)));
  return hn::IfThenZeroElse(hn::Gt(minus_two_u, hn::Set(d, 88.0f)), y);
}

template <bool kTanh>
HWY_INLINE void GeluLoopF32(size_t n, const float* x, float* y) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  // The exact form's K vectors side by side.
  const auto gelu_erf = [d](auto& v) HWY_ATTR {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    GeluErfTableF32(d, v);
#else
    GeluErfF32(d, v);
#endif
  };
  if constexpr (!kTanh) {
    constexpr size_t K = 4;
    for (; i + K * N <= n; i += K * N) {
      V v[K];
      for (size_t u = 0; u < K; ++u) v[u] = hn::LoadU(d, x + i + u * N);
      gelu_erf(v);
      for (size_t u = 0; u < K; ++u) hn::StoreU(v[u], d, y + i + u * N);
    }
  }
  const auto gelu = [&](V v) HWY_ATTR {
    if constexpr (kTanh) return GeluTanhF32(d, v);
    V a[1] = {v};
    gelu_erf(a);
    return a[0];
  };
  for (; i + N <= n; i += N) hn::StoreU(gelu(hn::LoadU(d, x + i)), d, y + i);
  if (i < n) StoreTail(d, gelu(LoadTail(d, x + i, n - i, 0.0f)), y + i, n - i);
}

// torch.relu: x < 0 -> 0, else x, so NaN stays NaN and -0.0 stays -0.0 as in PyTorch (a Max
// against zero would turn NaN into 0 on x86: maxps returns its second operand on NaN).
void ReluF32(int64_t count, const float* x, float* y) {
  if (count <= 0) return;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t n = static_cast<size_t>(count);
  const auto zero = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    hn::StoreU(hn::IfThenElse(hn::Lt(v, zero), zero, v), d, y + i);
  }
  for (; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

// ------------------------------------------------------------------------------------------
// The exp-based maps, measured against double over every 1024th float of [-120, 120] (2.1M
// values; kernels/unary_maps_match_float64_to_a_few_ulp) on AVX2, SSE4 and SCALAR alike:
// sigmoid 2.13 ulp, silu 2.99, tanh 2.50 (AVX2; 2.47 on the others). Each is exp (1 ulp), an
// add, a divide and (silu) a multiply, each rounding at most half an ulp.
//
// sigmoid(x) = num / (1 + e) with e = exp(-|x|) <= 1, num = 1 for x >= 0 and e for x < 0 (then
// e / (1 + e) = 1 / (1 + e^-x)). The exp argument is never positive, so nothing overflows for
// any x (sigmoid(-100) is e^-100 ~ 0, never NaN: 1 / (1 + inf) would be fine, but inf / inf
// would not), and the negative tail keeps its relative accuracy instead of cancelling in 1 - s.
// ExpF32 (1 ulp) flushes e below e^-87 to 0, so sigmoid(x < -87) is 0 where PyTorch gives the
// subnormal or tiny normal e^x: an absolute error under 1.7e-38. -inf gives 0, +inf 1, NaN NaN.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V SigmoidF32(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V e = ExpF32(d, hn::Neg(hn::Abs(x)));
  const V num = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), e, one);
  return hn::Div(num, hn::Add(one, e));
}

// silu(x) = x * sigmoid(x) = x / (1 + e^-x), as num / (1 + e) with num = x for x >= 0 and x * e
// for x < 0: one divide, and as in SigmoidF32 no exp of a positive argument. PyTorch computes
// x / (1 + exp(-x)), which gives -0 once exp(-x) overflows (x < -88.7) where this gives the
// tiny x e^x (or 0 below -87): both are within 1e-36 of the true value. silu(-inf) is NaN
// (-inf * 0), as PyTorch's -inf / inf; silu(+inf) = +inf; -0.0 stays -0.0.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V SiluF32(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V e = ExpF32(d, hn::Neg(hn::Abs(x)));
  const V num = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Mul(x, e), x);
  return hn::Div(num, hn::Add(one, e));
}

// A map y = f(x) over n floats, the tail through a stack copy (padded with 0, which every f here
// takes without a special case).
template <class F>
HWY_INLINE void UnaryLoopF32(int64_t count, const float* x, float* y, F f) {
  if (count <= 0) return;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t n = static_cast<size_t>(count);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(f(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) StoreTail(d, f(d, LoadTail(d, x + i, n - i, 0.0f)), y + i, n - i);
}

void SigmoidMapF32(int64_t n, const float* x, float* y) {
  UnaryLoopF32(n, x, y, [](auto d, auto v) HWY_ATTR { return SigmoidF32(d, v); });
}
void SiluMapF32(int64_t n, const float* x, float* y) {
  UnaryLoopF32(n, x, y, [](auto d, auto v) HWY_ATTR { return SiluF32(d, v); });
}
// Highway's contrib Tanh: sign(x) * expm1(2|x|) / (expm1(2|x|) + 2), exactly +-1 past
// |x| = 18.7 (so tanh(+-100) and tanh(+-inf) are +-1, never NaN); NaN stays NaN, -0.0 stays
// -0.0. expm1 keeps small |x| accurate, where (1 - e^-2|x|) / (1 + e^-2|x|) would cancel.
// Highway documents 4 ulp; the figure above is what these targets measure.
void TanhMapF32(int64_t n, const float* x, float* y) {
  UnaryLoopF32(n, x, y, [](auto d, auto v) HWY_ATTR { return hn::Tanh(d, v); });
}

void GeluF32(int64_t n, const float* x, float* y, bool tanh_approx) {
  if (n <= 0) return;
  if (tanh_approx) {
    GeluLoopF32<true>(static_cast<size_t>(n), x, y);
  } else {
    GeluLoopF32<false>(static_cast<size_t>(n), x, y);
  }
}

// ------------------------------------------------------------------------------------------
// Layer norm, biased variance, float arithmetic with a corrected two-pass (Chan et al.):
//   pass 1: m0 = mean(x) in float;  pass 2: s1 = sum(x - m0), s2 = sum((x - m0)^2);
//   mean = m0 + s1/n, var = s2/n - (s1/n)^2.
// s1 repairs the rounding error of m0, which matters when |mean| >> std (x = 1000 + N(0, 1):
// float sums of ~1e6 carry errors of several ulps of 1e6, 0.06 each). Pass 3 subtracts the mean
// as a float pair hi + lo: x - mean_hi is exact for x near the mean, and mean_lo restores what
// rounding the mean to float lost (half an ulp of 1000 is 3e-5 std; without the lo part the
// tests' mean-1000 rows are 7e-5 off, with it 1e-6). Several accumulators per sum (four in
// pass 1, two per sum in pass 2) hide the add latency and shorten each lane's float sum.
// With a residual (AddLayerNormRowsF32), pass 1 first forms s = x + residual, stores it in the
// `sum` row and sums what it stored, in the same order as pass 1 over a stored s: the pair gives
// the bits of add_f32 then layer_norm_rows_f32, in one read of x and one of the residual
// instead of three reads and a write, and one parallel phase instead of two. Passes 2 and 3 then
// read s back from `sum`, which is still in L1 (a row of up to 8192 floats is 32 KiB).
template <bool kResidual>
HWY_INLINE void LayerNormRowsImpl(int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                                  const float* residual, int64_t residual_stride, float* sum,
                                  int64_t sum_stride, float* y, int64_t y_stride,
                                  const float* gamma, const float* beta, float eps) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  if (cols <= 0) return;
  const size_t n = static_cast<size_t>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    // Pass 1's loads: x, or x + residual stored to the sum row (which passes 2 and 3 then read).
    [[maybe_unused]] const float* rr = kResidual ? residual + r * residual_stride : nullptr;
    [[maybe_unused]] float* sr = kResidual ? sum + r * sum_stride : nullptr;
    const auto load = [&](size_t j) HWY_ATTR -> V {
      if constexpr (!kResidual) {
        return hn::LoadU(d, xr + j);
      } else {
        const V v = hn::Add(hn::LoadU(d, xr + j), hn::LoadU(d, rr + j));
        hn::StoreU(v, d, sr + j);
        return v;
      }
    };

    V a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    size_t i = 0;
    for (; i + 4 * N <= n; i += 4 * N) {
      a0 = hn::Add(a0, load(i));
      a1 = hn::Add(a1, load(i + N));
      a2 = hn::Add(a2, load(i + 2 * N));
      a3 = hn::Add(a3, load(i + 3 * N));
    }
    for (; i + N <= n; i += N) a0 = hn::Add(a0, load(i));
    float tail_sum = 0.0f;
    for (; i < n; ++i) {
      if constexpr (kResidual) sr[i] = xr[i] + rr[i];
      tail_sum += kResidual ? sr[i] : xr[i];
    }
    if constexpr (kResidual) xr = sr;
    const float m0 =
        (hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)))) + tail_sum) /
        static_cast<float>(n);

    const V vm0 = hn::Set(d, m0);
    V s0 = hn::Zero(d), s1 = hn::Zero(d), q0 = hn::Zero(d), q1 = hn::Zero(d);
    i = 0;
    for (; i + 2 * N <= n; i += 2 * N) {
      const V d0 = hn::Sub(hn::LoadU(d, xr + i), vm0);
      const V d1 = hn::Sub(hn::LoadU(d, xr + i + N), vm0);
      s0 = hn::Add(s0, d0);
      s1 = hn::Add(s1, d1);
      q0 = hn::MulAdd(d0, d0, q0);
      q1 = hn::MulAdd(d1, d1, q1);
    }
    for (; i + N <= n; i += N) {
      const V d0 = hn::Sub(hn::LoadU(d, xr + i), vm0);
      s0 = hn::Add(s0, d0);
      q0 = hn::MulAdd(d0, d0, q0);
    }
    float tail_s = 0.0f, tail_q = 0.0f;
    for (; i < n; ++i) {
      const float dv = xr[i] - m0;
      tail_s += dv;
      tail_q += dv * dv;
    }
    const double sum_d = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1))) + double{tail_s};
    const double sum_d2 = hn::GetLane(hn::SumOfLanes(d, hn::Add(q0, q1))) + double{tail_q};
    const double mean_shift = sum_d / static_cast<double>(n);
    const double var = std::max(sum_d2 / static_cast<double>(n) - mean_shift * mean_shift, 0.0);
    const double mean = double{m0} + mean_shift;
    const float mean_hi = static_cast<float>(mean);
    const float mean_lo = static_cast<float>(mean - double{mean_hi});
    const float rstd = static_cast<float>(1.0 / std::sqrt(var + double{eps}));

    const V vhi = hn::Set(d, mean_hi), vlo = hn::Set(d, mean_lo), vrstd = hn::Set(d, rstd);
    const auto normalize = [&](V v, size_t j, bool tail) HWY_ATTR {
      V out = hn::Mul(hn::Sub(hn::Sub(v, vhi), vlo), vrstd);
      const size_t count = n - j;
      if (gamma != nullptr) {
        out = hn::Mul(out, tail ? LoadTail(d, gamma + j, count, 0.0f) : hn::LoadU(d, gamma + j));
      }
      if (beta != nullptr) {
        out = hn::Add(out, tail ? LoadTail(d, beta + j, count, 0.0f) : hn::LoadU(d, beta + j));
      }
      return out;
    };
    i = 0;
    for (; i + N <= n; i += N) hn::StoreU(normalize(hn::LoadU(d, xr + i), i, false), d, yr + i);
    if (i < n) StoreTail(d, normalize(LoadTail(d, xr + i, n - i, 0.0f), i, true), yr + i, n - i);
  }
}

void LayerNormRowsF32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float* y,
                      int64_t y_stride, const float* gamma, const float* beta, float eps) {
  LayerNormRowsImpl<false>(rows, cols, x, x_stride, nullptr, 0, nullptr, 0, y, y_stride, gamma,
                           beta, eps);
}

void AddLayerNormRowsF32(int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                         const float* residual, int64_t residual_stride, float* sum,
                         int64_t sum_stride, float* y, int64_t y_stride, const float* gamma,
                         const float* beta, float eps) {
  LayerNormRowsImpl<true>(rows, cols, x, x_stride, residual, residual_stride, sum, sum_stride, y,
                          y_stride, gamma, beta, eps);
}

// ------------------------------------------------------------------------------------------
// Softmax down the columns of a row-major [rows, cols] block: y[i, j] = e[i, j] / sum_i e[i, j],
// e = exp(x[i, j] - max_i x[i, j]). This is torch.softmax over a dim that is not the last one,
// seen as [outer, rows, cols] with cols the product of the later dims: each lane is one column,
// every load contiguous, no transpose. Three passes per block of up to 4 vectors of columns
// (max, exp stored in y and summed, scale), 12 accumulators in registers; a block of 1000 rows
// of 32 columns (AVX2) is 128 KiB of y, in L2 between passes.
//
// Each column's sum is a Kahan sum over its rows: plain float sums of n terms drift by up to n/2
// ulp when a weight near 1 absorbs many small ones (softmax_f32.cc measures the same effect);
// compensated, the sum is within 2 ulp for any n, for 3 more adds per vector (the exp costs ~16).
// Unlike softmax_rows_f32 (attention's convention), this keeps PyTorch's special values: a column
// of all -inf has max -inf and every x - max NaN, so it comes out NaN; a NaN or a +inf makes its
// column NaN too (x86 max drops NaNs, but x - max is NaN for a NaN x and sum propagates it).
// y may alias x (same strides): pass 2 reads each element before writing it.
void SoftmaxColumnsF32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float* y,
                       int64_t y_stride) {
  if (rows <= 0 || cols <= 0) return;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  constexpr size_t kVectors = 4;
  const size_t n = static_cast<size_t>(cols);
  for (size_t j0 = 0; j0 < n; j0 += kVectors * N) {
    const size_t width = std::min(kVectors * N, n - j0);
    const size_t full = width / N;         // whole vectors in this block
    const size_t tail = width - full * N;  // columns of a last partial vector
    const size_t vectors = full + (tail ? 1 : 0);
    // Partial vectors go through a stack copy padded with 0: a padded lane is a column of
    // zeros, harmless (weight 1/rows), and never stored.
    const auto load = [&](const float* row, size_t v) HWY_ATTR -> V {
      return v < full ? hn::LoadU(d, row + j0 + v * N) : LoadTail(d, row + j0 + v * N, tail, 0.0f);
    };
    const auto store = [&](V value, float* row, size_t v) HWY_ATTR {
      if (v < full) {
        hn::StoreU(value, d, row + j0 + v * N);
      } else {
        StoreTail(d, value, row + j0 + v * N, tail);
      }
    };
    V m[kVectors], s[kVectors], c[kVectors];
    for (size_t v = 0; v < kVectors; ++v) {
      m[v] = hn::Set(d, -std::numeric_limits<float>::infinity());
      s[v] = hn::Zero(d);
      c[v] = hn::Zero(d);
    }
    for (int64_t i = 0; i < rows; ++i) {
      const float* xr = x + i * x_stride;
      for (size_t v = 0; v < vectors; ++v) m[v] = hn::Max(m[v], load(xr, v));
    }
    for (int64_t i = 0; i < rows; ++i) {
      const float* xr = x + i * x_stride;
      float* yr = y + i * y_stride;
      for (size_t v = 0; v < vectors; ++v) {
        const V e = ExpF32(d, hn::Sub(load(xr, v), m[v]));
        store(e, yr, v);
        // Kahan: c holds what the last add lost (negated), taken back from the next term.
        const V term = hn::Sub(e, c[v]);
        const V sum = hn::Add(s[v], term);
        c[v] = hn::Sub(hn::Sub(sum, s[v]), term);
        s[v] = sum;
      }
    }
    V inv[kVectors];
    for (size_t v = 0; v < vectors; ++v) inv[v] = hn::Div(hn::Set(d, 1.0f), s[v]);
    for (int64_t i = 0; i < rows; ++i) {
      float* yr = y + i * y_stride;
      for (size_t v = 0; v < vectors; ++v) store(hn::Mul(load(yr, v), inv[v]), yr, v);
    }
  }
}

}  // namespace tessera::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/cpu_kernels.h"

namespace tessera {
HWY_EXPORT(DispatchedTarget);
HWY_EXPORT(RopeRotateHalfF32);
HWY_EXPORT(AddBiasRowsF32);
HWY_EXPORT(AddF32);
HWY_EXPORT(GeluF32);
HWY_EXPORT(ReluF32);
HWY_EXPORT(AddMapF32);
HWY_EXPORT(SubMapF32);
HWY_EXPORT(MulMapF32);
HWY_EXPORT(DivMapF32);
HWY_EXPORT(SiluMapF32);
HWY_EXPORT(SigmoidMapF32);
HWY_EXPORT(TanhMapF32);
HWY_EXPORT(SoftmaxColumnsF32);
HWY_EXPORT(LayerNormRowsF32);
HWY_EXPORT(AddLayerNormRowsF32);

namespace cpu {
int64_t dispatched_target() { return HWY_DYNAMIC_DISPATCH(DispatchedTarget)(); }

namespace {
void relu_f32(int64_t n, const float* x, float* y) { HWY_DYNAMIC_DISPATCH(ReluF32)(n, x, y); }
void silu_f32(int64_t n, const float* x, float* y) { HWY_DYNAMIC_DISPATCH(SiluMapF32)(n, x, y); }
void sigmoid_f32(int64_t n, const float* x, float* y) {
  HWY_DYNAMIC_DISPATCH(SigmoidMapF32)(n, x, y);
}
void tanh_f32(int64_t n, const float* x, float* y) { HWY_DYNAMIC_DISPATCH(TanhMapF32)(n, x, y); }

void add_map_f32(int64_t n, const float* a, int64_t a_step, const float* b, int64_t b_step,
                 float* y) {
  HWY_DYNAMIC_DISPATCH(AddMapF32)(n, a, a_step, b, b_step, y);
}
void sub_map_f32(int64_t n, const float* a, int64_t a_step, const float* b, int64_t b_step,
                 float* y) {
  HWY_DYNAMIC_DISPATCH(SubMapF32)(n, a, a_step, b, b_step, y);
}
void mul_map_f32(int64_t n, const float* a, int64_t a_step, const float* b, int64_t b_step,
                 float* y) {
  HWY_DYNAMIC_DISPATCH(MulMapF32)(n, a, a_step, b, b_step, y);
}
void div_map_f32(int64_t n, const float* a, int64_t a_step, const float* b, int64_t b_step,
                 float* y) {
  HWY_DYNAMIC_DISPATCH(DivMapF32)(n, a, a_step, b, b_step, y);
}

// The elementwise maps, by the op they serve: one line per map.
constexpr NamedUnaryMapF32 kUnaryMaps[] = {
    {"relu", relu_f32},
    {"silu", silu_f32},
    {"sigmoid", sigmoid_f32},
    {"tanh", tanh_f32},
};

// The broadcasting binary maps, by the op they serve: one line per map.
constexpr NamedBinaryMapF32 kBinaryMaps[] = {
    {"add", add_map_f32},
    {"sub", sub_map_f32},
    {"mul", mul_map_f32},
    {"div", div_map_f32},
};
}  // namespace

const NamedBinaryMapF32* binary_maps_f32(int64_t* count) {
  *count = static_cast<int64_t>(std::size(kBinaryMaps));
  return kBinaryMaps;
}

const NamedUnaryMapF32* unary_maps_f32(int64_t* count) {
  *count = static_cast<int64_t>(std::size(kUnaryMaps));
  return kUnaryMaps;
}

void rope_rotate_half_f32(int64_t positions, int64_t heads, int64_t head_dim, float* x,
                          int64_t row_stride, const float* cos, const float* sin) {
  HWY_DYNAMIC_DISPATCH(RopeRotateHalfF32)(positions, heads, head_dim, x, row_stride, cos, sin);
}
void add_bias_rows_f32(int64_t rows, int64_t cols, float* x, int64_t x_stride, const float* bias) {
  HWY_DYNAMIC_DISPATCH(AddBiasRowsF32)(rows, cols, x, x_stride, bias);
}
void add_f32(int64_t n, const float* a, const float* b, float* y) {
  HWY_DYNAMIC_DISPATCH(AddF32)(n, a, b, y);
}
void gelu_f32(int64_t n, const float* x, float* y, bool tanh_approx) {
  HWY_DYNAMIC_DISPATCH(GeluF32)(n, x, y, tanh_approx);
}
void layer_norm_rows_f32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float* y,
                         int64_t y_stride, const float* gamma, const float* beta, float eps) {
  HWY_DYNAMIC_DISPATCH(LayerNormRowsF32)(rows, cols, x, x_stride, y, y_stride, gamma, beta, eps);
}
void add_layer_norm_rows_f32(int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                             const float* residual, int64_t residual_stride, float* sum,
                             int64_t sum_stride, float* y, int64_t y_stride, const float* gamma,
                             const float* beta, float eps) {
  HWY_DYNAMIC_DISPATCH(AddLayerNormRowsF32)(rows, cols, x, x_stride, residual, residual_stride,
                                            sum, sum_stride, y, y_stride, gamma, beta, eps);
}
void softmax_columns_f32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float* y,
                         int64_t y_stride) {
  HWY_DYNAMIC_DISPATCH(SoftmaxColumnsF32)(rows, cols, x, x_stride, y, y_stride);
}
}  // namespace cpu
}  // namespace tessera
#endif  // HWY_ONCE
