// Element-wise and row-wise f32 kernels: rotary embedding, bias add, add, GELU, ReLU, layer norm.
// All are a few vector ops per element over data that is read once, so they run at memory
// (or L2) bandwidth except GELU, whose erf costs about 35 vector ops per vector.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/elementwise_f32.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstddef>
#include <cstdint>

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

// ------------------------------------------------------------------------------------------
// GELU, exact form: x * Phi(x), Phi(x) = 1 - erfc(x/sqrt2)/2 for x >= 0 and erfc(|x|/sqrt2)/2
// for x < 0. Going through erfc keeps Phi relatively accurate in the negative tail, where
// PyTorch's 0.5 * x * (1 + erf(x/sqrt2)) cancels. erfc(t) = tau * exp(-t^2 + P(tau)),
// tau = 1 / (1 + t/2), is the Chebyshev fit of Numerical Recipes (erfcc, section 6.2):
// fractional error < 1.2e-7 for all t >= 0. Measured gelu error on [-15, 15]: 3.8e-7 absolute,
// most of it the final rounding of x * Phi (half an ulp of 15 is 4.8e-7). The Eigen/XLA erf
// rational (x P(x^2) / Q(x^2) on [-4, 4]) is cheaper but, evaluated in float, is off by 3.7e-7
// near |x/sqrt2| = 3.6-4, which puts gelu 1.05e-6 off at |x| = 5.1.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V GeluErfF32(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V half = hn::Set(d, 0.5f);
  const V t = hn::Mul(hn::Abs(x), hn::Set(d, 0.70710678118654752f));
  const V tau = hn::Div(one, hn::MulAdd(half, t, one));
  V p = hn::Set(d, 0.17087277f);
  p = hn::MulAdd(p, tau, hn::Set(d, -0.82215223f));
  p = hn::MulAdd(p, tau, hn::Set(d, 1.48851587f));
  p = hn::MulAdd(p, tau, hn::Set(d, -1.13520398f));
  p = hn::MulAdd(p, tau, hn::Set(d, 0.27886807f));
  p = hn::MulAdd(p, tau, hn::Set(d, -0.18628806f));
  p = hn::MulAdd(p, tau, hn::Set(d, 0.09678418f));
  p = hn::MulAdd(p, tau, hn::Set(d, 0.37409196f));
  p = hn::MulAdd(p, tau, hn::Set(d, 1.00002368f));
  p = hn::MulAdd(p, tau, hn::Set(d, -1.26551223f));
  // The exponent peaks at t = 0 (3e-8, 0 up to rounding), far inside ExpF32's domain; below -87
  // (|x| > 13.2, Phi < 1e-39) ExpF32 flushes to 0.
  const V half_erfc = hn::Mul(hn::Mul(half, tau), ExpF32(d, hn::NegMulAdd(t, t, p)));
  const V phi = hn::IfThenElse(hn::Lt(x, hn::Zero(d)), half_erfc, hn::Sub(one, half_erfc));
  return hn::Mul(x, phi);
}

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
  const size_t N = hn::Lanes(d);
  const auto gelu = [d](hn::Vec<decltype(d)> v) HWY_ATTR {
    if constexpr (kTanh) return GeluTanhF32(d, v);
    return GeluErfF32(d, v);
  };
  size_t i = 0;
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
void LayerNormRowsF32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float* y,
                      int64_t y_stride, const float* gamma, const float* beta, float eps) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  if (cols <= 0) return;
  const size_t n = static_cast<size_t>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;

    V a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    size_t i = 0;
    for (; i + 4 * N <= n; i += 4 * N) {
      a0 = hn::Add(a0, hn::LoadU(d, xr + i));
      a1 = hn::Add(a1, hn::LoadU(d, xr + i + N));
      a2 = hn::Add(a2, hn::LoadU(d, xr + i + 2 * N));
      a3 = hn::Add(a3, hn::LoadU(d, xr + i + 3 * N));
    }
    for (; i + N <= n; i += N) a0 = hn::Add(a0, hn::LoadU(d, xr + i));
    float tail_sum = 0.0f;
    for (; i < n; ++i) tail_sum += xr[i];
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
HWY_EXPORT(LayerNormRowsF32);

namespace cpu {
int64_t dispatched_target() { return HWY_DYNAMIC_DISPATCH(DispatchedTarget)(); }

namespace {
void relu_f32(int64_t n, const float* x, float* y) { HWY_DYNAMIC_DISPATCH(ReluF32)(n, x, y); }

// The elementwise maps, by the op they serve: one line per map.
constexpr NamedUnaryMapF32 kUnaryMaps[] = {
    {"relu", relu_f32},
};
}  // namespace

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
}  // namespace cpu
}  // namespace tessera
#endif  // HWY_ONCE
