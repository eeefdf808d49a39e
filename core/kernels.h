// The kernel table a Device exposes. Layers call kernels only through this table, so a second
// backend is a second table, not a change to the layers.
//
// Contract for every kernel: plain pointers, sizes and strides in elements, row-major; no
// allocation, no exceptions, no threads of their own (layers split work and call kernels from
// worker threads). Arguments are validated by the layer before the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace tessera {

// The fused attention kernel's argument, defined in core/attention_tile.h. Declared only: the
// table's slot takes it by reference, which needs no definition, so this header carries nothing
// attention-specific; the layer that builds tiles and the kernels that read them include that
// header. It stays in core because it is the slot's contract for every backend; defined next
// to the CPU kernel, it would make the layer include one backend's header.
struct FlashAttentionTile;
struct DecodeAttentionBlock;

// A matrix's rows as the projection kernels read or write them: row r at rows[r] when `rows` is
// given (a gather or a scatter folded into the product: Swin's window partition), else at
// base + r * stride; the columns of a row contiguous.
template <class T>
struct MatrixRows {
  T* base = nullptr;
  int64_t stride = 0;
  T* const* rows = nullptr;
  T* row(int64_t r) const { return rows != nullptr ? rows[r] : base + r * stride; }
};
using RowsInF32 = MatrixRows<const float>;
using RowsOutF32 = MatrixRows<float>;

// Projection kernels for one stored weight dtype, y[r, j] = sum_i x[r, i] w[j, i] + bias[j]
// (x, bias, y float32; w in that dtype; bias may be null), in two steps: pack copies rows of x
// into panels of panel_rows rows (panels p0 .. p1-1 of the ceil(m / panel_rows), each
// k * panel_rows floats at packed + p * that, 64-byte aligned); packed then computes rows of
// panels p0 .. p1-1 against output features n0 .. n1-1. Every y element is the same sum in the
// same order whatever the split. w is untyped so that every weight dtype's entry has this one
// signature; ldw is in its elements.
struct LinearKernels {
  int64_t panel_rows = 0;
  void (*pack)(int64_t m, int64_t k, const float* x, int64_t ldx, int64_t p0, int64_t p1,
               float* packed) = nullptr;
  void (*packed)(int64_t m, int64_t k, const float* packed, int64_t p0, int64_t p1,
                 const void* w, int64_t ldw, int64_t n0, int64_t n1, const float* bias, float* y,
                 int64_t ldy) = nullptr;
  // Whether `packed` beats OpenBLAS for y[m, n] = x[m, k] w^T on the target dispatched now
  // (asked at every call: tests and TESSERA_HWY_TARGET change the target at run time).
  bool (*preferred)(int64_t m, int64_t k, int64_t n) = nullptr;
  // Few rows (a decode step: one position per sequence), m <= matvec_max_rows: y[r, j] for
  // j in [n0, n1) straight from x and w, no packing; each weight row read once per call, so the
  // call runs at memory speed. Every y element is the same sum whatever the split over j.
  int64_t matvec_max_rows = 0;
  void (*matvec)(int64_t m, int64_t k, const float* x, int64_t ldx, const void* w, int64_t ldw,
                 int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy) = nullptr;
  // A layer's own weights packed once (ParameterSet::pack_projections) into panels of
  // weight_panel output features, ceil(n / weight_panel) * weight_panel * k floats, the same
  // layout on every target: pack_weights writes panels q0 .. q1 - 1 of w [n, k]. `panels`
  // computes rows r0 .. r1 - 1 x columns c0 .. c1 - 1 of y = x w^T + bias from them, and
  // `panels_matvec` the same for m <= matvec_max_rows rows (c0 a multiple of weight_panel for
  // both). Every y element is one FMA chain in k order, bias last, however the rows and columns
  // are split; the packed kernel above computes the same bits. `panel_tile_cols` is the column
  // width of the dispatched target's tile (a multiple of weight_panel): a column split at other
  // multiples of weight_panel is exact but computes partial tiles.
  int64_t weight_panel = 0;
  int64_t (*panel_tile_cols)() = nullptr;
  // The most rows the layer gives one `panels` call (its depth blocks keep that many rows of x
  // in the L2); 0: no bound.
  int64_t panel_row_block = 0;
  int64_t weight_panel_floats(int64_t n, int64_t k) const {
    return (n + weight_panel - 1) / weight_panel * weight_panel * k;
  }
  void (*pack_weights)(int64_t n, int64_t k, const float* w, int64_t ldw, int64_t q0, int64_t q1,
                       float* panels) = nullptr;
  // `panels` also takes the columns the caller computes next, [next_c0, next_c1) (empty for
  // none): a hint (their weights are prefetched while this call runs), never read or written.
  // Both read x's rows and write y's through MatrixRows: strided, or one pointer per row.
  void (*panels)(int64_t k, RowsInF32 x, int64_t r0, int64_t r1, const float* panels, int64_t n,
                 int64_t c0, int64_t c1, int64_t next_c0, int64_t next_c1, const float* bias,
                 RowsOutF32 y) = nullptr;
  void (*panels_matvec)(int64_t m, int64_t k, RowsInF32 x, const float* panels, int64_t n,
                        int64_t c0, int64_t c1, const float* bias, RowsOutF32 y) = nullptr;
};

// An elementwise map y[i] = f(x[i]) for i < n (y may alias x), named by the op it serves.
using UnaryMapF32 = void (*)(int64_t n, const float* x, float* y);
struct NamedUnaryMapF32 {
  const char* name;
  UnaryMapF32 fn;
};

// A broadcasting binary map y[i] = a[i * a_step] op b[i * b_step] for i < n, each step 0 (the one
// value a[0] or b[0] stretched over the row) or 1; y may alias an operand of step 1. Named by the
// op it serves ("add", "sub", "mul", "div"): one IEEE operation per element, so every target
// gives the same bits.
using BinaryMapF32 = void (*)(int64_t n, const float* a, int64_t a_step, const float* b,
                              int64_t b_step, float* y);
struct NamedBinaryMapF32 {
  const char* name;
  BinaryMapF32 fn;
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

  // The projection kernels for weights stored as `weight`, or null when the backend has none
  // for that dtype. A new weight dtype (bf16) is a new entry in linear_by_weight, set by the
  // backend; the layers already ask by dtype.
  const LinearKernels* linear(DType weight) const {
    const LinearKernels& entry = linear_by_weight[static_cast<size_t>(weight)];
    return entry.packed != nullptr ? &entry : nullptr;
  }
  LinearKernels linear_by_weight[kDTypeCount] = {};

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
  // sum[r, :] = x[r, :] + residual[r, :], then y[r, :] = layer_norm_rows_f32 of sum[r, :]: the
  // bits of add_f32 followed by layer_norm_rows_f32, in one pass. sum and y may alias x, residual
  // or each other with the same strides (sum = y: a scratch row for a caller with no use for it).
  void (*add_layer_norm_rows_f32)(int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                                  const float* residual, int64_t residual_stride, float* sum,
                                  int64_t sum_stride, float* y, int64_t y_stride,
                                  const float* gamma, const float* beta, float eps) = nullptr;

  // The elementwise maps the backend has ("relu", ...): a new map is one entry in the backend's
  // list, not a new slot here. unary_map_f32 finds one by name (null when absent).
  const NamedUnaryMapF32* unary_maps_f32 = nullptr;
  int64_t unary_map_count = 0;
  UnaryMapF32 unary_map_f32(std::string_view name) const {
    for (int64_t i = 0; i < unary_map_count; ++i)
      if (name == unary_maps_f32[i].name) return unary_maps_f32[i].fn;
    return nullptr;
  }
  // The broadcasting binary maps ("add", "sub", "mul", "div"), found the same way.
  const NamedBinaryMapF32* binary_maps_f32 = nullptr;
  int64_t binary_map_count = 0;
  BinaryMapF32 binary_map_f32(std::string_view name) const {
    for (int64_t i = 0; i < binary_map_count; ++i)
      if (name == binary_maps_f32[i].name) return binary_maps_f32[i].fn;
    return nullptr;
  }

  // y[i, j] = softmax over i of x[i, j], for i < rows, j < cols: softmax down each column of a
  // row-major block (torch.softmax over a dim that is not the last; cols = the product of the
  // later dims); columns contiguous. PyTorch's special values: a column of all -inf, or holding
  // a NaN or +inf, becomes NaN. x and y may alias (same strides).
  void (*softmax_columns_f32)(int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                              float* y, int64_t y_stride) = nullptr;

  // Fused attention for one tile (core/attention_tile.h). Rows whose keys are all masked get
  // zeros (never NaN); a NaN score makes its row NaN. Null when the backend has none; the core
  // then takes the materialising path.
  void (*flash_attention_f32)(const FlashAttentionTile& tile) = nullptr;
  // Scratch the kernel needs for a tile of `rows` queries, in floats.
  int64_t (*flash_attention_scratch_floats)(int64_t rows, int64_t head_dim,
                                            int64_t v_head_dim) = nullptr;

  // Incremental decoding: one query row against one block of a K/V cache (core/attention_tile.h),
  // then the blocks' partial results merged in block order: out[j] = sum_b e^(m_b - M) o_b[j] /
  // sum_b e^(m_b - M) l_b with M = max_b m_b (o_b at o + b * o_stride). All blocks -inf: zeros;
  // a NaN anywhere: NaN. Fixed blocks merged in order give the same bits at any thread count.
  void (*decode_attention_block_f32)(const DecodeAttentionBlock& block) = nullptr;
  void (*decode_attention_merge_f32)(int64_t blocks, int64_t v_head_dim, const float* m,
                                     const float* l, const float* o, int64_t o_stride,
                                     float* out) = nullptr;
};

}  // namespace tessera
