// Per-target bounded tail loads/stores for the Highway kernel files (core/convert.cc and the
// CPU backend's). Included once per SIMD target from a file that has already included
// <hwy/highway.h> under foreach_target.h, hence Highway's toggling include guard instead of
// #pragma once.
#if defined(TESSERA_CORE_SIMD_TAIL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_CORE_SIMD_TAIL_INL_H_
#undef TESSERA_CORE_SIMD_TAIL_INL_H_
#else
#define TESSERA_CORE_SIMD_TAIL_INL_H_
#endif

#include <hwy/highway.h>
#include <stddef.h>

HWY_BEFORE_NAMESPACE();
namespace tessera::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Highway 1.0.3 has no LoadN/StoreN, and its MaskedLoad on SSE4/EMU128 loads the whole vector,
// so row tails (count < Lanes(d)) go through a stack copy: no read or write past the row.
template <class D>
HWY_INLINE hn::Vec<D> LoadTail(D d, const hn::TFromD<D>* p, size_t count, hn::TFromD<D> pad) {
  HWY_ALIGN hn::TFromD<D> buf[hn::MaxLanes(D())];
  for (size_t i = 0; i < hn::MaxLanes(D()); ++i) buf[i] = i < count ? p[i] : pad;
  return hn::Load(d, buf);
}

template <class D>
HWY_INLINE void StoreTail(D d, hn::Vec<D> v, hn::TFromD<D>* p, size_t count) {
  HWY_ALIGN hn::TFromD<D> buf[hn::MaxLanes(D())];
  hn::Store(v, d, buf);
  for (size_t i = 0; i < count; ++i) p[i] = buf[i];
}

}  // namespace tessera::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TESSERA_CORE_SIMD_TAIL_INL_H_
