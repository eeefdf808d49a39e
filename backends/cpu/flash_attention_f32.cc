// flash_attention_f32: one query tile of one (batch, head) against its keys with an online
// softmax, never materialising the [rows, kv_len] scores.
//
// Query rows live in vector lanes. The tile is taken in panels of up to 256 rows, each split in
// row blocks of 2 vectors (32 rows on AVX-512) whose queries, pre-multiplied by `scale`, are
// transposed once into scratch as qt[block][d][row]. Keys are consumed in blocks of 32 (30 on
// AVX2: kTargetKeyBlock), or twice that where the L1d holds the doubled block (KeyBlockKeys);
// each key block is copied once per panel into contiguous scratch (unless its rows are
// contiguous already) and then serves every row block:
//   1. scores S[key][row] = qt . k (+ mask, + relative-position bias, causal cut). Register
//      tile of 2 row vectors x 8 keys: per d, 2 aligned loads of qt and 8 broadcasts of k[s][d]
//      feed 16 FMAs into 16 accumulators (AVX-512 has 32 registers: 16 accumulators + 2 q +
//      8 k + spare). 4 row vectors x 4 keys (4 loads + 4 broadcasts per 16 FMAs) measured 3-5%
//      slower: its 64-row S and qt blocks crowd L1.
//   2. online softmax, elementwise across the block's keys because each vector holds 2N rows,
//      against a reference max m per row, in log2 units (targets with FMA; RowBlockStep says
//      why), that moves only when the block max exceeds it by more than 8 (FlashAttention-4's
//      rule): m_new = block max log2 e if so, else m; alpha = 2^(m - m_new), P = 2^(S log2 e -
//      m_new) <= 2^8, l = alpha l + sum P. out = O / l is the same whatever m is; P and O grow
//      by at most 2^8, far from float overflow. No horizontal reduction anywhere.
//   3. O[row][:] = alpha O[row][:] + sum_key P[key][row] V[key][:]. Register tile of 4 rows x 4
//      vectors of v_head_dim: per key, 4 loads of V and 4 broadcasts of P feed 16 FMAs. The
//      rescale is skipped while no row's reference max moved (alpha == 1 exactly): after the
//      first block, nearly always. With m the running max itself, a row block rescaled
//      whenever any of its 16-32 rows found a new max, i.e. in most blocks up to T ~ 1000; the
//      lazy reference gained 0.9-1.3 points of the FMA probe on AVX2 at T = 512 and 4096 and
//      was within noise on AVX-512 (Zen 4; benchmarks/results/, *-zen4-attention-core-s18).
//      Where all keys are one block (Swin's windows, T <= 32 at d = 64) O is final after it:
//      the tile stores O / l into the output rows, never O into scratch; a last row or two
//      past a row vector run on their own there (SingleRowOneBlock).
// At head_dim = v_head_dim = 64 a (row block, key block) step is 2 x 2048 FMAs against 64 vector
// exps of 10-13 ops, 7 of them on the FMA pipes: ~11% extra FMA-pipe work (Exp2F32 after one
// FMA, RowBlockStep). The exps as powers of two on AVX2 made its core 0.5-3% faster on Zen 4
// (session 39); the reference max in log2 units, which spares each exp one more op (three on
// AVX-512), another 1.2-1.5% on AVX2 and 1.5-2.5% on AVX-512 at T = 512 and 4096, 2-4% on Swin's
// windows (session 45). Measured split at T = 4096 before that (perf, Zen 4, AVX2): score loop
// 41% of the core, P.V 43%, both at ~95% of the FMA probe, the exps ~10%, packing, transposes
// and bookkeeping ~6%.
//
// Why these sizes (this machine: L1d 32 KiB per /sys/devices/system/cpu/cpu0/cache/index0, L2
// 1 MiB per core, 4 KiB pages, THP only on madvise):
// - Key block 32: the packed K and V blocks (32 x 64 floats = 8 KiB each), the S block (32 x 32
//   = 4 KiB) and the current row block's qt (8 KiB) stay in L1 (28 KiB of 32) while the row
//   blocks of the panel take turns; V is read once per 4-row P.V tile, 8 times per row block.
//   64 keys need 48 KiB with qt, and measured 10-15% slower on a 32 KiB L1d; on Zen 5's 48 KiB
//   they halve the P.V tiles' O loads and stores per key and ran 1-4% faster (KeyBlockKeys).
// - Panel 256 rows: qt and O of the panel (64 KiB each at d = 64) live in L2; a 4096-FMA step
//   reads 8 KiB of qt and reads and writes 8 KiB of O, ~6 B/cycle, far below L2 bandwidth.
//   Each panel streams all of K and V once (512 B per key at d = 64: 2 MiB at T = 4096, twice
//   L2), so the panel height divides that traffic: 128 -> 256 rows took T = 4096 from 72 to
//   80 GFLOP/s (probe 117), with the core's tiles 256 rows high.
// - Packing K and V per key block: the core reads them in place from the packed QKV projection
//   ([T, 3E], rows 6 KiB apart at E = 512), so every key row sits on its own 4 KiB page. Read
//   in place by every 32-row block, T = 4096 ran at 35-45% of the probe against 77% for
//   contiguous K/V (TLB and L3 misses). The copy touches each row once per panel, with the
//   next block prefetched while this one computes. (The rest of the TLB cost goes away if the
//   caller's QKV buffer is on huge pages: +15-25% at T = 4096 with madvise(MADV_HUGEPAGE).)
//   Rows that are already contiguous (the layer's head-major copy of long sequences) are read
//   in place: the same lines in the same order as a packed block, one copy fewer per panel.
//
// Semantics (core/kernels.h, core/attention_tile.h): rows whose visible scores are all -inf,
// and rows that see no key, get zeros; a NaN score makes its row NaN (Exp2F32 in
// math_f32-inl.h keeps NaN).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/flash_attention_f32.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/flash_attention.h"
#include "backends/cpu/math_f32-inl.h"
#include "core/attention_tile.h"

// Scratch layout, shared by every target and by flash_attention_scratch_floats_cpu.
#ifndef TESSERA_BACKENDS_CPU_FLASH_ATTENTION_LAYOUT_
#define TESSERA_BACKENDS_CPU_FLASH_ATTENTION_LAYOUT_
namespace tessera::cpu::flash_detail {

// Rows per row block on the widest target (2 AVX-512 vectors of 16 floats); narrower targets
// use the first lanes of every 32-row section.
constexpr int64_t kMaxRowBlock = 32;
constexpr int64_t kPanelRows = 256;  // a multiple of kMaxRowBlock
constexpr int64_t kKeyBlock = 32;
// Packed blocks of twice the target's keys where the L1d holds them (KeyBlockKeys below).
constexpr int64_t kMaxPackedKeys = 2 * kKeyBlock;
// A problem with at most this many keys whose K and V rows fit ~16 KiB of L1 (Swin's 7 x 7
// windows: 49 keys of 32 + 32 floats) takes them as one block, read in place (one_block in
// Panel): no key-block packing, no second pass of the online softmax.
constexpr int64_t kMaxKeyBlock = 64;
constexpr int64_t kOneBlockFloats = 4096;
// Sections start on 64-byte boundaries: aligned vector loads, and no line shared by two.
constexpr int64_t kAlignFloats = 16;

constexpr int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Offsets in floats from tile.scratch.
struct Layout {
  int64_t panel_rows = 0;  // rows per panel: min(rows rounded up to a row block, 256)
  int64_t qt = 0;          // [row block][head_dim][kMaxRowBlock]: scaled queries, transposed
  int64_t o = 0;           // [panel row][v_head_dim padded]: unnormalised output
  int64_t m = 0;           // [panel row]: reference max (log2 units with FMA: RowBlockStep)
  int64_t l = 0;           // [panel row]: running sum of the P terms
  int64_t alpha = 0;       // [kMaxRowBlock]: 2^(m_old - m_new) of the current row block
  int64_t scores = 0;      // [key][kMaxRowBlock]: mask, then scores, then probabilities
  int64_t kpack = 0;       // [key][head_dim], then from VpackOffset: [key][v_head_dim padded]
  int64_t total = 0;
};

// Where the packed values start after `keys` packed keys of head_dim floats (64-byte aligned).
constexpr int64_t VpackOffset(int64_t keys, int64_t head_dim) {
  return RoundUp(keys * head_dim, kAlignFloats);
}

constexpr Layout MakeLayout(int64_t rows, int64_t head_dim, int64_t v_head_dim) {
  const int64_t dv_pad = RoundUp(v_head_dim, kAlignFloats);
  Layout lay;
  lay.panel_rows = std::min(RoundUp(std::max<int64_t>(rows, 1), kMaxRowBlock), kPanelRows);
  int64_t at = 0;
  const auto take = [&at](int64_t floats) {
    const int64_t offset = at;
    at += RoundUp(floats, kAlignFloats);
    return offset;
  };
  lay.qt = take(lay.panel_rows * head_dim);
  lay.o = take(lay.panel_rows * dv_pad);
  lay.m = take(lay.panel_rows);
  lay.l = take(lay.panel_rows);
  lay.alpha = take(kMaxRowBlock);
  lay.scores = take(kMaxKeyBlock * kMaxRowBlock);
  // Packed keys then values: up to kMaxPackedKeys of each, or one block of up to
  // kOneBlockFloats in all.
  lay.kpack =
      take(std::max(kMaxPackedKeys * (head_dim + dv_pad), kOneBlockFloats) + kAlignFloats);
  lay.total = at;
  return lay;
}

}  // namespace tessera::cpu::flash_detail
#endif  // TESSERA_BACKENDS_CPU_FLASH_ATTENTION_LAYOUT_

HWY_BEFORE_NAMESPACE();
namespace tessera::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;
using cpu::flash_detail::kKeyBlock;
using cpu::flash_detail::kMaxKeyBlock;
using cpu::flash_detail::Layout;

// Register tiles. AVX-512 has 32 vector registers: scores 2 x 8 = 16 accumulators (+ 2 q + 8
// broadcast k), P.V 4 x 4 = 16 accumulators (+ 4 V + 4 broadcast p); 2 x 10 and 2 x 12 score
// tiles measured 3-9% slower. AVX2 has 16: scores 2 x 6 and P.V 4 x 3 (12 accumulators, 2-3
// operands, 1 broadcast) beat 2 x 4 and 4 x 2 (8 accumulators: exactly the 2 FMA pipes x
// latency 4, no slack) by 3-5% on the AVX2 core at T = 128-4096 (Zen 5, forced AVX2); 2 x 8
// spills and lost 15%. SSE4 keeps 2 x 4 and 4 x 2: without FMA each MulAdd needs a temporary,
// and the 12-accumulator tiles ran 10-15% slower there. The P.V tile's rows must divide the
// row block: HWY_SCALAR (1 lane, a 1- or 2-row block) takes 1 row.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr size_t kRowVecs = 2;
constexpr size_t kScoreKeys = 8;
constexpr size_t kPvVecs = 4;
#elif HWY_TARGET == HWY_AVX2
constexpr size_t kRowVecs = 2;
constexpr size_t kScoreKeys = 6;
constexpr size_t kPvVecs = 3;
#else
constexpr size_t kRowVecs = 2;
constexpr size_t kScoreKeys = 4;
constexpr size_t kPvVecs = 2;
#endif
static_assert(kRowVecs * hn::MaxLanes(DF()) <= cpu::flash_detail::kMaxRowBlock,
              "a row block must fit the scratch layout");
static_assert(kKeyMajorRowAlign % cpu::flash_detail::kMaxRowBlock == 0,
              "a key-major bias row covers every row block it is read for");
constexpr size_t kPvRows = hn::MaxLanes(DF()) >= 4 ? 4 : 1;
// A P.V tile narrower than kPvVecs (v_head_dim 32 on AVX-512: 2 vectors) takes more rows, so
// that it keeps as many accumulators: 4 rows x 2 vectors left 8 chains for 2 FMA pipes of
// latency 4, with 4 broadcasts per 8 FMAs. Powers of two: they divide the row block.
template <size_t NV>
constexpr size_t PvRowsFor() {
  size_t rows = kPvRows;
  while (rows * 2 * NV <= kPvRows * kPvVecs) rows *= 2;
  return rows;
}
static_assert(cpu::flash_detail::kMaxRowBlock % PvRowsFor<1>() == 0 &&
                  (kRowVecs * hn::MaxLanes(DF())) % PvRowsFor<1>() == 0,
              "P.V tiles divide the row block");
static_assert(kScoreKeys <= 8, "the last keys of a block take groups of 4, 2 and 1");
// Keys per packed block: a whole number of score groups (30 on AVX2), so that no block ends in
// a 2-key group. That group has 4 accumulators for 2 FMA pipes of latency 4 and ran at half
// speed: 3.8% of the AVX2 core's samples at T = 4096 with blocks of 32 (Zen 4, forced AVX2).
// 30-key blocks took the AVX2 core from 72.7-77.2% to 76.0-79.7% of the probe at T = 512-4096.
constexpr int64_t kTargetKeyBlock = kKeyBlock / kScoreKeys * kScoreKeys;
static_assert(2 * kTargetKeyBlock <= kMaxKeyBlock, "scores and koff hold a doubled block");

// Keys per packed block: twice kTargetKeyBlock when that block's K, V and scores plus one row
// block's queries fit the L1d, else kTargetKeyBlock. Zen 5 (48 KiB) at head_dim 64 on AVX-512:
// 64 keys need exactly 48 KiB and ran 1.3-4.4% faster than 32 at T = 128-8192 on one thread,
// level to 2% faster on two (same-process A B B A, bench_attention_kernel --core), forced AVX2
// (60 keys, 38.6 KiB) 0.2-0.8%. On a 32 KiB L1d the rule keeps 32 keys at head_dim 64: 64
// measured 10-15% slower there.
int64_t KeyBlockKeys(size_t head_dim, size_t dv_pad, size_t rb) {
  constexpr size_t kDoubled = 2 * kTargetKeyBlock;
  const size_t bytes = sizeof(float) * (kDoubled * (head_dim + dv_pad + rb) + rb * head_dim);
  return bytes <= cpu::l1d_cache_bytes() ? kDoubled : kTargetKeyBlock;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// How far a score may exceed its row's reference max before the reference moves (step 2 above),
// in log2 units (P <= 2^8; MoveReference converts it where m is in natural units).
constexpr float kRescaleSlack = 8.0f;

// The reference max in log2 units where the target has FMA, natural units elsewhere
// (RowBlockStep says why).
constexpr bool kLog2Reference = HWY_NATIVE_FMA;

// A row's reference max after a block whose max is bm, from m_old (RowBlockStep): m_new, what is
// stored, and m_use, the same but 0 where m_new is -inf (so that -inf - m_use = -inf).
struct SoftmaxReference {
  VF m_new, m_use;
};
HWY_INLINE SoftmaxReference MoveReference(DF d, VF bm, VF m_old) {
  const VF slack = hn::Set(d, kLog2Reference ? kRescaleSlack : kRescaleSlack * 0x1.62e43p-1f);
  const VF bm_ref = kLog2Reference ? hn::Mul(bm, hn::Set(d, kLog2eF32)) : bm;
  const VF m_new = hn::IfThenElse(hn::Gt(bm_ref, hn::Add(m_old, slack)), bm_ref, m_old);
  return {m_new, hn::IfThenZeroElse(hn::Eq(m_new, hn::Set(d, kNegInf)), m_new)};
}

// The power of two that gives a score x its weight e^(x - m): x log2 e - m_use (one FMA) in
// log2 units, (x - m_use) log2 e in natural ones.
HWY_INLINE VF WeightExponent(DF d, VF x, VF m_use) {
  const VF log2e = hn::Set(d, kLog2eF32);
  return kLog2Reference ? hn::MulAdd(x, log2e, hn::Neg(m_use))
                        : hn::Mul(hn::Sub(x, m_use), log2e);
}

// One row block's view of the scratch for one key block.
struct BlockCtx {
  const FlashAttentionTile* t;
  const float* qt;  // this block's [d][rb]
  float* scores;    // [key][rb]
  float* o;         // this block's first O row
  float* m;         // this block's rows
  float* l;
  float* alpha;
  const float* kpack;  // the key block's first key row (packed, or in place)
  const float* vpack;  // its first value row
  size_t k_stride;     // floats between key rows: head_dim packed, the tile's k_stride in place
  size_t v_stride;     // between value rows: dv_pad packed, the tile's v_stride in place
  int64_t r0;          // first row of the block in the tile
  size_t nr;           // valid rows (<= rb)
  size_t rb;           // lane stride of qt and scores: kRowVecs N
  size_t dv_pad;
  bool o_live;         // O holds this row block's sums (false before its first P.V)
  // The tile's output rows of this block when the tile's only key block writes them (direct_out
  // in Panel): P.V then stores O / l there, not O into scratch. Null otherwise.
  float* out;
};

// The additive term of a tile whose only terms are the key-major bias and region ids, which
// ScoreGroup adds to the scores itself, in FillAdditive's order (bias, then penalty), instead
// of a pass that writes them into `scores` first: that pass was ~10% of the AVX2 core's time at
// 7 x 7 windows (perf, Zen 4). Rows past the block's valid rows get finite terms, not -inf:
// their scores are never stored.
template <size_t RV>
struct InlineAdditive {
  const float* bias = nullptr;  // key_major_bias at (key s0, row r0), or null
  size_t bias_stride = 0;
  const int32_t* key_region = nullptr;  // region ids from key s0 on, or null
  hn::Vec<DI> row_region[RV];           // region ids of the block's rows
  VF penalty;
};

// Region ids of the block's rows rv N .. rv N + N - 1 (t.region set; lanes past the valid rows
// repeat the vector's first row: valid memory).
HWY_INLINE hn::Vec<DI> RowRegions(const BlockCtx& c, size_t rv) {
  const DI di;
  const size_t N = hn::Lanes(di);
  const size_t first = rv * N;
  const size_t lanes = c.nr > first ? std::min(N, c.nr - first) : 0;
  const int32_t* HWY_RESTRICT region = c.t->region + c.t->q_pos0 + c.r0 + first;
  HWY_ALIGN int32_t rq[hn::MaxLanes(DI())];
  for (size_t i = 0; i < N; ++i) rq[i] = region[i < lanes ? i : 0];
  return hn::Load(di, rq);
}

// term + penalty in the lanes whose row's region differs from the key's.
HWY_INLINE VF AddRegionPenalty(DF d, VF term, hn::Vec<DI> row_regions, int32_t key_region,
                               VF penalty) {
  const DI di;
  const auto differ = hn::RebindMask(d, hn::Ne(row_regions, hn::Set(di, key_region)));
  return hn::Add(term, hn::IfThenElseZero(differ, penalty));
}

// Scores of keys j0 .. j0 + KEYS - 1 (all of them in the block) of the key block starting at s0
// for the RV row vectors of the block. Adds the mask already transposed into `scores`,
// applies the causal cut, and folds the result into the running block max bm[]. KEYS is
// kScoreKeys but for a block's last keys (49 = 6 x 8 + 1: one key, not a group of 8 of which 7
// are thrown away).
template <size_t RV, size_t KEYS = kScoreKeys>
HWY_INLINE void ScoreGroup(DF d, const BlockCtx& c, int64_t s0, size_t j0, bool masked,
                           const InlineAdditive<RV>* add, bool causal_cut, VF* bm) {
  const FlashAttentionTile& t = *c.t;
  const size_t N = hn::Lanes(d);
  const size_t D = static_cast<size_t>(t.head_dim);
  const float* HWY_RESTRICT krow[KEYS];
  for (size_t jj = 0; jj < KEYS; ++jj) krow[jj] = c.kpack + (j0 + jj) * c.k_stride;
  VF acc[RV][KEYS];
  for (size_t rv = 0; rv < RV; ++rv)
    for (size_t jj = 0; jj < KEYS; ++jj) acc[rv][jj] = hn::Zero(d);
  const float* HWY_RESTRICT qt = c.qt;
  for (size_t dd = 0; dd < D; ++dd) {
    VF q[RV];
    for (size_t rv = 0; rv < RV; ++rv) q[rv] = hn::Load(d, qt + dd * c.rb + rv * N);
    for (size_t jj = 0; jj < KEYS; ++jj) {
      const VF kb = hn::Set(d, krow[jj][dd]);
      for (size_t rv = 0; rv < RV; ++rv) acc[rv][jj] = hn::MulAdd(q[rv], kb, acc[rv][jj]);
    }
  }
  const VF neg_inf = hn::Set(d, kNegInf);
  const VF lane = hn::Iota(d, 0.0f);
  // Unrolled by request: GCC's own limit left this loop rolled (its body carries the mask, bias
  // and causal branches), so acc[][] lived on the stack, zeroed there and reloaded per group.
  HWY_UNROLL(8)
  for (size_t jj = 0; jj < KEYS; ++jj) {
    const size_t j = j0 + jj;
    float* HWY_RESTRICT row = c.scores + j * c.rb;
    HWY_UNROLL(4)
    for (size_t rv = 0; rv < RV; ++rv) {
      VF v = acc[rv][jj];
      if (masked) v = hn::Add(v, hn::Load(d, row + rv * N));
      if (add) {
        VF a = hn::Zero(d);
        if (add->bias) a = hn::Add(a, hn::LoadU(d, add->bias + j * add->bias_stride + rv * N));
        if (add->key_region)
          a = AddRegionPenalty(d, a, add->row_region[rv], add->key_region[j], add->penalty);
        v = hn::Add(v, a);
      }
      if (causal_cut) {
        // Lane i is row r0 + rv N + i, which sees key s iff s <= q_pos0 + row, i.e. from lane
        // s - q_pos0 - r0 - rv N on; clamped to [-1, N] so the float compare is exact.
        const int64_t first =
            s0 + static_cast<int64_t>(j) - t.q_pos0 - c.r0 - static_cast<int64_t>(rv * N);
        const float thr =
            static_cast<float>(std::clamp<int64_t>(first, -1, static_cast<int64_t>(N)));
        v = hn::IfThenElse(hn::Lt(lane, hn::Set(d, thr)), neg_inf, v);
      }
      hn::Store(v, d, row + rv * N);
      bm[rv] = hn::Max(bm[rv], v);
    }
  }
}

// How a P.V tile starts and ends. Each is its own instantiation: with the choice made at run
// time inside one tile, GCC kept the 12 AVX2 accumulators on the stack between the prologue, the
// key loop and the epilogue (two extra stores and two extra loads per accumulator per tile: the
// core 6-7% slower on AVX2 at T = 512 and 4096, 8% on AVX-512 at T = 4096, Zen 4;
// benchmarks/results/2026-12-07-zen4-session44-changes.txt).
enum class PvMode {
  kFirst,    // O starts from zero (the row block's first P.V), and is stored
  kAdd,      // O += P V
  kRescale,  // O = alpha O + P V
  kOut,      // the tile's only key block: out = (P V) / l into the output rows
};

// O[r .. r+ROWS-1][c0 N .. (c0+NV) N) per MODE, over the nk keys of the block.
template <size_t NV, PvMode MODE, size_t ROWS = PvRowsFor<NV>()>
HWY_INLINE void PvTile(DF d, const BlockCtx& c, size_t r, size_t c0, size_t nk) {
  const size_t N = hn::Lanes(d);
  const size_t dv_pad = c.dv_pad;  // a local: the stores to O may alias c as far as GCC knows
  float* HWY_RESTRICT o = c.o + r * dv_pad + c0 * N;
  VF acc[ROWS][NV];
  for (size_t i = 0; i < ROWS; ++i)
    for (size_t v = 0; v < NV; ++v) {
      if constexpr (MODE == PvMode::kFirst || MODE == PvMode::kOut) {
        acc[i][v] = hn::Zero(d);
      } else if constexpr (MODE == PvMode::kAdd) {
        acc[i][v] = hn::Load(d, o + i * dv_pad + v * N);
      } else {
        acc[i][v] = hn::Mul(hn::Load(d, o + i * dv_pad + v * N), hn::Set(d, c.alpha[r + i]));
      }
    }
  const float* HWY_RESTRICT p = c.scores + r;
  const float* HWY_RESTRICT vrow = c.vpack + c0 * N;
  for (size_t j = 0; j < nk; ++j, p += c.rb, vrow += c.v_stride) {
    VF vv[NV];
    for (size_t v = 0; v < NV; ++v) vv[v] = hn::LoadU(d, vrow + v * N);
    for (size_t i = 0; i < ROWS; ++i) {
      const VF pb = hn::Set(d, p[i]);
      for (size_t v = 0; v < NV; ++v) acc[i][v] = hn::MulAdd(pb, vv[v], acc[i][v]);
    }
  }
  if constexpr (MODE == PvMode::kOut) {
    // The final rows: out = O / l as Panel's last loop computes it (zeros where l == 0).
    for (size_t i = 0; i < ROWS; ++i) {
      if (r + i >= c.nr) continue;
      float* HWY_RESTRICT dst = c.out + (r + i) * static_cast<size_t>(c.t->out_stride) + c0 * N;
      const float li = c.l[r + i];
      const bool none = li == 0.0f;
      const VF inv = hn::Set(d, none ? 0.0f : 1.0f / li);
      for (size_t v = 0; v < NV; ++v)
        hn::StoreU(none ? hn::Zero(d) : hn::Mul(acc[i][v], inv), d, dst + v * N);
    }
  } else {
    for (size_t i = 0; i < ROWS; ++i)
      for (size_t v = 0; v < NV; ++v) hn::Store(acc[i][v], d, o + i * dv_pad + v * N);
  }
}

// P.V over columns c0 N .. (c0 + NV) N of every row of the block, in tiles of PvRowsFor<NV>
// rows. Rows past nr (up to the tile height) hold finite garbage that is never stored. A
// function of its own, so that its registers are allocated apart from the score loop's; the
// call is once per ~1000 FMA cycles.
template <size_t NV, PvMode MODE>
HWY_NOINLINE void PvColumnsIn(DF d, const BlockCtx& c, size_t c0, size_t nk) {
  constexpr size_t kRows = PvRowsFor<NV>();
  const size_t pv_rows = (c.nr + kRows - 1) / kRows * kRows;
  for (size_t r = 0; r < pv_rows; r += kRows) PvTile<NV, MODE>(d, c, r, c0, nk);
}

template <size_t NV>
HWY_INLINE void PvColumns(DF d, const BlockCtx& c, size_t c0, size_t nk, bool rescale) {
  if (c.out) {
    PvColumnsIn<NV, PvMode::kOut>(d, c, c0, nk);
  } else if (!c.o_live) {
    PvColumnsIn<NV, PvMode::kFirst>(d, c, c0, nk);
  } else if (rescale) {
    PvColumnsIn<NV, PvMode::kRescale>(d, c, c0, nk);
  } else {
    PvColumnsIn<NV, PvMode::kAdd>(d, c, c0, nk);
  }
}

// Writes the additive term of scores[j][row] for keys s0 .. s0+nk-1: mask[r0 + row][s0 + j]
// plus the relative-position bias plus the region penalty (any may be absent). Rows past nr get
// -inf (ignored by the all-masked test). Returns false when every entry is -inf: the block adds
// nothing to these rows and is skipped.
template <size_t RV>
HWY_INLINE bool FillAdditive(DF d, const BlockCtx& c, int64_t s0, size_t nk) {
  const FlashAttentionTile& t = *c.t;
  const size_t N = hn::Lanes(d);
  const DI di;
  const VF neg_inf = hn::Set(d, kNegInf);
  auto visible = hn::Lt(neg_inf, neg_inf);  // all false
  const float* mbase = t.mask ? t.mask + c.r0 * t.mask_stride + s0 : nullptr;
  // The gather takes 32-bit lane offsets: row * mask_stride must fit for rows < 32.
  const bool mask_gather = t.mask_stride != 0 && t.mask_stride <= (int64_t{1} << 31) / 32;

  // Bias index (core/attention_tile.h) split as qbase(q) - koff(s), with
  //   qbase(q) = (q / W + H - 1)(2W - 1) + q % W + W - 1,  koff(s) = (s / W)(2W - 1) + s % W.
  // koff of this key block is computed once, stepping the grid column (one division, not 32:
  // 32 int64 divisions would cost about half of the block's 2048-cycle score GEMM).
  const int64_t W = t.grid_w, R = 2 * W - 1;
  const auto qbase = [&t, W, R](int64_t q) { return (q / W + t.grid_h - 1) * R + q % W + W - 1; };
  int64_t koff[kMaxKeyBlock];
  bool bias_gather = false;  // the gather's int32 indices hold every index of the table
  if (t.rel_table) {
    int64_t sy = s0 / W, sx = s0 % W;
    for (size_t j = 0; j < nk; ++j) {
      koff[j] = sy * R + sx;
      if (++sx == W) sx = 0, ++sy;
    }
    bias_gather = (2 * t.grid_h - 1) * R <= std::numeric_limits<int32_t>::max();
  }

  for (size_t rv = 0; rv < RV; ++rv) {
    const size_t first = rv * N;
    const size_t lanes = c.nr > first ? std::min(N, c.nr - first) : 0;
    const auto valid = hn::FirstN(d, lanes);
    // Offsets of this vector's rows in the mask; invalid lanes read row r0 (valid memory).
    auto rows = hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(first)));
    rows = hn::IfThenElseZero(hn::RebindMask(di, valid), rows);
    const auto moffs =
        hn::Mul(rows, hn::Set(di, static_cast<int32_t>(mask_gather ? t.mask_stride : 0)));
    // This vector's queries are q_first + i. When they share a grid row (every vector once
    // W >= 16 and W is a multiple of 16, as tiles start at multiples of 32), their indices
    // for one key are consecutive: one unaligned load from the table. Otherwise a gather
    // (invalid lanes repeat lane 0's query: valid memory).
    const int64_t q_first = t.q_pos0 + c.r0 + static_cast<int64_t>(first);
    const bool bias_row = t.rel_table && lanes == N && q_first % W + static_cast<int64_t>(N) <= W;
    HWY_ALIGN int32_t qb[hn::MaxLanes(DI())] = {};
    if (t.rel_table && !bias_row && bias_gather)
      for (size_t i = 0; i < N; ++i)
        qb[i] = static_cast<int32_t>(qbase(q_first + static_cast<int64_t>(i < lanes ? i : 0)));
    const auto qbv = hn::Load(di, qb);
    const float* row_bias = bias_row ? t.rel_table + qbase(q_first) : nullptr;
    const auto rqv = t.region ? RowRegions(c, rv) : hn::Zero(di);
    const VF penalty = hn::Set(d, t.region_penalty);

    for (size_t j = 0; j < nk; ++j) {
      VF v = hn::Zero(d);
      if (mbase && t.mask_stride == 0) {
        v = hn::Set(d, mbase[j]);
      } else if (mbase && mask_gather) {
        v = hn::GatherIndex(d, mbase + j, moffs);
      } else if (mbase) {
        HWY_ALIGN float buf[hn::MaxLanes(DF())];
        for (size_t i = 0; i < N; ++i)
          buf[i] = i < lanes ? mbase[static_cast<int64_t>(first + i) * t.mask_stride + j] : kNegInf;
        v = hn::Load(d, buf);
      }
      if (t.key_major_bias) {
        v = hn::Add(v, hn::LoadU(d, t.key_major_bias + (s0 + static_cast<int64_t>(j)) *
                                                         t.key_major_stride +
                                        c.r0 + static_cast<int64_t>(first)));
      } else if (row_bias) {
        v = hn::Add(v, hn::LoadU(d, row_bias - koff[j]));
      } else if (t.rel_table && bias_gather) {
        v = hn::Add(v, hn::GatherIndex(d, t.rel_table,
                                       hn::Sub(qbv, hn::Set(di, static_cast<int32_t>(koff[j])))));
      } else if (t.rel_table) {
        HWY_ALIGN float buf[hn::MaxLanes(DF())];
        for (size_t i = 0; i < N; ++i)
          buf[i] = t.rel_table[qbase(q_first + static_cast<int64_t>(i < lanes ? i : 0)) - koff[j]];
        v = hn::Add(v, hn::Load(d, buf));
      }
      if (t.region)
        v = AddRegionPenalty(d, v, rqv, t.region[s0 + static_cast<int64_t>(j)], penalty);
      v = hn::IfThenElse(valid, v, neg_inf);
      visible = hn::Or(visible, hn::Ne(v, neg_inf));
      hn::Store(v, d, c.scores + j * c.rb + first);
    }
  }
  return !hn::AllFalse(d, visible);
}

// Scores, online softmax and P.V of one row block against one key block of nk keys. Returns
// false when the block was skipped (every score -inf): O was not written.
template <size_t RV>
bool RowBlockStep(DF d, const BlockCtx& c, int64_t s0, size_t nk) {
  const FlashAttentionTile& t = *c.t;
  const size_t N = hn::Lanes(d);
  // A mask or a bias table: FillAdditive writes every term first. Only a key-major bias and
  // region ids: the score groups add them (InlineAdditive).
  const bool masked = t.mask != nullptr || t.rel_table != nullptr;
  if (masked && !FillAdditive<RV>(d, c, s0, nk)) return false;
  InlineAdditive<RV> inline_add;
  const bool has_inline = !masked && (t.key_major_bias != nullptr || t.region != nullptr);
  if (has_inline) {
    if (t.key_major_bias) {
      inline_add.bias = t.key_major_bias + s0 * t.key_major_stride + c.r0;
      inline_add.bias_stride = static_cast<size_t>(t.key_major_stride);
    }
    if (t.region) {
      inline_add.key_region = t.region + s0;
      inline_add.penalty = hn::Set(d, t.region_penalty);
      for (size_t rv = 0; rv < RV; ++rv) inline_add.row_region[rv] = RowRegions(c, rv);
    }
  }
  const InlineAdditive<RV>* add = has_inline ? &inline_add : nullptr;
  // Row r0 (the block's first) sees keys s <= q_pos0 + r0; a block ending there needs no cut.
  const bool causal_cut = t.causal && s0 + static_cast<int64_t>(nk) - 1 > t.q_pos0 + c.r0;

  VF bm[RV];
  for (size_t rv = 0; rv < RV; ++rv) bm[rv] = hn::Set(d, kNegInf);
  size_t j0 = 0;
  for (; j0 + kScoreKeys <= nk; j0 += kScoreKeys)
    ScoreGroup<RV>(d, c, s0, j0, masked, add, causal_cut, bm);
  // The last keys: groups of 4, 2 and 1 (at most one of each; no key computed twice).
  if constexpr (kScoreKeys > 4) {
    if (j0 + 4 <= nk) {
      ScoreGroup<RV, 4>(d, c, s0, j0, masked, add, causal_cut, bm);
      j0 += 4;
    }
  }
  if (j0 + 2 <= nk) {
    ScoreGroup<RV, 2>(d, c, s0, j0, masked, add, causal_cut, bm);
    j0 += 2;
  }
  if (j0 < nk) ScoreGroup<RV, 1>(d, c, s0, j0, masked, add, causal_cut, bm);

  // The reference max moves to the block max only past m + kRescaleSlack (always from -inf;
  // a NaN block max never moves it). m_use replaces a reference of -inf (every score so far
  // -inf) by 0, so that -inf - m_use = -inf and the exp gives 0 instead of the NaN of -inf -
  // -inf. A NaN score reaches l through its exp; a NaN m reaches alpha, hence O and l.
  // With FMA the reference max m is kept in log2 units (m log2 e, rounded once where it moves)
  // and e^(x - m) taken as 2^(x log2 e - m): the FMA forms x log2 e - m exactly and rounds once,
  // as precise as e^(x - m) where x - m is exact, and m's rounding is a factor common to every
  // P, l and O term of the row, which O / l cancels; alpha = 2^(m_old - m_new) carries the old
  // terms' factor to the new exactly (and is exactly 1 where m stays). Against 2^((x - m)
  // log2 e): one op fewer per exp, and on AVX-512 three fewer on the FMA pipes than
  // ExpFastF32's e^x (its x log2 e and Cody-Waite pair). m_old comes from memory and m_new
  // from a blend: no multiply that GCC could contract into alpha's subtraction (with
  // m_old log2 e computed here it fused that into an FMA, and alpha drifted from 1 by m's
  // rounding: 1.7e-4 at scores of 5000). Without FMA, x log2 e would round at the scores'
  // magnitude: m stays in natural units there, the exponent (x - m) log2 e.
  bool rescale = false;
  for (size_t rv = 0; rv < RV; ++rv) {
    const VF m_old = hn::Load(d, c.m + rv * N);
    // Not a structured binding: clang before 16 cannot capture one in the lambda below.
    const SoftmaxReference ref = MoveReference(d, bm[rv], m_old);
    const VF m_new = ref.m_new, m_use = ref.m_use;
    const auto exponent = [&](VF x) HWY_ATTR { return WeightExponent(d, x, m_use); };
    const VF alpha_exponent = hn::Sub(m_old, m_use);
    const VF alpha = Exp2F32(d, kLog2Reference ? alpha_exponent
                                               : hn::Mul(alpha_exponent, hn::Set(d, kLog2eF32)));
    rescale |= !hn::AllTrue(d, hn::Eq(alpha, hn::Set(d, 1.0f)));
    hn::Store(m_new, d, c.m + rv * N);
    hn::Store(alpha, d, c.alpha + rv * N);
    // Two sums: two independent add chains next to the exps.
    VF sum0 = hn::Zero(d), sum1 = hn::Zero(d);
    float* HWY_RESTRICT p = c.scores + rv * N;
    size_t j = 0;
    for (; j + 2 <= nk; j += 2) {
      const VF e0 = Exp2F32(d, exponent(hn::Load(d, p + j * c.rb)));
      const VF e1 = Exp2F32(d, exponent(hn::Load(d, p + (j + 1) * c.rb)));
      hn::Store(e0, d, p + j * c.rb);
      hn::Store(e1, d, p + (j + 1) * c.rb);
      sum0 = hn::Add(sum0, e0);
      sum1 = hn::Add(sum1, e1);
    }
    if (j < nk) {
      const VF e = Exp2F32(d, exponent(hn::Load(d, p + j * c.rb)));
      hn::Store(e, d, p + j * c.rb);
      sum0 = hn::Add(sum0, e);
    }
    const VF l = hn::Load(d, c.l + rv * N);
    hn::Store(hn::MulAdd(l, alpha, hn::Add(sum0, sum1)), d, c.l + rv * N);
  }

  const size_t dv_vecs = c.dv_pad / N;
  size_t c0 = 0;
  if constexpr (kPvVecs == 3) {
    // The last 4 vectors as 2 + 2, not 3 + 1 (v_head_dim 32 on AVX2): the 1-vector tile's 8
    // broadcasts per 8 FMAs made it ~1.5x the cost per FMA of the 3-vector one; windows of
    // 7 x 7 at head_dim 32 ran ~1% faster (bench_attention_kernel --windows, Zen 4).
    if (dv_vecs % 3 == 1 && dv_vecs >= 4) {
      for (; c0 + 4 < dv_vecs; c0 += 3) PvColumns<3>(d, c, c0, nk, rescale);
      PvColumns<2>(d, c, c0, nk, rescale);
      PvColumns<2>(d, c, c0 + 2, nk, rescale);
      return true;
    }
  }
  for (; c0 + kPvVecs <= dv_vecs; c0 += kPvVecs) PvColumns<kPvVecs>(d, c, c0, nk, rescale);
  switch (dv_vecs - c0) {
    case 0:
      break;
    case 1:
      PvColumns<1>(d, c, c0, nk, rescale);
      break;
    case 2:
      if constexpr (kPvVecs > 2) PvColumns<2>(d, c, c0, nk, rescale);
      break;
    default:
      if constexpr (kPvVecs > 3) PvColumns<3>(d, c, c0, nk, rescale);
      break;
  }
  return true;
}

// Copies keys s0 .. s0+nk-1 into kpack [key][head_dim] and vpack [key][dv_pad] (zero padded).
// What this costs is the first touch of the strided rows (L3, TLB), not the copy: inline
// vectors and 64 memcpy calls per block measured the same. PrefetchKeyRows brings them in
// while the block before computes.
void PackKeyBlock(DF d, const FlashAttentionTile& t, float* HWY_RESTRICT kpack,
                  float* HWY_RESTRICT vpack, size_t dv_pad, int64_t s0, size_t nk) {
  const size_t N = hn::Lanes(d);
  const size_t D = static_cast<size_t>(t.head_dim);
  const size_t Dv = static_cast<size_t>(t.v_head_dim);
  for (size_t j = 0; j < nk; ++j) {
    const int64_t s = s0 + static_cast<int64_t>(j);
    const float* HWY_RESTRICT k = t.k + s * t.k_stride;
    float* HWY_RESTRICT kd = kpack + j * D;
    size_t i = 0;
    for (; i + N <= D; i += N) hn::StoreU(hn::LoadU(d, k + i), d, kd + i);
    for (; i < D; ++i) kd[i] = k[i];
    const float* HWY_RESTRICT v = t.v + s * t.v_stride;
    float* HWY_RESTRICT vd = vpack + j * dv_pad;
    i = 0;
    for (; i + N <= Dv; i += N) hn::Store(hn::LoadU(d, v + i), d, vd + i);
    for (; i < Dv; ++i) vd[i] = v[i];
    for (; i < dv_pad; ++i) vd[i] = 0.0f;
  }
}

// Prefetches the K and V rows of keys s0 .. s1-1 (into L1).
void PrefetchKeyRows(const FlashAttentionTile& t, int64_t s0, int64_t s1) {
  for (int64_t s = s0; s < s1; ++s) {
    const float* k = t.k + s * t.k_stride;
    const float* v = t.v + s * t.v_stride;
    for (int64_t i = 0; i < t.head_dim; i += 16) hwy::Prefetch(k + i);
    for (int64_t i = 0; i < t.v_head_dim; i += 16) hwy::Prefetch(v + i);
  }
}

// block[dd * rb + i] = scale * q[p0 + r_first + i][dd] for the rb rows of one row block (zero for
// rows at or past np). On AVX2 and AVX-512 in 8 x 8 squares transposed in registers: element
// by element, these stores (one float per 128-byte qt row) took ~40% of a 7 x 7 window's time
// outside the score and P.V loops (perf, Zen 5). Same products, same bits either way.
void TransposeQueries(const FlashAttentionTile& t, int64_t p0, int64_t np, size_t r_first,
                      size_t rb, float* HWY_RESTRICT block) {
  const size_t D = static_cast<size_t>(t.head_dim);
  size_t d_done = 0;
#if HWY_TARGET <= HWY_AVX2
  if (rb % 8 == 0) {
    const hn::FixedTag<float, 8> d8;
    const hn::Repartition<double, decltype(d8)> dd;
    using V8 = hn::Vec<decltype(d8)>;
    const V8 scale = hn::Set(d8, t.scale);
    d_done = D / 8 * 8;
    for (size_t i0 = 0; i0 < rb; i0 += 8) {
      const float* HWY_RESTRICT rows[8];
      bool live[8];
      for (size_t i = 0; i < 8; ++i) {
        const int64_t r = static_cast<int64_t>(r_first + i0 + i);
        live[i] = r < np;
        rows[i] = t.q + (p0 + (live[i] ? r : 0)) * t.q_stride;
      }
      for (size_t d0 = 0; d0 < d_done; d0 += 8) {
        V8 x[8];
        for (size_t i = 0; i < 8; ++i)
          x[i] = live[i] ? hn::Mul(scale, hn::LoadU(d8, rows[i] + d0)) : hn::Zero(d8);
        // Pairs of rows interleaved by 32, then by 64 bits, then 128-bit halves exchanged.
        V8 a[8], b[8];
        for (size_t i = 0; i < 8; i += 2) {
          a[i] = hn::InterleaveLower(d8, x[i], x[i + 1]);
          a[i + 1] = hn::InterleaveUpper(d8, x[i], x[i + 1]);
        }
        for (size_t i = 0; i < 8; i += 4)
          for (size_t j = 0; j < 2; ++j) {
            const auto lo = hn::BitCast(dd, a[i + j]), hi = hn::BitCast(dd, a[i + j + 2]);
            b[i + 2 * j] = hn::BitCast(d8, hn::InterleaveLower(dd, lo, hi));
            b[i + 2 * j + 1] = hn::BitCast(d8, hn::InterleaveUpper(dd, lo, hi));
          }
        // b[k] (k < 4) holds dims k and k + 4 of rows 0-3; b[k + 4] those of rows 4-7.
        for (size_t k = 0; k < 4; ++k) {
          hn::Store(hn::ConcatLowerLower(d8, b[k + 4], b[k]), d8, block + (d0 + k) * rb + i0);
          hn::Store(hn::ConcatUpperUpper(d8, b[k + 4], b[k]), d8, block + (d0 + k + 4) * rb + i0);
        }
      }
    }
  }
#endif
  for (size_t i = 0; i < rb && d_done < D; ++i) {
    const int64_t r = static_cast<int64_t>(r_first + i);
    const float* HWY_RESTRICT q = t.q + (p0 + r) * t.q_stride;
    for (size_t dd = d_done; dd < D; ++dd) block[dd * rb + i] = r < np ? t.scale * q[dd] : 0.0f;
  }
}

// A row block's last one or two rows, where the tile's keys are one block read in place and its
// only additive terms are a key-major bias and region ids (Swin's 7 x 7 windows: 49 rows are
// 3 x 16 + 1 on AVX2, 32 + 17 on AVX-512), each on its own: head_dim in the lanes, the keys one
// after another. In the row-block layout such a row took a vector of lanes to itself (8 on
// AVX2, 16 on AVX-512) and a score tile of one row vector, too few accumulators for 2 FMA pipes
// of latency 4: the AVX2 window core spent ~1/7 of its time on that one row in 49, and AVX-512
// ran its last 17 rows as 32.
// The same arithmetic as RowBlockStep's for a tile's only key block: scores (scale q) . k +
// (bias + penalty), the reference max the row's max (log2 units with FMA), P = 2^(S log2 e -
// m), out = sum P v / l, zeros where l == 0, NaN from any NaN score; each dot product sums its
// lanes and then across them, another order than the row-block tile's, within the same
// tolerance. q of at most kSingleRowMaxDim floats, both head dims whole vectors (Panel checks).
// Swin-T's windows (bench_attention_kernel --windows, Zen 4, 4 rounds alternating, medians):
// AVX2 0.95 / 0.47 / 0.25 / 0.14 -> 0.86 / 0.43 / 0.23 / 0.13 ms for stages 1-4, AVX-512 0.90 /
// 0.45 / 0.23 / 0.13 -> 0.78 / 0.39 / 0.20 / 0.11.
constexpr size_t kSingleRowMaxDim = 256;
constexpr size_t kSingleRowsMax = 2;

// out[c0 N .. (c0 + NV) N) = sum_j p[j] v_j / l over the nk keys.
template <size_t NV>
HWY_INLINE void SingleRowValues(DF d, const float* HWY_RESTRICT p, size_t nk,
                                const float* HWY_RESTRICT vp, size_t v_stride, size_t c0, VF inv,
                                float* HWY_RESTRICT out) {
  const size_t N = hn::Lanes(d);
  VF acc[NV];
  for (size_t v = 0; v < NV; ++v) acc[v] = hn::Zero(d);
  for (size_t j = 0; j < nk; ++j) {
    const VF pj = hn::Set(d, p[j]);
    const float* HWY_RESTRICT vr = vp + j * v_stride + c0 * N;
    for (size_t v = 0; v < NV; ++v) acc[v] = hn::MulAdd(pj, hn::LoadU(d, vr + v * N), acc[v]);
  }
  for (size_t v = 0; v < NV; ++v) hn::StoreU(hn::Mul(acc[v], inv), d, out + (c0 + v) * N);
}

HWY_NOINLINE void SingleRowOneBlock(DF d, const FlashAttentionTile& t, int64_t row,
                                    const float* kp, size_t k_stride, const float* vp,
                                    size_t v_stride, size_t nk) {
  const size_t N = hn::Lanes(d);
  const size_t D = static_cast<size_t>(t.head_dim);
  const size_t Dv = static_cast<size_t>(t.v_head_dim);
  // The scaled query as TransposeQueries rounds it: scale q, once.
  HWY_ALIGN float qs[kSingleRowMaxDim];
  const float* HWY_RESTRICT q = t.q + row * t.q_stride;
  const VF scale = hn::Set(d, t.scale);
  for (size_t i = 0; i < D; i += N) hn::Store(hn::Mul(scale, hn::LoadU(d, q + i)), d, qs + i);
  HWY_ALIGN float sc[cpu::flash_detail::kMaxKeyBlock + hn::MaxLanes(DF())];
  const int32_t row_region = t.region ? t.region[t.q_pos0 + row] : 0;
  for (size_t j = 0; j < nk; ++j) {
    const float* HWY_RESTRICT kr = kp + j * k_stride;
    VF acc0 = hn::Zero(d), acc1 = hn::Zero(d);
    size_t i = 0;
    for (; i + 2 * N <= D; i += 2 * N) {
      acc0 = hn::MulAdd(hn::Load(d, qs + i), hn::LoadU(d, kr + i), acc0);
      acc1 = hn::MulAdd(hn::Load(d, qs + i + N), hn::LoadU(d, kr + i + N), acc1);
    }
    if (i < D) acc0 = hn::MulAdd(hn::Load(d, qs + i), hn::LoadU(d, kr + i), acc0);
    float add = 0.0f;
    if (t.key_major_bias)
      add += t.key_major_bias[static_cast<int64_t>(j) * t.key_major_stride + row];
    if (t.region && t.region[j] != row_region) add += t.region_penalty;
    sc[j] = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1))) + add;
  }
  const size_t padded = (nk + N - 1) / N * N;
  for (size_t j = nk; j < padded; ++j) sc[j] = kNegInf;
  VF bm = hn::Set(d, kNegInf);
  for (size_t j = 0; j < padded; j += N) bm = hn::Max(bm, hn::Load(d, sc + j));
  // RowBlockStep's reference from -inf, for the row's one block.
  const VF m_use = MoveReference(d, hn::MaxOfLanes(d, bm), hn::Set(d, kNegInf)).m_use;
  VF sum = hn::Zero(d);
  for (size_t j = 0; j < padded; j += N) {
    const VF e = Exp2F32(d, WeightExponent(d, hn::Load(d, sc + j), m_use));
    hn::Store(e, d, sc + j);
    sum = hn::Add(sum, e);
  }
  const float l = hn::GetLane(hn::SumOfLanes(d, sum));
  float* HWY_RESTRICT out = t.out + row * t.out_stride;
  if (l == 0.0f) {
    std::memset(out, 0, Dv * sizeof(float));
    return;
  }
  const VF inv = hn::Set(d, 1.0f / l);
  const size_t dv_vecs = Dv / N;
  size_t c0 = 0;
  for (; c0 + 4 <= dv_vecs; c0 += 4) SingleRowValues<4>(d, sc, nk, vp, v_stride, c0, inv, out);
  if (c0 + 2 <= dv_vecs) {
    SingleRowValues<2>(d, sc, nk, vp, v_stride, c0, inv, out);
    c0 += 2;
  }
  if (c0 < dv_vecs) SingleRowValues<1>(d, sc, nk, vp, v_stride, c0, inv, out);
}

// Rows p0 .. p0+np-1 of the tile (np <= layout panel_rows).
void Panel(const FlashAttentionTile& t, const Layout& lay, int64_t p0, int64_t np) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const size_t rb = kRowVecs * N;
  const size_t D = static_cast<size_t>(t.head_dim);
  const size_t Dv = static_cast<size_t>(t.v_head_dim);
  const size_t dv_pad = (Dv + N - 1) / N * N;
  const size_t nrb = (static_cast<size_t>(np) + rb - 1) / rb;
  float* qt = t.scratch + lay.qt;
  float* o = t.scratch + lay.o;
  float* m = t.scratch + lay.m;
  float* l = t.scratch + lay.l;

  // Scaled queries, transposed per row block; rows past np are zero (finite scores, never
  // stored). The scale rounds once into q: (scale q) . k, not scale (q . k).
  for (size_t b = 0; b < nrb; ++b) TransposeQueries(t, p0, np, b * rb, rb, qt + b * D * rb);
  for (size_t i = 0; i < nrb * rb; i += N) {
    hn::Store(hn::Set(d, kNegInf), d, m + i);
    hn::Store(hn::Zero(d), d, l + i);
  }
  // O of a row block is written by its first P.V (BlockCtx::o_live), read only after.
  bool o_live[cpu::flash_detail::kPanelRows] = {};

  // Keys row p0 + r sees: all kv_len, or with causal s <= q_pos0 + p0 + r.
  const auto row_limit = [&t](int64_t row) {
    return t.causal ? std::min(t.kv_len, t.q_pos0 + row + 1) : t.kv_len;
  };
  const int64_t panel_limit = row_limit(p0 + np - 1);

  // Few keys (a window): one block of them all. Otherwise blocks of KeyBlockKeys keys. Decided
  // by kv_len, not by the panel's causal limit: the blocks, hence the bits, must not depend on
  // how rows are tiled. K and V are read in place when the value rows are whole vectors and
  // either there is one block or the rows are contiguous (head-major K and V, which the layer
  // copies for long sequences): a block of contiguous rows is one run of lines, as the packed
  // copy is. Packing those too was a second copy per panel: in place measured level at
  // T = 2048 and 2-3% faster at T = 4096-8192 (AVX-512, Xeon family 6 model 207).
  const bool one_block =
      t.kv_len <= kMaxKeyBlock &&
      t.kv_len * static_cast<int64_t>(D + dv_pad) <= cpu::flash_detail::kOneBlockFloats;
  const bool contiguous = t.k_stride == t.head_dim && t.v_stride == t.v_head_dim;
  const bool in_place = (one_block || contiguous) && Dv % N == 0;
  const int64_t key_block = one_block ? t.kv_len : KeyBlockKeys(D, dv_pad, rb);
  // One key block: its P.V is final, and writes O / l into the output rows itself (whole
  // vectors of them only), rather than O into scratch for the loop at the end to read back: that
  // loop was ~5% of the AVX2 core's time at 7 x 7 windows (perf, Zen 4).
  const bool direct_out = one_block && Dv % N == 0;
  // A last row or two on their own (SingleRowOneBlock) where those are the only additive terms.
  const bool single_rows = direct_out && t.mask == nullptr && t.rel_table == nullptr &&
                           !t.causal && D % N == 0 && D <= kSingleRowMaxDim;

  BlockCtx c;
  c.t = &t;
  c.scores = t.scratch + lay.scores;
  c.alpha = t.scratch + lay.alpha;
  c.k_stride = in_place ? static_cast<size_t>(t.k_stride) : D;
  c.v_stride = in_place ? static_cast<size_t>(t.v_stride) : dv_pad;
  c.rb = rb;
  c.dv_pad = dv_pad;
  for (int64_t s0 = 0; s0 < panel_limit; s0 += key_block) {
    const size_t nk = static_cast<size_t>(std::min<int64_t>(key_block, panel_limit - s0));
    // The next block's rows, prefetched a slice per row block: the whole block at once (512
    // lines at head_dim 64 on AVX-512) held every line fill buffer and stalled until most had
    // arrived from L3: 43% of Panel's time, ~3.5% of the core's at T = 4096 (Xeon family 6
    // model 207, perf cpu-clock).
    const int64_t next_s0 = s0 + static_cast<int64_t>(nk);
    const int64_t next_keys = one_block ? 0 : std::min(key_block, panel_limit - next_s0);
    if (in_place) {
      c.kpack = t.k + s0 * t.k_stride;
      c.vpack = t.v + s0 * t.v_stride;
    } else {
      float* kpack = t.scratch + lay.kpack;
      float* vpack = kpack + cpu::flash_detail::VpackOffset(key_block, t.head_dim);
      PackKeyBlock(d, t, kpack, vpack, dv_pad, s0, nk);
      c.kpack = kpack;
      c.vpack = vpack;
    }
    for (size_t b = 0; b < nrb; ++b) {
      if (next_keys > 0) {
        const int64_t share = static_cast<int64_t>(nrb);
        PrefetchKeyRows(t, next_s0 + next_keys * static_cast<int64_t>(b) / share,
                        next_s0 + next_keys * static_cast<int64_t>(b + 1) / share);
      }
      c.r0 = p0 + static_cast<int64_t>(b * rb);
      c.nr = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(rb), p0 + np - c.r0));
      // Causal: key blocks wholly above this row block's diagonal are skipped.
      const int64_t limit = row_limit(c.r0 + static_cast<int64_t>(c.nr) - 1);
      if (limit <= s0) continue;
      const size_t nk_b = static_cast<size_t>(std::min<int64_t>(nk, limit - s0));
      c.qt = qt + b * D * rb;
      c.o = o + b * rb * dv_pad;
      c.m = m + b * rb;
      c.l = l + b * rb;
      c.o_live = o_live[b];
      c.out = direct_out ? t.out + c.r0 * t.out_stride : nullptr;
      size_t single = single_rows ? c.nr % N : 0;
      if (single > kSingleRowsMax) single = 0;
      c.nr -= single;
      for (size_t i = 0; i < single; ++i)
        SingleRowOneBlock(d, t, c.r0 + static_cast<int64_t>(c.nr + i), c.kpack, c.k_stride,
                          c.vpack, c.v_stride, nk_b);
      // A short last block works on as many row vectors as it has rows for.
      bool ran = single > 0;
      switch ((c.nr + N - 1) / N) {
        case 0:
          break;
        case 1:
          ran = RowBlockStep<1>(d, c, s0, nk_b) || ran;
          break;
        case 2:
          if constexpr (kRowVecs >= 2) ran = RowBlockStep<2>(d, c, s0, nk_b) || ran;
          break;
        case 3:
          if constexpr (kRowVecs >= 3) ran = RowBlockStep<3>(d, c, s0, nk_b) || ran;
          break;
        default:
          if constexpr (kRowVecs >= 4) ran = RowBlockStep<4>(d, c, s0, nk_b) || ran;
          break;
      }
      o_live[b] = o_live[b] || ran;  // with single rows: written (direct_out)
    }
  }

  // out = O / l. l == 0 exactly when no key was visible (every weight an exact 0): zeros. A NaN
  // l gives a NaN row.
  for (int64_t r = 0; r < np; ++r) {
    if (direct_out && o_live[static_cast<size_t>(r) / rb]) continue;  // written by P.V
    float* HWY_RESTRICT out = t.out + (p0 + r) * t.out_stride;
    const float lr = l[r];
    if (lr == 0.0f) {
      std::memset(out, 0, Dv * sizeof(float));
      continue;
    }
    const float inv = 1.0f / lr;
    const VF vinv = hn::Set(d, inv);
    const float* HWY_RESTRICT orow = o + static_cast<size_t>(r) * dv_pad;
    size_t i = 0;
    for (; i + N <= Dv; i += N) hn::StoreU(hn::Mul(hn::Load(d, orow + i), vinv), d, out + i);
    for (; i < Dv; ++i) out[i] = orow[i] * inv;
  }
}

}  // namespace

void FlashAttentionF32(const FlashAttentionTile& t) {
  if (t.rows <= 0) return;
  const Layout lay = cpu::flash_detail::MakeLayout(t.rows, t.head_dim, t.v_head_dim);
  for (int64_t p0 = 0; p0 < t.rows; p0 += lay.panel_rows)
    Panel(t, lay, p0, std::min(lay.panel_rows, t.rows - p0));
}

// y[i] = exp(x[i]) by `exp` (a vector function: e^x or 2^x), whole vectors and a zero-padded
// tail.
template <class Exp>
void ExpArray(int64_t n, const float* x, float* y, Exp exp) {
  const DF d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= static_cast<size_t>(n); i += N) hn::StoreU(exp(hn::LoadU(d, x + i)), d, y + i);
  if (i < static_cast<size_t>(n)) {
    HWY_ALIGN float buf[hn::MaxLanes(DF())] = {};
    const size_t rest = static_cast<size_t>(n) - i;
    std::memcpy(buf, x + i, rest * sizeof(float));
    hn::Store(exp(hn::Load(d, buf)), d, buf);
    std::memcpy(y + i, buf, rest * sizeof(float));
  }
}

// The softmax's Exp2F32 and ExpFastF32 (decode attention's, gelu's), for the tests of the exps
// alone.
void ExpFastArrayF32(int64_t n, const float* x, float* y) {
  ExpArray(n, x, y, [](VF v) { return ExpFastF32(DF(), v); });
}
void Exp2ArrayF32(int64_t n, const float* x, float* y) {
  ExpArray(n, x, y, [](VF v) { return Exp2F32(DF(), v); });
}

}  // namespace tessera::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera {
HWY_EXPORT(FlashAttentionF32);
HWY_EXPORT(ExpFastArrayF32);
HWY_EXPORT(Exp2ArrayF32);

namespace cpu {

void flash_attention_f32_dispatch(const FlashAttentionTile& tile) {
  HWY_DYNAMIC_DISPATCH(FlashAttentionF32)(tile);
}

int64_t flash_attention_scratch_floats_cpu(int64_t rows, int64_t head_dim, int64_t v_head_dim) {
  return flash_detail::MakeLayout(rows, head_dim, v_head_dim).total;
}

void exp_fast_f32(int64_t n, const float* x, float* y) {
  HWY_DYNAMIC_DISPATCH(ExpFastArrayF32)(n, x, y);
}

void exp2_f32(int64_t n, const float* x, float* y) {
  HWY_DYNAMIC_DISPATCH(Exp2ArrayF32)(n, x, y);
}

}  // namespace cpu
}  // namespace tessera
#endif  // HWY_ONCE
