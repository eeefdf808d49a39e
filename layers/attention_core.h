// The one attention core behind MultiheadAttention and the spec's `attention` op.
//
// Inputs are already projected (and rotated, for rope). Every operand is addressed by strides so
// the projections' outputs are read in place: a packed QKV buffer [B, T, 3D] is q = base,
// k = base + D, v = base + 2D with row stride 3D; PyTorch's sequence-first [L, N, E] has batch
// stride E and row stride N*E. The output is written straight into the out-projection's input.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/workspace.h"

namespace tessera {

struct AttentionArgs {
  int64_t batch = 0, heads = 0;
  int64_t q_len = 0;       // L
  int64_t kv_len = 0;      // S (0 allowed: every query attends to nothing and gets zeros)
  int64_t head_dim = 0;    // D (q/k width)
  int64_t v_head_dim = 0;  // value width per head (equal to head_dim for both layers today)
  float scale = 1.0f;      // applied to q.k (1/sqrt(head_dim) normally)

  // Element (b, t, h, d) of q at q[b*q_batch_stride + t*q_row_stride + h*q_head_stride + d].
  const float* q = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  const float* k = nullptr;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  const float* v = nullptr;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  float* out = nullptr;  // (b, t, h, d) likewise
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;

  // Optional additive float mask (-inf = masked), element (b, h, l, s) at
  // mask[b*mask_batch_stride + h*mask_head_stride + l*mask_row_stride + s]; strides may be 0
  // (broadcast), columns are contiguous.
  const float* mask = nullptr;
  int64_t mask_batch_stride = 0, mask_head_stride = 0, mask_row_stride = 0;
  // Optional relative-position bias for self-attention over a grid_h x grid_w token grid
  // (L = S = grid_h * grid_w): adds rel_table[h * rel_head_stride +
  // relative_position_index(l, s, grid_h, grid_w)] (core/attention_tile.h) to score (b, h, l, s),
  // after the mask. Looked up inside the kernel's tile: no [H, L, S] bias is built.
  const float* rel_table = nullptr;
  int64_t rel_head_stride = 0;
  int64_t grid_h = 0, grid_w = 0;
  // Optional region mask for self-attention over windows (Swin's shifted windows, L == S):
  // token t of batch element b lies in region region[(b % region_groups) * q_len + t], and
  // score (b, h, l, s) gets region_penalty added when the regions of l and s differ (after the
  // mask and the bias). The ids are computed per window from its position by the layer; no
  // [windows, L, S] mask is built. region_groups > 0 says a region mask is (or will be) given:
  // set it when sizing the scratch. The fused kernel takes the ids per tile
  // (FlashAttentionTile::region); the tiled path adds the penalty to its scores tile.
  const int32_t* region = nullptr;
  int64_t region_groups = 0;
  float region_penalty = -100.0f;
  // Query l sees keys s <= l (upper-left aligned when L != S). Combines with mask (sum).
  bool causal = false;

  // Optional attention weights out: contiguous [B, H, L, S] (probabilities after dropout), or
  // with average_weights their mean over heads, [B, L, S] (summed in head order, then divided
  // by heads, as PyTorch's weights.sum(dim=1) / num_heads).
  float* weights = nullptr;
  bool average_weights = false;

  // Dropout on the attention weights (training mode of the `attention` op): each weight is
  // zeroed with probability dropout_p and the rest scaled by 1/(1-p). The draw for (b, h, l, s)
  // depends only on (dropout_seed, b, h, l, s), so results do not depend on thread count.
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  // Whether `weights` is written: set it when sizing the scratch, before weights has a home.
  bool need_weights = false;
  // attention_prepare_f32 has built this call's relative-position state into the scratch (for
  // the same heads, table and q_len): the forward reads it as built instead of building it.
  bool prepared = false;
};

// The scratch attention_forward_f32 works in: on the fused path a head-major copy of K and V,
// and one tile per worker (the fused kernel's panel, or a scores tile and a bias tile).
struct AttentionScratch {
  float* kv_copy = nullptr;
  float* key_major_bias = nullptr;  // the fused path's relative-position bias, per head
  WorkerScratch tiles;
};

// Lays the scratch for `args` out in `ws` (sizes, strides and flags of args are read; its
// pointers may be null): run over a counting Workspace it sizes the scratch, over the plan's
// it hands it out. One tile per thread of the current thread count.
AttentionScratch attention_scratch(const Device& device, const AttentionArgs& args, Workspace& ws);

// Builds what attention_forward_f32 otherwise builds from args' relative-position table at the
// start of every call (the fused path's key-major bias) into `scratch`, for a caller that runs
// the core over parts of one batch with one table (Swin's groups of windows) and sets
// args.prepared on those calls. Allocates nothing.
void attention_prepare_f32(const Device& device, const AttentionArgs& args,
                           const AttentionScratch& scratch);

// Validates nothing (layers do); splits (batch, head, query tile) over the worker threads.
// `scratch`: attention_scratch() of the same args. Allocates nothing.
void attention_forward_f32(const Device& device, const AttentionArgs& args,
                           const AttentionScratch& scratch);

// ------------------------------------------------------------------ cached (incremental) attention
// Causal self-attention of `new_len` new positions of each sequence against the keys and values
// of every position so far, kept in a cache between calls (generation, runtime/generation.h).
// Position t of a call is absolute position past + t and sees keys 0..past + t. The call first
// writes its new keys and values into the cache, then:
//  - past == 0 (the prompt): the fused causal path of attention_forward_f32 over the new q/k/v,
//    the same computation as a full forward of the prompt;
//  - past > 0 (a step, or a chunk of appended positions): the decode kernel, one query row at a
//    time, keys in vector lanes, over blocks of kDecodeKeyBlock keys merged by log-sum-exp in
//    block order; up to kDecodeRowsPerPass rows share a pass over the cache. The blocks are fixed
//    by position, not by thread count or chunking, so results are bitwise the same for any
//    number of threads and the same as steps of one position.
// Cache layout of one layer, per (batch, head): the keys transposed, kt[d * capacity + s], then
// the values row-major, v[s * v_head_dim + j] (cached_attention_cache_floats).
struct CachedAttentionArgs {
  // The new positions of this call: q_len of them per sequence, their q/k/v projections and
  // output addressed as in AttentionArgs, the scale. kv_len, causal and the optional fields
  // (mask, bias, regions, weights, dropout) are not read: the call is causal self-attention.
  AttentionArgs step;
  int64_t past = 0;        // positions already in the cache, per sequence
  int64_t capacity = 0;    // positions the cache holds (past + q_len <= capacity: the layer checks)
  float* cache = nullptr;  // cached_attention_cache_floats(...) floats
};

// Keys per decode block: 256 keys of d = 64 are 64 KB of K and V, an L2-sized unit of work
// (~10 us), and at context 4096 give 16 blocks per head to split over the threads.
constexpr int64_t kDecodeKeyBlock = 256;
// Query rows the decode kernel takes per pass over the cache (past > 0 with several new
// positions); the scratch holds partial results for that many rows.
constexpr int64_t kDecodeRowsPerPass = 16;

int64_t cached_attention_cache_floats(int64_t batch, int64_t heads, int64_t head_dim,
                                      int64_t v_head_dim, int64_t capacity);

struct CachedAttentionScratch {
  AttentionScratch prefill;   // attention_forward_f32's, for past == 0
  float* partial = nullptr;   // per (batch, head, block): m, l, o[v_head_dim] of one query row
  WorkerScratch scores;       // kDecodeKeyBlock floats per worker
};

// Lays out the scratch of cached_attention_f32 for `args` (sizes only; pointers may be null):
// enough for any past <= capacity - new_len, so one plan serves the prompt and every step.
CachedAttentionScratch cached_attention_scratch(const Device& device,
                                                const CachedAttentionArgs& args, Workspace& ws);

// Validates nothing. Allocates nothing.
void cached_attention_f32(const Device& device, const CachedAttentionArgs& args,
                          const CachedAttentionScratch& scratch);

}  // namespace tessera
