// linear_f32: y = x w^T + bias, the projections' GEMM (x [m, k], w [n, k], both rows along k).
// Two kernels: a model's own weights, packed once at load into 16-feature panels ("prepacked
// weights" below, what the models run), and weights read in place (the C++ layers, tied
// weights), described first.
//
// Computed transposed, as y^T = w x^T: the micro-kernel broadcasts weights and keeps rows of x
// in vector lanes. So the operand that is packed (transposed into panels) is x, not w:
//   - x is small where packing costs most (T = 128 at D = 512: 64 K floats against w's 786 K
//     for the QKV projection), and it is packed once per call, shared by every thread;
//   - w is read in place, row by row (sequential, prefetch-friendly), never copied.
// OpenBLAS packs w on every call and on every thread (the row split gives each worker the whole
// weight): at T = 128 its copy routines took 16% of MultiheadAttention's time (perf).
//
// Packed x: panels of kPanel = 32 rows; panel p holds xp[p][kk][j] = x[32 p + j][kk] (zero rows
// past m). Micro-kernel: kRows weight rows (output features n0 .. n0+kRows-1) x one panel (32
// rows of x). AVX-512: 12 x 2 vectors = 24 accumulators + 2 panel vectors + 1 broadcast of 32
// registers; per kk, 2 aligned loads and 12 broadcasts feed 24 FMAs. Each output element is one
// FMA chain over kk = 0 .. k-1 in order, however the work is split over threads: results do not
// depend on the thread count.
//
// Why these sizes (L1d 32 KiB, L2 1 MiB per core here): a panel of x is 32 k floats (64 KiB at
// k = 512) and is read from L2; the 12 weight rows being broadcast (24 KiB at k = 512) stay in
// L1 while the task's panels pass under them (layers/linear.cpp sizes tasks for that). 64-row
// panels x 6 weight rows (4 loads + 6 broadcasts per 24 FMAs instead of 2 + 12) measured the
// same within noise (bench_kernels, 3 runs each) and waste more rows on short inputs.
// Measured against OpenBLAS (Cooperlake kernels) in benchmarks/bench_kernels; the numbers are in
// layers/linear.cpp, which picks between the two.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/linear_f32.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backends/cpu/cpu_kernels.h"
#include "core/simd_tail-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr size_t kPanel = static_cast<size_t>(cpu::kLinearPanelRows);
constexpr size_t kLanes = hn::MaxLanes(DF());
constexpr size_t kPanelVecs = kPanel / kLanes;
static_assert(kPanel % kLanes == 0, "a panel is a whole number of vectors");
// Weight rows per tile: accumulators kRows x kPanelVecs within the register file (32 on
// AVX-512, 16 on AVX2/SSE4) with room for the operands.
// AVX-512: 12 x 2 = 24; AVX2: 3 x 4 = 12; SSE4 (8 vectors per panel) and SCALAR: one row.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kRows = 12;
#elif HWY_TARGET == HWY_AVX2
constexpr size_t kRows = 3;
#else
constexpr size_t kRows = 1;
#endif

// acc[i][v] = sum_kk w[i][kk] * xp[kk][v lanes], then y[row j][n0 + i] = acc + bias.
void Tile(const float* HWY_RESTRICT xp, size_t k, const float* const* w, size_t valid_rows,
          size_t valid_n, const float* bias, int64_t n0, float* y, int64_t ldy) {
  const DF d;
  VF acc[kRows][kPanelVecs];
  for (size_t i = 0; i < kRows; ++i)
    for (size_t v = 0; v < kPanelVecs; ++v) acc[i][v] = hn::Zero(d);
  for (size_t kk = 0; kk < k; ++kk) {
    VF xv[kPanelVecs];
    for (size_t v = 0; v < kPanelVecs; ++v) xv[v] = hn::Load(d, xp + kk * kPanel + v * kLanes);
    for (size_t i = 0; i < kRows; ++i) {
      const VF wb = hn::Set(d, w[i][kk]);
      for (size_t v = 0; v < kPanelVecs; ++v) acc[i][v] = hn::MulAdd(wb, xv[v], acc[i][v]);
    }
  }
  // Transposed write: lane j of acc[i] is y[j][n0 + i].
  HWY_ALIGN float tile[kRows][kPanel];
  for (size_t i = 0; i < kRows; ++i) {
    const VF b = hn::Set(d, bias && i < valid_n ? bias[n0 + static_cast<int64_t>(i)] : 0.0f);
    for (size_t v = 0; v < kPanelVecs; ++v)
      hn::Store(hn::Add(acc[i][v], b), d, tile[i] + v * kLanes);
  }
  for (size_t j = 0; j < valid_rows; ++j) {
    float* HWY_RESTRICT out = y + static_cast<int64_t>(j) * ldy + n0;
    for (size_t i = 0; i < valid_n; ++i) out[i] = tile[i][j];
  }
}

// ---------------------------------------------------------------- few rows (decoding)
// y[r][j] = x[r] . w[j] for R rows of x and J weight rows at a time: R*J vector accumulators
// (R = 1, 2: J = 4; R = 3, 4: J = 2, at most 8 of the 16 AVX2 registers), the weight rows
// streamed once, in order; each lane sums every Lanes()-th product, then the lanes are summed.
// The order depends on k only, not on how the features are split over threads.
template <size_t R, size_t J>
void MatvecGroup(size_t k, const float* const* x, const float* const* w, float (*out)[J]) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
  VF acc[R][J];
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < J; ++j) acc[r][j] = hn::Zero(d);
  size_t kk = 0;
  for (; kk + lanes <= k; kk += lanes) {
    VF wv[J];
    for (size_t j = 0; j < J; ++j) wv[j] = hn::LoadU(d, w[j] + kk);
    for (size_t r = 0; r < R; ++r) {
      const VF xv = hn::LoadU(d, x[r] + kk);
      for (size_t j = 0; j < J; ++j) acc[r][j] = hn::MulAdd(xv, wv[j], acc[r][j]);
    }
  }
  if (kk < k) {
    VF wv[J];
    for (size_t j = 0; j < J; ++j) wv[j] = LoadTail(d, w[j] + kk, k - kk, 0.0f);
    for (size_t r = 0; r < R; ++r) {
      const VF xv = LoadTail(d, x[r] + kk, k - kk, 0.0f);
      for (size_t j = 0; j < J; ++j) acc[r][j] = hn::MulAdd(xv, wv[j], acc[r][j]);
    }
  }
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < J; ++j) out[r][j] = hn::GetLane(hn::SumOfLanes(d, acc[r][j]));
}

template <size_t R>
void MatvecRows(int64_t k, const float* const* x, const float* w, int64_t ldw, int64_t n0,
                int64_t n1, const float* bias, float* const* y) {
  constexpr size_t J = R <= 2 ? 4 : 2;
  for (int64_t n = n0; n < n1; n += static_cast<int64_t>(J)) {
    const size_t valid = static_cast<size_t>(std::min<int64_t>(J, n1 - n));
    // Rows past n1 repeat the last one (valid memory); their results are dropped.
    const float* wr[J];
    for (size_t j = 0; j < J; ++j) wr[j] = w + std::min(n + static_cast<int64_t>(j), n1 - 1) * ldw;
    float out[R][J];
    MatvecGroup<R, J>(static_cast<size_t>(k), x, wr, out);
    for (size_t r = 0; r < R; ++r)
      for (size_t j = 0; j < valid; ++j)
        y[r][n + static_cast<int64_t>(j)] =
            out[r][j] + (bias ? bias[n + static_cast<int64_t>(j)] : 0.0f);
  }
}

}  // namespace

void LinearMatvecF32(int64_t m, int64_t k, const float* x, int64_t ldx, const float* w,
                     int64_t ldw, int64_t n0, int64_t n1, const float* bias, float* y,
                     int64_t ldy) {
  const float* xr[cpu::kLinearMatvecRows];
  float* yr[cpu::kLinearMatvecRows];
  for (int64_t r = 0; r < m; ++r) {
    xr[r] = x + r * ldx;
    yr[r] = y + r * ldy;
  }
  switch (m) {
    case 1: MatvecRows<1>(k, xr, w, ldw, n0, n1, bias, yr); break;
    case 2: MatvecRows<2>(k, xr, w, ldw, n0, n1, bias, yr); break;
    case 3: MatvecRows<3>(k, xr, w, ldw, n0, n1, bias, yr); break;
    default: MatvecRows<4>(k, xr, w, ldw, n0, n1, bias, yr); break;
  }
}

void LinearPackF32(int64_t m, int64_t k, const float* x, int64_t ldx, int64_t p0, int64_t p1,
                   float* packed) {
  for (int64_t p = p0; p < p1; ++p) {
    float* HWY_RESTRICT dst = packed + p * k * static_cast<int64_t>(kPanel);
    for (size_t j = 0; j < kPanel; ++j) {
      const int64_t r = p * static_cast<int64_t>(kPanel) + static_cast<int64_t>(j);
      if (r < m) {
        const float* HWY_RESTRICT src = x + r * ldx;
        for (int64_t kk = 0; kk < k; ++kk) dst[kk * static_cast<int64_t>(kPanel) + j] = src[kk];
      } else {
        for (int64_t kk = 0; kk < k; ++kk) dst[kk * static_cast<int64_t>(kPanel) + j] = 0.0f;
      }
    }
  }
}

void LinearPackedF32(int64_t m, int64_t k, const float* packed, int64_t p0, int64_t p1,
                     const float* w, int64_t ldw, int64_t n0, int64_t n1, const float* bias,
                     float* y, int64_t ldy) {
  const int64_t panel = static_cast<int64_t>(kPanel), rows = static_cast<int64_t>(kRows);
  for (int64_t n = n0; n < n1; n += rows) {
    const size_t valid_n = static_cast<size_t>(std::min(rows, n1 - n));
    // Rows past n1 repeat the last one (valid memory); their results are never stored.
    const float* wr[kRows];
    for (size_t i = 0; i < kRows; ++i)
      wr[i] = w + std::min(n + static_cast<int64_t>(i), n1 - 1) * ldw;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = p * panel;
      const size_t valid_rows = static_cast<size_t>(std::min(panel, m - r0));
      Tile(packed + p * k * panel, static_cast<size_t>(k), wr, valid_rows, valid_n, bias, n,
           y + r0 * ldy, ldy);
    }
  }
}

// ---------------------------------------------------------------- prepacked weights
// A layer's own weights, packed once at load into panels of kWeightPanel = 16 output features:
// panel q holds wp[q][kk][j] = w[16 q + j][kk] (zeros past n). The layout is the same on every
// target; only the tile differs. Micro-kernel: kTileRows rows of x (broadcast, read in place)
// times kTilePanels panels (loaded as vectors). A column tile's depth slice (on AVX2 one panel x
// DepthBlock() steps: half the L1d, or 768 steps in L2 where the L2 is 1 MiB or more; on
// AVX-512 three panels x ~768 steps, in L2) stays while every row tile of the task passes over
// it, and x comes from L2 at one float per row per step.
// This is the GotoBLAS/MLAS arrangement; the x-panel kernel loads 32 x floats per step from L2
// for 3 weight rows on AVX2, and waits on those loads.
// Each output element is one FMA chain over kk = 0 .. k-1 in order (a depth block's partial
// sums go through y), bias added last: the result does not depend on how rows and columns are
// split, and equals the x-panel kernel's bit for bit.
// Measured on Zen 3 (AVX2, one thread, interleaved runs, % of the FMA loop): 197 x 2304 x 768
// 85 vs 70, 512 x 8192 x 512 81 vs 66, 3136 x 288 x 96 87 vs 70 (OpenBLAS); the two
// prefetches below (the next slice of weights, the next tile's y rows) are worth 5-9 points of
// that. benchmarks/results/2026-12-02-zen3-avx2-projections-prepacked.txt.
constexpr size_t kWeightPanel = static_cast<size_t>(cpu::kLinearWeightPanel);
constexpr size_t kWVecs = kWeightPanel / kLanes;
static_assert(kWeightPanel % kLanes == 0, "a weight panel is a whole number of vectors");
// Accumulators kTileRows x kTilePanels x kWVecs: AVX-512 8 x 3 x 1 = 24 (3 loads + 8 broadcasts
// per 24 FMAs); AVX2 6 x 1 x 2 = 12 (2 + 6 per 12); SSE4 3 x 1 x 4 = 12; SCALAR 1 x 1 x 16.
// kStreamWeights: the tile's weights stream from L2, each step prefetching its own streams
// ahead (AVX-512). AVX2's 768-step slices also stream from L2 where its L2 allows them
// (DepthBlock), without that prefetch: 32 steps ahead measured level to 9% slower there.
// Depth blocks of DepthBlock() steps either way.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kTileRows = 8, kTilePanels = 3;
constexpr bool kStreamWeights = true;
#elif HWY_TARGET == HWY_AVX2
constexpr size_t kTileRows = 6, kTilePanels = 1;
constexpr bool kStreamWeights = false;
#elif HWY_TARGET == HWY_SCALAR
constexpr size_t kTileRows = 1, kTilePanels = 1;
constexpr bool kStreamWeights = false;
#else
constexpr size_t kTileRows = 3, kTilePanels = 1;
constexpr bool kStreamWeights = false;
#endif
constexpr size_t kTileCols = kTilePanels * kWeightPanel;

// The depth block. AVX-512 (slices streamed from L2): from the L1d, whose half holds a row
// tile's x slice (kTileRows x kc floats), the rest for the weight streams' lines in flight. Zen 4
// (32 KiB): 512 steps; Zen 5 (48 KiB): 768. Chosen when the row tile was the outer loop and its
// x slice stayed in L1 across the column tiles; there, against 512, one thread, bench_linear
// --cold (alternating, 2 rounds): 197x2304x768 200-202 -> 205-206 GFLOP/s, 197x768x3072 201-202
// -> 204-206, 512x512x2048 199-201 -> 202-204; 1024 no better, worse at k = 2048. With the
// column tile outside (LinearPanelsF32), one run of each, 2 rounds: 512 was 2-9% slower at
// 197x3072x768 and 49x2304x768, 1024 and one block for all of k level with 768 within the drift.
// SSE4, SCALAR: the slice (kTileCols floats per step) in half the L1d, 256 steps at 32 KiB.
// AVX2: the largest multiple of 256 steps, up to 768, whose x slice of a full row block
// (cpu::kLinearPanelRowBlock rows) fits 3/4 of the L2, and never less than the L1d rule above
// (256 steps at 32 KiB, 384 at 48). 1 MiB and more (Zen 4, Zen 5, Intel's cores since Tiger
// Lake): 768, k = 768 and 512 in one block; the slice (48 KiB) then streams from L2 like
// AVX-512's. 512 KiB (Zen 2, Zen 3) or 256 (Skylake's clients): 256 steps, as before, where
// Zen 3's 240 x 256 block and the y strips already filled the L2. Every depth block costs each
// row tile its accumulators in and out, its output prefetch and a restart. Zen 4, AVX2,
// bench_linear --cold, one thread, pinned, 3 rounds alternating, GFLOP/s (probe ~117) 256 ->
// 768 steps:
// 197x3072x768 102.7-103.2 -> 108.1-108.8, 128x2048x512 99.4-100.7 -> 105.6-106.5, 512x8192x512
// 96.5-97.1 -> 105.3-106.0, 49x768x3072 level; 512 steps 1-3% below 768, 1024 level with it.
// Whole models, AVX2, one thread, pinned, alternating processes, ms medians: vit_b_16
// 351.6-369.8 -> 334.6-353.2, swin_t 98.3-101.1 -> 94.4-98.3, nn.Transformer 116.7-118.7 ->
// 112.9-114.1, gpt 255.2-260.7 -> 247.5-249.9; two threads 2-3% (fastest calls). On the Xeon
// family 6 model 207 (48 KiB, 2 MiB) 384, 512 and 768 measured level (session 38).
// benchmarks/results/2026-12-07-zen4-session43-changes.txt.
size_t DepthBlock() {
  static const size_t block = [] {
    const size_t half_l1d = cpu::l1d_cache_bytes() / 2;
    if constexpr (kStreamWeights)
      return std::clamp<size_t>(half_l1d / (kTileRows * sizeof(float)) / 64 * 64, 256, 1024);
    const size_t in_l1 =
        std::clamp<size_t>(half_l1d / (kTileCols * sizeof(float)) / 16 * 16, 128, 1024);
    if constexpr (HWY_TARGET != HWY_AVX2) return in_l1;
    const size_t x_block_steps = cpu::l2_cache_bytes() * 3 / 4 /
                                 (static_cast<size_t>(cpu::kLinearPanelRowBlock) * sizeof(float));
    return std::max(in_l1, std::min<size_t>(x_block_steps / 256 * 256, 768));
  }();
  return block;
}

int64_t LinearPanelTileColsF32() { return static_cast<int64_t>(kTileCols); }

// One tile over depth kk = 0 .. kc - 1 (x and wp already offset to the block): y[r][c] (+)=
// sum x[r][kk] wp[c][kk] for ROWS rows and `cols` columns (<= the tile's), then + bias[c] when
// bias is given (the last block). A partial column tile computes on clamped panels and stores
// only its own columns. ROWS: the tile's height, kTileRows but for a task's last rows
// (PanelTileOf below).
// AVX-512 (weights streamed from L2): a slice's first row tile reads it from memory in a model
// (hundreds of MB of them; they do not stay in the L3 between calls), three panel streams the
// hardware prefetcher alone kept ~6 GB/s short of the FMAs. Each step also prefetches 32 steps
// (2 KiB) ahead in every stream: bench_linear --cold, two threads, 128x2048x512 0.656 -> 0.626
// ms, 128x512x2048 0.660 -> 0.638; weights in cache unchanged. 96 steps measured the same, 256
// worse.
constexpr size_t kWeightPrefetchSteps = kStreamWeights ? 32 : 0;

// Lines of the slice that runs after this one, pulled in by a tile (LinearPanelsF32 says which
// and why): line i >> shift of `panel` at each step i < steps, so one line every 2^shift steps.
// Into the L2 (prefetcht1) where a slice lives there (more than half the L1d: AVX-512's 96-144
// KiB, AVX2's 48 KiB at 768 steps); into L1 (prefetcht0) where it lives in L1 (AVX2's 16-24 KiB
// at 256-384 steps). On AVX2 with L1 slices, prefetcht1 measured 0-8% slower than the bursts of
// prefetcht0 this replaced at two threads (bench_linear --cold --target AVX2, Zen 5), prefetcht0
// level with them; with 768-step slices (Zen 4) prefetcht1 level to 2% faster than prefetcht0.
struct NextLines {
  const float* panel = nullptr;
  size_t steps = 0;
  size_t shift = 0;
  bool into_l2 = false;
};

// The tile's rows: row .. row + ROWS - 1 of x from step k0 on and of y from column c0 on. x and
// y by reference: by value (24 bytes each, on the stack) every tile call stored them in 8-byte
// halves and a callee read them back 16 bytes at a time, a failed store-to-load forwarding that
// showed as ~1% of swin_t's samples (perf, Zen 4, AVX2).
template <size_t ROWS, size_t PANELS>
void PanelTileRows(const RowsInF32& x, int64_t row, int64_t k0, const float* wp,
                   int64_t panel_stride, size_t kc, size_t cols, bool first, const float* bias,
                   const RowsOutF32& yrows, int64_t c0, const NextLines& next) {
  const DF d;
  const size_t panels = (cols + kWeightPanel - 1) / kWeightPanel;
  const float* xr[ROWS];
  float* y[ROWS];
  for (size_t r = 0; r < ROWS; ++r) {
    xr[r] = x.row(row + static_cast<int64_t>(r)) + k0;
    y[r] = yrows.row(row + static_cast<int64_t>(r)) + c0;
  }
  const float* wq[PANELS];
  for (size_t q = 0; q < PANELS; ++q)
    wq[q] = wp + static_cast<int64_t>(std::min(q, panels - 1)) * panel_stride;
  const bool full = cols == PANELS * kWeightPanel;
  HWY_ALIGN float edge[ROWS][PANELS * kWeightPanel];
  if (!full && !first)
    for (size_t r = 0; r < ROWS; ++r)
      std::memcpy(edge[r], y[r], cols * sizeof(float));
  VF acc[ROWS][PANELS][kWVecs];
  for (size_t r = 0; r < ROWS; ++r)
    for (size_t q = 0; q < PANELS; ++q)
      for (size_t v = 0; v < kWVecs; ++v) {
        const size_t c = q * kWeightPanel + v * kLanes;
        acc[r][q][v] = first  ? hn::Zero(d)
                       : full ? hn::LoadU(d, y[r] + c)
                              : hn::Load(d, edge[r] + c);
      }
  // The steps that also prefetch a line of the next slice (the first next.steps) run as a loop
  // of their own, then the rest: with one loop testing kk < next.steps at every step, GCC kept
  // the accumulators on the stack through part of it (FMAs on stack operands at k = 96;
  // bench_linear --cold --target AVX2, Zen 4, 4 rounds: 3136x384x96 93.2-99.6 -> 98.9-100.3
  // GFLOP/s, the other shapes and AVX-512 level).
  // AVX2 steps unrolled by 4: on Intel cores the loop's own adds and compare share ports 0
  // and 1 with the 12 FMAs of a step; unrolled, they come once per 4 steps. Xeon family 6
  // model 207 (Raptor Cove), bench_linear --cold --target AVX2, one thread: 197x2304x768
  // 76.9 -> 81.8 GFLOP/s (85.6% of the probe), 512x8192x512 75.1 -> 79.3; forced-AVX2 models
  // 2-8% faster. On AVX-512 the same unroll measured level or 1-3% slower (not taken).
  // benchmarks/results/2026-12-06-xeon-session30-changes.txt.
  const auto step = [&](size_t kk) HWY_ATTR {
    if constexpr (kWeightPrefetchSteps > 0)
      for (size_t q = 0; q < PANELS; ++q)
        __builtin_prefetch(wq[q] + (kk + kWeightPrefetchSteps) * kWeightPanel);
    VF wv[PANELS][kWVecs];
    for (size_t q = 0; q < PANELS; ++q)
      for (size_t v = 0; v < kWVecs; ++v)
        wv[q][v] = hn::Load(d, wq[q] + kk * kWeightPanel + v * kLanes);
    for (size_t r = 0; r < ROWS; ++r) {
      const VF xb = hn::Set(d, xr[r][kk]);
      for (size_t q = 0; q < PANELS; ++q)
        for (size_t v = 0; v < kWVecs; ++v) acc[r][q][v] = hn::MulAdd(xb, wv[q][v], acc[r][q][v]);
    }
  };
  const size_t pf_steps = std::min(next.steps, kc);
  size_t kk = 0;
  if (next.into_l2) {
    for (; kk < pf_steps; ++kk) {
      __builtin_prefetch(next.panel + (kk >> next.shift) * kWeightPanel, 0, 2);
      step(kk);
    }
  } else {
    for (; kk < pf_steps; ++kk) {
      __builtin_prefetch(next.panel + (kk >> next.shift) * kWeightPanel, 0, 3);
      step(kk);
    }
  }
#if HWY_TARGET == HWY_AVX2
#pragma GCC unroll 4
#endif
  for (; kk < kc; ++kk) step(kk);
  if (full) {
    for (size_t r = 0; r < ROWS; ++r)
      for (size_t q = 0; q < PANELS; ++q)
        for (size_t v = 0; v < kWVecs; ++v) {
          const size_t c = q * kWeightPanel + v * kLanes;
          VF out = acc[r][q][v];
          if (bias) out = hn::Add(out, hn::LoadU(d, bias + c));
          hn::StoreU(out, d, y[r] + c);
        }
    return;
  }
  for (size_t r = 0; r < ROWS; ++r)
    for (size_t q = 0; q < PANELS; ++q)
      for (size_t v = 0; v < kWVecs; ++v)
        hn::Store(acc[r][q][v], d, edge[r] + q * kWeightPanel + v * kLanes);
  for (size_t r = 0; r < ROWS; ++r) {
    float* HWY_RESTRICT out = y[r];
    for (size_t c = 0; c < cols; ++c) out[c] = bias ? edge[r][c] + bias[c] : edge[r][c];
  }
}

// A tile of exactly `rows` <= kTileRows rows and PANELS weight panels, one instantiation per
// height: a task's last rows (197 = 24 x 8 + 5 for vit_b_16) run as one tile of their own
// height rather than 4 + 1, whose 1-row tile has 3 accumulators for 2 FMA pipes of latency 4
// and ran at ~3/8 of the full tile's rate. Each element is the same FMA chain whatever the
// tile's height, so this changes no result bit.
template <size_t PANELS, size_t H = kTileRows>
void PanelTileOf(const RowsInF32& x, int64_t row, int64_t k0, const float* wp,
                 int64_t panel_stride, size_t kc, size_t rows, size_t cols, bool first,
                 const float* bias, const RowsOutF32& y, int64_t c0, const NextLines& next) {
  if constexpr (H > 1) {
    if (rows < H)
      return PanelTileOf<PANELS, H - 1>(x, row, k0, wp, panel_stride, kc, rows, cols, first,
                                        bias, y, c0, next);
  }
  PanelTileRows<H, PANELS>(x, row, k0, wp, panel_stride, kc, cols, first, bias, y, c0, next);
}

// The height of the row tile that starts `left` rows before the end of a task.
// AVX2 (one panel of 2 vectors: 2 accumulators per row): rows dealt out evenly over the fewest
// tiles, so that no tile is shorter than it must be: 128 = 18 x 6 + 4 x 5, not 20 x 6 + 2 x 4;
// 49 = 4 x 6 + 5 x 5, not 7 x 6 + 4 + 3. A 4-row tile has 8 chains for 2 FMA pipes of latency
// 4, no slack: in nn.Transformer (128 rows) its 6% of the rows took 6.4% of the time against
// 83.4% for the other 94%, 15% slower per row (perf, Xeon family 6 model 207). bench_linear
// --cold --target AVX2, one thread, 3 rounds alternating, same binary, that Xeon, medians:
// 128x1536x512 2.48 -> 2.45 ms, 128x512x2048 3.35 -> 3.27, 49x3072x768 2.99 -> 2.91,
// 49x768x3072 2.98 -> 2.92.
// Elsewhere (AVX-512's 8 x 3 tile, SSE4: 3 or more accumulators per row) full tiles first, and
// a remainder shorter than kMinTileRows (fewer than 8 chains) is taken with the last full tile
// as two tiles of about half (Swin-T's last stage: 49 = 5 x 8 + 5 + 4, not 6 x 8 + 1). Rows
// dealt out evenly there measured level to 5% slower (AVX-512, 49x3072x768: 7-row tiles 1.84
// against 1.74 ms).
constexpr bool kBalancedRowTiles = kTilePanels * kWVecs == 2;
constexpr size_t kMinTileRows =
    std::max<size_t>(1, (8 + kTilePanels * kWVecs - 1) / (kTilePanels * kWVecs));
size_t RowTileHeight(int64_t left) {
  const size_t rows = static_cast<size_t>(left);
  if constexpr (kBalancedRowTiles) {
    const size_t tiles = (rows + kTileRows - 1) / kTileRows;
    return (rows + tiles - 1) / tiles;
  }
  if (rows > kTileRows && rows < kTileRows + kMinTileRows) return (rows + 1) / 2;
  return std::min(rows, kTileRows);
}

// A column tile of `cols` <= kTileCols features. On AVX-512 a last tile of one or two panels
// (512 features are 10 tiles of 48 and one of 32) runs as a tile that wide instead of the
// clamped three-panel one, which computed a third of it for nothing: 3% of every projection to
// 512 features (nn.Transformer's and the gpt recipe's out-projections and fc2). Same FMA chains,
// same bits.
// Rows row .. row + rows - 1 of x from step k0 on, of y from column c0 on.
void PanelTile(const RowsInF32& x, int64_t row, int64_t k0, const float* wp,
               int64_t panel_stride, size_t kc, size_t rows, size_t cols, bool first,
               const float* bias, const RowsOutF32& y, int64_t c0, const NextLines& next) {
  if constexpr (kTilePanels == 3) {
    const size_t panels = (cols + kWeightPanel - 1) / kWeightPanel;
    if (panels == 2)
      return PanelTileOf<2>(x, row, k0, wp, panel_stride, kc, rows, cols, first, bias, y, c0,
                            next);
    if (panels == 1)
      return PanelTileOf<1>(x, row, k0, wp, panel_stride, kc, rows, cols, first, bias, y, c0,
                            next);
  }
  PanelTileOf<kTilePanels>(x, row, k0, wp, panel_stride, kc, rows, cols, first, bias, y, c0,
                           next);
}

void LinearPackWeightsF32(int64_t n, int64_t k, const float* w, int64_t ldw, int64_t q0,
                          int64_t q1, float* wp) {
  const int64_t panel = static_cast<int64_t>(kWeightPanel);
  // Step by step, all 16 rows at a time: the panel is written front to back, one whole line per
  // step, from 16 sequential read streams (writing row by row instead strides 64 bytes per
  // store across k lines, which for k = 768 no longer fit L1: vit_b_16's load took ~3x longer).
  for (int64_t q = q0; q < q1; ++q) {
    float* HWY_RESTRICT dst = wp + q * k * panel;
    // Rows past n read one zero over and over (step 0), so the inner loop has no branch.
    static const float kZero = 0.0f;
    const float* src[kWeightPanel];
    int64_t inc[kWeightPanel];
    for (int64_t j = 0; j < panel; ++j) {
      const int64_t row = q * panel + j;
      src[j] = row < n ? w + row * ldw : &kZero;
      inc[j] = row < n ? 1 : 0;
    }
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t j = 0; j < panel; ++j) dst[kk * panel + j] = src[j][kk * inc[j]];
  }
}

void LinearPanelsF32(int64_t k, RowsInF32 x, int64_t r0, int64_t r1, const float* wp, int64_t n,
                     int64_t c0, int64_t c1, int64_t next_c0, int64_t next_c1, const float* bias,
                     RowsOutF32 y) {
  const int64_t tile_rows = static_cast<int64_t>(kTileRows);
  const int64_t tile_cols = static_cast<int64_t>(kTileCols);
  const int64_t panel = static_cast<int64_t>(kWeightPanel);
  const int64_t panel_stride = k * panel;
  c1 = std::min(c1, n);
  next_c1 = std::min(next_c1, n);
  // Depth blocks of equal size (to 16 steps: k = 2048 at 768 is 688 + 688 + 672, not
  // 768 + 768 + 512), at most DepthBlock().
  const int64_t max_block = static_cast<int64_t>(DepthBlock());
  const int64_t blocks = (k + max_block - 1) / max_block;
  const int64_t block = ((k + blocks - 1) / blocks + 15) / 16 * 16;
  // Within a depth block, column tile outside, row tile inside: the tile's slice of weights
  // (kTilePanels panels x kc steps: on AVX2 16-24 KiB in L1 at 256-384 steps, 48 KiB in L2 at
  // 768; 144 KiB at 768 steps on AVX-512, in L2) is read by every row tile, x comes from L2 one
  // row tile at a time.
  // A slice's first row tile reads it from memory (a model's weights, hundreds of MB, do not
  // stay in the L3 between calls): on AVX-512, 3 lines per 24 FMAs, more than one core's
  // demand misses deliver, so that row tile waited on memory. So each later row tile's tile
  // call also pulls one panel of the next slice (the next column tile's, else the next depth
  // block's first, else that of the caller's next columns [next_c0, next_c1)), one line per
  // step: the next slice arrives spread over this one's row tiles instead of all at once.
  // AVX-512, Zen 5, bench_linear --cold against the build before (row tile outside, task's
  // column tiles inside, no such prefetch), A B B A x 3, mean ms: one thread 128x2048x512
  // 1.405 -> 1.302, 128x512x2048 1.376 -> 1.341, 128x512x512 0.339 -> 0.324, 197x3072x768
  // 4.719 -> 4.563, 512 rows level; two threads 3-4% at 128 rows and 8% at 49x2304x768
  // (Swin's last stage), in runs that always put the old build first (an order that read
  // about twice the A B B A gain on one thread). In one process with this order both ways,
  // the prefetch without the caller's next columns gave half of that at 128 rows; the order
  // alone (no prefetch) measured level with the old one. Forced AVX2 (its bursts of
  // prefetcht0 between row tiles replaced by this): level (A B B A x 3, within 1%).
  // benchmarks/results/*-zen5-session23-changes.txt.
  // Where the tile is one panel wide (AVX2, SSE4; its slice in L1, or on AVX2 in L2 at 768 steps),
  // the next slice is instead shared by all the later row tiles, in equal runs of lines, and a run
  // of 32 lines or more is spaced out to one line every 2-8 steps: one tile pulling the whole next
  // panel (384 lines at 48 KiB of L1d) kept more lines in flight than the core tracks, and the
  // tile's own x lines from L2 waited behind them. Xeon family 6 model 207, AVX2, bench_linear
  // --cold, one thread, 4 rounds alternating, best ms: 49x3072x768 3.23 -> 2.88, 49x768x3072 3.27
  // -> 2.87 (7 tiles: 55-line runs every 4 steps), 128x1536x512 2.53 -> 2.41, 196x384x1536 2.85 ->
  // 2.74, 197x3072x768 11.26 -> 10.99; 784 rows level, 3136 rows (k = 96) level to 1.6% slower.
  // benchmarks/results/2026-12-06-xeon-session34-changes.txt.
  for (int64_t k0 = 0; k0 < k; k0 += block) {
    const int64_t kc = std::min(block, k - k0);
    const bool first = k0 == 0, last = k0 + kc == k;
    for (int64_t c = c0; c < c1; c += tile_cols) {
      const size_t cols = static_cast<size_t>(std::min(tile_cols, c1 - c));
      const float* slice = wp + (c / panel) * panel_stride + k0 * panel;
      int64_t nc = 0, nc_end = 0, nk0 = 0;
      if (c + tile_cols < c1) {
        nc = c + tile_cols, nc_end = c1, nk0 = k0;
      } else if (!last) {
        nc = c0, nc_end = c1, nk0 = k0 + kc;
      } else if (next_c0 < next_c1) {
        nc = next_c0, nc_end = next_c1, nk0 = 0;
      }
      const int64_t next_panels = (std::min(tile_cols, nc_end - nc) + panel - 1) / panel;
      const size_t next_steps = static_cast<size_t>(std::min(block, k - nk0));
      // The next slice's lines per later row tile (AVX-512: one panel each) and their spacing,
      // and the level they go to (NextLines).
      const size_t next_lines = nc < nc_end ? static_cast<size_t>(next_panels) * next_steps : 0;
      const bool next_into_l2 =
          kStreamWeights || next_lines * kWeightPanel * sizeof(float) > cpu::l1d_cache_bytes() / 2;
      const size_t later_tiles =
          static_cast<size_t>(std::max<int64_t>(1, (r1 - r0 + tile_rows - 1) / tile_rows - 1));
      const size_t run =
          kStreamWeights ? next_steps
                         : std::min(next_steps, (next_lines + later_tiles - 1) / later_tiles);
      size_t shift = 0;
      while (!kStreamWeights && run >= 32 && shift < 3 &&
             (run << (shift + 1)) <= static_cast<size_t>(kc))
        ++shift;
      size_t next_done = 0;
      for (int64_t r = r0, h = 0; r < r1; r += h) {
        h = static_cast<int64_t>(RowTileHeight(r1 - r));
        // The next row tile's outputs, which its loads (or first stores) would miss on.
        for (int64_t rr = r + h; rr < std::min(r1, r + h + tile_rows); ++rr)
          for (int64_t cc = c; cc < c + static_cast<int64_t>(cols); cc += panel)
            __builtin_prefetch(y.row(rr) + cc, 1);
        NextLines next;
        if (r > r0 && next_done < next_lines) {
          const size_t q = next_done / next_steps, s0 = next_done % next_steps;
          const size_t n = std::min(run, next_steps - s0);  // within one panel
          next = {wp + (nc / panel + static_cast<int64_t>(q)) * panel_stride +
                      (nk0 + static_cast<int64_t>(s0)) * panel,
                  n << shift, shift, next_into_l2};
          next_done += n;
        }
        PanelTile(x, r, k0, slice, panel_stride, static_cast<size_t>(kc), static_cast<size_t>(h),
                  cols, first, last && bias ? bias + c : nullptr, y, c, next);
      }
    }
  }
}

// Few rows against the panels (a decode step): R rows x one panel (2R accumulators on AVX2),
// every panel streamed once, in order. Each element is the same FMA chain in k order as the
// tile's, so a step's projections equal a prompt's bit for bit.
template <size_t R>
void PanelMatvecRows(int64_t k, const float* const* x, const float* wp, int64_t n, int64_t c0,
                     int64_t c1, const float* bias, float* const* y) {
  const DF d;
  const int64_t panel = static_cast<int64_t>(kWeightPanel);
  for (int64_t c = c0; c < c1; c += panel) {
    const float* HWY_RESTRICT wq = wp + (c / panel) * k * panel;
    VF acc[R][kWVecs];
    for (size_t r = 0; r < R; ++r)
      for (size_t v = 0; v < kWVecs; ++v) acc[r][v] = hn::Zero(d);
    for (int64_t kk = 0; kk < k; ++kk) {
      VF wv[kWVecs];
      for (size_t v = 0; v < kWVecs; ++v) wv[v] = hn::Load(d, wq + kk * panel + v * kLanes);
      for (size_t r = 0; r < R; ++r) {
        const VF xb = hn::Set(d, x[r][kk]);
        for (size_t v = 0; v < kWVecs; ++v) acc[r][v] = hn::MulAdd(xb, wv[v], acc[r][v]);
      }
    }
    const size_t valid = static_cast<size_t>(std::min(panel, std::min(c1, n) - c));
    HWY_ALIGN float out[kWeightPanel];
    for (size_t r = 0; r < R; ++r) {
      for (size_t v = 0; v < kWVecs; ++v) hn::Store(acc[r][v], d, out + v * kLanes);
      for (size_t j = 0; j < valid; ++j) {
        const int64_t col = c + static_cast<int64_t>(j);
        y[r][col] = bias ? out[j] + bias[col] : out[j];
      }
    }
  }
}

void LinearPanelsMatvecF32(int64_t m, int64_t k, RowsInF32 x, const float* wp, int64_t n,
                           int64_t c0, int64_t c1, const float* bias, RowsOutF32 y) {
  const float* xr[cpu::kLinearMatvecRows];
  float* yr[cpu::kLinearMatvecRows];
  for (int64_t r = 0; r < m; ++r) {
    xr[r] = x.row(r);
    yr[r] = y.row(r);
  }
  c1 = std::min(c1, n);
  switch (m) {
    case 1: PanelMatvecRows<1>(k, xr, wp, n, c0, c1, bias, yr); break;
    case 2: PanelMatvecRows<2>(k, xr, wp, n, c0, c1, bias, yr); break;
    case 3: PanelMatvecRows<3>(k, xr, wp, n, c0, c1, bias, yr); break;
    default: PanelMatvecRows<4>(k, xr, wp, n, c0, c1, bias, yr); break;
  }
}

// Where this kernel runs instead of OpenBLAS's sgemm (layers/linear.cpp has the numbers): at
// least one panel of rows and 64 features everywhere; on AVX2 (Zen 3 here) from k = 256 on: at
// k = 96 the transposed write of each tile is not paid back by its 96 steps, and OpenBLAS runs
// Swin's first-stage projections 20-40% faster.
bool LinearPackedPreferredF32(int64_t m, int64_t k, int64_t n) {
  if (m < static_cast<int64_t>(kPanel) || n < 64) return false;
#if HWY_TARGET == HWY_AVX2
  return k >= 256;
#else
  (void)k;
  return true;
#endif
}

}  // namespace tessera::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera {
HWY_EXPORT(LinearPackF32);
HWY_EXPORT(LinearPackedF32);
HWY_EXPORT(LinearPackedPreferredF32);
HWY_EXPORT(LinearMatvecF32);
HWY_EXPORT(LinearPackWeightsF32);
HWY_EXPORT(LinearPanelsF32);
HWY_EXPORT(LinearPanelsMatvecF32);
HWY_EXPORT(LinearPanelTileColsF32);

namespace cpu {

void linear_pack_f32(int64_t m, int64_t k, const float* x, int64_t ldx, int64_t p0, int64_t p1,
                     float* packed) {
  HWY_DYNAMIC_DISPATCH(LinearPackF32)(m, k, x, ldx, p0, p1, packed);
}

void linear_packed_f32(int64_t m, int64_t k, const float* packed, int64_t p0, int64_t p1,
                       const void* w, int64_t ldw, int64_t n0, int64_t n1, const float* bias,
                       float* y, int64_t ldy) {
  HWY_DYNAMIC_DISPATCH(LinearPackedF32)
  (m, k, packed, p0, p1, static_cast<const float*>(w), ldw, n0, n1, bias, y, ldy);
}

bool linear_packed_preferred_f32(int64_t m, int64_t k, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(LinearPackedPreferredF32)(m, k, n);
}

void linear_matvec_f32(int64_t m, int64_t k, const float* x, int64_t ldx, const void* w,
                       int64_t ldw, int64_t n0, int64_t n1, const float* bias, float* y,
                       int64_t ldy) {
  HWY_DYNAMIC_DISPATCH(LinearMatvecF32)
  (m, k, x, ldx, static_cast<const float*>(w), ldw, n0, n1, bias, y, ldy);
}

void linear_pack_weights_f32(int64_t n, int64_t k, const float* w, int64_t ldw, int64_t q0,
                             int64_t q1, float* panels) {
  HWY_DYNAMIC_DISPATCH(LinearPackWeightsF32)(n, k, w, ldw, q0, q1, panels);
}

void linear_panels_f32(int64_t k, RowsInF32 x, int64_t r0, int64_t r1, const float* panels,
                       int64_t n, int64_t c0, int64_t c1, int64_t next_c0, int64_t next_c1,
                       const float* bias, RowsOutF32 y) {
  HWY_DYNAMIC_DISPATCH(LinearPanelsF32)(k, x, r0, r1, panels, n, c0, c1, next_c0, next_c1, bias, y);
}

void linear_panels_matvec_f32(int64_t m, int64_t k, RowsInF32 x, const float* panels, int64_t n,
                              int64_t c0, int64_t c1, const float* bias, RowsOutF32 y) {
  HWY_DYNAMIC_DISPATCH(LinearPanelsMatvecF32)(m, k, x, panels, n, c0, c1, bias, y);
}

int64_t linear_panel_tile_cols_f32() { return HWY_DYNAMIC_DISPATCH(LinearPanelTileColsF32)(); }

}  // namespace cpu
}  // namespace tessera
#endif  // HWY_ONCE
