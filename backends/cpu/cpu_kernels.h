// The CPU kernels behind KernelTable (core/kernels.h), as plain functions. The Highway ones
// re-dispatch on every call (HWY_DYNAMIC_DISPATCH reads hwy's chosen target), so a test that
// calls hwy::SetSupportedTargetsForTest reaches each compiled SIMD target through the same table.
// Contracts are those documented in core/kernels.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/kernels.h"

namespace tessera::cpu {

// gemm_f32.cpp: OpenBLAS sgemm, single-threaded.
void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc);
void gemm_batched_f32(int64_t batch, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, int64_t lda, int64_t stride_a, const float* b,
                      int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                      int64_t stride_c);

// linear_f32.cc: y = x w^T + bias with x packed in panels, float32 weights: the F32 entry of
// KernelTable::linear (contract: LinearKernels, core/kernels.h). w is float32, untyped only to
// share the table's signature with other weight dtypes.
constexpr int64_t kLinearPanelRows = 32;
void linear_pack_f32(int64_t m, int64_t k, const float* x, int64_t ldx, int64_t p0, int64_t p1,
                     float* packed);
void linear_packed_f32(int64_t m, int64_t k, const float* packed, int64_t p0, int64_t p1,
                       const void* w, int64_t ldw, int64_t n0, int64_t n1, const float* bias,
                       float* y, int64_t ldy);
bool linear_packed_preferred_f32(int64_t m, int64_t k, int64_t n);
// A layer's own weights packed once into panels of kLinearWeightPanel output features (panel q:
// [k][16], feature 16 q + j at column j, zeros past n): LinearKernels::weight_panel_floats(n, k)
// floats, the same layout on every target. Packs panels q0 .. q1 - 1 of w [n, k] (row stride
// ldw).
inline constexpr int64_t kLinearWeightPanel = 16;
// The column width of linear_panels_f32's tile on the dispatched target: 48 on AVX-512, 16 on
// the others.
int64_t linear_panel_tile_cols_f32();
// The most rows one linear_panels_f32 call should be given: its depth blocks are sized so that
// this many rows of x (one depth block of them) stay in the L2 while the call's column tiles
// pass over them (240 KiB at 256 steps: half of Zen 3's 512 KiB L2).
inline constexpr int64_t kLinearPanelRowBlock = 240;
void linear_pack_weights_f32(int64_t n, int64_t k, const float* w, int64_t ldw, int64_t q0,
                             int64_t q1, float* panels);
// y[r, c] = x[r, :] . w[c, :] + bias[c] for rows r0 .. r1 - 1 and columns c0 .. c1 - 1 (c0 a
// multiple of kLinearWeightPanel, c1 clamped to n) from the panels; bias may be null; x's and
// y's rows strided or one pointer each (MatrixRows, core/kernels.h). Columns
// [next_c0, next_c1) (next_c0 a multiple of kLinearWeightPanel; empty for none) are the ones
// the caller computes next: their first weights are prefetched, never read or written.
void linear_panels_f32(int64_t k, RowsInF32 x, int64_t r0, int64_t r1, const float* panels,
                       int64_t n, int64_t c0, int64_t c1, int64_t next_c0, int64_t next_c1,
                       const float* bias, RowsOutF32 y);
// The same for m <= kLinearMatvecRows rows (c0 a multiple of 16), each panel streamed once.
void linear_panels_matvec_f32(int64_t m, int64_t k, RowsInF32 x, const float* panels, int64_t n,
                              int64_t c0, int64_t c1, const float* bias, RowsOutF32 y);
// Few rows (m <= kLinearMatvecRows): one dot product per output, the weights streamed once.
inline constexpr int64_t kLinearMatvecRows = 4;
void linear_matvec_f32(int64_t m, int64_t k, const float* x, int64_t ldx, const void* w,
                       int64_t ldw, int64_t n0, int64_t n1, const float* bias, float* y,
                       int64_t ldy);

// decode_attention_f32.cc: one query row against a block of a transposed-K cache, and the merge
// of such blocks (contract: KernelTable::decode_attention_block_f32 / _merge_f32).
void decode_attention_block_f32(const DecodeAttentionBlock& block);
void decode_attention_merge_f32(int64_t blocks, int64_t v_head_dim, const float* m,
                                const float* l, const float* o, int64_t o_stride, float* out);

// softmax_f32.cc
void softmax_rows_f32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float scale,
                      const float* mask, int64_t mask_stride, float* y, int64_t y_stride);

// elementwise_f32.cc
void rope_rotate_half_f32(int64_t positions, int64_t heads, int64_t head_dim, float* x,
                          int64_t row_stride, const float* cos, const float* sin);
void add_bias_rows_f32(int64_t rows, int64_t cols, float* x, int64_t x_stride, const float* bias);
void add_f32(int64_t n, const float* a, const float* b, float* y);
void gelu_f32(int64_t n, const float* x, float* y, bool tanh_approx);
void layer_norm_rows_f32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float* y,
                         int64_t y_stride, const float* gamma, const float* beta, float eps);
void add_layer_norm_rows_f32(int64_t rows, int64_t cols, const float* x, int64_t x_stride,
                             const float* residual, int64_t residual_stride, float* sum,
                             int64_t sum_stride, float* y, int64_t y_stride, const float* gamma,
                             const float* beta, float eps);
// Every elementwise map y = f(x) of elementwise_f32.cc, by the op it serves (KernelTable's
// unary_maps_f32); `count` receives the number of entries.
const NamedUnaryMapF32* unary_maps_f32(int64_t* count);
// Every broadcasting binary map of elementwise_f32.cc (KernelTable's binary_maps_f32).
const NamedBinaryMapF32* binary_maps_f32(int64_t* count);
void softmax_columns_f32(int64_t rows, int64_t cols, const float* x, int64_t x_stride, float* y,
                         int64_t y_stride);
// The HWY_TARGET the Highway kernels dispatch to right now (one bit, e.g. HWY_AVX3).
int64_t dispatched_target();

// cpu_device.cpp: this core's L1 data cache in bytes (sysconf), or 32 KiB where the system
// reports none or an implausible size (outside 16 KiB .. 1 MiB). Read once. The kernels size
// their L1-resident blocks from it (linear_f32's depth blocks, flash_attention's key
// block).
size_t l1d_cache_bytes();
// Likewise the L2 (per core on the machines here), or 512 KiB where none or an implausible size
// (outside 128 KiB .. 64 MiB) is reported.
size_t l2_cache_bytes();

}  // namespace tessera::cpu
