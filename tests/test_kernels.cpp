// The CPU kernel table against scalar float64 references written here, on every SIMD target
// that is both compiled into the kernels and supported by this CPU (each check runs once per
// target, re-dispatched through hwy::SetSupportedTargetsForTest).
//
// Sizes: every length 1 .. 33 (twice the 16 f32 lanes of AVX-512, plus one: no vector, one
// partial vector, full vectors with and without a tail) and a few large ones (1000, 4097), with
// row strides larger than the row. Gaps between rows hold a sentinel that must survive.
//
// Tolerances (against float64 evaluated on the same float inputs):
//   softmax        |y - ref| <= 1e-6 (weights are <= 1); entries at -inf exactly 0.
//   small weights  relative 4e-7 over exp arguments in [-87, 0] (exp ~1 ulp, then a reciprocal,
//                  an add and a multiply at 0.5 ulp each: 4e-7 is ~3.5 ulp).
//   rope           |v - ref| <= 1e-6 * max|v| (two products and a sum per output).
//   layer norm     |y - ref| <= 1e-5 (outputs are O(1..5)), also for mean 1000, std 1.
//   gelu           |y - ref| <= 1e-6, both the erf and tanh forms, |x| <= 15.
//   gemm           |c - ref| <= 2 k eps sum_p |alpha a_ip b_pj| + eps |beta c_ij| + 1e-30
//                  (the classical dot-product bound, eps = 2^-24, times 2).
//   add, bias      bit-exact (one IEEE add).
//   binary maps    bit-exact against the float operation (add, sub, mul, div), stretched or not.
//   silu, tanh,    ulps against float64 over every 1024th float of [-120, 120]: sigmoid <= 3,
//   sigmoid        silu <= 4, tanh <= 4 (Highway's documented bound); results below the normal
//                  range may flush to 0.
//   softmax down   |y - ref| <= 1e-6, as the row kernel; all -inf columns NaN.
//   columns
//   conversions    bit-exact against core/dtype.h's scalar functions: all 65536 f16 and bf16
//                  patterns to f32, and 818k floats to f16/bf16 (every f16/bf16 value, the ties
//                  between neighbours and one float ulp either side, random bit patterns,
//                  specials).
#include <cblas.h>
#include <hwy/targets.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/kernels.h"
#include "core/random.h"
#include "tests/targets.h"

using namespace tessera;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -12345.5f;  // fills row gaps; a kernel must never write it

const KernelTable& table() { return cpu_device().kernels(); }

// Every length from 1 to 2 * 16 + 1, then large ones.
std::vector<int64_t> test_lengths() {
  std::vector<int64_t> n;
  for (int64_t i = 1; i <= 33; ++i) n.push_back(i);
  for (int64_t i : {63, 64, 65, 1000, 4097}) n.push_back(i);
  return n;
}

// Runs fn once per SIMD target compiled here and supported by this CPU; the kernels re-dispatch
// on their next call. Checks that they really did, via the device's report.
template <class Fn>
void for_each_target(const char* what, Fn&& fn) {
  const std::vector<int64_t> targets = compiled_targets();
  BOOST_REQUIRE(!targets.empty());
  TargetReset reset;
  std::string names;
  for (const int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    BOOST_TEST_CONTEXT(what << " on " << hwy::TargetName(target)) {
      fn();
      BOOST_TEST(std::string(cpu_device().simd_target()) == hwy::TargetName(target));
    }
    names += std::string(" ") + hwy::TargetName(target);
  }
  BOOST_TEST_MESSAGE(what << " ran on:" << names);
}

std::vector<float> normal_vector(Generator& gen, size_t n, double mean, double sigma) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(mean + sigma * gen.normal());
  return v;
}

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// Elements of y (m rows of ldy floats) that differ from the float64 product x w^T + bias (w [n, k]
// rows; bias may be null) by more than 2 (k + 1) float32 roundings of the terms' magnitudes, or,
// past column n, are no longer `sentinel`. The first three misses are reported under `what`.
int linear_mismatches(const std::string& what, int64_t m, int64_t n, int64_t k, const float* x,
                      int64_t ldx, const float* w, const float* bias, const std::vector<float>& y,
                      int64_t ldy, float sentinel) {
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldy; ++j) {
      const float got = y[static_cast<size_t>(i * ldy + j)];
      if (j >= n) {
        bad += bits_of(got) != bits_of(sentinel);
        continue;
      }
      double ref = bias ? bias[j] : 0.0, mag = std::abs(ref);
      for (int64_t q = 0; q < k; ++q) {
        const double t = static_cast<double>(x[i * ldx + q]) * w[j * k + q];
        ref += t;
        mag += std::abs(t);
      }
      const double tol = 2.0 * static_cast<double>(k + 1) * 0x1p-24 * mag + 1e-30;
      if (!(std::abs(got - ref) <= tol) && bad++ < 3)
        BOOST_ERROR(what << " m" << m << " n" << n << " k" << k << " bias " << (bias != nullptr)
                         << " at (" << i << "," << j << "): " << got << " want " << ref);
    }
  return bad;
}

// Elements whose bits differ between a and b.
int bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += bits_of(a[i]) != bits_of(b[i]);
  return differ;
}

// A buffer of n T whose last element ends exactly where a PROT_NONE page begins: any access
// past the end faults, and Boost.Test reports the signal as a failure of the test case.
template <class T>
class Guarded {
 public:
  explicit Guarded(size_t n) : n_(n) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(T);
    total_ = (bytes + page - 1) / page * page + page;
    void* base = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    BOOST_REQUIRE(base != MAP_FAILED);
    base_ = static_cast<char*>(base);
    BOOST_REQUIRE(mprotect(base_ + total_ - page, page, PROT_NONE) == 0);
    data_ = reinterpret_cast<T*>(base_ + total_ - page - n * sizeof(T));
  }
  ~Guarded() { munmap(base_, total_); }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  T* data() { return data_; }
  size_t size() const { return n_; }

 private:
  size_t n_;
  char* base_ = nullptr;
  size_t total_ = 0;
  T* data_ = nullptr;
};
using GuardedFloats = Guarded<float>;

// ---------------------------------------------------------------------------------------------
// Softmax reference. The logits are the kernel's float logits: fl(fl(scale * x) + mask) (the
// product of two floats is exact in double, so the cast rounds it once, like a float multiply).
// Everything after that is float64.
float logit(float scale, float x, const float* mask, int64_t j) {
  const float p = static_cast<float>(static_cast<double>(scale) * static_cast<double>(x));
  return mask != nullptr ? p + mask[j] : p;
}

std::vector<double> softmax_reference(int64_t cols, const float* x, float scale,
                                      const float* mask) {
  std::vector<double> z(cols), y(cols);
  bool has_nan = false;
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < cols; ++j) {
    z[j] = logit(scale, x[j], mask, j);
    has_nan |= std::isnan(z[j]);
    m = std::max(m, z[j]);
  }
  if (has_nan || m == std::numeric_limits<double>::infinity()) {
    std::fill(y.begin(), y.end(), std::numeric_limits<double>::quiet_NaN());
    return y;
  }
  if (m == -std::numeric_limits<double>::infinity()) return y;  // all -inf: zeros
  double sum = 0.0;
  for (int64_t j = 0; j < cols; ++j) sum += (y[j] = std::exp(z[j] - m));
  for (double& v : y) v /= sum;
  return y;
}

struct SoftmaxCase {
  int64_t rows, cols;
  float scale;
  bool use_mask;
  int64_t mask_stride;  // 0: one mask row for all rows
  bool in_place;
};

// Runs one case on x (rows x cols at stride cols + 7) and the given mask, checks every row.
void check_softmax(const SoftmaxCase& c, const std::vector<float>& x_rows,
                   const std::vector<float>& mask_rows) {
  const int64_t x_stride = c.cols + 7;
  const int64_t y_stride = c.in_place ? x_stride : c.cols + 3;
  std::vector<float> x(c.rows * x_stride, kSentinel);
  for (int64_t r = 0; r < c.rows; ++r) {
    std::copy_n(&x_rows[r * c.cols], c.cols, &x[r * x_stride]);
  }
  std::vector<float> y_own(c.rows * y_stride, kSentinel);
  float* y = c.in_place ? x.data() : y_own.data();
  const std::vector<float> x_before = x;
  const float* mask = c.use_mask ? mask_rows.data() : nullptr;
  table().softmax_rows_f32(c.rows, c.cols, x.data(), x_stride, c.scale, mask, c.mask_stride, y,
                           y_stride);
  for (int64_t r = 0; r < c.rows; ++r) {
    const float* mask_row = mask != nullptr ? mask + r * c.mask_stride : nullptr;
    const std::vector<double> ref =
        softmax_reference(c.cols, &x_before[r * x_stride], c.scale, mask_row);
    double worst = 0.0;
    int64_t zero_violations = 0, nan_violations = 0;
    for (int64_t j = 0; j < c.cols; ++j) {
      const float got = y[r * y_stride + j];
      if (std::isnan(ref[j])) {
        nan_violations += !std::isnan(got);
        continue;
      }
      if (logit(c.scale, x_before[r * x_stride + j], mask_row, j) == -kInf) {
        zero_violations += got != 0.0f;
      }
      worst = std::max(worst, std::isnan(got) ? kInf : std::abs(got - ref[j]));
    }
    BOOST_TEST_CONTEXT("cols " << c.cols << " row " << r << " scale " << c.scale << " mask "
                               << c.use_mask << " mask_stride " << c.mask_stride << " in_place "
                               << c.in_place) {
      BOOST_TEST(worst <= 1e-6);
      BOOST_TEST(zero_violations == 0);
      BOOST_TEST(nan_violations == 0);
      for (int64_t j = c.cols; j < y_stride && r + 1 < c.rows; ++j) {
        BOOST_TEST(y[r * y_stride + j] == kSentinel);
      }
    }
  }
}

double rel_diff(double got, double want) { return std::abs(got - want) / std::abs(want); }

}  // namespace

// OpenBLAS's pthread build: 1 while its server threads run (started as the library loads).
// Weak, as in cpu_device.cpp: builds without a thread server lack it.
extern "C" int blas_server_avail __attribute__((weak));

BOOST_AUTO_TEST_SUITE(kernels)

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(device_allocates_aligned_and_reports_target) {
  Device& dev = cpu_device();
  BOOST_TEST(std::string(dev.name()) == "cpu");
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{3}, size_t{63}, size_t{64}, size_t{65},
                       size_t{4096}, size_t{1} << 20}) {
    void* p = dev.allocator().allocate(bytes);
    BOOST_TEST_REQUIRE(p != nullptr);
    BOOST_TEST(reinterpret_cast<uintptr_t>(p) % 64 == 0, "bytes " << bytes);
    std::memset(p, 0xab, bytes);
    dev.allocator().deallocate(p);
  }
  void* a = dev.allocator().allocate(0);
  void* b = dev.allocator().allocate(0);
  BOOST_TEST((a != nullptr && b != nullptr && a != b));
  dev.allocator().deallocate(a);
  dev.allocator().deallocate(b);
  BOOST_CHECK_THROW(dev.allocator().allocate(std::numeric_limits<size_t>::max() - 8), Error);
  const std::string target = dev.simd_target();
  BOOST_TEST(!target.empty());
  BOOST_TEST(target != "Unknown");
  BOOST_TEST_MESSAGE("cpu device dispatches to " << target);
}

// The device stops OpenBLAS's server threads (one thread never uses them; spinning, they took
// a core from a oneTBB worker for the process's first ~100 ms). That OpenBLAS still computes
// after it is gemm_transposes_strides_alpha_beta's to check: it calls OpenBLAS through the
// device's kernel table, so after the stop.
BOOST_AUTO_TEST_CASE(device_stops_openblas_server_threads) {
  cpu_device();
  if (&blas_server_avail == nullptr) {
    BOOST_TEST_MESSAGE("this OpenBLAS has no thread server");
    return;
  }
  BOOST_TEST(blas_server_avail == 0);
  BOOST_TEST(openblas_get_num_threads() == 1);
}

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(softmax_random_rows_masks_strides) {
  for_each_target("softmax", [] {
    Generator gen(11);
    for (int64_t cols : test_lengths()) {
      const int64_t rows = 4;
      const std::vector<float> x = normal_vector(gen, rows * cols, 0.0, 3.0);
      // Mask rows at stride cols + 5: N(0, 1) with ~20% -inf; row 2 entirely -inf.
      const int64_t mask_stride = cols + 5;
      std::vector<float> mask(rows * mask_stride, kSentinel);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          const bool masked = r == 2 || gen.uniform() < 0.2;
          mask[r * mask_stride + j] = masked ? -kInf : static_cast<float>(gen.normal());
        }
      }
      for (const float scale : {1.0f, 0.3f}) {
        check_softmax({rows, cols, scale, false, 0, false}, x, mask);
        check_softmax({rows, cols, scale, true, mask_stride, false}, x, mask);
        check_softmax({rows, cols, scale, true, 0, false}, x, mask);  // one row for all
        check_softmax({rows, cols, scale, true, mask_stride, true}, x, mask);
      }
    }
  });
}

BOOST_AUTO_TEST_CASE(softmax_large_magnitudes_are_exact) {
  for_each_target("softmax large", [] {
    Generator gen(12);
    for (int64_t cols : test_lengths()) {
      const std::vector<float> unit = normal_vector(gen, 3 * cols, 0.0, 1.0);
      // +-1e30 logits reached through the scale, through x itself, and 80-ish logits (exp(80)
      // overflows float without the max subtraction).
      check_softmax({3, cols, 1e30f, false, 0, false}, unit, {});
      std::vector<float> huge(unit);
      for (float& v : huge) v = v < 0 ? -1e30f : 1e30f;
      check_softmax({3, cols, 1.0f, false, 0, false}, huge, {});
      const std::vector<float> eighty = normal_vector(gen, 3 * cols, 80.0, 4.0);
      check_softmax({3, cols, 1.0f, false, 0, true}, eighty, {});
      check_softmax({3, cols, 0.125f, false, 0, false}, normal_vector(gen, 3 * cols, 700.0, 30.0),
                    {});
    }
  });
}

BOOST_AUTO_TEST_CASE(softmax_nan_and_infinities) {
  for_each_target("softmax nan/inf", [] {
    Generator gen(13);
    for (int64_t cols : test_lengths()) {
      const int64_t rows = 5;
      std::vector<float> x = normal_vector(gen, rows * cols, 0.0, 2.0);
      // Row 0: one NaN (in the vector body or the tail, depending on cols).
      x[(7 * cols) / 11] = kNaN;
      // Row 1: a NaN among -inf only (max pass sees no finite value).
      std::fill_n(&x[cols], cols, -kInf);
      x[cols + (cols - 1) / 2] = kNaN;
      // Row 2: all -inf -> zeros. Row 3: one +inf -> NaN (as PyTorch: inf - inf).
      std::fill_n(&x[2 * cols], cols, -kInf);
      x[3 * cols + cols / 3] = kInf;
      // Row 4 stays finite and must be unaffected by its neighbours.
      check_softmax({rows, cols, 1.0f, false, 0, false}, x, {});
      check_softmax({rows, cols, 1.0f, false, 0, true}, x, {});
      // A NaN arriving through the mask.
      std::vector<float> mask(cols, 0.0f);
      mask[cols - 1] = kNaN;
      check_softmax({rows, cols, 1.0f, true, 0, false}, normal_vector(gen, rows * cols, 0, 1),
                    mask);
      // Explicit expectations, independent of the reference function.
      std::vector<float> y(rows * cols);
      table().softmax_rows_f32(rows, cols, x.data(), cols, 1.0f, nullptr, 0, y.data(), cols);
      BOOST_TEST(std::all_of(&y[0], &y[cols], [](float v) { return std::isnan(v); }));
      BOOST_TEST(std::all_of(&y[cols], &y[2 * cols], [](float v) { return std::isnan(v); }));
      BOOST_TEST(std::all_of(&y[2 * cols], &y[3 * cols], [](float v) { return v == 0.0f; }));
      BOOST_TEST(std::all_of(&y[4 * cols], &y[5 * cols], [](float v) { return v > 0.0f; }));
    }
  });
}

// The exp inside softmax over its whole domain, relative accuracy of small weights: rows of 37
// (vector body and tail on every target) hold 0 and then 36 arguments from 0 down to -87.
BOOST_AUTO_TEST_CASE(softmax_small_weights_relative_accuracy) {
  for_each_target("softmax exp", [] {
    const int64_t rows = 1200, cols = 37, count = rows * (cols - 1);
    std::vector<float> x(rows * cols), y(rows * cols);
    for (int64_t r = 0, t = 0; r < rows; ++r) {
      x[r * cols] = 0.0f;
      for (int64_t j = 1; j < cols; ++j, ++t) {
        x[r * cols + j] = static_cast<float>(-87.0 * t / (count - 1));
      }
    }
    table().softmax_rows_f32(rows, cols, x.data(), cols, 1.0f, nullptr, 0, y.data(), cols);
    double worst = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<double> ref = softmax_reference(cols, &x[r * cols], 1.0f, nullptr);
      for (int64_t j = 0; j < cols; ++j) worst = std::max(worst, rel_diff(y[r * cols + j], ref[j]));
    }
    BOOST_TEST(worst <= 4e-7);
    BOOST_TEST_MESSAGE("  softmax small-weight max relative error " << worst);
    // Below e^-87 = 1.6e-38 (about FLT_MIN) weights flush to exactly 0, an absolute error under
    // 1.7e-38.
    const float far[4] = {0.0f, -87.5f, 0.0f, -200.0f};
    float out[4];
    table().softmax_rows_f32(2, 2, far, 2, 1.0f, nullptr, 0, out, 2);
    BOOST_TEST(out[1] == 0.0f);
    BOOST_TEST(out[3] == 0.0f);
    BOOST_TEST(out[0] == 1.0f);
  });
}

// z must be rounded after the multiply and again after the mask add on every target. Here
// fl(s * a) = 100761608 while s * a = 100761608.0078125, and the mask cancels fl(s * a). Row of
// 37 (vector body and tail): x = a, 0, a, 0, ...; mask = -fl(s * a), 0, ... The separate ops
// give z = 0 everywhere and weights of exactly fl(1/37); a fused multiply-add would give
// z = 0.0078125 at the even columns and weights 1.004 / 0.996 times that.
BOOST_AUTO_TEST_CASE(softmax_rounds_scaled_logits_before_the_mask_add) {
  for_each_target("softmax rounding", [] {
    const float scale = 1.0009765625f;  // 1 + 2^-10
    const float a = 100663304.0f, fl_sa = 100761608.0f;
    const double exact = static_cast<double>(scale) * a;
    BOOST_REQUIRE(static_cast<float>(exact) == fl_sa);  // the premises of the test
    BOOST_REQUIRE(exact - fl_sa == 0.0078125);
    const int64_t cols = 37;
    std::vector<float> x(cols, 0.0f), mask(cols, 0.0f), y(cols);
    for (int64_t j = 0; j < cols; j += 2) {
      x[j] = a;
      mask[j] = -fl_sa;
    }
    table().softmax_rows_f32(1, cols, x.data(), cols, scale, mask.data(), cols, y.data(), cols);
    const float uniform = static_cast<float>(1.0 / cols);
    BOOST_TEST(std::all_of(y.begin(), y.end(), [&](float v) { return v == uniform; }));
  });
}

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(rope_rotate_half) {
  for_each_target("rope", [] {
    Generator gen(21);
    std::vector<int64_t> halves;
    for (int64_t h = 1; h <= 33; ++h) halves.push_back(h);
    halves.push_back(64);
    for (int64_t half : halves) {
      const int64_t head_dim = 2 * half, heads = 3, positions = 4;
      const int64_t row_stride = heads * head_dim + 5;
      std::vector<float> x(positions * row_stride, kSentinel);
      for (int64_t t = 0; t < positions; ++t) {
        for (int64_t i = 0; i < heads * head_dim; ++i) {
          x[t * row_stride + i] = static_cast<float>(gen.normal());
        }
      }
      std::vector<float> cos(positions * half), sin(positions * half);
      for (int64_t i = 0; i < positions * half; ++i) {
        const double angle = 6.283185307179586 * gen.uniform();
        cos[i] = static_cast<float>(std::cos(angle));
        sin[i] = static_cast<float>(std::sin(angle));
      }
      const std::vector<float> before = x;
      table().rope_rotate_half_f32(positions, heads, head_dim, x.data(), row_stride, cos.data(),
                                   sin.data());
      double worst = 0.0, max_abs = 0.0;
      for (int64_t t = 0; t < positions; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          const float* v = &before[t * row_stride + h * head_dim];
          const float* got = &x[t * row_stride + h * head_dim];
          for (int64_t i = 0; i < half; ++i) {
            const double c = cos[t * half + i], s = sin[t * half + i];
            const double a = v[i], b = v[i + half];
            worst = std::max(worst, std::abs(got[i] - (a * c - b * s)));
            worst = std::max(worst, std::abs(got[i + half] - (b * c + a * s)));
            max_abs = std::max({max_abs, std::abs(a), std::abs(b)});
          }
        }
        for (int64_t i = heads * head_dim; i < row_stride; ++i) {
          BOOST_TEST(x[t * row_stride + i] == kSentinel);
        }
      }
      BOOST_TEST(worst <= 1e-6 * max_abs, "half " << half << " error " << worst);
    }
  });
}

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(add_and_bias_are_exact) {
  for_each_target("add/bias", [] {
    Generator gen(31);
    for (int64_t n : test_lengths()) {
      const std::vector<float> a = normal_vector(gen, n, 0, 1), b = normal_vector(gen, n, 0, 1e3);
      std::vector<float> y(n + 1, kSentinel);
      table().add_f32(n, a.data(), b.data(), y.data());
      int64_t mismatches = 0;
      for (int64_t i = 0; i < n; ++i) mismatches += bits_of(y[i]) != bits_of(a[i] + b[i]);
      BOOST_TEST(mismatches == 0, "n " << n);
      BOOST_TEST(y[n] == kSentinel);
      std::vector<float> in_a = a, in_b = b;  // y aliasing a, then b
      table().add_f32(n, in_a.data(), b.data(), in_a.data());
      table().add_f32(n, a.data(), in_b.data(), in_b.data());
      BOOST_TEST(std::memcmp(in_a.data(), y.data(), n * sizeof(float)) == 0);
      BOOST_TEST(std::memcmp(in_b.data(), y.data(), n * sizeof(float)) == 0);

      const int64_t rows = 3, stride = n + 2;
      std::vector<float> x(rows * stride, kSentinel);
      for (int64_t r = 0; r < rows; ++r) std::copy_n(&b[0], n, &x[r * stride]);
      table().add_bias_rows_f32(rows, n, x.data(), stride, a.data());
      for (int64_t r = 0; r < rows; ++r) {
        BOOST_TEST(std::memcmp(&x[r * stride], y.data(), n * sizeof(float)) == 0, "row " << r);
        BOOST_TEST(x[r * stride + n] == kSentinel);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The broadcasting binary maps: every step combination (0 stretches one value), every length,
// bit for bit against the float operation, nothing written past the end, y aliasing an operand.
BOOST_AUTO_TEST_CASE(binary_maps_are_exact) {
  struct Map {
    const char* name;
    float (*op)(float, float);
  };
  const Map maps[] = {{"add", [](float a, float b) { return a + b; }},
                      {"sub", [](float a, float b) { return a - b; }},
                      {"mul", [](float a, float b) { return a * b; }},
                      {"div", [](float a, float b) { return a / b; }}};
  for_each_target("binary maps", [&] {
    Generator gen(37);
    for (const Map& map : maps) {
      const BinaryMapF32 fn = table().binary_map_f32(map.name);
      BOOST_REQUIRE(fn != nullptr);
      for (int64_t n : test_lengths()) {
        std::vector<float> a = normal_vector(gen, n, 0, 1), b = normal_vector(gen, n, 0, 1e3);
        a[0] = n % 3 == 0 ? kNaN : a[0];  // a NaN in the body or the tail now and then
        if (n > 2) b[n - 1] = n % 2 ? 0.0f : -kInf;
        for (const int64_t sa : {0, 1}) {
          for (const int64_t sb : {0, 1}) {
            std::vector<float> y(n + 1, kSentinel);
            fn(n, a.data(), sa, b.data(), sb, y.data());
            int64_t mismatches = 0;
            for (int64_t i = 0; i < n; ++i) {
              const float want = map.op(a[i * sa], b[i * sb]);
              mismatches += std::isnan(want) ? !std::isnan(y[i]) : bits_of(y[i]) != bits_of(want);
            }
            BOOST_TEST(mismatches == 0, map.name << " n " << n << " steps " << sa << sb);
            BOOST_TEST(y[n] == kSentinel);
            if (sa == 1 && sb == 1) {
              std::vector<float> in_a = a, in_b = b;  // y aliasing a, then b
              fn(n, in_a.data(), 1, b.data(), 1, in_a.data());
              fn(n, a.data(), 1, in_b.data(), 1, in_b.data());
              BOOST_TEST(std::memcmp(in_a.data(), y.data(), n * sizeof(float)) == 0);
              BOOST_TEST(std::memcmp(in_b.data(), y.data(), n * sizeof(float)) == 0);
            }
          }
        }
      }
    }
    // add's map is the add kernel, bit for bit.
    const std::vector<float> a = normal_vector(gen, 100, 0, 1), b = normal_vector(gen, 100, 0, 1);
    std::vector<float> y0(100), y1(100);
    table().add_f32(100, a.data(), b.data(), y0.data());
    table().binary_map_f32("add")(100, a.data(), 1, b.data(), 1, y1.data());
    BOOST_TEST(std::memcmp(y0.data(), y1.data(), sizeof(float) * 100) == 0);
  });
}

// ---------------------------------------------------------------------------------------------
// silu, tanh and sigmoid against float64 in ulps of the float result, over every 1024th float of
// [-120, 120] (about 2.1M values, both signs, down to 1e-37 in magnitude), reported per target.
// Where x < -87 the exp inside flushes e^x to 0, so sigmoid(x) (< 1.7e-38) and silu(x)
// (< 1.5e-36; PyTorch's own silu gives -0 there below -88.7) may be 0: such a result is checked
// against that bound instead of in ulps.
BOOST_AUTO_TEST_CASE(unary_maps_match_float64_to_a_few_ulp) {
  struct Map {
    const char* name;
    double (*ref)(double);
    double max_ulp;
    double flush_below;  // |ref| under which a 0 is accepted
  };
  const Map maps[] = {
      {"sigmoid", [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, 3.0, 1.7e-38},
      {"silu", [](double x) { return x / (1.0 + std::exp(-x)); }, 4.0, 1.5e-36},
      {"tanh", [](double x) { return std::tanh(x); }, 4.0, 0.0}};
  std::vector<float> x;
  for (uint32_t bits = 0x02000000u; bits <= std::bit_cast<uint32_t>(120.0f); bits += 1024) {
    x.push_back(std::bit_cast<float>(bits));
    x.push_back(-std::bit_cast<float>(bits));
  }
  const auto n = static_cast<int64_t>(x.size());
  for_each_target("silu/tanh/sigmoid", [&] {
    for (const Map& map : maps) {
      const UnaryMapF32 fn = table().unary_map_f32(map.name);
      BOOST_REQUIRE(fn != nullptr);
      std::vector<float> y(n + 1, kSentinel);
      fn(n, x.data(), y.data());
      double worst = 0.0;
      float worst_at = 0.0f;
      int64_t flushed = 0, bad_flush = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double ref = map.ref(x[i]);
        if (std::abs(ref) < 0x1p-126 || (y[i] == 0.0f && std::abs(ref) < map.flush_below)) {
          ++flushed;
          bad_flush += !(std::abs(y[i] - ref) < std::max(map.flush_below, 0x1p-126));
          continue;
        }
        // One ulp of the float nearest ref: 2^(exponent - 23).
        int e = 0;
        std::frexp(static_cast<float>(ref), &e);
        const double ulp = std::ldexp(1.0, e - 24);
        const double err = std::isnan(y[i]) ? kInf : std::abs(y[i] - ref) / ulp;
        if (err > worst) {
          worst = err;
          worst_at = x[i];
        }
      }
      BOOST_TEST(worst <= map.max_ulp, map.name << " " << worst << " ulp at x = " << worst_at);
      BOOST_TEST(bad_flush == 0);
      BOOST_TEST(y[n] == kSentinel);
      BOOST_TEST_MESSAGE("  " << map.name << ": max " << worst << " ulp (at " << worst_at
                              << ") over " << n << " values, " << flushed << " flushed or tiny");
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Softmax down columns: rows x cols blocks at row strides larger than the row (sentinels in the
// gaps), -inf entries (weight exactly 0), all -inf columns (NaN, as torch.softmax), large
// offsets, a long column (the compensated sum), in place.
BOOST_AUTO_TEST_CASE(softmax_columns_match_float64) {
  for_each_target("softmax columns", [] {
    Generator gen(43);
    for (const int64_t rows : {1, 2, 3, 7, 600}) {
      for (const int64_t cols : test_lengths()) {
        if (rows * cols > 700000) continue;
        for (const bool in_place : {false, true}) {
          const int64_t x_stride = cols + 5, y_stride = in_place ? x_stride : cols + 3;
          std::vector<float> x(rows * x_stride, kSentinel);
          const double mean = cols % 5 == 0 ? 50.0 : 0.0;
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) {
              float v = static_cast<float>(mean + 2.0 * gen.normal());
              if (i > 0 && gen.uniform() < 0.2) v = -kInf;
              if (j == 1 && rows > 1) v = -kInf;  // column 1 all -inf: NaN
              x[i * x_stride + j] = v;
            }
          const std::vector<float> x_before = x;
          std::vector<float> y_own(rows * y_stride, kSentinel);
          float* y = in_place ? x.data() : y_own.data();
          table().softmax_columns_f32(rows, cols, x.data(), x_stride, y, y_stride);
          double worst = 0.0;
          int64_t nan_violations = 0, zero_violations = 0, sentinel_violations = 0;
          for (int64_t j = 0; j < cols; ++j) {
            double m = -kInf, sum = 0.0;
            for (int64_t i = 0; i < rows; ++i) m = std::max<double>(m, x_before[i * x_stride + j]);
            for (int64_t i = 0; i < rows; ++i) sum += std::exp(x_before[i * x_stride + j] - m);
            for (int64_t i = 0; i < rows; ++i) {
              const float got = y[i * y_stride + j];
              if (m == -kInf) {
                nan_violations += !std::isnan(got);
                continue;
              }
              const double ref = std::exp(x_before[i * x_stride + j] - m) / sum;
              if (x_before[i * x_stride + j] == -kInf) zero_violations += got != 0.0f;
              worst = std::max(worst, std::isnan(got) ? kInf : std::abs(got - ref));
            }
          }
          for (int64_t i = 0; i + 1 < rows; ++i)
            for (int64_t j = cols; j < y_stride; ++j)
              sentinel_violations += y[i * y_stride + j] != kSentinel;
          BOOST_TEST_CONTEXT("rows " << rows << " cols " << cols << " in_place " << in_place) {
            BOOST_TEST(worst <= 1e-6);
            BOOST_TEST(nan_violations == 0);
            BOOST_TEST(zero_violations == 0);
            BOOST_TEST(sentinel_violations == 0);
          }
        }
      }
    }
    // One dominant weight and 100000 small ones: a plain float sum would drift by ~1e-3.
    const int64_t rows = 100001;
    std::vector<float> x(rows * 2, -17.0f);
    x[0] = x[1] = 0.0f;
    std::vector<float> y(rows * 2);
    table().softmax_columns_f32(rows, 2, x.data(), 2, y.data(), 2);
    const double small = std::exp(-17.0), sum = 1.0 + 100000 * small;
    BOOST_TEST(std::abs(y[0] - 1.0 / sum) <= 1e-6 / sum, "weight " << y[0] << " vs " << 1.0 / sum);
    BOOST_TEST(std::abs(y[3] - small / sum) <= 1e-6 * small / sum);
  });
}

// Tails go through a stack copy so that no kernel reads or writes past its last element: every
// buffer here ends at an inaccessible page (a stray access faults the test case). Values are
// checked by the tests above; this one is about bounds.
BOOST_AUTO_TEST_CASE(row_kernels_stay_within_their_buffers) {
  for_each_target("bounds", [] {
    Generator gen(35);
    for (int64_t n : test_lengths()) {
      Guarded<float> x(n), y(n), other(n), mask(n), gamma(n), beta(n), cos(n), sin(n);
      Guarded<uint16_t> h(n);
      for (int64_t i = 0; i < n; ++i) {
        x.data()[i] = static_cast<float>(gen.normal());
        other.data()[i] = mask.data()[i] = gamma.data()[i] = beta.data()[i] = 0.5f;
        cos.data()[i] = 0.6f;
        sin.data()[i] = 0.8f;
      }
      table().softmax_rows_f32(1, n, x.data(), n, 0.5f, mask.data(), 0, y.data(), n);
      table().softmax_rows_f32(1, n, x.data(), n, 0.5f, nullptr, 0, y.data(), n);
      table().layer_norm_rows_f32(1, n, x.data(), n, y.data(), n, gamma.data(), beta.data(), 1e-5f);
      table().gelu_f32(n, x.data(), y.data(), false);
      table().gelu_f32(n, x.data(), y.data(), true);
      table().add_f32(n, x.data(), other.data(), y.data());
      table().add_bias_rows_f32(1, n, y.data(), n, other.data());
      for (const char* map : {"add", "sub", "mul", "div"}) {
        table().binary_map_f32(map)(n, x.data(), 1, other.data(), 1, y.data());
        table().binary_map_f32(map)(n, x.data(), 0, other.data(), 1, y.data());
        table().binary_map_f32(map)(n, x.data(), 1, other.data(), 0, y.data());
      }
      for (const char* map : {"relu", "silu", "tanh", "sigmoid"})
        table().unary_map_f32(map)(n, x.data(), y.data());
      table().softmax_columns_f32(1, n, x.data(), n, y.data(), n);
      // One position, one head of 2n dims: the second half ends at the guard page; cos/sin have n.
      Guarded<float> head(2 * n);
      std::copy_n(x.data(), n, head.data());
      std::copy_n(x.data(), n, head.data() + n);
      table().rope_rotate_half_f32(1, 1, 2 * n, head.data(), 2 * n, cos.data(), sin.data());
      convert_f32_to_f16(n, x.data(), h.data());
      convert_f16_to_f32(n, h.data(), y.data());
      convert_f32_to_bf16(n, x.data(), h.data());
      convert_bf16_to_f32(n, h.data(), y.data());
      BOOST_TEST(std::isfinite(y.data()[n - 1]));  // the calls completed and wrote the end
    }
  });
}

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(gelu_erf_and_tanh) {
  for_each_target("gelu", [] {
    Generator gen(41);
    std::vector<int64_t> lengths = test_lengths();
    lengths.push_back(60001);  // the grid below
    for (int64_t n : lengths) {
      std::vector<float> x = normal_vector(gen, n, 0.0, 3.0);
      if (n == 60001) {
        for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(-15.0 + 30.0 * i / (n - 1));
      }
      for (const bool tanh_form : {false, true}) {
        std::vector<float> y(n + 1, kSentinel);
        table().gelu_f32(n, x.data(), y.data(), tanh_form);
        double worst = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const double v = x[i];
          const double ref = tanh_form ? 0.5 * v *
                                             (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) *
                                                              (v + 0.044715 * v * v * v)))
                                       : 0.5 * v * std::erfc(-v / std::sqrt(2.0));
          worst = std::max(worst, std::isnan(y[i]) ? kInf : std::abs(y[i] - ref));
        }
        BOOST_TEST(worst <= 1e-6, "n " << n << " tanh " << tanh_form << " error " << worst);
        BOOST_TEST(y[n] == kSentinel);
        if (n == 60001) {
          BOOST_TEST_MESSAGE("  gelu " << (tanh_form ? "tanh" : "erf")
                                       << " max abs error on [-15, 15]: " << worst);
        }
        std::vector<float> in_place = x;
        table().gelu_f32(n, in_place.data(), in_place.data(), tanh_form);
        BOOST_TEST(std::memcmp(in_place.data(), y.data(), n * sizeof(float)) == 0);
      }
    }
    // Past the grid: inf and +-1e30 (x for x > 0, 0 below), where the erf form's reciprocal
    // and the tanh form's cube meet infinities of their own.
    const float special[6] = {kNaN, 0.0f, -0.0f, kInf, 1e30f, -1e30f};
    for (const bool tanh_form : {false, true}) {
      float out[6];
      table().gelu_f32(6, special, out, tanh_form);
      BOOST_TEST(std::isnan(out[0]));
      BOOST_TEST(out[1] == 0.0f);
      BOOST_TEST(out[2] == 0.0f);
      BOOST_TEST(out[3] == kInf);
      BOOST_TEST(out[4] == 1e30f);
      BOOST_TEST(out[5] == 0.0f);
    }
  });
}

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE(layer_norm_rows) {
  for_each_target("layer norm", [] {
    Generator gen(51);
    double overall = 0.0;
    for (int64_t cols : test_lengths()) {
      const int64_t rows = 4, x_stride = cols + 3, y_stride = cols + 1;
      const std::vector<float> gamma = normal_vector(gen, cols, 1.0, 0.5);
      const std::vector<float> beta = normal_vector(gen, cols, 0.0, 0.5);
      // Row 0 ~ N(0, 1), row 1 ~ N(1000, 1) (|mean| >> std), row 2 ~ N(-3, 20), row 3 constant.
      std::vector<float> x(rows * x_stride, kSentinel);
      const double means[rows] = {0.0, 1000.0, -3.0, 2.5};
      const double sigmas[rows] = {1.0, 1.0, 20.0, 0.0};
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          x[r * x_stride + j] = static_cast<float>(means[r] + sigmas[r] * gen.normal());
        }
      }
      for (int affine = 0; affine < 3; ++affine) {  // gamma and beta, neither, gamma only
        const float* g = affine != 1 ? gamma.data() : nullptr;
        const float* b = affine == 0 ? beta.data() : nullptr;
        for (const bool in_place : {false, true}) {
          std::vector<float> xin = x;
          std::vector<float> y_own(rows * y_stride, kSentinel);
          float* y = in_place ? xin.data() : y_own.data();
          const int64_t ys = in_place ? x_stride : y_stride;
          const float eps = 1e-5f;
          table().layer_norm_rows_f32(rows, cols, xin.data(), x_stride, y, ys, g, b, eps);
          for (int64_t r = 0; r < rows; ++r) {
            double mean = 0.0, var = 0.0;
            for (int64_t j = 0; j < cols; ++j) mean += x[r * x_stride + j];
            mean /= cols;
            for (int64_t j = 0; j < cols; ++j) {
              var += (x[r * x_stride + j] - mean) * (x[r * x_stride + j] - mean);
            }
            var /= cols;
            const double rstd = 1.0 / std::sqrt(var + eps);
            double worst = 0.0;
            for (int64_t j = 0; j < cols; ++j) {
              double ref = (x[r * x_stride + j] - mean) * rstd;
              if (g != nullptr) ref *= g[j];
              if (b != nullptr) ref += b[j];
              worst = std::max(worst, std::abs(y[r * ys + j] - ref));
            }
            BOOST_TEST(worst <= 1e-5, "cols " << cols << " row " << r << " affine " << affine
                                              << " in_place " << in_place << " error " << worst);
            if (r + 1 < rows) BOOST_TEST(y[r * ys + cols] == kSentinel);
            overall = std::max(overall, worst);
          }
        }
      }
    }
    BOOST_TEST_MESSAGE("  layer norm max abs error " << overall);
  });
}

// add_layer_norm_rows_f32 = add_f32 then layer_norm_rows_f32, bit for bit (the plan swaps one
// for the other), with the sum in a buffer of its own, in y (scratch) or in x; and the normalized
// rows within 1e-5 of a float64 layer norm of the float sum.
BOOST_AUTO_TEST_CASE(add_layer_norm_rows) {
  for_each_target("add + layer norm", [] {
    Generator gen(52);
    for (int64_t cols : test_lengths()) {
      const int64_t rows = 3, x_stride = cols + 3, r_stride = cols + 2, s_stride = cols + 5,
                    y_stride = cols + 1;
      const std::vector<float> gamma = normal_vector(gen, cols, 1.0, 0.5);
      const std::vector<float> beta = normal_vector(gen, cols, 0.0, 0.5);
      std::vector<float> x(rows * x_stride, kSentinel), res(rows * r_stride, kSentinel);
      const double means[rows] = {0.0, 500.0, -3.0};
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          x[r * x_stride + j] = static_cast<float>(means[r] + gen.normal());
          res[r * r_stride + j] = static_cast<float>(means[r] + 3.0 * gen.normal());
        }
      // The unfused pair on this target.
      std::vector<float> sum_ref(rows * cols), y_ref(rows * cols);
      for (int64_t r = 0; r < rows; ++r)
        table().add_f32(cols, x.data() + r * x_stride, res.data() + r * r_stride,
                        sum_ref.data() + r * cols);
      table().layer_norm_rows_f32(rows, cols, sum_ref.data(), cols, y_ref.data(), cols,
                                  gamma.data(), beta.data(), 1e-5f);
      for (int where = 0; where < 3; ++where) {  // sum: own buffer, in y, in x
        std::vector<float> xin = x, sum_own(rows * s_stride, kSentinel),
                           y(rows * y_stride, kSentinel);
        float* sum = where == 0 ? sum_own.data() : where == 1 ? y.data() : xin.data();
        const int64_t ss = where == 0 ? s_stride : where == 1 ? y_stride : x_stride;
        table().add_layer_norm_rows_f32(rows, cols, xin.data(), x_stride, res.data(), r_stride,
                                        sum, ss, y.data(), y_stride, gamma.data(), beta.data(),
                                        1e-5f);
        double worst = 0.0;
        for (int64_t r = 0; r < rows; ++r) {
          if (where != 1)
            for (int64_t j = 0; j < cols; ++j)
              BOOST_TEST(sum[r * ss + j] == sum_ref[r * cols + j], "cols " << cols << " sum");
          double mean = 0.0, var = 0.0;
          for (int64_t j = 0; j < cols; ++j) mean += sum_ref[r * cols + j];
          mean /= cols;
          for (int64_t j = 0; j < cols; ++j)
            var += (sum_ref[r * cols + j] - mean) * (sum_ref[r * cols + j] - mean);
          const double rstd = 1.0 / std::sqrt(var / cols + 1e-5);
          for (int64_t j = 0; j < cols; ++j) {
            const float got = y[r * y_stride + j];
            BOOST_TEST(got == y_ref[r * cols + j], "cols " << cols << " where " << where);
            const double ref = (sum_ref[r * cols + j] - mean) * rstd * gamma[j] + beta[j];
            worst = std::max(worst, std::abs(got - ref));
          }
          if (r + 1 < rows) BOOST_TEST(y[r * y_stride + cols] == kSentinel);
          if (where == 0 && r + 1 < rows) BOOST_TEST(sum_own[r * s_stride + cols] == kSentinel);
        }
        BOOST_TEST(worst <= 1e-5, "cols " << cols << " where " << where << " error " << worst);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Conversions: bit-exact against the scalar reference functions of core/dtype.h.
namespace {

std::vector<float> conversion_inputs() {
  std::vector<float> v;
  // Every f16 value, the midpoints (ties) between neighbouring f16 values and one float ulp
  // either side of each midpoint. Same for bf16 (its values are the top 16 bits of a float).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    v.push_back(f);
    if ((h & 0x7fff) <= 0x7bff) {  // finite: has a successor of larger magnitude
      const float next = half_to_float(static_cast<uint16_t>(h + 1));
      const float mid = (h & 0x7fff) == 0x7bff ? std::copysign(65520.0f, f) : (f + next) / 2;
      v.push_back(mid);
      v.push_back(std::nextafter(mid, 0.0f));
      v.push_back(std::nextafter(mid, std::copysign(kInf, f)));
    }
    const uint32_t bf = h << 16;
    v.push_back(std::bit_cast<float>(bf));
    v.push_back(std::bit_cast<float>(bf | 0x8000u));  // tie
    v.push_back(std::bit_cast<float>(bf | 0x8001u));
    v.push_back(std::bit_cast<float>(bf | 0x7fffu));
  }
  // Random bit patterns over the whole float range (NaNs with random payloads included).
  Generator gen(61);
  for (int i = 0; i < 300000; ++i) v.push_back(std::bit_cast<float>(uint32_t(gen.next_u64())));
  // Specials: zeros, infinities, NaN payloads (signalling, quiet, payload only in the low 13 or
  // 16 bits), extremes of float, the f16 overflow threshold and subnormal boundaries.
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                     0x7f800001u, 0xff800001u, 0x7f801fffu, 0x7f802000u, 0x7fbfffffu, 0x7fffffffu,
                     0xffffffffu, 0x7f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000001u,
                     0x007fffffu, 0x00800000u, 0x477fefffu, 0x477ff000u, 0x477fe000u, 0x33000000u,
                     0x33000001u, 0x337fffffu, 0x33400000u, 0x387fc000u, 0x387fe000u, 0x387fffffu,
                     0x38800000u, 0x7f7f8000u, 0x7f7f7fffu, 0x3f808000u, 0x3f818000u}) {
    v.push_back(std::bit_cast<float>(b));
  }
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(convert_f16_bf16_to_f32_all_patterns) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  for_each_target("f16/bf16 -> f32", [&] {
    std::vector<float> out(0x10000 + 1, kSentinel);
    convert_f16_to_f32(0x10000, all.data(), out.data());
    int64_t bad = 0;
    for (uint32_t h = 0; h < 0x10000; ++h) bad += bits_of(out[h]) != bits_of(half_to_float(all[h]));
    BOOST_TEST(bad == 0);
    BOOST_TEST(out[0x10000] == kSentinel);
    convert_bf16_to_f32(0x10000, all.data(), out.data());
    bad = 0;
    for (uint32_t h = 0; h < 0x10000; ++h) {
      bad += bits_of(out[h]) != bits_of(bfloat16_to_float(all[h]));
    }
    BOOST_TEST(bad == 0);
    // Every tail length, from an odd (2-byte aligned only) source offset.
    for (int64_t n : test_lengths()) {
      std::vector<float> o(n + 1, kSentinel);
      convert_f16_to_f32(n, all.data() + 0x3bf1, o.data());
      for (int64_t i = 0; i < n; ++i)
        BOOST_TEST(bits_of(o[i]) == bits_of(half_to_float(all[0x3bf1 + i])));
      BOOST_TEST(o[n] == kSentinel);
      convert_bf16_to_f32(n, all.data() + 0x7f71, o.data());
      for (int64_t i = 0; i < n; ++i) {
        BOOST_TEST(bits_of(o[i]) == bits_of(bfloat16_to_float(all[0x7f71 + i])));
      }
    }
  });
}

BOOST_AUTO_TEST_CASE(convert_f32_to_f16_bf16_rounding) {
  const std::vector<float> in = conversion_inputs();
  const int64_t n = static_cast<int64_t>(in.size());
  BOOST_TEST_MESSAGE("  f32 -> f16/bf16 over " << n << " inputs");
  for_each_target("f32 -> f16/bf16", [&] {
    std::vector<uint16_t> out(n + 1, 0xbeef);
    convert_f32_to_f16(n, in.data(), out.data());
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (out[i] != float_to_half(in[i]) && bad++ < 5) {
        BOOST_ERROR("f16 of 0x" << std::hex << bits_of(in[i]) << ": 0x" << out[i] << " want 0x"
                                << float_to_half(in[i]));
      }
    }
    BOOST_TEST(bad == 0);
    BOOST_TEST(out[n] == 0xbeef);
    convert_f32_to_bf16(n, in.data(), out.data());
    bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (out[i] != float_to_bfloat16(in[i]) && bad++ < 5) {
        BOOST_ERROR("bf16 of 0x" << std::hex << bits_of(in[i]) << ": 0x" << out[i] << " want 0x"
                                 << float_to_bfloat16(in[i]));
      }
    }
    BOOST_TEST(bad == 0);
    for (int64_t len : test_lengths()) {
      std::vector<uint16_t> o(len + 1, 0xbeef);
      convert_f32_to_f16(len, in.data() + 101, o.data());
      for (int64_t i = 0; i < len; ++i) BOOST_TEST(o[i] == float_to_half(in[101 + i]));
      BOOST_TEST(o[len] == 0xbeef);
      convert_f32_to_bf16(len, in.data() + 203, o.data());
      for (int64_t i = 0; i < len; ++i) BOOST_TEST(o[i] == float_to_bfloat16(in[203 + i]));
      BOOST_TEST(o[len] == 0xbeef);
    }
  });
}

// The reference functions themselves, on values whose encodings are known, so that bit-exact
// agreement above means agreement with IEEE round-to-nearest-even.
BOOST_AUTO_TEST_CASE(scalar_reference_conversions_known_values) {
  BOOST_TEST(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie, even stays
  BOOST_TEST(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie, rounds up
  BOOST_TEST(float_to_half(65519.996f) == 0x7bff);
  BOOST_TEST(float_to_half(65520.0f) == 0x7c00);
  BOOST_TEST(float_to_half(std::ldexp(3.0f, -26)) == 0x0001);     // 0.75 of the smallest subnormal
  BOOST_TEST(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);     // tie to even zero
  BOOST_TEST(float_to_half(std::ldexp(3.0f, -25)) == 0x0002);     // tie 1.5 -> 2
  BOOST_TEST(float_to_half(std::ldexp(1023.5f, -24)) == 0x0400);  // rounds into the normals
  BOOST_TEST((float_to_half(kNaN) & 0x7fff) > 0x7c00);
  BOOST_TEST(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);  // tie, even
  BOOST_TEST(float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  BOOST_TEST(float_to_bfloat16(std::bit_cast<float>(0x7f7fffffu)) == 0x7f80);  // overflow: inf
  BOOST_TEST((float_to_bfloat16(std::bit_cast<float>(0x7f800001u)) & 0x7fff) > 0x7f80);
  BOOST_TEST(half_to_float(0x0001) == std::ldexp(1.0f, -24));
  BOOST_TEST(half_to_float(0x7bff) == 65504.0f);
}

// ---------------------------------------------------------------------------------------------
// GEMM. Reference in float64 from the stored (possibly transposed, padded) matrices.
namespace {

struct GemmShape {
  int64_t m, n, k;
};

// Fills a stored rows x cols matrix at stride ld, returns its element at logical (i, p).
float stored_at(const float* a, bool trans, int64_t ld, int64_t i, int64_t p) {
  return trans ? a[p * ld + i] : a[i * ld + p];
}

void check_gemm_case(const GemmShape& s, bool ta, bool tb, int64_t pad, float alpha, float beta,
                     Generator& gen) {
  const int64_t a_rows = ta ? s.k : s.m, a_cols = ta ? s.m : s.k;
  const int64_t b_rows = tb ? s.n : s.k, b_cols = tb ? s.k : s.n;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = s.n + pad;
  // Exactly the footprint a minimal-stride caller owns: the last row ends at its last column.
  const int64_t a_size = a_rows == 0 ? 0 : (a_rows - 1) * lda + a_cols;
  const int64_t b_size = b_rows == 0 ? 0 : (b_rows - 1) * ldb + b_cols;
  const int64_t c_size = s.m == 0 ? 0 : (s.m - 1) * ldc + s.n;
  GuardedFloats a_buf(a_size), b_buf(b_size), c_buf(c_size);
  float* a = a_buf.data();
  float* b = b_buf.data();
  float* c = c_buf.data();
  for (int64_t i = 0; i < a_size; ++i) a[i] = static_cast<float>(gen.normal());
  for (int64_t i = 0; i < b_size; ++i) b[i] = static_cast<float>(gen.normal());
  // beta == 0 must not read C: fill it with NaN then.
  for (int64_t i = 0; i < c_size; ++i)
    c[i] = beta == 0.0f ? kNaN : static_cast<float>(gen.normal());
  const std::vector<float> c0(c, c + c_size);
  table().gemm_f32(ta, tb, s.m, s.n, s.k, alpha, a, lda, b, ldb, beta, c, ldc);
  const double eps = std::ldexp(1.0, -24);
  int64_t bad = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double dot = 0.0, mag = 0.0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double prod =
            double{stored_at(a, ta, lda, i, p)} * double{stored_at(b, !tb, ldb, j, p)};
        dot += prod;
        mag += std::abs(prod);
      }
      const double c_old = beta == 0.0f ? 0.0 : double{c0[i * ldc + j]};
      const double ref = alpha * dot + beta * c_old;
      const double tol =
          2.0 * s.k * eps * std::abs(alpha) * mag + eps * std::abs(beta * c_old) + 1e-30;
      const double got = c[i * ldc + j];
      if (!(std::abs(got - ref) <= tol) && bad++ < 3) {
        BOOST_ERROR("gemm m" << s.m << " n" << s.n << " k" << s.k << " ta" << ta << " tb" << tb
                             << " pad" << pad << " alpha " << alpha << " beta " << beta << " at ("
                             << i << "," << j << "): " << got << " want " << ref);
      }
    }
    for (int64_t j = s.n; j < ldc && i + 1 < s.m; ++j) {  // padding between rows of C
      bad += bits_of(c[i * ldc + j]) != bits_of(c0[i * ldc + j]);
    }
  }
  BOOST_TEST(bad == 0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(gemm_transposes_strides_alpha_beta) {
  Generator gen(71);
  // {40, 20, 48}, {7, 8, 64}, {3, 24, 33} and {2, 1, 130} have 1-8 columns past a multiple of 16
  // and k >= 32: those columns are computed outside OpenBLAS (gemm_f32.cpp).
  const GemmShape shapes[] = {{1, 1, 1},   {3, 5, 7},   {17, 33, 9},  {64, 31, 65},
                              {2, 1, 130}, {1, 40, 17}, {33, 1, 1},   {70, 70, 70},
                              {40, 20, 48}, {7, 8, 64}, {3, 24, 33}};
  for (const GemmShape& s : shapes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      check_gemm_case(s, ta, tb, 0, 1.0f, 0.0f, gen);
      check_gemm_case(s, ta, tb, 3, 1.5f, 0.5f, gen);
      check_gemm_case(s, ta, tb, 5, -0.75f, 0.0f, gen);
      check_gemm_case(s, ta, tb, 1, 2.0f, 1.0f, gen);
    }
  }
}

// Minimal strides (pad 0). Every matrix in these tests ends right at an inaccessible page, so
// OpenBLAS reading (A, B) or writing (C) past the last element faults the test.
BOOST_AUTO_TEST_CASE(gemm_minimal_strides_stay_in_bounds) {
  Generator gen(72);
  const GemmShape shapes[] = {{1, 1, 1},    {3, 5, 7},  {17, 33, 9},
                              {5, 16, 1},   {61, 47, 129}, {9, 21, 40}};
  for (const GemmShape& s : shapes) {
    for (int t = 0; t < 4; ++t) {
      check_gemm_case(s, t & 1, t & 2, 0, 1.0f, 0.0f, gen);
      check_gemm_case(s, t & 1, t & 2, 0, 0.5f, 2.0f, gen);
    }
  }
}

BOOST_AUTO_TEST_CASE(gemm_empty_dimensions) {
  Generator gen(73);
  for (int t = 0; t < 4; ++t) {
    // k == 0: C = beta * C; beta == 0 zeroes a NaN-filled C.
    check_gemm_case({3, 4, 0}, t & 1, t & 2, 2, 1.0f, 0.0f, gen);
    check_gemm_case({3, 4, 0}, t & 1, t & 2, 0, 1.0f, 2.0f, gen);
    check_gemm_case({5, 3, 4}, t & 1, t & 2, 1, 0.0f, 0.5f, gen);  // alpha == 0
  }
  // m == 0 or n == 0: nothing is touched (null pointers are fine: nothing can be read).
  float c = 7.0f;
  table().gemm_f32(false, false, 0, 1, 5, 1.0f, nullptr, 5, nullptr, 1, 0.0f, &c, 1);
  table().gemm_f32(false, false, 1, 0, 5, 1.0f, nullptr, 5, nullptr, 0, 0.0f, &c, 0);
  table().gemm_batched_f32(0, false, false, 2, 2, 2, 1.0f, nullptr, 2, 4, nullptr, 2, 4, 0.0f, &c,
                           2, 4);
  BOOST_TEST(c == 7.0f);
}

BOOST_AUTO_TEST_CASE(gemm_batched_with_strides) {
  Generator gen(74);
  const int64_t batch = 3, m = 5, n = 7, k = 9;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
    const int64_t stride_a = (ta ? k : m) * lda + 11, stride_b = (tb ? n : k) * ldb + 13;
    const int64_t stride_c = m * ldc + 17;
    std::vector<float> a(batch * stride_a), b(batch * stride_b), c(batch * stride_c, kSentinel);
    for (float& v : a) v = static_cast<float>(gen.normal());
    for (float& v : b) v = static_cast<float>(gen.normal());
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t r = 0; r < m; ++r) std::fill_n(&c[i * stride_c + r * ldc], n, 1.0f);
    }
    const std::vector<float> c0 = c;
    table().gemm_batched_f32(batch, ta, tb, m, n, k, 0.5f, a.data(), lda, stride_a, b.data(), ldb,
                             stride_b, -1.0f, c.data(), ldc, stride_c);
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < ldc; ++j) {
          const float got = c[i * stride_c + r * ldc + j];
          if (j >= n) {
            BOOST_TEST(got == kSentinel);
            continue;
          }
          double dot = 0.0, mag = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            const double prod = double{stored_at(&a[i * stride_a], ta, lda, r, p)} *
                                double{stored_at(&b[i * stride_b], !tb, ldb, j, p)};
            dot += prod;
            mag += std::abs(prod);
          }
          const double ref = 0.5 * dot - 1.0;
          BOOST_TEST(std::abs(got - ref) <= 2.0 * k * std::ldexp(1.0, -24) * (0.5 * mag + 1.0));
        }
      }
      for (int64_t j = m * ldc; j < stride_c; ++j) BOOST_TEST(c[i * stride_c + j] == kSentinel);
    }
  }
}

// The layers call GEMM from several oneTBB workers at once; the device pins OpenBLAS to one
// thread so those calls neither spawn a second pool nor interfere. Two threads hammering GEMM
// concurrently must reproduce the single-threaded results bit for bit.
BOOST_AUTO_TEST_CASE(gemm_concurrent_calls_match_sequential) {
  cpu_device();  // the constructor pins OpenBLAS
  BOOST_TEST(openblas_get_num_threads() == 1);
  Generator gen(75);
  const int64_t m = 96, n = 80, k = 70;
  const std::vector<float> a = normal_vector(gen, m * k, 0, 1), b = normal_vector(gen, k * n, 0, 1);
  std::vector<float> expect(m * n);
  table().gemm_f32(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, expect.data(), n);
  std::vector<float> results[2] = {std::vector<float>(m * n), std::vector<float>(m * n)};
  int64_t mismatches[2] = {0, 0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 200; ++rep) {
        table().gemm_f32(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                         results[t].data(), n);
        mismatches[t] += std::memcmp(results[t].data(), expect.data(), m * n * sizeof(float)) != 0;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  BOOST_TEST(mismatches[0] == 0);
  BOOST_TEST(mismatches[1] == 0);
}

// linear_pack_f32 + linear_packed_f32 (y = x w^T + bias) against a float64 product, on every
// target: rows around the 32-row panel, features around the 12- (AVX-512) and 3-row (AVX2)
// tiles, strided x and y, with and without bias. x, w and bias end at an inaccessible page (a
// read past them faults); y's row padding must stay untouched. Then the same product computed in
// pieces (one call per panel, odd feature ranges) must match the whole call bit for bit: the layers
// split work over threads that way, and results must not depend on the thread count.
BOOST_AUTO_TEST_CASE(linear_packed_matches_float64_and_any_split) {
  BOOST_TEST((table().linear(DType::BF16) == nullptr));  // no bf16-weight kernel yet
  BOOST_TEST_REQUIRE((table().linear(DType::F32) != nullptr));
  const LinearKernels& k = *table().linear(DType::F32);
  struct Shape {
    int64_t m, n, kk;
  };
  const Shape shapes[] = {{1, 1, 1},    {5, 13, 7},    {32, 12, 16}, {33, 25, 64},
                          {70, 100, 3}, {64, 64, 130}, {97, 37, 17}};
  constexpr float kSentinel = -12345.0f;
  for_each_target("linear_packed_f32", [&] {
    Generator gen(81);
    for (const Shape& s : shapes) {
      for (const bool with_bias : {false, true}) {
        const int64_t ldx = s.kk + 3, ldy = s.n + 2;
        GuardedFloats x(static_cast<size_t>((s.m - 1) * ldx + s.kk));
        GuardedFloats w(static_cast<size_t>(s.n * s.kk));
        const std::vector<float> xv = normal_vector(gen, static_cast<size_t>(s.m * ldx), 0, 1);
        const std::vector<float> wv = normal_vector(gen, static_cast<size_t>(s.n * s.kk), 0, 1);
        const std::vector<float> bv = normal_vector(gen, static_cast<size_t>(s.n), 0, 1);
        GuardedFloats bias(static_cast<size_t>(s.n));
        std::copy(xv.begin(), xv.begin() + ((s.m - 1) * ldx + s.kk), x.data());
        std::copy(wv.begin(), wv.end(), w.data());
        std::copy(bv.begin(), bv.end(), bias.data());
        const int64_t panels = (s.m + k.panel_rows - 1) / k.panel_rows;
        std::vector<float> packed_store(
            static_cast<size_t>(panels * k.panel_rows * s.kk + 16));
        float* packed = packed_store.data() +
                        (16 - reinterpret_cast<uintptr_t>(packed_store.data()) / 4 % 16) % 16;
        std::vector<float> y(static_cast<size_t>(s.m * ldy), kSentinel);
        const float* b = with_bias ? bias.data() : nullptr;
        k.pack(s.m, s.kk, x.data(), ldx, 0, panels, packed);
        k.packed(s.m, s.kk, packed, 0, panels, w.data(), s.kk, 0, s.n, b, y.data(), ldy);
        BOOST_TEST(linear_mismatches("linear", s.m, s.n, s.kk, x.data(), ldx, w.data(), b, y,
                                     ldy, kSentinel) == 0);

        // Pieces: one pack call and one compute call per panel, features in ranges of 7.
        std::vector<float> packed2_store(packed_store.size());
        float* packed2 = packed2_store.data() +
                         (16 - reinterpret_cast<uintptr_t>(packed2_store.data()) / 4 % 16) % 16;
        std::vector<float> y2(y.size(), kSentinel);
        for (int64_t p = 0; p < panels; ++p) {
          k.pack(s.m, s.kk, x.data(), ldx, p, p + 1, packed2);
          for (int64_t n0 = 0; n0 < s.n; n0 += 7)
            k.packed(s.m, s.kk, packed2, p, p + 1, w.data(), s.kk, n0, std::min(s.n, n0 + 7), b,
                     y2.data(), ldy);
        }
        const int differ = bit_differences(y, y2);
        BOOST_TEST(differ == 0, "m" << s.m << " n" << s.n << " k" << s.kk << ": split changed "
                                    << differ << " elements");
      }
    }
  });
}

// LinearKernels::matvec (a decode step's projections: m <= matvec_max_rows rows straight from x
// and w) against a float64 product on every target: each row count, k around the vector width
// and its tails, features around the 4- and 2-row groups, strided x and y, with and without
// bias; x, w and bias end at an inaccessible page, y's padding stays untouched. Computed in
// feature ranges of 5 it must give the same bits (the layer splits features over threads).
BOOST_AUTO_TEST_CASE(linear_matvec_matches_float64_and_any_split) {
  const LinearKernels& k = *table().linear(DType::F32);
  BOOST_TEST_REQUIRE(k.matvec != nullptr);
  BOOST_TEST(k.matvec_max_rows == 4);
  constexpr float kSentinel = -12345.0f;
  for_each_target("linear_matvec_f32", [&] {
    Generator gen(82);
    for (int64_t m = 1; m <= k.matvec_max_rows; ++m)
      for (const int64_t kk : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{16}, int64_t{17},
                               int64_t{33}, int64_t{130}})
        for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{9}, int64_t{70}})
          for (const bool with_bias : {false, true}) {
            const int64_t ldx = kk + 5, ldy = n + 3;
            const size_t xn = static_cast<size_t>((m - 1) * ldx + kk);
            GuardedFloats x(xn), w(static_cast<size_t>(n * kk)), bias(static_cast<size_t>(n));
            const std::vector<float> xv = normal_vector(gen, xn, 0, 1);
            const std::vector<float> wv = normal_vector(gen, static_cast<size_t>(n * kk), 0, 1);
            const std::vector<float> bv = normal_vector(gen, static_cast<size_t>(n), 0, 1);
            std::copy(xv.begin(), xv.end(), x.data());
            std::copy(wv.begin(), wv.end(), w.data());
            std::copy(bv.begin(), bv.end(), bias.data());
            const float* b = with_bias ? bias.data() : nullptr;
            std::vector<float> y(static_cast<size_t>(m * ldy), kSentinel), y2 = y;
            k.matvec(m, kk, x.data(), ldx, w.data(), kk, 0, n, b, y.data(), ldy);
            for (int64_t n0 = 0; n0 < n; n0 += 5)
              k.matvec(m, kk, x.data(), ldx, w.data(), kk, n0, std::min(n, n0 + 5), b, y2.data(),
                       ldy);
            BOOST_TEST(linear_mismatches("matvec", m, n, kk, x.data(), ldx, w.data(), b, y, ldy,
                                         kSentinel) == 0);
            const int differ = bit_differences(y, y2);
            BOOST_TEST(differ == 0, "m" << m << " n" << n << " k" << kk << ": split changed "
                                        << differ << " elements");
          }
  });
}

// The prepacked-weight kernels (a model's projections): pack_weights, then `panels` (rows
// around every target's tile of 1-8 rows, features around the 16-feature panel and the tile's
// 16-48 features, depths around AVX2's blocks (256 steps at 32 KiB of L1d and 512 KiB of L2,
// 384 at 48 KiB, 768 from 1 MiB of L2) and past AVX-512's L1d-sized ones, 512 or 768: k = 1030
// is two or three blocks, k = 1800 two to eight, with a partial column tile; each call's next
// columns prefetched) and `panels_matvec` (1-4 rows), against a float64 product on every
// target, strided x and y, with and without bias; x, w and the panels end at an inaccessible
// page, y's padding stays untouched.
// The same product in pieces (rows in ranges of 5, columns in task steps) and the x-panel
// kernel (`packed`) must give the same bits: the layer splits work over threads that way, a
// model's projections must not depend on whether its weights were packed, and a decode step's
// rows must equal a prompt's.
BOOST_AUTO_TEST_CASE(linear_panels_match_float64_any_split_and_the_packed_kernel) {
  const LinearKernels& k = *table().linear(DType::F32);
  BOOST_TEST_REQUIRE(k.pack_weights != nullptr);
  BOOST_TEST_REQUIRE(k.weight_panel == 16);
  struct Shape {
    int64_t m, n, kk;
  };
  const Shape shapes[] = {{1, 1, 1},    {4, 17, 7},    {6, 16, 256}, {7, 48, 257},
                          {13, 49, 130}, {50, 100, 300}, {9, 15, 129}, {3, 97, 33},
                          {10, 64, 513}, {17, 112, 1030}, {8, 32, 385}, {11, 50, 1800}};
  constexpr float kSentinel = -12345.0f;
  for_each_target("linear_panels_f32", [&] {
    Generator gen(83);
    for (const Shape& s : shapes) {
      for (const bool with_bias : {false, true}) {
        const int64_t ldx = s.kk + 3, ldy = s.n + 2;
        const int64_t npanels = (s.n + k.weight_panel - 1) / k.weight_panel;
        GuardedFloats x(static_cast<size_t>((s.m - 1) * ldx + s.kk));
        GuardedFloats w(static_cast<size_t>(s.n * s.kk)), bias(static_cast<size_t>(s.n));
        GuardedFloats panels(static_cast<size_t>(npanels * k.weight_panel * s.kk));
        const std::vector<float> xv = normal_vector(gen, x.size(), 0, 1);
        const std::vector<float> wv = normal_vector(gen, w.size(), 0, 1);
        const std::vector<float> bv = normal_vector(gen, bias.size(), 0, 1);
        std::copy(xv.begin(), xv.end(), x.data());
        std::copy(wv.begin(), wv.end(), w.data());
        std::copy(bv.begin(), bv.end(), bias.data());
        // Packed in two calls (the layer splits packing over threads too).
        k.pack_weights(s.n, s.kk, w.data(), s.kk, 0, npanels / 2, panels.data());
        k.pack_weights(s.n, s.kk, w.data(), s.kk, npanels / 2, npanels, panels.data());
        const float* b = with_bias ? bias.data() : nullptr;
        std::vector<float> y(static_cast<size_t>(s.m * ldy), kSentinel), y2 = y, y3 = y;
        k.panels(s.kk, RowsInF32{x.data(), ldx}, 0, s.m, panels.data(), s.n, 0, s.n, 0, 0, b,
                 RowsOutF32{y.data(), ldy});
        BOOST_TEST(linear_mismatches("panels", s.m, s.n, s.kk, x.data(), ldx, w.data(), b, y,
                                     ldy, kSentinel) == 0);
        // Columns in steps of one tile and of one weight panel (a partial tile), each call
        // told the next step's columns (past n on the last: the kernel clamps them).
        BOOST_TEST_REQUIRE(k.panel_tile_cols() % k.weight_panel == 0);
        const int64_t step = (s.m % 2 == 0) ? k.panel_tile_cols() : k.weight_panel;
        for (int64_t r0 = 0; r0 < s.m; r0 += 5)
          for (int64_t c0 = 0; c0 < s.n; c0 += step)
            k.panels(s.kk, RowsInF32{x.data(), ldx}, r0, std::min(s.m, r0 + 5), panels.data(),
                     s.n, c0, c0 + step, c0 + step, c0 + 2 * step, b, RowsOutF32{y2.data(), ldy});
        const int split = bit_differences(y, y2);
        BOOST_TEST(split == 0, "m" << s.m << " n" << s.n << " k" << s.kk << ": split changed "
                                   << split << " elements");
        // The x-panel kernel on the same product.
        const int64_t xpanels = (s.m + k.panel_rows - 1) / k.panel_rows;
        std::vector<float> packed_store(static_cast<size_t>(xpanels * k.panel_rows * s.kk + 16));
        float* packed = packed_store.data() +
                        (16 - reinterpret_cast<uintptr_t>(packed_store.data()) / 4 % 16) % 16;
        k.pack(s.m, s.kk, x.data(), ldx, 0, xpanels, packed);
        k.packed(s.m, s.kk, packed, 0, xpanels, w.data(), s.kk, 0, s.n, b, y3.data(), ldy);
        const int kernels = bit_differences(y, y3);
        BOOST_TEST(kernels == 0, "m" << s.m << " n" << s.n << " k" << s.kk << ": the x-panel "
                                     << "kernel differs in " << kernels << " elements");
        // A few rows at a time, as decode steps: the same bits as the GEMM's rows.
        std::vector<float> y4(y.size(), kSentinel);
        for (int64_t r0 = 0; r0 < s.m; r0 += k.matvec_max_rows)
          for (int64_t c0 = 0; c0 < s.n; c0 += 4 * k.weight_panel)
            k.panels_matvec(std::min(k.matvec_max_rows, s.m - r0), s.kk,
                            RowsInF32{x.data() + r0 * ldx, ldx}, panels.data(), s.n, c0,
                            c0 + 4 * k.weight_panel, b, RowsOutF32{y4.data() + r0 * ldy, ldy});
        const int steps = bit_differences(y, y4);
        BOOST_TEST(steps == 0, "m" << s.m << " n" << s.n << " k" << s.kk << ": panels_matvec "
                                   << "differs in " << steps << " elements");
        // Rows through one pointer each (a gather and a scatter folded into the product), in
        // reverse order, in the split pieces and as decode steps: row i reads x row m-1-i and
        // writes y row m-1-i, so y comes out in place, the same bits.
        std::vector<const float*> x_rows(static_cast<size_t>(s.m));
        std::vector<float> y5(y.size(), kSentinel), y6 = y5;
        std::vector<float*> y5_rows(x_rows.size()), y6_rows(x_rows.size());
        for (int64_t i = 0; i < s.m; ++i) {
          x_rows[static_cast<size_t>(i)] = x.data() + (s.m - 1 - i) * ldx;
          y5_rows[static_cast<size_t>(i)] = y5.data() + (s.m - 1 - i) * ldy;
          y6_rows[static_cast<size_t>(i)] = y6.data() + (s.m - 1 - i) * ldy;
        }
        for (int64_t r0 = 0; r0 < s.m; r0 += 5)
          for (int64_t c0 = 0; c0 < s.n; c0 += step)
            k.panels(s.kk, RowsInF32{nullptr, 0, x_rows.data()}, r0, std::min(s.m, r0 + 5),
                     panels.data(), s.n, c0, c0 + step, c0 + step, c0 + 2 * step, b,
                     RowsOutF32{nullptr, 0, y5_rows.data()});
        for (int64_t r0 = 0; r0 < s.m; r0 += k.matvec_max_rows)
          k.panels_matvec(std::min(k.matvec_max_rows, s.m - r0), s.kk,
                          RowsInF32{nullptr, 0, x_rows.data() + r0}, panels.data(), s.n, 0, s.n,
                          b, RowsOutF32{nullptr, 0, y6_rows.data() + r0});
        const int gathered = bit_differences(y, y5), gathered_steps = bit_differences(y, y6);
        BOOST_TEST(gathered == 0, "m" << s.m << " n" << s.n << " k" << s.kk << ": row pointers "
                                      << "differ in " << gathered << " elements");
        BOOST_TEST(gathered_steps == 0, "m" << s.m << " n" << s.n << " k" << s.kk
                                            << ": row pointers, decode steps, differ in "
                                            << gathered_steps << " elements");
      }
    }
  });
}

BOOST_AUTO_TEST_SUITE_END()
