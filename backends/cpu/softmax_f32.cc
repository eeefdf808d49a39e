// softmax_rows_f32: y = softmax(scale * x + mask) per row, three passes over the row.
//   1. z = scale * x (+ mask), row max m.  2. e = exp(z - m), stored in y, summed.  3. y *= 1/sum.
// Subtracting the row max keeps every exp argument <= 0, so logits of any magnitude (1e30,
// 88, ...) neither overflow nor lose the largest weight. A 1024-float row (4 KiB) stays in L1
// between passes, so memory traffic is one read of x (and mask) and one write of y; the exp
// (about 16 vector ops per vector) bounds the speed.

// GCC contracts a separate multiply and add into one FMA even under -std=c++20 (measured, GCC
// 12), which would round the logits once on AVX2/AVX3 and twice on SSE4/EMU128. Off for this
// file, so z = scale * x + mask rounds after the multiply and after the add on every target;
// the explicit hn::MulAdd calls in ExpF32 stay FMAs. Clang (the fuzz build) has its own pragma.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/softmax_f32.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "backends/cpu/math_f32-inl.h"
#include "core/simd_tail-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One row. The logits are rounded to float after the multiply and again after the mask add
// (never fused: see the pragma above), as PyTorch's separate `scores * scale + mask` ops round
// them; z is then the same on every target, and the tests reproduce it exactly.
template <bool kMasked>
HWY_INLINE void SoftmaxRowF32(size_t cols, const float* x, float scale, const float* mask,
                              float* y) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const size_t N = hn::Lanes(d);
  const V vscale = hn::Set(d, scale);
  const V kNegInf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto logits = [&](size_t i) HWY_ATTR -> V {
    const V z = hn::Mul(vscale, hn::LoadU(d, x + i));
    if constexpr (kMasked) return hn::Add(z, hn::LoadU(d, mask + i));
    return z;
  };
  // The tail's unused lanes become -inf: neutral for the max, and exp gives them 0.
  const auto tail_logits = [&](size_t i) HWY_ATTR -> V {
    const size_t count = cols - i;
    V z = hn::Mul(vscale, LoadTail(d, x + i, count, 0.0f));
    if constexpr (kMasked) z = hn::Add(z, LoadTail(d, mask + i, count, 0.0f));
    return hn::IfThenElse(hn::FirstN(d, count), z, kNegInf);
  };

  // Pass 1: max. Four accumulators cover the 2-cycle latency of max at 2 loads per cycle.
  V m0 = kNegInf, m1 = kNegInf, m2 = kNegInf, m3 = kNegInf;
  size_t i = 0;
  for (; i + 4 * N <= cols; i += 4 * N) {
    m0 = hn::Max(m0, logits(i));
    m1 = hn::Max(m1, logits(i + N));
    m2 = hn::Max(m2, logits(i + 2 * N));
    m3 = hn::Max(m3, logits(i + 3 * N));
  }
  for (; i + N <= cols; i += N) m0 = hn::Max(m0, logits(i));
  if (i < cols) m1 = hn::Max(m1, tail_logits(i));
  const float row_max = hn::GetLane(hn::MaxOfLanes(d, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3))));

  // The max of a row holding a NaN is unreliable (x86 max returns its second operand when
  // either is NaN, so a NaN, and with it earlier lanes, can be dropped), but pass 2 still sees
  // every NaN logit: z - m is NaN, ExpF32 keeps it, the sum becomes NaN, and so does every
  // output. Pass 2 cannot run when m == -inf (-inf - -inf = NaN): then every logit is -inf, or a
  // NaN hid the finite ones; a scan tells which. All -inf means no admissible key: zeros, never
  // NaN (the contract; PyTorch would give NaN).
  if (row_max == -std::numeric_limits<float>::infinity()) {
    bool has_nan = false;
    for (size_t j = 0; j < cols; ++j) {
      const float z = scale * x[j] + (kMasked ? mask[j] : 0.0f);
      has_nan |= std::isnan(z);
    }
    const float fill = has_nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    for (size_t j = 0; j < cols; ++j) y[j] = fill;
    return;
  }

  // Pass 2: e = exp(z - m) into y, summed. A +inf logit makes m = +inf and its own z - m NaN:
  // the row becomes NaN, as in PyTorch. y may alias x: each lane is read before it is written.
  // The sum runs in blocks: float lanes within a block, double across blocks. Float error comes
  // from the lane holding the max term (1.0) absorbing small ones: terms a little above half an
  // ulp of 1 (6e-8) all round the same way, so k of them bias the sum by up to k * 4e-8.
  // Blocks of 16 vectors (<= 8 terms per lane, 256 floats per horizontal sum on AVX-512) keep
  // the measured relative error of small weights at 2.8e-7; targets of <= 4 lanes, whose
  // horizontal sums are cheap, use blocks of 4 vectors (with 16 the 1-lane SCALAR target
  // measured 5.3e-7, with 4 it measures 1.8e-7).
  const V vmax = hn::Set(d, row_max);
  const size_t block = (N >= 8 ? 16 : 4) * N;
  double sum = 0.0;
  i = 0;
  while (i < cols) {
    const size_t block_end = std::min(cols, i + block);
    V s0 = hn::Zero(d), s1 = hn::Zero(d);
    for (; i + 2 * N <= block_end; i += 2 * N) {
      const V e0 = ExpF32(d, hn::Sub(logits(i), vmax));
      const V e1 = ExpF32(d, hn::Sub(logits(i + N), vmax));
      hn::StoreU(e0, d, y + i);
      hn::StoreU(e1, d, y + i + N);
      s0 = hn::Add(s0, e0);
      s1 = hn::Add(s1, e1);
    }
    for (; i + N <= block_end; i += N) {
      const V e = ExpF32(d, hn::Sub(logits(i), vmax));
      hn::StoreU(e, d, y + i);
      s0 = hn::Add(s0, e);
    }
    if (i < block_end) {  // only in the last block: block_end == cols
      const V e = ExpF32(d, hn::Sub(tail_logits(i), vmax));
      StoreTail(d, e, y + i, cols - i);
      s1 = hn::Add(s1, e);
      i = cols;
    }
    sum += hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
  }
  // The max entry contributes exactly exp(0) = 1, so sum >= 1 (or NaN).

  // Pass 3: normalise. One reciprocal per row, then a multiply per element: a vector divide
  // issues several times less often than a multiply, for < 1 ulp of gain.
  const float inv_sum = static_cast<float>(1.0 / sum);
  const V vinv = hn::Set(d, inv_sum);
  i = 0;
  for (; i + N <= cols; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, y + i), vinv), d, y + i);
  for (; i < cols; ++i) y[i] *= inv_sum;
}

void SoftmaxRowsF32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float scale,
                    const float* mask, int64_t mask_stride, float* y, int64_t y_stride) {
  if (cols <= 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    if (mask != nullptr) {
      SoftmaxRowF32<true>(static_cast<size_t>(cols), x + r * x_stride, scale,
                          mask + r * mask_stride, y + r * y_stride);
    } else {
      SoftmaxRowF32<false>(static_cast<size_t>(cols), x + r * x_stride, scale, nullptr,
                           y + r * y_stride);
    }
  }
}

}  // namespace tessera::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/cpu_kernels.h"

namespace tessera {
HWY_EXPORT(SoftmaxRowsF32);

namespace cpu {
void softmax_rows_f32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float scale,
                      const float* mask, int64_t mask_stride, float* y, int64_t y_stride) {
  HWY_DYNAMIC_DISPATCH(SoftmaxRowsF32)
  (rows, cols, x, x_stride, scale, mask, mask_stride, y, y_stride);
}
}  // namespace cpu
}  // namespace tessera
#endif  // HWY_ONCE
