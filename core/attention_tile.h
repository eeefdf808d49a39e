// The argument of KernelTable::flash_attention_f32 (core/kernels.h): one query tile of one
// (batch, head), and the relative-position index formula its bias lookup uses. Included by the
// attention core (layers/) that builds tiles and by the kernels that read them.
#pragma once

#include <cstdint>

namespace tessera {

// Index into a relative-position bias table for self-attention over a grid_h x grid_w token grid
// (tokens row-major: position p is grid cell (p / grid_w, p % grid_w)): query q, key s ->
//   (qy - sy + grid_h - 1) * (2 grid_w - 1) + (qx - sx + grid_w - 1),  in [0, (2H-1)(2W-1)).
// The kernels compute it on the fly; a [T, T] index (128 MiB of int64 at T = 4096) is never built.
constexpr int64_t relative_position_index(int64_t q, int64_t s, int64_t grid_h, int64_t grid_w) {
  return (q / grid_w - s / grid_w + grid_h - 1) * (2 * grid_w - 1) + (q % grid_w - s % grid_w) +
         grid_w - 1;
}

// Swin's shifted-window region, along one axis of length n (the padded map) with window
// `window` and shift `shift` >= 0, of coordinate p: the last of torchvision's slices
// (0, -window), (-window, -shift), (-shift, None) (Python slice bounds: a negative bound counts
// from the end, then clamps to [0, n]; -0 is 0) that holds p, 0..2. A token's region id is
// 3 * region(y) + region(x) (the last (h, w) slice pair of the loop that labels the mask).
constexpr int64_t shifted_window_region(int64_t p, int64_t n, int64_t window, int64_t shift) {
  auto bound = [n](int64_t v) { return v < 0 ? (v + n < 0 ? 0 : v + n) : (v > n ? n : v); };
  const int64_t starts[3] = {0, bound(-window), bound(-shift)};
  const int64_t stops[3] = {bound(-window), bound(-shift), n};
  int64_t region = 0;
  for (int64_t k = 0; k < 3; ++k)
    if (p >= starts[k] && p < stops[k]) region = k;
  return region;
}

// Rows of FlashAttentionTile::key_major_bias readable past the tile's (its row blocks' height),
// and the row stride of a key-major bias for `rows` query rows.
constexpr int64_t kKeyMajorRowAlign = 32;
constexpr int64_t key_major_rows(int64_t rows) {
  return (rows + kKeyMajorRowAlign - 1) / kKeyMajorRowAlign * kKeyMajorRowAlign;
}

// One query tile of one (batch, head) for the fused attention kernel: rows of q at positions
// q_pos0 .. q_pos0+rows-1 against all kv_len keys, online softmax, never materialising
// [rows, kv_len]. Row r of q/out/mask is at ptr + r*stride; key/value s at ptr + s*stride.

struct FlashAttentionTile {
  int64_t rows = 0;
  int64_t q_pos0 = 0;    // for causal: row r sees keys s <= q_pos0 + r
  int64_t kv_len = 0;    // S (0: every row gets zeros)
  int64_t head_dim = 0;  // q/k width
  int64_t v_head_dim = 0;
  float scale = 1.0f;  // multiplies q.k before the mask is added
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  const float* mask = nullptr;  // additive [rows, kv_len], columns contiguous; may be null
  int64_t mask_stride = 0;      // may be 0 (one row for all)
  // Optional relative-position bias, added like the mask (both may be set: their sum is
  // added): query q_pos0 + r and key s, both < grid_h * grid_w, get
  // rel_table[relative_position_index(q_pos0 + r, s, grid_h, grid_w)]. This head's
  // [(2 grid_h - 1) * (2 grid_w - 1)] floats, contiguous.
  const float* rel_table = nullptr;
  int64_t grid_h = 0, grid_w = 0;
  // Optional additive term already laid out the way the kernel holds scores, keys outside and
  // query rows in lanes: key s, tile row r at key_major_bias[s * key_major_stride + r], for
  // r < rows rounded up to kKeyMajorRowAlign (the padding is read, never used). Added like the
  // mask; the attention core builds it from a relative-position table once per call when every
  // window shares it (Swin), instead of rel_table's per-key gathers.
  const float* key_major_bias = nullptr;
  int64_t key_major_stride = 0;
  // Optional region ids (Swin's shifted-window mask, added like the mask): token p has region
  // id region[p], for queries p = q_pos0 + r and keys p = s; a query and a key in different
  // regions get region_penalty added (torchvision's -100).
  const int32_t* region = nullptr;
  float region_penalty = 0.0f;
  bool causal = false;
  float* out = nullptr;  // [rows, v_head_dim]
  int64_t out_stride = 0;
  float* scratch = nullptr;  // flash_attention_scratch_floats(...) floats, 64-byte aligned
};

// One query row of one (batch, head) against the keys [key_begin, key_end) of a K/V cache, for
// incremental decoding (KernelTable::decode_attention_block_f32). The cache stores keys
// transposed, kt[d * kt_stride + s] (so keys sit in vector lanes: one new query row uses every
// lane), values row-major, v[s * v_stride + j]. The block's scores are scale * q . k_s (+ mask[s]
// when a mask is given, indexed by the absolute key position s); it writes its partial result
// for a log-sum-exp merge in block order (decode_attention_merge_f32):
//   m = the largest score, l = sum_s e^(score_s - m), o[j] = sum_s e^(score_s - m) v[s][j].
// A block whose scores are all -inf writes m = -inf, l = 0, o = 0; a NaN score makes m, l and
// every o NaN (the flash kernel's rules: masked rows give zeros, NaN propagates).
struct DecodeAttentionBlock {
  int64_t head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t key_begin = 0, key_end = 0;  // key_begin < key_end
  float scale = 1.0f;                   // multiplies q before the dot products
  const float* q = nullptr;             // [head_dim]
  const float* kt = nullptr;            // key s, dim d at kt[d * kt_stride + s]
  int64_t kt_stride = 0;
  const float* v = nullptr;  // value s at v + s * v_stride, v_head_dim floats
  int64_t v_stride = 0;
  const float* mask = nullptr;  // additive, mask[s]; may be null
  float* scores = nullptr;  // scratch: key_end - key_begin floats, 64-byte aligned
  float* o = nullptr;       // [v_head_dim]
  float* m = nullptr;       // one float
  float* l = nullptr;       // one float
};

}  // namespace tessera
