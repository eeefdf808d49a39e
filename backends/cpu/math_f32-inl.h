// The exps of the Highway kernel files, per SIMD target. They differ on purpose; measured
// against double exp over every third float of their domain, on AVX2, SSE4 and SCALAR alike:
//   ExpF32             e^x for x <= 88: at most 1.01 ulp (8.4e-8 relative) on [-87, 88].
//                      Where results track PyTorch's expf: gelu, softmax_rows_f32.
//   ExpFastF32         e^x for x <= 88: at most 5.2e-7 relative (7.2 ulp) on [-87.33, 88],
//                      for two vector ops fewer (one Horner chain instead of 1 + r + r^2 P(r)):
//                      1.2-1.3x ExpF32's throughput on AVX2 (0.31 against 0.40 ns per value,
//                      Zen 3, exps over an L1-resident row), 1.3-1.5x on SSE4. Decode
//                      attention's softmax (arguments <= 0; PyTorch's flash kernel accepts a
//                      20-ulp exp there) and gelu's erfc, whose error counts absolutely.
//   Exp2F32            2^y, for the flash kernel's online softmax (e^(x - m) as 2^(x log2 e -
//                      m log2 e)): at most 2e-7 relative on [-126, 127] (1.7e-7 measured), the
//                      same bits on AVX2 and AVX-512.
// All keep NaN a NaN (hn::Exp returns 0, which would silently drop a NaN logit from its row)
// and return exactly 0 for -inf and below the normal range, never a subnormal. Tail
// loads/stores: core/simd_tail-inl.h.
//
// Included once per SIMD target from a file that has already included <hwy/highway.h> under
// foreach_target.h, hence Highway's toggling include guard instead of #pragma once.
#if defined(TESSERA_BACKENDS_CPU_MATH_F32_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_BACKENDS_CPU_MATH_F32_INL_H_
#undef TESSERA_BACKENDS_CPU_MATH_F32_INL_H_
#else
#define TESSERA_BACKENDS_CPU_MATH_F32_INL_H_
#endif

#include <hwy/highway.h>
#include <stddef.h>

HWY_BEFORE_NAMESPACE();
namespace tessera::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// log2 e rounded to float: the exps' x log2 e, and the flash kernel's scores into log2 units.
constexpr float kLog2eF32 = 0x1.715476p+0f;

// The last step of ExpF32 and ExpFastF32: p 2^n, or 0 where x < flush_below (x = -inf
// included; a NaN x gives a NaN p and stays NaN). t = n + 1.5 * 2^23 holds n in its low
// mantissa bits. 2^n as a float: exponent field (n + 127) << 23; the shifter's own bits
// (0x4B400000) sit at bit 22 and above and leave the 32-bit lane in the shift. n is in
// [-126, 127] for x in [flush_below, 88], so the field is never 0 or 255. A float multiply, not
// an integer add into p's exponent, keeps NaN a NaN.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V ScaleByPow2OrZero(D d, V x, V p, V t, V /*n*/, float flush_below) {
  const hn::RebindToSigned<D> di;
  const V pow2n = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127))));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, flush_below)), hn::Mul(p, pow2n));
}
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// AVX-512: vscalefps computes p 2^n in one op (one rounding of the same product, so the same
// bits as the multiply above) and its zero-masking takes the flush: 2 ops instead of 5. On
// Intel cores every 512-bit vector op shares ports 0 and 5 with the FMAs, so the softmax's exps
// cost the attention core's FMAs directly. The compare is "not less than" so that NaN keeps its
// lane.
template <class D>
HWY_INLINE hn::Vec512<float> ScaleByPow2OrZero(D /*d*/, hn::Vec512<float> x, hn::Vec512<float> p,
                                               hn::Vec512<float> /*t*/, hn::Vec512<float> n,
                                               float flush_below) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x.raw, _mm512_set1_ps(flush_below), _CMP_NLT_UQ);
  return hn::Vec512<float>{_mm512_maskz_scalef_ps(keep, p.raw, n.raw)};
}
#endif

// e^x for x <= 88 (e^88 = 1.65e38 is the largest power below FLT_MAX = 3.4e38 with margin).
// Relative error about 1 ulp (Cephes expf polynomial; figures above). Differs from hn::Exp in
// two ways that softmax relies on: NaN in gives NaN out (hn::Exp returns 0, which would
// silently drop a NaN logit from its row), and x < -87 gives exactly 0 (so -inf gives 0, and no
// subnormal is formed: e^-87 = 1.6e-38 is just above FLT_MIN = 1.18e-38).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpF32(D d, V x) {
  // Adding 1.5 * 2^23 rounds x/ln2 to the nearest integer n (the float add has no fraction
  // bits left at that magnitude) and leaves n in the low mantissa bits of t.
  const V kShifter = hn::Set(d, 12582912.0f);
  const V t = hn::MulAdd(x, hn::Set(d, kLog2eF32), kShifter);
  const V n = hn::Sub(t, kShifter);
  // r = x - n ln2 with ln2 split in two (Cody-Waite): n * 0.693145751953125 is exact for
  // |n| < 2^11, so |r| <= ln2/2 carries no cancellation error.
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693145751953125f), x);
  r = hn::NegMulAdd(n, hn::Set(d, 1.428606765330187045e-6f), r);
  // e^r = 1 + r + r^2 P(r) on |r| <= ln2/2 (Cephes expf minimax coefficients).
  V p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  p = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(d, 1.0f));
  return ScaleByPow2OrZero(d, x, p, t, n, -87.0f);
}

// e^x for x <= 88 (the softmax's score - max, at most 8 in flash_attention_f32), plus
// x = -inf -> 0 and x = NaN -> NaN. Above 88 the result is garbage, not inf: no caller gets
// there. x = n ln2 + r with n = round(x / ln2), |r| <= ln2/2; e^r = 1 + r P(r), P of degree 4
// fitted (Remez, relative error) on that interval: 4.4e-7 with float coefficients, 5.2e-7
// measured in float arithmetic by the flash_attention/exp_fast test (through cpu::exp_fast_f32)
// over [-87.3, 88]; one Horner step and all special-case logic short of a 1-ulp exp. Below
// -87.34 the result is 0 (e^-87.34 = 2^-126 is the smallest normal float: no subnormal is ever
// formed), an absolute error under 1.2e-38. hn::Exp would return 0 for NaN and silently drop a
// NaN score from its row; here r is NaN, so is P, and the scaling multiply keeps it.
// ExpFastF32Interleaved: the same on K vectors in place, step by step across them, so that a
// caller with a long dependency chain per vector (gelu: ~25 dependent ops) puts K independent
// chains side by side in program order, where the scheduler can overlap them.
template <size_t K, class D, class V = hn::Vec<D>>
HWY_INLINE void ExpFastF32Interleaved(D d, V (&x)[K]) {
  // Adding 1.5 * 2^23 rounds x/ln2 to an integer (a float that large has no fraction bits) and
  // leaves n in the low mantissa bits of t.
  const V shifter = hn::Set(d, 0x1.8p23f);
  V t[K], n[K], r[K], p[K];
  for (size_t u = 0; u < K; ++u) t[u] = hn::MulAdd(x[u], hn::Set(d, kLog2eF32), shifter);
  // Cody-Waite: ln2_hi has 17 significant bits, so n * ln2_hi is exact for |n| <= 127.
  for (size_t u = 0; u < K; ++u) {
    n[u] = hn::Sub(t[u], shifter);
    r[u] = hn::NegMulAdd(n[u], hn::Set(d, 0x1.62e4p-1f), x[u]);
    r[u] = hn::NegMulAdd(n[u], hn::Set(d, 0x1.7f7d1cp-20f), r[u]);
  }
  for (size_t u = 0; u < K; ++u)
    p[u] = hn::MulAdd(hn::Set(d, 0x1.c7b170p-8f), r[u], hn::Set(d, 0x1.570ad0p-5f));
  for (size_t u = 0; u < K; ++u) p[u] = hn::MulAdd(p[u], r[u], hn::Set(d, 0x1.55c360p-3f));
  for (size_t u = 0; u < K; ++u) p[u] = hn::MulAdd(p[u], r[u], hn::Set(d, 0x1.fffe5cp-2f));
  for (size_t u = 0; u < K; ++u) p[u] = hn::MulAdd(p[u], r[u], hn::Set(d, 0x1.ffff2ep-1f));
  for (size_t u = 0; u < K; ++u) p[u] = hn::MulAdd(p[u], r[u], hn::Set(d, 1.0f));
  for (size_t u = 0; u < K; ++u) x[u] = ScaleByPow2OrZero(d, x[u], p[u], t[u], n[u], -87.33654f);
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpFastF32(D d, V x) {
  V v[1] = {x};
  ExpFastF32Interleaved(d, v);
  return v[0];
}

// 2^y for y <= 127: y = -inf gives 0, NaN gives NaN, and below -126 the result is exactly 0
// (from -126 up it is normal: n >= -126, and r >= 0 where n = -126). The flash kernel's online
// softmax takes e^(x - m) as 2^(x log2 e - m') with its reference max m' kept in log2 units
// (RowBlockStep in flash_attention_f32.cc says why that is as exact as e^(x - m)). y = n + r
// with n = round(y), r in [-1/2, 1/2] exact (Sterbenz); 2^r = 1 + r P(r), P of degree 4 fitted
// on [-1/2, 1/2] (1.1e-7 relative; 1.7e-7 measured in float). AVX2 and narrower round by the
// shifter (t = y + 1.5 * 2^23 + 127 leaves n + 127 in t's low bits, so t shifted left by 23 is
// 2^n), AVX-512 by vrndscaleps and scales with vscalefps (ScaleByPow2OrZero): the same n, r, P
// and product, hence the same bits.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp2F32(D d, V y) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const V n = hn::Round(y);
#else
  const hn::RebindToSigned<D> di;
  const V shifter = hn::Set(d, 0x1.8p23f + 127.0f);
  const V t = hn::Add(y, shifter);
  const V n = hn::Sub(t, shifter);
#endif
  const V r = hn::Sub(y, n);
  V p = hn::MulAdd(hn::Set(d, 0x1.5bb9f4p-10f), r, hn::Set(d, 0x1.3cea84p-7f));
  p = hn::MulAdd(p, r, hn::Set(d, 0x1.c6b754p-5f));
  p = hn::MulAdd(p, r, hn::Set(d, 0x1.ebf9bcp-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 0x1.62e42ap-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return ScaleByPow2OrZero(d, y, p, /*t, unused there=*/n, n, -126.0f);
#else
  const V pow2n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t)));
  return hn::IfThenZeroElse(hn::Lt(y, hn::Set(d, -126.0f)), hn::Mul(p, pow2n));
#endif
}

}  // namespace tessera::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TESSERA_BACKENDS_CPU_MATH_F32_INL_H_
