#include "layers/attention_core.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/attention_tile.h"
#include "core/kernels.h"
#include "core/parallel.h"
#include "core/tensor.h"

namespace tessera {

namespace {

// Query rows per task. The scores tile is [rows, S] floats; keeping it near 256 KB, a quarter
// of the 1 MB L2 each core has here (lscpu: 2 MiB in 2 instances), leaves room for the K and V
// panels the two GEMMs stream: 65536 floats / S rows, clamped to [16, 256].
int64_t query_tile_rows(int64_t kv_len) {
  const int64_t rows = 65536 / std::max<int64_t>(kv_len, 1);
  return std::clamp<int64_t>(rows, 16, 256);
}

// Query rows per task when weights are averaged over heads: tiles of ~512 KiB of scores (half
// the L2), twice query_tile_rows's, because every scores GEMM packs all of the head's K, so
// taller tiles pack it fewer times. MHA E=768 H=12 need_weights, 1 / 2 threads, T=2048: 256 KiB
// 354 / 182 ms, 512 KiB 306 / 163, 1 MiB 311 / 164, 2 MiB 301 / 170; T=512: 39.2 / 20.9,
// 35.1 / 19.5, 38.4 / 19.9, 41.9 / 21.7.
int64_t averaged_tile_rows(int64_t kv_len) {
  return std::clamp<int64_t>(131072 / std::max<int64_t>(kv_len, 1), 16, 256);
}

// Floats of one scores tile: `rows` query rows by S keys (at least one column).
int64_t tile_scores_floats(int64_t rows, int64_t kv_len) {
  return rows * std::max<int64_t>(kv_len, 1);
}

// The fused path's relative-position bias laid out as the kernel holds scores
// (FlashAttentionTile::key_major_bias): [heads][S][L rounded up to 32] floats, built once per
// call. Every window of a batch of windows (Swin) shares it, so its per-key table gathers
// (one 16-lane gather per key and row vector: a quarter of the kernel's time at 7 x 7 windows,
// perf on Zen 5) become loads. Kept to 4 MiB: beyond that (windows of 24 x 24 and more) the
// kernel looks the table up itself. A query tile that does not start at a multiple of
// kKeyMajorRowAlign (L = 49 split in tiles of 24 for too few heads) reads its padded rows on
// into the next key's row, and past the last key's by up to kKeyMajorRowAlign - 1 floats: a
// zeroed tail of that many keeps those reads inside the buffer.
int64_t key_major_bias_floats(const AttentionArgs& a) {
  if (a.grid_h <= 0) return 0;
  const int64_t floats = a.heads * a.kv_len * key_major_rows(a.q_len);
  return floats <= (int64_t{1} << 20) ? floats + kKeyMajorRowAlign : 0;
}

// bias[h][s][l] = rel_table[h][relative_position_index(l, s)] for l < L; the row padding is 0.
void build_key_major_bias(const AttentionArgs& a, float* bias) {
  const int64_t L = a.q_len, S = a.kv_len, Lp = key_major_rows(L);
  parallel_for(0, a.heads * S, std::max<int64_t>(1, 4096 / Lp), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t h = i / S, s = i % S;
      const float* table = a.rel_table + h * a.rel_head_stride;
      float* row = bias + i * Lp;
      // relative_position_index(l, s) along l: consecutive within a grid row of l (W entries
      // of the table copied as one run), 2W - 1 further on per grid row. Element by element
      // this loop was ~20% of the core's time at Swin's last stage (24 heads, one 7 x 7 window;
      // perf, Zen 4).
      const int64_t W = a.grid_w, R = 2 * W - 1;
      const float* from = table + relative_position_index(0, s, a.grid_h, W);
      for (int64_t l = 0; l < L; l += W, from += R)
        for (int64_t j = 0; j < std::min(W, L - l); ++j) row[l + j] = from[j];
      std::fill(row + L, row + Lp, 0.0f);
    }
  });
  std::fill_n(bias + a.heads * S * Lp, kKeyMajorRowAlign, 0.0f);
}

// Whether the fused path gives its tiles the key-major bias (else the kernel looks the table up).
bool uses_key_major_bias(const AttentionArgs& a, const AttentionScratch& scratch) {
  return a.rel_table != nullptr && scratch.key_major_bias != nullptr;
}

// need_weights=false and no dropout, with a fused kernel: the flash path.
// A region mask (AttentionArgs::region: Swin's shifted windows) goes to the kernel as region
// ids, so shifted windows take the fused path as well: no [rows, S] scores per window and head.
bool fused_path(const KernelTable& k, const AttentionArgs& a) {
  return !a.need_weights && a.dropout_p == 0.0f && k.flash_attention_f32 != nullptr;
}

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Drops each of the `cols` weights of row (b, h, l) with probability p and scales the kept ones
// by 1/(1-p). The draw depends only on (seed, b, h, l, s): same result at any thread count.
void dropout_row(float* row, int64_t cols, float p, uint64_t seed, int64_t b, int64_t h,
                 int64_t l) {
  const float keep_scale = 1.0f / (1.0f - p);
  const uint64_t row_key =
      mix64(seed ^ mix64(static_cast<uint64_t>(b) * 0x9e3779b97f4a7c15ull ^
                         mix64(static_cast<uint64_t>(h) << 32 ^ static_cast<uint64_t>(l))));
  for (int64_t s = 0; s < cols; ++s) {
    const uint64_t r = mix64(row_key + static_cast<uint64_t>(s) * 0x9e3779b97f4a7c15ull);
    const double u = static_cast<double>(r >> 11) * 0x1.0p-53;
    row[s] = u < p ? 0.0f : row[s] * keep_scale;
  }
}

// The fused path's tallest query tile: the kernel streams all of K and V once per tile, so
// taller tiles move fewer bytes (T=4096: 128 -> 256 rows took the kernel from 72 to 80
// GFLOP/s). Its scratch panel is sized for this many rows.
int64_t fused_tile_max(int64_t q_len) { return std::min<int64_t>(q_len, 256); }

// True when K or V is read through a row stride wider than its head (a packed projection
// buffer) by more than one query tile per head: attention_fused_f32 then copies them head-major
// first. With q_len <= 256 (one tile per head at up to 2 threads) the kernel's own key-block
// packing reads every row once and the copy would be a second pass.
bool copies_kv_head_major(const AttentionArgs& a) {
  return (a.k_row_stride != a.head_dim || a.v_row_stride != a.v_head_dim) &&
         a.q_len > fused_tile_max(a.q_len) && a.kv_len > 0;
}

// Copies K and V into head-major contiguous [B, H, S, d] blocks, reading whole rows in order.
// Why: read in place from the packed QKV projection ([T, 3E], one key row every 6 KiB at
// E = 512), every key block the kernel packs touches 32 pages, once per 256-row tile. Measured
// with bench_attention_kernel at T = 4096, d = 64: 88.6 GFLOP/s strided against 98.0
// contiguous on one thread, and with two copies running at once (both cores) 80-85 strided
// against 97-98 contiguous: the strided reads contend for the shared L3 and the page walks.
// The copy is one sequential pass over 2/3 of the QKV buffer (~5 ms at T = 4096).
void copy_kv_head_major(const AttentionArgs& a, float* k_out, float* v_out) {
  const int64_t B = a.batch, H = a.heads, S = a.kv_len, d = a.head_dim, dv = a.v_head_dim;
  const int64_t row_floats = std::max<int64_t>(H * (d + dv), 1);
  parallel_for(0, B * S, std::max<int64_t>(1, 16384 / row_floats), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / S, s = i % S;
      const float* kr = a.k + b * a.k_batch_stride + s * a.k_row_stride;
      const float* vr = a.v + b * a.v_batch_stride + s * a.v_row_stride;
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(k_out + ((b * H + h) * S + s) * d, kr + h * a.k_head_stride,
                    static_cast<size_t>(d) * sizeof(float));
        std::memcpy(v_out + ((b * H + h) * S + s) * dv, vr + h * a.v_head_stride,
                    static_cast<size_t>(dv) * sizeof(float));
      }
    }
  });
}

// need_weights=false and no dropout: the fused kernel, one query tile of one head per task,
// never materialising [L, S]. Scratch is per chunk of tasks, sized for the largest tile.
void attention_fused_f32(const KernelTable& k, AttentionArgs a, const AttentionScratch& scratch) {
  const int64_t L = a.q_len;
  if (copies_kv_head_major(a)) {
    const int64_t k_floats = a.batch * a.heads * a.kv_len * a.head_dim;
    float* kc = scratch.kv_copy;
    copy_kv_head_major(a, kc, kc + k_floats);
    a.k = kc;
    a.v = kc + k_floats;
    a.k_batch_stride = a.heads * a.kv_len * a.head_dim;
    a.k_head_stride = a.kv_len * a.head_dim;
    a.k_row_stride = a.head_dim;
    a.v_batch_stride = a.heads * a.kv_len * a.v_head_dim;
    a.v_head_stride = a.kv_len * a.v_head_dim;
    a.v_row_stride = a.v_head_dim;
  }
  const bool key_major = uses_key_major_bias(a, scratch);
  if (key_major && !a.prepared) build_key_major_bias(a, scratch.key_major_bias);
  const int64_t key_major_stride = key_major_rows(L);
  // Keep at least ~4 tasks per thread so causal work (uneven per tile) balances.
  const int64_t heads_total = a.batch * a.heads;
  const int64_t min_tasks = 4 * static_cast<int64_t>(num_threads());
  int64_t tile = fused_tile_max(L);
  while (tile > 32 && heads_total * ((L + tile - 1) / tile) < min_tasks) tile /= 2;
  const int64_t tiles_per_head = (L + tile - 1) / tile;
  const auto run_tiles = [&](int64_t t0, int64_t t1) {
    // A panel of at least this tile's size (sized for fused_tile_max rows), 64-byte aligned.
    const WorkerScratch::Lease panel = scratch.tiles.acquire();
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / (a.heads * tiles_per_head);
      const int64_t h = (task / tiles_per_head) % a.heads;
      const int64_t l0 = (task % tiles_per_head) * tile;
      FlashAttentionTile t;
      t.rows = std::min(tile, L - l0);
      t.q_pos0 = l0;
      t.kv_len = a.kv_len;
      t.head_dim = a.head_dim;
      t.v_head_dim = a.v_head_dim;
      t.scale = a.scale;
      t.q = a.q + b * a.q_batch_stride + l0 * a.q_row_stride + h * a.q_head_stride;
      t.q_stride = a.q_row_stride;
      t.k = a.k + b * a.k_batch_stride + h * a.k_head_stride;
      t.k_stride = a.k_row_stride;
      t.v = a.v + b * a.v_batch_stride + h * a.v_head_stride;
      t.v_stride = a.v_row_stride;
      if (a.mask) {
        t.mask = a.mask + b * a.mask_batch_stride + h * a.mask_head_stride + l0 * a.mask_row_stride;
        t.mask_stride = a.mask_row_stride;
      }
      if (key_major) {
        t.key_major_bias = scratch.key_major_bias + h * a.kv_len * key_major_stride + l0;
        t.key_major_stride = key_major_stride;
      } else if (a.rel_table) {
        t.rel_table = a.rel_table + h * a.rel_head_stride;
        t.grid_h = a.grid_h;
        t.grid_w = a.grid_w;
      }
      if (a.region) {
        t.region = a.region + (b % a.region_groups) * a.q_len;
        t.region_penalty = a.region_penalty;
      }
      t.causal = a.causal;
      t.out = a.out + b * a.out_batch_stride + l0 * a.out_row_stride + h * a.out_head_stride;
      t.out_stride = a.out_row_stride;
      t.scratch = panel.as<float>();
      k.flash_attention_f32(t);
    }
  };
  // Tiles of 4M FLOPs and more (20 us and up: MultiheadAttention at T >= 128) one per chunk, so
  // that no bundle of them runs alone at the end of the loop (T = 4096, E = 512 on two threads:
  // 128-136 ms against 134-137 with parallel_for's bundles of 4); smaller ones (Swin's 7 x 7
  // windows, ~1.5 us) in parallel_for's bundles.
  const int64_t tasks = heads_total * tiles_per_head;
  if (4 * tile * a.kv_len * a.head_dim >= (int64_t{4} << 20))
    parallel_for_each(0, tasks, run_tiles);
  else
    parallel_for(0, tasks, 1, run_tiles);
}

// Keys rows l0 .. l0+rows-1 can see at all: with causal, row l sees s <= l.
int64_t visible_keys(const AttentionArgs& a, int64_t l0, int64_t rows) {
  return a.causal ? std::min(a.kv_len, l0 + rows) : a.kv_len;
}

// The materialising path for one head's query tile: p [rows, kv_vis] (row stride ldp) =
// softmax(scale q k^T + mask + bias, causal cut), dropout, then out = p v. bias_rows: scratch
// for [rows, kv_vis] floats when there is a relative-position bias. Returns kv_vis; when it is
// 0 the output rows are zeros and p is untouched.
int64_t head_tile(const KernelTable& k, const AttentionArgs& a, int64_t b, int64_t h, int64_t l0,
                  int64_t rows, float* p, int64_t ldp, float* bias_rows) {
  const int64_t S = a.kv_len, D = a.head_dim, Dv = a.v_head_dim;
  float* out = a.out + b * a.out_batch_stride + l0 * a.out_row_stride + h * a.out_head_stride;
  const int64_t kv_vis = visible_keys(a, l0, rows);
  if (kv_vis == 0) {
    for (int64_t r = 0; r < rows; ++r)
      std::memset(out + r * a.out_row_stride, 0, static_cast<size_t>(Dv) * sizeof(float));
    return 0;
  }
  const float* q = a.q + b * a.q_batch_stride + l0 * a.q_row_stride + h * a.q_head_stride;
  const float* kk = a.k + b * a.k_batch_stride + h * a.k_head_stride;
  const float* v = a.v + b * a.v_batch_stride + h * a.v_head_stride;
  // scores = scale * q k^T   [rows, kv_vis]
  k.gemm_f32(false, true, rows, kv_vis, D, a.scale, q, a.q_row_stride, kk, a.k_row_stride, 0.0f, p,
             ldp);
  const float* mask =
      a.mask ? a.mask + b * a.mask_batch_stride + h * a.mask_head_stride + l0 * a.mask_row_stride
             : nullptr;
  int64_t mask_row_stride = a.mask_row_stride;
  if (a.rel_table && !a.region) {
    // This tile's [rows, kv_vis] additive term: mask (if any) + bias, as the fused kernel.
    const float* table = a.rel_table + h * a.rel_head_stride;
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = bias_rows + r * kv_vis;
      for (int64_t s = 0; s < kv_vis; ++s) {
        const float m = mask ? mask[r * a.mask_row_stride + s] : 0.0f;
        dst[s] = m + table[relative_position_index(l0 + r, s, a.grid_h, a.grid_w)];
      }
    }
    mask = bias_rows;
    mask_row_stride = kv_vis;
  } else if (a.region) {
    // mask (if any) + bias (if any) + the region penalty between tokens of different regions.
    const float* table = a.rel_table ? a.rel_table + h * a.rel_head_stride : nullptr;
    const int32_t* region = a.region + (b % a.region_groups) * a.q_len;
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = bias_rows + r * kv_vis;
      const int32_t rl = region[l0 + r];
      for (int64_t s = 0; s < kv_vis; ++s) {
        float v = mask ? mask[r * a.mask_row_stride + s] : 0.0f;
        if (table) v += table[relative_position_index(l0 + r, s, a.grid_h, a.grid_w)];
        if (region[s] != rl) v += a.region_penalty;
        dst[s] = v;
      }
    }
    mask = bias_rows;
    mask_row_stride = kv_vis;
  }
  if (!a.causal) {
    k.softmax_rows_f32(rows, kv_vis, p, ldp, 1.0f, mask, mask_row_stride, p, ldp);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t cols = std::min(S, l0 + r + 1);
      float* row = p + r * ldp;
      k.softmax_rows_f32(1, cols, row, ldp, 1.0f, mask ? mask + r * mask_row_stride : nullptr, 0,
                         row, ldp);
      std::fill(row + cols, row + kv_vis, 0.0f);
    }
  }
  if (a.dropout_p > 0.0f)
    for (int64_t r = 0; r < rows; ++r)
      dropout_row(p + r * ldp, kv_vis, a.dropout_p, a.dropout_seed, b, h, l0 + r);
  // out = P v   [rows, Dv]
  k.gemm_f32(false, false, rows, Dv, kv_vis, 1.0f, p, ldp, v, a.v_row_stride, 0.0f, out,
             a.out_row_stride);
  return kv_vis;
}

// Weights averaged over heads ([B, L, S]): one task per (batch, query tile) runs every head
// through one scores tile and sums it into the tile's rows of the result, in head order, then
// divides by the head count (PyTorch's weights.sum(dim=1) / num_heads, bit for bit). The
// [B, H, L, S] per-head weights are never written: at B=1, T=2048, H=12 that is 192 MiB
// written, read back and summed that now stay a 512 KiB tile in L2 (averaged_tile_rows).
void attention_averaged_weights_f32(const KernelTable& k, const AttentionArgs& a,
                                    const AttentionScratch& scratch) {
  const int64_t L = a.q_len, S = a.kv_len, H = a.heads;
  // Shorter tiles when there are too few to give every thread ~4 tasks.
  const int64_t min_tasks = 4 * static_cast<int64_t>(num_threads());
  int64_t tile = averaged_tile_rows(S);
  while (tile > 16 && a.batch * ((L + tile - 1) / tile) < min_tasks) tile /= 2;
  const int64_t tiles = (L + tile - 1) / tile;
  const int64_t tile_floats = tile_scores_floats(averaged_tile_rows(S), S);
  parallel_for(0, a.batch * tiles, 1, [&](int64_t t0, int64_t t1) {
    const WorkerScratch::Lease lease = scratch.tiles.acquire();
    float* scores = lease.as<float>();
    float* bias = a.rel_table || a.region ? scores + tile_floats : nullptr;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / tiles, l0 = (task % tiles) * tile;
      const int64_t rows = std::min(tile, L - l0);
      float* avg = a.weights + (b * L + l0) * S;
      const int64_t ldp = std::max<int64_t>(visible_keys(a, l0, rows), 1);
      int64_t kv_vis = 0;
      for (int64_t h = 0; h < H; ++h) {
        kv_vis = head_tile(k, a, b, h, l0, rows, scores, ldp, bias);
        for (int64_t r = 0; r < rows && kv_vis > 0; ++r) {
          const float* src = scores + r * ldp;
          float* dst = avg + r * S;
          if (h == 0) {
            std::memcpy(dst, src, static_cast<size_t>(kv_vis) * sizeof(float));
          } else {
            for (int64_t s = 0; s < kv_vis; ++s) dst[s] += src[s];
          }
        }
      }
      const float heads = static_cast<float>(H);
      for (int64_t r = 0; r < rows; ++r) {
        float* dst = avg + r * S;
        for (int64_t s = 0; s < kv_vis; ++s) dst[s] /= heads;
        std::fill(dst + kv_vis, dst + S, 0.0f);
      }
    }
  });
}

}  // namespace

AttentionScratch attention_scratch(const Device& device, const AttentionArgs& a, Workspace& ws) {
  const KernelTable& k = device.kernels();
  AttentionScratch s;
  if (a.batch <= 0 || a.heads <= 0 || a.q_len <= 0) return s;
  const int threads = num_threads();
  if (fused_path(k, a)) {
    // The head-major K and V copy (copy_kv_head_major), then one kernel panel per worker.
    if (copies_kv_head_major(a))
      s.kv_copy = ws.take<float>(a.batch * a.heads * a.kv_len * (a.head_dim + a.v_head_dim));
    s.key_major_bias = ws.take<float>(key_major_bias_floats(a));
    const int64_t panel = k.flash_attention_scratch_floats(fused_tile_max(a.q_len), a.head_dim,
                                                           a.v_head_dim);
    s.tiles = WorkerScratch(ws, sizeof(float) * static_cast<size_t>(panel), threads);
    return s;
  }
  // A scores tile (the averaged path always; the per-head path unless the weights are the
  // output) and a bias tile of the same size with a relative-position bias.
  const bool averaged = a.need_weights && a.average_weights;
  const int64_t tile_floats = tile_scores_floats(
      averaged ? averaged_tile_rows(a.kv_len) : query_tile_rows(a.kv_len), a.kv_len);
  // The bias tile follows the scores tile (reserved even when the weights are the output, so
  // the bias is at one offset on every path). grid_h > 0: a bias table is (or will be) given.
  const bool bias = a.grid_h > 0 || a.region_groups > 0;
  const int64_t floats = bias ? 2 * tile_floats : (averaged || !a.need_weights ? tile_floats : 0);
  s.tiles = WorkerScratch(ws, sizeof(float) * static_cast<size_t>(floats), threads);
  return s;
}

void attention_prepare_f32(const Device& device, const AttentionArgs& a,
                           const AttentionScratch& scratch) {
  if (a.batch <= 0 || a.heads <= 0 || a.q_len <= 0) return;
  if (fused_path(device.kernels(), a) && uses_key_major_bias(a, scratch))
    build_key_major_bias(a, scratch.key_major_bias);
}

void attention_forward_f32(const Device& device, const AttentionArgs& a,
                           const AttentionScratch& scratch) {
  const KernelTable& k = device.kernels();
  const int64_t L = a.q_len, S = a.kv_len;
  if (a.batch <= 0 || a.heads <= 0 || L <= 0) return;
  if (fused_path(k, a)) {
    attention_fused_f32(k, a, scratch);
    return;
  }
  if (a.need_weights && a.average_weights) {
    attention_averaged_weights_f32(k, a, scratch);
    return;
  }
  const int64_t tile = query_tile_rows(S);
  const int64_t tiles_per_head = (L + tile - 1) / tile;
  const int64_t tasks = a.batch * a.heads * tiles_per_head;

  const int64_t tile_floats = tile_scores_floats(tile, S);
  parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    // One scores tile (unless the weights are the output) and one bias tile per chunk.
    const WorkerScratch::Lease lease = scratch.tiles.acquire();
    float* scores = lease.as<float>();
    float* bias = a.rel_table || a.region ? scores + tile_floats : nullptr;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / (a.heads * tiles_per_head);
      const int64_t h = (task / tiles_per_head) % a.heads;
      const int64_t l0 = (task % tiles_per_head) * tile;
      const int64_t rows = std::min(tile, L - l0);
      float* p = a.weights ? a.weights + ((b * a.heads + h) * L + l0) * S : scores;
      const int64_t ldp = a.weights ? S : std::max<int64_t>(visible_keys(a, l0, rows), 1);
      const int64_t kv_vis = head_tile(k, a, b, h, l0, rows, p, ldp, bias);
      if (a.weights)
        for (int64_t r = 0; r < rows; ++r) std::fill(p + r * ldp + kv_vis, p + r * ldp + S, 0.0f);
    }
  });
}

}  // namespace tessera

// ------------------------------------------------------------------ cached attention

namespace tessera {

namespace {

// The prompt's attention as a full forward computes it: causal over its own positions, the
// fused path.
AttentionArgs prompt_args(const CachedAttentionArgs& c) {
  AttentionArgs a = c.step;
  a.kv_len = a.q_len;
  a.causal = true;
  return a;
}

int64_t decode_blocks(int64_t keys) { return (keys + kDecodeKeyBlock - 1) / kDecodeKeyBlock; }

// Floats of one (batch, head) cache: transposed keys, then values.
int64_t head_cache_floats(const CachedAttentionArgs& c) {
  return c.capacity * (c.step.head_dim + c.step.v_head_dim);
}

// Writes the new keys (transposed) and values at positions past .. past + q_len - 1.
void append_to_cache(const CachedAttentionArgs& c) {
  const AttentionArgs& a = c.step;
  const int64_t d = a.head_dim, dv = a.v_head_dim, cap = c.capacity;
  // ~4K floats per task: a step's few hundred floats per head stay on one thread.
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(a.q_len * (d + dv), 1));
  parallel_for(0, a.batch * a.heads, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / a.heads, h = i % a.heads;
      float* kt = c.cache + i * head_cache_floats(c);
      float* v = kt + d * cap;
      for (int64_t t = 0; t < a.q_len; ++t) {
        const int64_t s = c.past + t;
        const float* kr = a.k + b * a.k_batch_stride + t * a.k_row_stride + h * a.k_head_stride;
        const float* vr = a.v + b * a.v_batch_stride + t * a.v_row_stride + h * a.v_head_stride;
        for (int64_t j = 0; j < d; ++j) kt[j * cap + s] = kr[j];
        std::memcpy(v + s * dv, vr, static_cast<size_t>(dv) * sizeof(float));
      }
    }
  });
}

// Partial results per (batch, head), query row of a pass and block: the m of every block, their
// l, then their o (decode_attention_merge_f32 reads m and l as arrays).
int64_t partial_floats(const CachedAttentionArgs& c) { return 2 + c.step.v_head_dim; }

// Query rows per pass of the decode kernel: a step has one; a chunk of new positions after a
// cache (appended text) takes up to 16 at a time, so each 256-key block of K and V (128 KB at
// d = 64) is read from memory once per 16 rows and from L2 for the other 15.
int64_t rows_per_pass(const CachedAttentionArgs& c) {
  return std::min<int64_t>(kDecodeRowsPerPass, c.step.q_len);
}

}  // namespace

int64_t cached_attention_cache_floats(int64_t batch, int64_t heads, int64_t head_dim,
                                      int64_t v_head_dim, int64_t capacity) {
  return batch * heads * capacity * (head_dim + v_head_dim);
}

CachedAttentionScratch cached_attention_scratch(const Device& device,
                                                const CachedAttentionArgs& c, Workspace& ws) {
  const AttentionArgs& a = c.step;
  CachedAttentionScratch s;
  if (a.batch <= 0 || a.heads <= 0 || a.q_len <= 0) return s;
  s.prefill = attention_scratch(device, prompt_args(c), ws);
  s.partial = ws.take<float>(a.batch * a.heads * rows_per_pass(c) * decode_blocks(c.capacity) *
                             partial_floats(c));
  s.scores = WorkerScratch(ws, sizeof(float) * kDecodeKeyBlock, num_threads());
  return s;
}

void cached_attention_f32(const Device& device, const CachedAttentionArgs& c,
                          const CachedAttentionScratch& scratch) {
  const AttentionArgs& a = c.step;
  if (a.batch <= 0 || a.heads <= 0 || a.q_len <= 0) return;
  append_to_cache(c);
  if (c.past == 0) {
    attention_forward_f32(device, prompt_args(c), scratch.prefill);
    return;
  }
  const KernelTable& k = device.kernels();
  const int64_t heads_total = a.batch * a.heads, pf = partial_floats(c);
  const int64_t max_blocks = decode_blocks(c.capacity), pass = rows_per_pass(c);
  // Per (batch, head) and row of the pass: its blocks' m, l and o.
  const int64_t row_floats = max_blocks * pf;
  // Rows t0 .. t0 + rows - 1 per pass: their (batch, head, block) items in parallel, each running
  // the block for every row of the pass that sees it, then each row's blocks merged in block
  // order. A row's blocks and merge are those of a one-row step, so a chunk of new positions
  // gives the bits that stepping through them one at a time gives.
  for (int64_t t0 = 0; t0 < a.q_len; t0 += pass) {
    const int64_t rows = std::min(pass, a.q_len - t0);
    const int64_t blocks = decode_blocks(c.past + t0 + rows);  // of the pass's last row
    parallel_for(0, heads_total * blocks, 1, [&](int64_t i0, int64_t i1) {
      const WorkerScratch::Lease scores = scratch.scores.acquire();
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t bh = i / blocks, blk = i % blocks;
        const int64_t b = bh / a.heads, h = bh % a.heads;
        const float* kt = c.cache + bh * head_cache_floats(c);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = t0 + r, keys = c.past + t + 1;
          const int64_t key_begin = blk * kDecodeKeyBlock;
          if (key_begin >= keys) continue;  // past this row's last key: not merged for it
          float* part = scratch.partial + (bh * pass + r) * row_floats;
          DecodeAttentionBlock db;
          db.head_dim = a.head_dim;
          db.v_head_dim = a.v_head_dim;
          db.key_begin = key_begin;
          db.key_end = std::min(keys, key_begin + kDecodeKeyBlock);
          db.scale = a.scale;
          db.q = a.q + b * a.q_batch_stride + t * a.q_row_stride + h * a.q_head_stride;
          db.kt = kt;
          db.kt_stride = c.capacity;
          db.v = kt + a.head_dim * c.capacity;
          db.v_stride = a.v_head_dim;
          db.scores = scores.as<float>();
          db.m = part + blk;
          db.l = part + max_blocks + blk;
          db.o = part + 2 * max_blocks + blk * a.v_head_dim;
          k.decode_attention_block_f32(db);
        }
      }
    });
    parallel_for(0, heads_total * rows, 4, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t bh = i / rows, r = i % rows, t = t0 + r;
        const int64_t b = bh / a.heads, h = bh % a.heads;
        const float* part = scratch.partial + (bh * pass + r) * row_floats;
        k.decode_attention_merge_f32(
            decode_blocks(c.past + t + 1), a.v_head_dim, part, part + max_blocks,
            part + 2 * max_blocks, a.v_head_dim,
            a.out + b * a.out_batch_stride + t * a.out_row_stride + h * a.out_head_stride);
      }
    });
  }
}

}  // namespace tessera
