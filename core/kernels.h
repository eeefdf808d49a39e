// The kernel table a Device exposes. Layers call kernels only through this table, so a second
// backend is a second table, not a change to the layers.
//
// Contract for every kernel: plain pointers, sizes and strides in elements, row-major; no
// allocation, no exceptions, no threads of their own (layers split work and call kernels from
// worker threads). Arguments are validated by the layer before the call.
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
  bool causal = false;
  float* out = nullptr;  // [rows, v_head_dim]
  int64_t out_stride = 0;
  float* scratch = nullptr;  // flash_attention_scratch_floats(...) floats, 64-byte aligned
};

struct KernelTable {
  // C[m, n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T (trans_*), row-major.
  // op(A) is [m, k], op(B) is [k, n]; lda/ldb/ldc are row strides of the stored matrices.
  void (*gemm_f32)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc);
  // `batch` independent GEMMs; matrix i starts at a + i*stride_a (likewise b, c).
  void (*gemm_batched_f32)(int64_t batch, bool trans_a, bool trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float* a, int64_t lda, int64_t stride_a,
                           const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                           int64_t ldc, int64_t stride_c);

  // Projections, y[r, j] = sum_i x[r, i] w[j, i] + bias[j] (bias may be null), in two steps:
  // linear_pack_f32 copies rows of x into panels of linear_panel_rows rows (panels p0 .. p1-1 of
  // the ceil(m / linear_panel_rows), each k * linear_panel_rows floats at packed + p * that,
  // 64-byte aligned); linear_packed_f32 then computes rows of panels p0 .. p1-1 against output
  // features n0 .. n1-1. Every y element is the same sum in the same order whatever the split.
  int64_t linear_panel_rows = 0;
  void (*linear_pack_f32)(int64_t m, int64_t k, const float* x, int64_t ldx, int64_t p0,
                          int64_t p1, float* packed) = nullptr;
  void (*linear_packed_f32)(int64_t m, int64_t k, const float* packed, int64_t p0, int64_t p1,
                            const float* w, int64_t ldw, int64_t n0, int64_t n1,
                            const float* bias, float* y, int64_t ldy) = nullptr;

  // y[r, j] = softmax_j(scale * x[r, j] + mask[r, j]) for r < rows, j < cols.
  // mask may be null; its row stride may be 0 (one mask row for all rows); columns contiguous.
  // -inf entries get weight exactly 0; a row whose entries are all -inf becomes all zeros
  // (never NaN); a NaN entry makes its row NaN. x and y may alias (same strides).
  void (*softmax_rows_f32)(int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                           float scale, const float* mask, int64_t mask_stride, float* y,
                           int64_t y_stride);

  // Rotary embedding, rotate-half convention, in place. For t < positions and h < heads the
  // head vector v = x + t*row_stride + h*head_dim (head_dim even, half = head_dim/2) becomes
  //   v[i]        = v[i] * cos[t*half + i] - v[i + half] * sin[t*half + i]
  //   v[i + half] = v[i + half] * cos[t*half + i] + v[i] * sin[t*half + i]   (i < half)
  // cos/sin are [positions, half] tables built by the caller.
  void (*rope_rotate_half_f32)(int64_t positions, int64_t heads, int64_t head_dim, float* x,
                               int64_t row_stride, const float* cos, const float* sin);

  // x[r, j] += bias[j] for r < rows, j < cols (in place).
  void (*add_bias_rows_f32)(int64_t rows, int64_t cols, float* x, int64_t x_stride,
                            const float* bias);
  // y[i] = a[i] + b[i] (y may alias a or b).
  void (*add_f32)(int64_t n, const float* a, const float* b, float* y);
  // y[i] = gelu(x[i]); exact erf form, or the tanh approximation when tanh_approx.
  void (*gelu_f32)(int64_t n, const float* x, float* y, bool tanh_approx);
  // y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * gamma + beta (biased variance, as PyTorch);
  // gamma/beta may be null (no affine). x and y may alias.
  void (*layer_norm_rows_f32)(int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                              float* y, int64_t y_stride, const float* gamma, const float* beta,
                              float eps);

  // Fused attention for one tile (see FlashAttentionTile). Rows whose keys are all masked get
  // zeros (never NaN); a NaN score makes its row NaN. Null when the backend has none; the core
  // then takes the materialising path.
  void (*flash_attention_f32)(const FlashAttentionTile& tile) = nullptr;
  // Scratch the kernel needs for a tile of `rows` queries, in floats.
  int64_t (*flash_attention_scratch_floats)(int64_t rows, int64_t head_dim,
                                            int64_t v_head_dim) = nullptr;
};

}  // namespace tessera
