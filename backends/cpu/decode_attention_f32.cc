// decode_attention_f32: one new query row against a block of a K/V cache (incremental decoding),
// and the log-sum-exp merge of such blocks. Contract: core/attention_tile.h
// (DecodeAttentionBlock) and core/kernels.h.
//
// Why keys in lanes: the flash kernel puts query rows in the vector lanes, so a single query row
// would use 1 of 8 (AVX2) or 16 (AVX-512) lanes. Here the cache keeps K transposed (kt[d][s]), so
// the scores of 4 vectors of keys are 4 FMA chains over d, each step one broadcast of q[d] and 4
// contiguous loads; P.V broadcasts p_s and adds it times the value row, v_head_dim wide. A decode
// step reads every cached key and value once (2 FLOPs per 4-byte element), so it is bounded by
// memory bandwidth, not FMAs: the loads are what the loop is shaped for.
//
// Scores are scale * q . k_s with q pre-multiplied by scale (as the flash kernel does it), each
// an FMA chain over d = 0 .. head_dim-1 in order; softmax terms use ExpFastF32 (the
// flash kernel's exp, math_f32-inl.h).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/decode_attention_f32.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/math_f32-inl.h"
#include "core/attention_tile.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr size_t kKeyVecs = 4;    // key vectors whose scores are computed together
constexpr size_t kValueVecs = 8;  // value vectors accumulated together in P.V

// scores[s - s0] = sum_d qs[d] * kt[d][s] (+ mask[s]) for s in [s0, s1).
void Scores(const DecodeAttentionBlock& b, const float* HWY_RESTRICT qs, float* HWY_RESTRICT out) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const int64_t s0 = b.key_begin, n = b.key_end - b.key_begin;
  int64_t s = 0;
  for (; s + static_cast<int64_t>(kKeyVecs * N) <= n; s += static_cast<int64_t>(kKeyVecs * N)) {
    VF acc[kKeyVecs];
    for (size_t u = 0; u < kKeyVecs; ++u) acc[u] = hn::Zero(d);
    const float* col = b.kt + s0 + s;
    for (int64_t dd = 0; dd < b.head_dim; ++dd) {
      const VF qv = hn::Set(d, qs[dd]);
      const float* row = col + dd * b.kt_stride;
      for (size_t u = 0; u < kKeyVecs; ++u)
        acc[u] = hn::MulAdd(qv, hn::LoadU(d, row + u * N), acc[u]);
    }
    for (size_t u = 0; u < kKeyVecs; ++u)
      hn::Store(acc[u], d, out + s + static_cast<int64_t>(u * N));
  }
  for (; s + static_cast<int64_t>(N) <= n; s += static_cast<int64_t>(N)) {
    VF acc = hn::Zero(d);
    const float* col = b.kt + s0 + s;
    for (int64_t dd = 0; dd < b.head_dim; ++dd)
      acc = hn::MulAdd(hn::Set(d, qs[dd]), hn::LoadU(d, col + dd * b.kt_stride), acc);
    hn::StoreU(acc, d, out + s);
  }
  for (; s < n; ++s) {  // the same FMA chain, one lane
    float acc = 0.0f;
    for (int64_t dd = 0; dd < b.head_dim; ++dd)
      acc = std::fma(qs[dd], b.kt[dd * b.kt_stride + s0 + s], acc);
    out[s] = acc;
  }
  if (b.mask)
    for (int64_t i = 0; i < n; ++i) out[i] += b.mask[s0 + i];
}

void DecodeAttentionBlockF32(const DecodeAttentionBlock& b) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const int64_t n = b.key_end - b.key_begin, dv = b.v_head_dim;
  // q * scale, on the stack in chunks: head_dim is at most a few hundred in every model, but the
  // kernel takes any; kQChunk floats at a time keep it allocation-free.
  constexpr int64_t kQChunk = 512;
  HWY_ALIGN float qs[kQChunk];
  float* scores = b.scores;
  if (b.head_dim <= kQChunk) {
    for (int64_t i = 0; i < b.head_dim; ++i) qs[i] = b.q[i] * b.scale;
    Scores(b, qs, scores);
  } else {
    // Longer heads: partial dot products chunk by chunk would change the FMA chain order, so
    // fall back to one lane at a time over the whole head, still in order.
    for (int64_t s = 0; s < n; ++s) {
      float acc = 0.0f;
      for (int64_t dd = 0; dd < b.head_dim; ++dd)
        acc = std::fma(b.q[dd] * b.scale, b.kt[dd * b.kt_stride + b.key_begin + s], acc);
      scores[s] = acc + (b.mask ? b.mask[b.key_begin + s] : 0.0f);
    }
  }
  // The block's max; a NaN score makes the whole result NaN.
  float m = kNegInf;
  bool nan = false;
  for (int64_t s = 0; s < n; ++s) {
    if (std::isnan(scores[s])) nan = true;
    m = std::max(m, scores[s]);
  }
  if (nan || m == kNegInf) {
    const float fill = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    for (int64_t j = 0; j < dv; ++j) b.o[j] = fill;
    *b.m = nan ? fill : kNegInf;
    *b.l = fill;
    return;
  }
  // p_s = e^(score_s - m), l = sum p_s (in key order).
  const VF vm = hn::Set(d, m);
  int64_t s = 0;
  for (; s + static_cast<int64_t>(N) <= n; s += static_cast<int64_t>(N))
    hn::Store(ExpFastF32(d, hn::Sub(hn::Load(d, scores + s), vm)), d, scores + s);
  if (s < n) {
    HWY_ALIGN float tail[hn::MaxLanes(DF())];
    for (size_t i = 0; i < N; ++i)
      tail[i] = s + static_cast<int64_t>(i) < n ? scores[s + static_cast<int64_t>(i)] : m;
    hn::Store(ExpFastF32(d, hn::Sub(hn::Load(d, tail), vm)), d, tail);
    for (int64_t i = 0; s + i < n; ++i) scores[s + i] = tail[i];
  }
  float l = 0.0f;
  for (int64_t i = 0; i < n; ++i) l += scores[i];
  // o = sum_s p_s v[s]: kValueVecs vectors of v_head_dim at a time, keys in order.
  const float* v0 = b.v + b.key_begin * b.v_stride;
  int64_t j = 0;
  for (; j + static_cast<int64_t>(N) <= dv;) {
    const size_t vecs =
        std::min<size_t>(kValueVecs, static_cast<size_t>((dv - j) / static_cast<int64_t>(N)));
    VF acc[kValueVecs];
    for (size_t u = 0; u < kValueVecs; ++u) acc[u] = hn::Zero(d);
    for (int64_t i = 0; i < n; ++i) {
      const VF p = hn::Set(d, scores[i]);
      const float* row = v0 + i * b.v_stride + j;
      for (size_t u = 0; u < vecs; ++u) acc[u] = hn::MulAdd(p, hn::LoadU(d, row + u * N), acc[u]);
    }
    for (size_t u = 0; u < vecs; ++u) hn::StoreU(acc[u], d, b.o + j + static_cast<int64_t>(u * N));
    j += static_cast<int64_t>(vecs * N);
  }
  for (; j < dv; ++j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc = std::fma(scores[i], v0[i * b.v_stride + j], acc);
    b.o[j] = acc;
  }
  *b.m = m;
  *b.l = l;
}

}  // namespace
}  // namespace tessera::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera {
HWY_EXPORT(DecodeAttentionBlockF32);

namespace cpu {

void decode_attention_block_f32(const DecodeAttentionBlock& block) {
  HWY_DYNAMIC_DISPATCH(DecodeAttentionBlockF32)(block);
}

// Scalar: a handful of blocks per row, v_head_dim multiplies each; e^(m_b - M) in double keeps
// the merge's own rounding far below the float result's.
void decode_attention_merge_f32(int64_t blocks, int64_t v_head_dim, const float* m,
                                const float* l, const float* o, int64_t o_stride, float* out) {
  float big = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t b = 0; b < blocks; ++b) {
    if (std::isnan(m[b]) || std::isnan(l[b])) nan = true;
    big = std::max(big, m[b]);
  }
  if (nan || big == -std::numeric_limits<float>::infinity()) {
    const float fill = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    for (int64_t j = 0; j < v_head_dim; ++j) out[j] = fill;
    return;
  }
  double denominator = 0.0;
  for (int64_t b = 0; b < blocks; ++b)
    if (m[b] != -std::numeric_limits<float>::infinity())
      denominator += std::exp(static_cast<double>(m[b]) - big) * l[b];
  for (int64_t j = 0; j < v_head_dim; ++j) {
    double sum = 0.0;
    for (int64_t b = 0; b < blocks; ++b)
      if (m[b] != -std::numeric_limits<float>::infinity())
        sum += std::exp(static_cast<double>(m[b]) - big) * o[b * o_stride + j];
    out[j] = static_cast<float>(sum / denominator);
  }
}

}  // namespace cpu
}  // namespace tessera
#endif  // HWY_ONCE
