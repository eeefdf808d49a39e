// flash_attention_f32 (backends/cpu) against a scalar float64 reference, on every SIMD target
// this CPU supports, through cpu::flash_attention_f32_dispatch.
//
// Tolerance: max |out - ref| <= 2e-6 * max(1, max |ref|) per case. Error budget: the exp is
// 5.2e-7 relative (exp_fast below bounds it by 6e-7), the weights' error enters the
// output as ~|v| times that; float32 scores add ~1e-7 at the |score| <= 8 of the random cases.
// The worst case measured uses 0.47 of the tolerance (logged per test case). Cases
// with large scores use integer-valued q and k and power-of-two scales so the float32 scores
// are exact and the comparison still means something at |score| = 1e4.
//
// Every case poisons the scratch with NaN (a read of scratch the kernel did not write turns the
// row NaN) and the output's stride gaps and trailing rows with a sentinel (a stray write fails).
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/flash_attention.h"
#include "core/attention_tile.h"
#include "tests/targets.h"

namespace tessera {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 12345.5f;

// Worst error / tolerance seen per target in the current test case, logged when it ends (so
// the log shows the margin, not just a pass).
std::map<int64_t, double>& WorstRatio() {
  static std::map<int64_t, double> worst;
  return worst;
}
struct LogWorstError {
  ~LogWorstError() {
    std::ostringstream os;
    for (const auto& [target, ratio] : WorstRatio())
      os << " " << hwy::TargetName(target) << " " << ratio;
    BOOST_TEST_MESSAGE("worst error / tolerance:" << os.str());
    WorstRatio().clear();
  }
};

struct Problem {
  int64_t rows = 1, kv_len = 1, d = 8, dv = 8, q_pos0 = 0;
  bool causal = false;
  float scale = 1.0f;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, out_stride = 0, mask_stride = 0;
  bool has_mask = false;
  std::vector<float> q, k, v, mask;  // mask: rows (or 1 when mask_stride == 0) x mask_stride
  int64_t grid_h = 0, grid_w = 0;    // relative-position bias when grid_h > 0
  std::vector<float> table;          // [(2 grid_h - 1) (2 grid_w - 1)]
  std::vector<int32_t> region;       // region ids by token position, when not empty
  float region_penalty = 0.0f;
  // Hand the bias over as FlashAttentionTile::key_major_bias (built here from the table, its
  // row padding NaN: read, never used) instead of the table.
  bool key_major = false;

  // Strides larger than the widths, by odd amounts.
  void Shape(int64_t rows_, int64_t kv_, int64_t d_, int64_t dv_) {
    rows = rows_;
    kv_len = kv_;
    d = d_;
    dv = dv_;
    q_stride = d + 3;
    k_stride = d + 5;
    v_stride = dv + 7;
    out_stride = dv + 2;
    q.assign(static_cast<size_t>(rows * q_stride), kSentinel);
    k.assign(static_cast<size_t>(std::max<int64_t>(kv_len, 1) * k_stride), kSentinel);
    v.assign(static_cast<size_t>(std::max<int64_t>(kv_len, 1) * v_stride), kSentinel);
  }
  // K and V rows back to back (k_stride = d, v_stride = dv, nothing after the last row), as
  // the layer's head-major copy lays them out; the values are kept.
  void ContiguousKeys() {
    std::vector<float> kc(static_cast<size_t>(std::max<int64_t>(kv_len, 1) * d), kSentinel);
    std::vector<float> vc(static_cast<size_t>(std::max<int64_t>(kv_len, 1) * dv), kSentinel);
    for (int64_t s = 0; s < kv_len; ++s) {
      for (int64_t i = 0; i < d; ++i) kc[static_cast<size_t>(s * d + i)] = K(s, i);
      for (int64_t i = 0; i < dv; ++i) vc[static_cast<size_t>(s * dv + i)] = V(s, i);
    }
    k = std::move(kc);
    v = std::move(vc);
    k_stride = d;
    v_stride = dv;
  }
  float& Q(int64_t r, int64_t i) { return q[static_cast<size_t>(r * q_stride + i)]; }
  float& K(int64_t s, int64_t i) { return k[static_cast<size_t>(s * k_stride + i)]; }
  float& V(int64_t s, int64_t i) { return v[static_cast<size_t>(s * v_stride + i)]; }
  float& M(int64_t r, int64_t s) { return mask[static_cast<size_t>(r * mask_stride + s)]; }

  void Random(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d; ++i) Q(r, i) = u(rng);
    for (int64_t s = 0; s < kv_len; ++s) {
      for (int64_t i = 0; i < d; ++i) K(s, i) = u(rng);
      for (int64_t i = 0; i < dv; ++i) V(s, i) = u(rng);
    }
  }
  // An additive mask, [rows, kv_len] with row stride kv_len + 3, or one row (stride 0).
  void Mask(bool one_row) {
    has_mask = true;
    mask_stride = one_row ? 0 : kv_len + 3;
    mask.assign(static_cast<size_t>((one_row ? 1 : rows) * (kv_len + 3)), kSentinel);
    for (int64_t r = 0; r < (one_row ? 1 : rows); ++r)
      for (int64_t s = 0; s < kv_len; ++s) mask[static_cast<size_t>(r * (kv_len + 3) + s)] = 0.0f;
  }

  // A random relative-position bias table for an h x w grid.
  void RelBias(int64_t h, int64_t w, std::mt19937& rng) {
    grid_h = h;
    grid_w = w;
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    table.resize(static_cast<size_t>((2 * h - 1) * (2 * w - 1)));
    for (float& x : table) x = u(rng);
  }
  // The bias of query r against key s, from the grid coordinates directly (not through
  // relative_position_index, the formula the kernel implements).
  double Bias(int64_t r, int64_t s) const {
    const int64_t q = q_pos0 + r;
    const int64_t dy = q / grid_w - s / grid_w, dx = q % grid_w - s % grid_w;
    return table[static_cast<size_t>((dy + grid_h - 1) * (2 * grid_w - 1) + dx + grid_w - 1)];
  }

  std::string Describe() const {
    std::ostringstream os;
    os << "rows=" << rows << " kv_len=" << kv_len << " d=" << d << " dv=" << dv
       << " q_pos0=" << q_pos0 << " causal=" << causal << " scale=" << scale
       << " mask=" << (has_mask ? (mask_stride == 0 ? "one-row" : "full") : "none");
    if (grid_h > 0) os << " grid=" << grid_h << "x" << grid_w;
    if (!region.empty()) os << " regions penalty=" << region_penalty;
    return os.str();
  }
};

// Float64 reference: [rows][dv], NaN rows where a visible score is NaN.
std::vector<double> Reference(Problem& p) {
  std::vector<double> out(static_cast<size_t>(p.rows * p.dv), 0.0);
  std::vector<double> score(static_cast<size_t>(std::max<int64_t>(p.kv_len, 1)));
  for (int64_t r = 0; r < p.rows; ++r) {
    int64_t visible = p.kv_len;
    if (p.causal) visible = std::clamp<int64_t>(p.q_pos0 + r + 1, 0, p.kv_len);
    double mx = -INFINITY;
    bool nan = false;
    for (int64_t s = 0; s < visible; ++s) {
      double dot = 0.0;
      for (int64_t i = 0; i < p.d; ++i) dot += static_cast<double>(p.Q(r, i)) * p.K(s, i);
      double x = static_cast<double>(p.scale) * dot;
      if (p.has_mask) x += p.mask_stride == 0 ? p.mask[static_cast<size_t>(s)] : p.M(r, s);
      if (p.grid_h > 0) x += p.Bias(r, s);
      if (!p.region.empty() &&
          p.region[static_cast<size_t>(p.q_pos0 + r)] != p.region[static_cast<size_t>(s)])
        x += p.region_penalty;
      score[static_cast<size_t>(s)] = x;
      nan |= std::isnan(x);
      mx = std::max(mx, x);
    }
    double* o = out.data() + r * p.dv;
    if (nan) {
      std::fill(o, o + p.dv, NAN);
      continue;
    }
    if (visible == 0 || mx == -INFINITY) continue;  // zeros
    double sum = 0.0;
    for (int64_t s = 0; s < visible; ++s) {
      const double e = std::exp(score[static_cast<size_t>(s)] - mx);  // NaN if mx = +inf
      sum += e;
      for (int64_t i = 0; i < p.dv; ++i) o[i] += e * p.V(s, i);
    }
    for (int64_t i = 0; i < p.dv; ++i) o[i] /= sum;
  }
  return out;
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};

// Runs the kernel on the current target; returns [rows + 2][out_stride] with sentinels.
std::vector<float> Run(Problem& p) {
  const int64_t floats = cpu::flash_attention_scratch_floats_cpu(p.rows, p.d, p.dv);
  const size_t bytes = static_cast<size_t>((floats * 4 + 63) / 64 * 64 + 64);
  std::unique_ptr<float, AlignedFree> scratch(static_cast<float*>(std::aligned_alloc(64, bytes)));
  std::fill(scratch.get(), scratch.get() + bytes / 4, kNaN);
  std::vector<float> out(static_cast<size_t>((p.rows + 2) * p.out_stride), kSentinel);
  FlashAttentionTile t;
  t.rows = p.rows;
  t.q_pos0 = p.q_pos0;
  t.kv_len = p.kv_len;
  t.head_dim = p.d;
  t.v_head_dim = p.dv;
  t.scale = p.scale;
  t.q = p.q.data();
  t.q_stride = p.q_stride;
  t.k = p.k.data();
  t.k_stride = p.k_stride;
  t.v = p.v.data();
  t.v_stride = p.v_stride;
  t.mask = p.has_mask ? p.mask.data() : nullptr;
  t.mask_stride = p.mask_stride;
  std::vector<float> key_major;
  if (p.grid_h > 0 && p.key_major) {
    const int64_t stride = key_major_rows(p.rows);
    key_major.assign(static_cast<size_t>(std::max<int64_t>(p.kv_len, 1) * stride), kNaN);
    for (int64_t s = 0; s < p.kv_len; ++s)
      for (int64_t r = 0; r < p.rows; ++r)
        key_major[static_cast<size_t>(s * stride + r)] = p.table[static_cast<size_t>(
            relative_position_index(p.q_pos0 + r, s, p.grid_h, p.grid_w))];
    t.key_major_bias = key_major.data();
    t.key_major_stride = stride;
  } else if (p.grid_h > 0) {
    t.rel_table = p.table.data();
    t.grid_h = p.grid_h;
    t.grid_w = p.grid_w;
  }
  if (!p.region.empty()) {
    t.region = p.region.data();
    t.region_penalty = p.region_penalty;
  }
  t.causal = p.causal;
  t.out = out.data();
  t.out_stride = p.out_stride;
  t.scratch = scratch.get();
  cpu::flash_attention_f32_dispatch(t);
  return out;
}

// Both kernels' tolerance: 2e-6 * max(1, max |ref|) over the reference's non-NaN values.
double Tolerance(const std::vector<double>& ref) {
  double ref_max = 0.0;
  for (const double x : ref)
    if (!std::isnan(x)) ref_max = std::max(ref_max, std::fabs(x));
  return 2e-6 * std::max(1.0, ref_max);
}

// Runs p on every target and compares with the reference; one failure message per target.
void Check(Problem& p) {
  const std::vector<double> ref = Reference(p);
  const double tol = Tolerance(ref);
  TargetReset reset;
  for (const int64_t target : compiled_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::vector<float> out = Run(p);
    double err = 0.0;
    std::string problem;
    for (int64_t r = 0; r < p.rows + 2 && problem.empty(); ++r) {
      for (int64_t i = 0; i < p.out_stride; ++i) {
        const float got = out[static_cast<size_t>(r * p.out_stride + i)];
        if (r >= p.rows || i >= p.dv) {
          if (got != kSentinel) problem = "wrote outside the output at row " + std::to_string(r);
          continue;
        }
        const double want = ref[static_cast<size_t>(r * p.dv + i)];
        if (std::isnan(want) != std::isnan(got)) {
          problem = "NaN mismatch at row " + std::to_string(r) + " col " + std::to_string(i) +
                    ": got " + std::to_string(got) + ", want " + std::to_string(want);
          break;
        }
        if (!std::isnan(want)) err = std::max(err, std::fabs(got - want));
      }
    }
    double& worst = WorstRatio()[target];
    worst = std::max(worst, err / tol);
    if (problem.empty() && !(err <= tol)) {
      problem = "max abs error " + std::to_string(err) + " > " + std::to_string(tol);
    }
    BOOST_TEST(problem.empty(), hwy::TargetName(target) << ": " << p.Describe() << ": " << problem);
  }
}

BOOST_AUTO_TEST_SUITE(flash_attention)

BOOST_AUTO_TEST_CASE(targets_reach_the_kernel) {
  const std::vector<int64_t> targets = compiled_targets();
  TargetReset reset;
  std::string names;
  for (const int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    // The library's Highway files dispatch from the same target list as this one.
    BOOST_TEST(cpu::dispatched_target() == target, hwy::TargetName(target));
    names += std::string(" ") + hwy::TargetName(target);
  }
  BOOST_TEST_MESSAGE("flash_attention: testing targets" << names);
  BOOST_TEST(targets.size() >= 2u);
}

// Every row count through two row blocks and one (rows 1..65 covers 2N+1 for N = 16, 8, 4, 1),
// key counts around the 32-key block, causal or not, d = 64 and an odd d.
BOOST_AUTO_TEST_CASE(tile_edges) {
  LogWorstError log;
  std::mt19937 rng(1);
  for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{64, 64}, {17, 24}}) {
    for (const int64_t kv : {0, 1, 7, 31, 32, 33, 63, 64, 65, 97}) {
      for (int64_t rows = 1; rows <= 65; ++rows) {
        for (const bool causal : {false, true}) {
          Problem p;
          p.Shape(rows, kv, d, dv);
          p.Random(rng);
          p.causal = causal;
          p.scale = 1.0f / std::sqrt(static_cast<float>(d));
          Check(p);
        }
      }
    }
  }
}

// Panels of 256 rows: tiles past one panel, and long key ranges.
BOOST_AUTO_TEST_CASE(panels_and_long_keys) {
  LogWorstError log;
  std::mt19937 rng(2);
  for (const int64_t rows : {127, 200, 255, 256, 257, 530}) {
    for (const int64_t kv : {129, 300}) {
      for (const bool causal : {false, true}) {
        Problem p;
        p.Shape(rows, kv, 64, 64);
        p.Random(rng);
        p.causal = causal;
        p.scale = 0.125f;
        Check(p);
      }
    }
  }
}

// Contiguous K and V rows over several key blocks (read in place where the value rows are whole
// vectors, packed otherwise): the reference's values, and the same bits as the strided layout
// (one FMA chain per element either way).
BOOST_AUTO_TEST_CASE(contiguous_keys) {
  LogWorstError log;
  std::mt19937 rng(12);
  TargetReset reset;
  for (const int64_t dim : {64, 32, 40}) {
    for (const int64_t kv : {129, 300}) {
      for (const bool causal : {false, true}) {
        Problem strided;
        strided.Shape(257, kv, dim, dim);
        strided.Random(rng);
        strided.causal = causal;
        strided.scale = 0.125f;
        Problem contiguous = strided;
        contiguous.ContiguousKeys();
        Check(contiguous);
        for (const int64_t target : compiled_targets()) {
          hwy::SetSupportedTargetsForTest(target);
          BOOST_TEST((Run(strided) == Run(contiguous)),
                     hwy::TargetName(target) << ": " << contiguous.Describe());
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(head_dims) {
  LogWorstError log;
  std::mt19937 rng(3);
  const std::pair<int64_t, int64_t> dims[] = {{1, 1},   {8, 8},   {16, 16},   {33, 33},
                                              {64, 64}, {80, 80}, {128, 128}, {64, 80},
                                              {80, 64}, {16, 33}, {33, 7},    {128, 1}};
  for (const auto& [d, dv] : dims) {
    for (const int64_t rows : {1, 5, 17, 33, 64}) {
      for (const int64_t kv : {1, 33, 70}) {
        for (const bool causal : {false, true}) {
          Problem p;
          p.Shape(rows, kv, d, dv);
          p.Random(rng);
          p.causal = causal;
          p.scale = 1.0f / std::sqrt(static_cast<float>(d));
          Check(p);
        }
      }
    }
  }
}

// Peaky rows (scale 1 on d = 64: scores up to ~8) and rows whose max grows key block after key
// block, so the reference max, alpha and the rescale of O all move. The kernel moves a row's
// reference only when a block's max exceeds it by more than 8 in log2 units (8 ln 2 = 5.5 in
// the scores' own): the ramps below grow by 1.6, 3.2 and 16 per 32-key block (1.5, 3 and 15 per
// 30-key block on AVX2), 2.3, 4.6 and 23 in log2 units, so the reference stays for three or
// four blocks (P up to 2^8), moves every other block, and moves every block.
BOOST_AUTO_TEST_CASE(online_rescale) {
  LogWorstError log;
  std::mt19937 rng(4);
  for (const int64_t kv : {64, 200}) {
    Problem p;
    p.Shape(40, kv, 64, 64);
    p.Random(rng);
    p.scale = 1.0f;
    Check(p);
    // Increasing scores along s, up to 0 at the last key (scores of magnitude 100 would carry
    // float32 rounding of 6e-6 into the weights that count): every key block raises the max.
    p.Mask(false);
    for (const float slope : {0.05f, 0.1f, 0.5f}) {
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t s = 0; s < kv; ++s) p.M(r, s) = slope * static_cast<float>(s - (kv - 1));
      Check(p);
    }
    // Decreasing: the first block holds the max, no rescale after it.
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t s = 0; s < kv; ++s) p.M(r, s) = -0.05f * static_cast<float>(s);
    Check(p);
  }
}

// Causal with the query tile starting past key 0, and with fewer keys than q_pos0 + rows (the
// last rows see every key, or none when kv_len is 0).
BOOST_AUTO_TEST_CASE(causal_offsets) {
  LogWorstError log;
  std::mt19937 rng(5);
  for (const int64_t q_pos0 : {1, 5, 31, 32, 40, 100}) {
    for (const int64_t rows : {1, 9, 33, 64, 130}) {
      for (const int64_t kv : {int64_t{0}, int64_t{1}, int64_t{20}, q_pos0 + rows,
                               q_pos0 + rows / 2, q_pos0 + rows + 7}) {
        Problem p;
        p.Shape(rows, kv, 32, 40);
        p.Random(rng);
        p.causal = true;
        p.q_pos0 = q_pos0;
        p.scale = 0.2f;
        Check(p);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(masks) {
  LogWorstError log;
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::bernoulli_distribution masked(0.3);
  for (const int64_t rows : {1, 7, 32, 33, 70}) {
    for (const int64_t kv : {1, 31, 45, 96, 100}) {
      for (const bool causal : {false, true}) {
        for (const bool one_row : {false, true}) {
          Problem p;
          p.Shape(rows, kv, 24, 24);
          p.Random(rng);
          p.causal = causal;
          p.scale = 0.3f;
          p.Mask(one_row);
          for (int64_t r = 0; r < (one_row ? 1 : rows); ++r)
            for (int64_t s = 0; s < kv; ++s) p.M(r, s) = masked(rng) ? -kInf : u(rng);
          Check(p);
        }
      }
    }
  }
}

// Relative-position bias looked up in the tile: grids whose rows hold whole row vectors (the
// load path: W = 16, 32, 48), rows that straddle grid rows (the gather path: W = 5, 20, 33,
// and tiles starting off a vector boundary), one-column and one-row grids, T not a multiple of
// the tile, with a mask and the causal cut on top; the tile is any slice of the T queries.
BOOST_AUTO_TEST_CASE(relative_position_bias) {
  LogWorstError log;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::bernoulli_distribution masked(0.2);
  struct Case {
    int64_t h, w, q_pos0, rows;
    bool causal, mask;
  };
  const Case cases[] = {
      {4, 16, 0, 64, false, false},  {3, 32, 32, 64, false, false},   {2, 48, 0, 96, true, false},
      {6, 5, 0, 30, false, false},   {5, 20, 16, 70, false, true},    {3, 33, 7, 80, true, false},
      {17, 1, 0, 17, false, false},  {1, 40, 3, 37, true, true},      {1, 1, 0, 1, false, false},
      {16, 16, 0, 256, false, true}, {20, 20, 100, 300, true, false},
  };
  for (const Case& c : cases) {
    Problem p;
    const int64_t T = c.h * c.w;
    p.Shape(c.rows, T, 16, 24);
    p.Random(rng);
    p.q_pos0 = c.q_pos0;
    p.causal = c.causal;
    p.scale = 0.25f;
    p.RelBias(c.h, c.w, rng);
    if (c.mask) {
      p.Mask(false);
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t s = 0; s < T; ++s) p.M(r, s) = masked(rng) ? -kInf : u(rng);
    }
    BOOST_TEST_REQUIRE(c.q_pos0 + c.rows <= T);
    Check(p);
    p.key_major = true;  // the same bias laid out by the caller
    Check(p);
  }
}

// Swin's shifted-window mask as region ids: a query and a key of different regions get the
// penalty (-100 as torchvision, and -inf), with and without the relative-position bias and a
// mask; windows of 49 (7 x 7) and 64 tokens, region ids laid out as shifted windows make them
// (3 x 3 blocks) and at random.
BOOST_AUTO_TEST_CASE(region_penalty) {
  LogWorstError log;
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  struct Case {
    int64_t h, w, q_pos0, rows;
    bool bias, mask, random_ids;
    float penalty;
  };
  const Case cases[] = {
      {7, 7, 0, 49, true, false, false, -100.0f}, {7, 7, 16, 33, true, true, false, -100.0f},
      {8, 8, 0, 64, true, false, true, -100.0f},  {8, 8, 0, 64, false, false, true, -kInf},
      {5, 9, 3, 40, false, true, true, -3.5f},    {1, 1, 0, 1, true, false, false, -100.0f},
      {12, 12, 32, 100, true, false, false, -100.0f},
  };
  for (const Case& c : cases) {
    Problem p;
    const int64_t T = c.h * c.w;
    p.Shape(c.rows, T, 32, 32);
    p.Random(rng);
    p.q_pos0 = c.q_pos0;
    p.scale = 0.18f;
    if (c.bias) p.RelBias(c.h, c.w, rng);
    p.region.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      // Shifted windows: 3 bands per axis (the last 3 columns / rows a shift wraps around).
      const int64_t y = t / c.w, x = t % c.w;
      const int32_t ry = y < c.h - 3 ? 0 : (y < c.h - 1 ? 1 : 2);
      const int32_t rx = x < c.w - 3 ? 0 : (x < c.w - 1 ? 1 : 2);
      p.region[static_cast<size_t>(t)] =
          c.random_ids ? static_cast<int32_t>(rng() % 4) : 3 * ry + rx;
    }
    p.region_penalty = c.penalty;
    if (c.mask) {
      p.Mask(false);
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t s = 0; s < T; ++s) p.M(r, s) = u(rng);
    }
    Check(p);
    if (c.bias) {
      p.key_major = true;  // the bias laid out by the caller, as the core does for windows
      Check(p);
    }
  }
}

// A tile's last one or two rows past a row vector run on their own where its keys are one
// block and its only additive terms a key-major bias and region ids (Swin's windows): row
// counts leaving 1 or 2 on every target (1, 2, 17, 18, 49, 50 rows: 16, 8 and 4 lanes), head
// dims 32 to 256, with the bias and regions and without, scores ~1e3 apart, and a NaN in a
// last row's query or in a key.
BOOST_AUTO_TEST_CASE(single_rows) {
  LogWorstError log;
  std::mt19937 rng(29);
  std::uniform_int_distribution<int> small(-4, 4);
  struct Dims {
    int64_t d, dv, h, w;  // keys: an h x w window
  };
  for (const Dims& dm : {Dims{32, 32, 8, 8}, Dims{64, 48, 4, 8}, Dims{256, 16, 3, 5}}) {
    const int64_t T = dm.h * dm.w;
    for (const int64_t rows : {1, 2, 17, 18, 49, 50}) {
      if (rows > T) continue;
      for (const bool additive : {false, true}) {
        Problem p;
        p.Shape(rows, T, dm.d, dm.dv);
        p.Random(rng);
        p.scale = 1.0f / std::sqrt(static_cast<float>(dm.d));
        if (additive) {
          p.RelBias(dm.h, dm.w, rng);
          p.key_major = true;
          p.region.resize(static_cast<size_t>(T));
          for (int32_t& id : p.region) id = static_cast<int32_t>(rng() % 3);
          p.region_penalty = -100.0f;
        }
        Check(p);
        // Integer scores (exact in float: the float64 reference sees no rounding there) up to
        // ~8000 apart; the bias would round at that magnitude, so without it.
        if (!additive) {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < p.d; ++i) p.Q(r, i) = static_cast<float>(small(rng));
          for (int64_t s = 0; s < T; ++s)
            for (int64_t i = 0; i < p.d; ++i) p.K(s, i) = static_cast<float>(small(rng));
          p.scale = 16.0f;
          Check(p);
          p.scale = 0.5f;
        }
        p.Q(rows - 1, 1) = kNaN;  // that row only
        Check(p);
        p.Q(rows - 1, 1) = 1.0f;
        p.K(T / 2, 0) = kNaN;  // every row
        Check(p);
      }
    }
  }
}

// Rows with every key masked get zeros (never NaN), alone, next to live rows, and with the
// causal cut; key blocks masked for every row of a row block are skipped without changing the
// result; a row that sees only its last key block.
BOOST_AUTO_TEST_CASE(fully_masked) {
  LogWorstError log;
  std::mt19937 rng(7);
  for (const int64_t rows : {1, 20, 40}) {
    for (const int64_t kv : {1, 32, 80}) {
      for (const bool causal : {false, true}) {
        Problem p;
        p.Shape(rows, kv, 16, 16);
        p.Random(rng);
        p.causal = causal;
        p.Mask(false);
        for (int64_t r = 0; r < rows; r += 3)
          for (int64_t s = 0; s < kv; ++s) p.M(r, s) = -kInf;
        Check(p);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t s = 0; s < kv; ++s) p.M(r, s) = -kInf;
        Check(p);
        // Keys 32..63 masked for every row (a whole skipped block); row 1 sees only the keys
        // from 64 on (none in its causal range: zeros).
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t s = 0; s < kv; ++s) p.M(r, s) = (s >= 32 && s < 64) ? -kInf : 0.0f;
        if (rows > 1)
          for (int64_t s = 0; s < std::min<int64_t>(kv, 64); ++s) p.M(1, s) = -kInf;
        Check(p);
      }
    }
  }
  // One shared mask row (stride 0) masking everything.
  Problem p;
  p.Shape(37, 50, 16, 16);
  p.Random(rng);
  p.Mask(true);
  for (int64_t s = 0; s < 50; ++s) p.M(0, s) = -kInf;
  Check(p);
}

// Scores of +-80 and +-1e4 after the scale: no overflow, no NaN, same result. q and k are small
// integers and the scales powers of two, so every float32 score is exact.
BOOST_AUTO_TEST_CASE(large_magnitudes) {
  LogWorstError log;
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> small(-4, 4);
  for (const float scale : {0.25f, 0.5f, 16.0f, 64.0f}) {
    for (const bool causal : {false, true}) {
      Problem p;
      p.Shape(45, 90, 64, 32);
      p.Random(rng);
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t i = 0; i < p.d; ++i) p.Q(r, i) = static_cast<float>(small(rng));
      for (int64_t s = 0; s < p.kv_len; ++s)
        for (int64_t i = 0; i < p.d; ++i) p.K(s, i) = static_cast<float>(small(rng));
      p.scale = scale;
      p.causal = causal;
      Check(p);
      // Same magnitudes from the mask, with -inf mixed in.
      p.Mask(false);
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t s = 0; s < p.kv_len; ++s)
          p.M(r, s) =
              (r + s) % 5 == 0 ? -kInf : static_cast<float>((r * 7 + s * 3) % 11 - 5) * 1e3f;
      Check(p);
    }
  }
}

// A NaN score makes its row NaN, whether it comes from q, k or the mask, wherever it sits in
// the key blocks, also in a row whose other scores are all -inf; a NaN in a key a row does not
// see (causal) leaves that row alone. 70 keys take several key blocks, 30 one (whose P.V writes
// the output rows itself).
BOOST_AUTO_TEST_CASE(nan_propagation) {
  LogWorstError log;
  std::mt19937 rng(9);
  for (const auto& [kv, nan_key] : {std::pair<int64_t, int64_t>{70, 0}, {70, 5}, {70, 31},
                                    {70, 32}, {70, 69}, {30, 0}, {30, 17}, {30, 29}}) {
    for (const bool causal : {false, true}) {
      Problem p;
      p.Shape(40, kv, 16, 16);
      p.Random(rng);
      p.causal = causal;
      p.scale = 0.25f;
      p.K(nan_key, 3) = kNaN;  // every row that sees nan_key turns NaN
      Check(p);
      p.K(nan_key, 3) = 0.5f;
      p.Q(7, 0) = kNaN;  // row 7 only
      Check(p);
      p.Q(7, 0) = 0.5f;
      p.Mask(false);
      p.M(3, nan_key) = kNaN;  // row 3 if it sees nan_key
      p.M(9, nan_key) = kNaN;
      for (int64_t s = 0; s < p.kv_len; ++s)
        if (s != nan_key) p.M(9, s) = -kInf;  // row 9: NaN among -inf
      Check(p);
    }
  }
}

// An exp's base and domain: the float64 reference, the range checked for relative error (its
// result normal throughout) and where the results below the normal range start.
struct ExpDomain {
  double (*reference)(double);
  float lo, hi, underflow_from;
};
constexpr ExpDomain kBaseE = {[](double x) { return std::exp(x); }, -87.33f, 88.0f, -87.34f};
constexpr ExpDomain kBase2 = {[](double x) { return std::exp2(x); }, -126.0f, 127.0f, -126.01f};

// The exps on their own: relative error over the domain (flash attention's arguments reach +8,
// decode attention's stay <= 0), exact 1 at 0 (the rescale skip relies on alpha == 1 exactly),
// 0 at and below the normal range and never a subnormal, 0 for -inf, NaN for NaN, on every
// compiled target. `rel_bound(x)` bounds the relative error at x; `same_bits` lists targets that
// must give the first one's bits.
void CheckExp(const char* name, void (*exp)(int64_t, const float*, float*), const ExpDomain& dom,
              double (*rel_bound)(float), std::initializer_list<int64_t> same_bits) {
  std::vector<float> x;
  for (int i = 0; i <= 2000000; ++i) x.push_back(dom.lo * static_cast<float>(i) / 2000000.0f);
  for (int i = 1; i <= 2000000; ++i) x.push_back(dom.hi * static_cast<float>(i) / 2000000.0f);
  for (float y = -1e-30f; y > -1e-2f; y *= 1.7f) x.push_back(y);  // tiny arguments
  for (float y = 1e-30f; y < 1e-2f; y *= 1.7f) x.push_back(y);
  const size_t n_rel = x.size();
  for (float y = dom.underflow_from; y > dom.underflow_from - 18.0f; y -= 0.01f) x.push_back(y);
  x.push_back(-1e4f);
  x.push_back(-kInf);
  x.push_back(kNaN);
  std::vector<float> y(x.size()), first_bits;
  for (const int64_t target : compiled_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    std::fill(y.begin(), y.end(), kSentinel);
    exp(static_cast<int64_t>(x.size()), x.data(), y.data());
    const std::string label = std::string(name) + " " + hwy::TargetName(target);
    if (std::find(same_bits.begin(), same_bits.end(), target) != same_bits.end()) {
      if (first_bits.empty()) first_bits = y;
      BOOST_TEST(std::memcmp(first_bits.data(), y.data(), (y.size() - 1) * sizeof(float)) == 0,
                 label << ": bits differ from the first listed target's");
    }
    bool normal_or_zero = true;
    for (const float v : y) normal_or_zero &= std::fpclassify(v) != FP_SUBNORMAL;
    BOOST_TEST(normal_or_zero, label << ": a subnormal result");
    double worst = 0.0;  // of error / bound
    float worst_x = 0.0f;
    for (size_t i = 0; i < n_rel; ++i) {
      const double want = dom.reference(static_cast<double>(x[i]));
      const double ratio = std::fabs(y[i] - want) / want / rel_bound(x[i]);
      if (ratio > worst) {
        worst = ratio;
        worst_x = x[i];
      }
    }
    BOOST_TEST_MESSAGE(label << ": worst relative error / bound " << worst << " at x = "
                             << worst_x);
    BOOST_TEST(worst <= 1.0, label << ": " << worst << " of the bound at " << worst_x);
    BOOST_TEST(y[0] == 1.0f, label);
    bool under_ok = true;
    for (size_t i = n_rel; i + 1 < x.size(); ++i) under_ok &= y[i] >= 0.0f && y[i] <= 1.2e-38f;
    BOOST_TEST(under_ok, label << ": exp below " << dom.underflow_from << " not in [0, 1.2e-38]");
    BOOST_TEST(y[x.size() - 2] == 0.0f, label << ": exp(-inf)");
    BOOST_TEST(std::isnan(y[x.size() - 1]), label << ": exp(NaN)");
  }
}

// ExpFastF32: 6e-7 relative everywhere; the targets with FMA give the same bits (AVX-512 scales
// by 2^n with vscalefps, AVX2 with a multiply).
BOOST_AUTO_TEST_CASE(exp_fast) {
  TargetReset reset;
  CheckExp("exp_fast", cpu::exp_fast_f32, kBaseE, [](float) { return 6e-7; },
           {HWY_AVX2, HWY_AVX3, HWY_AVX3_DL});
}

// Exp2F32: 2^x to the polynomial's 1.1e-7 and the evaluation's roundings; the targets with FMA
// give the same bits (AVX-512 rounds by vrndscaleps and scales with vscalefps, AVX2 by the
// shifter and a multiply).
BOOST_AUTO_TEST_CASE(exp2) {
  TargetReset reset;
  CheckExp("exp2", cpu::exp2_f32, kBase2, [](float) { return 2e-7; },
           {HWY_AVX2, HWY_AVX3, HWY_AVX3_DL});
}

BOOST_AUTO_TEST_CASE(scratch_size) {
  // Bounded by the 256-row panel: the same for 256 rows and 10^6, and well inside L2 (170 KiB at
  // head_dim 64 with room for 64 packed keys).
  BOOST_TEST(cpu::flash_attention_scratch_floats_cpu(256, 64, 64) ==
             cpu::flash_attention_scratch_floats_cpu(1000000, 64, 64));
  BOOST_TEST(cpu::flash_attention_scratch_floats_cpu(1, 64, 64) <
             cpu::flash_attention_scratch_floats_cpu(256, 64, 64));
  BOOST_TEST(cpu::flash_attention_scratch_floats_cpu(1000000, 64, 64) * 4 <= 176 * 1024);
}

BOOST_AUTO_TEST_SUITE_END()

// ------------------------------------------------------------------ decode attention
// One query row against a K/V cache in blocks (cpu::decode_attention_block_f32, keys transposed
// in the cache) merged by log-sum-exp (cpu::decode_attention_merge_f32), against a float64
// softmax(scale q.k + mask) v. Tolerance as the flash kernel's: 2e-6 * max(1, max |ref|) (float
// dot products over d <= 80 and the softmax exp's 5.2e-7 relative error).
struct DecodeProblem {
  int64_t S = 1, d = 64, dv = 64, block = 0;  // block 0: one block of all S keys
  float scale = 0.125f;
  bool masked = false, all_masked = false, nan_q = false;
  uint32_t seed = 1;
};

std::vector<double> DecodeReference(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, const std::vector<float>& mask,
                                    const DecodeProblem& p) {
  std::vector<double> sc(static_cast<size_t>(p.S));
  double top = -std::numeric_limits<double>::infinity();
  bool nan = false;
  for (int64_t s = 0; s < p.S; ++s) {
    double acc = 0.0;
    for (int64_t i = 0; i < p.d; ++i)
      acc += static_cast<double>(q[static_cast<size_t>(i)]) * p.scale *
             k[static_cast<size_t>(s * p.d + i)];
    if (!mask.empty()) acc += mask[static_cast<size_t>(s)];
    sc[static_cast<size_t>(s)] = acc;
    nan |= std::isnan(acc);
    if (!std::isnan(acc)) top = std::max(top, acc);
  }
  std::vector<double> out(static_cast<size_t>(p.dv), 0.0);
  if (nan) return std::vector<double>(static_cast<size_t>(p.dv), std::nan(""));
  if (top == -std::numeric_limits<double>::infinity()) return out;
  double z = 0.0;
  for (int64_t s = 0; s < p.S; ++s) {
    const double e = std::exp(sc[static_cast<size_t>(s)] - top);
    z += e;
    for (int64_t j = 0; j < p.dv; ++j)
      out[static_cast<size_t>(j)] += e * v[static_cast<size_t>(s * p.dv + j)];
  }
  for (double& x : out) x /= z;
  return out;
}

void CheckDecode(const DecodeProblem& p) {
  std::mt19937 gen(p.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(p.d)), k(static_cast<size_t>(p.S * p.d)),
      v(static_cast<size_t>(p.S * p.dv)), mask;
  for (float& x : q) x = normal(gen);
  for (float& x : k) x = normal(gen);
  for (float& x : v) x = normal(gen);
  if (p.nan_q) q[0] = kNaN;
  if (p.masked || p.all_masked) {
    mask.resize(static_cast<size_t>(p.S));
    for (int64_t s = 0; s < p.S; ++s)
      mask[static_cast<size_t>(s)] = p.all_masked || (s % 3 == 1) || (s >= 8 && s < 24)
                                         ? -kInf
                                         : 0.5f * normal(gen);
  }
  const std::vector<double> ref = DecodeReference(q, k, v, mask, p);
  // The cache: K transposed with room past S (stride S + 5), V rows padded to dv + 3.
  const int64_t kt_stride = p.S + 5, v_stride = p.dv + 3;
  std::vector<float> kt(static_cast<size_t>(p.d * kt_stride), kSentinel),
      vc(static_cast<size_t>(p.S * v_stride), kSentinel);
  for (int64_t s = 0; s < p.S; ++s) {
    for (int64_t i = 0; i < p.d; ++i)
      kt[static_cast<size_t>(i * kt_stride + s)] = k[static_cast<size_t>(s * p.d + i)];
    for (int64_t j = 0; j < p.dv; ++j)
      vc[static_cast<size_t>(s * v_stride + j)] = v[static_cast<size_t>(s * p.dv + j)];
  }
  const int64_t block = p.block > 0 ? p.block : p.S;
  const int64_t blocks = (p.S + block - 1) / block;
  const double tol = Tolerance(ref);
  TargetReset reset;
  for (const int64_t target : compiled_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    std::unique_ptr<float, decltype(&std::free)> scores(
        // aligned_alloc wants a multiple of the alignment (ASan returns null otherwise).
        static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((block + 16) / 16 * 64))),
        &std::free);
    BOOST_REQUIRE(scores.get() != nullptr);
    std::vector<float> o(static_cast<size_t>(blocks * p.dv)), m(static_cast<size_t>(blocks)),
        l(static_cast<size_t>(blocks)), out(static_cast<size_t>(p.dv) + 1, kSentinel);
    for (int64_t b = 0; b < blocks; ++b) {
      DecodeAttentionBlock db;
      db.head_dim = p.d;
      db.v_head_dim = p.dv;
      db.key_begin = b * block;
      db.key_end = std::min(p.S, (b + 1) * block);
      db.scale = p.scale;
      db.q = q.data();
      db.kt = kt.data();
      db.kt_stride = kt_stride;
      db.v = vc.data();
      db.v_stride = v_stride;
      db.mask = mask.empty() ? nullptr : mask.data();
      db.scores = scores.get();
      db.o = o.data() + b * p.dv;
      db.m = &m[static_cast<size_t>(b)];
      db.l = &l[static_cast<size_t>(b)];
      cpu::decode_attention_block_f32(db);
    }
    cpu::decode_attention_merge_f32(blocks, p.dv, m.data(), l.data(), o.data(), p.dv, out.data());
    std::string problem;
    double err = 0.0;
    for (int64_t j = 0; j < p.dv && problem.empty(); ++j) {
      const float got = out[static_cast<size_t>(j)];
      const double want = ref[static_cast<size_t>(j)];
      if (std::isnan(want) != std::isnan(got))
        problem = "NaN mismatch at " + std::to_string(j) + ": got " + std::to_string(got);
      else if (!std::isnan(want))
        err = std::max(err, std::fabs(got - want));
    }
    if (out[static_cast<size_t>(p.dv)] != kSentinel) problem = "wrote past v_head_dim";
    if (problem.empty() && !(err <= tol))
      problem = "max abs error " + std::to_string(err) + " > " + std::to_string(tol);
    BOOST_TEST(problem.empty(), hwy::TargetName(target)
                                    << ": S=" << p.S << " d=" << p.d << " dv=" << p.dv
                                    << " block=" << block << (p.masked ? " masked" : "")
                                    << (p.all_masked ? " all-masked" : "")
                                    << (p.nan_q ? " nan-q" : "") << ": " << problem);
  }
}

BOOST_AUTO_TEST_SUITE(decode_attention)

// Key counts across the vector widths and the 4-vector score groups (1..65 and long caches),
// head widths with and without a vector tail, blocks of the whole cache, 64 keys and 7 keys.
BOOST_AUTO_TEST_CASE(matches_float64_softmax) {
  uint32_t seed = 1;
  for (const int64_t S : {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257, 1000})
    for (const int64_t block : {int64_t{0}, int64_t{64}, int64_t{7}}) {
      DecodeProblem p;
      p.S = S;
      p.block = block;
      p.seed = seed++;
      CheckDecode(p);
      p.d = 3;
      p.dv = 17;
      CheckDecode(p);
      p.d = 80;
      p.dv = 1;
      p.scale = 0.11f;
      CheckDecode(p);
    }
  DecodeProblem wide;
  wide.S = 40;
  wide.d = 600;  // past the kernel's on-stack q chunk: the one-lane path
  wide.scale = 0.04f;
  CheckDecode(wide);
}

BOOST_AUTO_TEST_CASE(masks_and_special_values) {
  for (const int64_t block : {int64_t{0}, int64_t{8}, int64_t{5}}) {
    DecodeProblem p;
    p.S = 50;
    p.block = block;
    p.masked = true;  // keys 8..23 masked: with block 8, whole blocks of -inf merge as nothing
    CheckDecode(p);
    p.masked = false;
    p.all_masked = true;  // every key masked: zeros
    CheckDecode(p);
    p.all_masked = false;
    p.nan_q = true;  // a NaN score: NaN out
    CheckDecode(p);
  }
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
}  // namespace tessera
