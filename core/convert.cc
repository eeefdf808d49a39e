// f16/bf16 <-> f32 conversions, bit-exact with the scalar reference in core/dtype.cpp on every
// SIMD target (round to nearest even, subnormals exact, overflow to inf, NaN kept).
//
// In core, not in a backend: Tensor::copy_from and to() convert with them, and core reaches no
// device's kernel table (ggml's fp16 row conversions are likewise part of its core API). The
// scalar loop instead would cost 7x on f16 -> f32 (3.5 against 0.5 ns per value, measured), a
// checkpoint's load time.
//
// All four are integer bit manipulation rather than Highway's PromoteTo/DemoteTo: those use
// F16C on AVX2/AVX3 but a different emulation on SSE4/EMU128, F16C quiets a signalling NaN and
// keeps truncated NaN payloads where the reference does neither, and 1.0.3's bf16 DemoteTo
// truncates. About 12 integer ops per vector of 16 values keeps even the f32 -> f16 direction
// at memory speed.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/convert.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

#include "core/simd_tail-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using DU16 = hn::Rebind<uint16_t, DF>;  // as many u16 lanes as f32 lanes (half a vector)
using VU = hn::Vec<DU>;

// f16 bits (zero-extended to u32 lanes) -> f32 bits.
HWY_INLINE VU HalfBitsToFloatBits(VU h) {
  const DU du;
  const DF df;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  VU o = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7fffu)));  // exponent and mantissa
  const VU exp = hn::And(o, hn::Set(du, 0x0f800000u));         // f16 exponent field, moved
  o = hn::Add(o, hn::Set(du, (127u - 15u) << 23));             // rebias
  // inf/NaN (exponent 31): rebias once more to exponent 255; the payload moves up unchanged.
  o = hn::IfThenElse(hn::Eq(exp, hn::Set(du, 0x0f800000u)), hn::Add(o, hn::Set(du, 0x38000000u)),
                     o);
  // Zero/subnormal (exponent 0): o + 2^23 is the float 2^-14 * (1 + mant/1024); subtracting
  // 2^-14 leaves mant * 2^-24 exactly (the FPU normalises it).
  const VU sub = hn::BitCast(du, hn::Sub(hn::BitCast(df, hn::Add(o, hn::Set(du, 1u << 23))),
                                         hn::BitCast(df, hn::Set(du, 113u << 23))));
  o = hn::IfThenElse(hn::Eq(exp, hn::Zero(du)), sub, o);
  return hn::Or(o, sign);
}

// f32 bits -> f16 bits in the low half of u32 lanes.
HWY_INLINE VU FloatBitsToHalfBits(VU u) {
  const DU du;
  const DI di;
  const DF df;
  const VU sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const VU absx = hn::And(u, hn::Set(du, 0x7fffffffu));
  // absx >= bits, as a signed compare (absx < 2^31; 1.0.3 has only > for integer lanes).
  const auto abs_at_least = [&](uint32_t bits) HWY_ATTR {
    return hn::RebindMask(
        du, hn::Gt(hn::BitCast(di, absx), hn::Set(di, static_cast<int32_t>(bits - 1))));
  };
  // Normal: rebias 127 -> 15 and round 23 -> 10 mantissa bits to nearest even; a carry out of
  // the mantissa correctly bumps the exponent.
  const VU r = hn::Sub(absx, hn::Set(du, 0x38000000u));
  const VU lsb = hn::And(hn::ShiftRight<13>(r), hn::Set(du, 1u));
  VU h = hn::ShiftRight<13>(hn::Add(r, hn::Add(lsb, hn::Set(du, 0xfffu))));
  // Below 2^-14 (subnormal f16 or zero): adding 0.5 rounds |x| to a multiple of 2^-24, the
  // float spacing in [0.5, 1), to nearest even; the mantissa of the sum is then the f16 value
  // in units of 2^-24 (1024 = the smallest normal, which is also the right f16 encoding).
  const VU sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, absx), hn::Set(df, 0.5f))),
                         hn::Set(du, 0x3f000000u));
  h = hn::IfThenElse(abs_at_least(0x38800000u), h, sub);
  h = hn::IfThenElse(abs_at_least(0x477ff000u), hn::Set(du, 0x7c00u), h);  // >= 65520: inf
  h = hn::IfThenElse(abs_at_least(0x7f800001u), hn::Set(du, 0x7e00u), h);  // NaN: quiet NaN
  return hn::Or(h, sign);
}

// f32 bits -> bf16 bits in the low half of u32 lanes: round to nearest even on the upper 16
// bits (a carry into the exponent rounds up to the next binade or to inf, as it should); NaN
// keeps its sign and upper payload and gets the quiet bit, so a payload living only in the low
// 16 bits cannot round to inf.
HWY_INLINE VU FloatBitsToBfloat16Bits(VU u) {
  const DU du;
  const DI di;
  const VU upper = hn::ShiftRight<16>(u);
  const VU lsb = hn::And(upper, hn::Set(du, 1u));
  const VU rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7fffu))));
  const VU nan = hn::Or(upper, hn::Set(du, 0x40u));
  const auto is_nan = hn::RebindMask(
      du, hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu))), hn::Set(di, 0x7f800000)));
  return hn::IfThenElse(is_nan, nan, rounded);
}

// u32 lanes holding values < 2^16 -> u16 lanes (saturating demote from i32: exact here).
HWY_INLINE hn::Vec<DU16> NarrowToU16(VU v) { return hn::DemoteTo(DU16(), hn::BitCast(DI(), v)); }

// n values through `convert` (din's vector -> dout's, as many lanes), the tail through a
// stack copy.
template <class DIn, class DOut, class Convert>
HWY_INLINE void ConvertRow(DIn din, DOut dout, size_t n, const hn::TFromD<DIn>* in,
                           hn::TFromD<DOut>* out, const Convert& convert) {
  const size_t N = hn::Lanes(din);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(convert(hn::LoadU(din, in + i)), dout, out + i);
  if (i < n) {
    StoreTail(dout, convert(LoadTail(din, in + i, n - i, hn::TFromD<DIn>{0})), out + i, n - i);
  }
}

void ConvertF16ToF32(int64_t count, const uint16_t* in, float* out) {
  if (count <= 0) return;
  ConvertRow(DU16(), DF(), static_cast<size_t>(count), in, out, [](hn::Vec<DU16> h) HWY_ATTR {
    return hn::BitCast(DF(), HalfBitsToFloatBits(hn::PromoteTo(DU(), h)));
  });
}

void ConvertBf16ToF32(int64_t count, const uint16_t* in, float* out) {
  if (count <= 0) return;
  // bf16 is the upper half of an f32.
  ConvertRow(DU16(), DF(), static_cast<size_t>(count), in, out, [](hn::Vec<DU16> h) HWY_ATTR {
    return hn::BitCast(DF(), hn::ShiftLeft<16>(hn::PromoteTo(DU(), h)));
  });
}

void ConvertF32ToF16(int64_t count, const float* in, uint16_t* out) {
  if (count <= 0) return;
  ConvertRow(DF(), DU16(), static_cast<size_t>(count), in, out, [](hn::Vec<DF> v) HWY_ATTR {
    return NarrowToU16(FloatBitsToHalfBits(hn::BitCast(DU(), v)));
  });
}

void ConvertF32ToBf16(int64_t count, const float* in, uint16_t* out) {
  if (count <= 0) return;
  ConvertRow(DF(), DU16(), static_cast<size_t>(count), in, out, [](hn::Vec<DF> v) HWY_ATTR {
    return NarrowToU16(FloatBitsToBfloat16Bits(hn::BitCast(DU(), v)));
  });
}

}  // namespace tessera::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "core/dtype.h"

namespace tessera {
HWY_EXPORT(ConvertF16ToF32);
HWY_EXPORT(ConvertF32ToF16);
HWY_EXPORT(ConvertBf16ToF32);
HWY_EXPORT(ConvertF32ToBf16);

void convert_f16_to_f32(int64_t n, const uint16_t* in, float* out) {
  HWY_DYNAMIC_DISPATCH(ConvertF16ToF32)(n, in, out);
}
void convert_f32_to_f16(int64_t n, const float* in, uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(ConvertF32ToF16)(n, in, out);
}
void convert_bf16_to_f32(int64_t n, const uint16_t* in, float* out) {
  HWY_DYNAMIC_DISPATCH(ConvertBf16ToF32)(n, in, out);
}
void convert_f32_to_bf16(int64_t n, const float* in, uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(ConvertF32ToBf16)(n, in, out);
}
}  // namespace tessera
#endif  // HWY_ONCE
