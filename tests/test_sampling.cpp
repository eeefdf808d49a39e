// Next-token choice (runtime/sampling.h) against interfaces.md §6 written out naively below:
// float64, every token sorted by (logit descending, index ascending) with a stable sort, the K
// best kept, exp((z - max) / T) renormalised, the smallest best-first prefix reaching P, and the
// resulting distribution. A sampler's draws are checked against it by frequency over 20000 draws
// of one fixed seed (deterministic: the same draws every run): every token within 5 standard
// deviations plus 0.002 of its probability, and a token of probability 0 never drawn.
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "runtime/sampling.h"
#include "tests/allocation_counter.h"
#include "tests/expect_error.h"

namespace tessera {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The distribution §6 describes, for finite or -inf logits (at least one finite).
std::vector<double> reference_distribution(const std::vector<float>& logits,
                                           const SamplingOptions& o) {
  const size_t n = logits.size();
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  const size_t k = o.top_k > 0 ? std::min(n, static_cast<size_t>(o.top_k)) : n;
  const double top = logits[idx[0]];
  std::vector<double> w(n, 0.0);
  double total = 0.0;
  for (size_t j = 0; j < k; ++j) {
    const double z = logits[idx[j]];
    w[idx[j]] = std::isinf(z) ? 0.0 : std::exp((z - top) / o.temperature);
    total += w[idx[j]];
  }
  std::vector<double> p(n, 0.0);
  double reached = 0.0;
  for (size_t j = 0; j < k; ++j) {
    p[idx[j]] = w[idx[j]] / total;
    reached += p[idx[j]];
    if (reached >= o.top_p) break;
  }
  const double kept = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= kept;
  return p;
}

void check_frequencies(const std::vector<float>& logits, const SamplingOptions& o) {
  const std::vector<double> p = reference_distribution(logits, o);
  const int64_t n = static_cast<int64_t>(logits.size());
  TokenSampler sampler(o, 1, n);
  constexpr int kDraws = 20000;
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    const int64_t t = sampler.next(0, logits.data());
    BOOST_REQUIRE(t >= 0 && t < n);
    ++count[static_cast<size_t>(t)];
  }
  for (size_t t = 0; t < p.size(); ++t) {
    const double f = static_cast<double>(count[t]) / kDraws;
    if (p[t] == 0.0) {
      BOOST_TEST(count[t] == 0, "token " << t << " has probability 0 but was drawn "
                                         << count[t] << " times (T=" << o.temperature
                                         << " k=" << o.top_k << " p=" << o.top_p << ")");
    } else {
      const double sigma = std::sqrt(p[t] * (1.0 - p[t]) / kDraws);
      BOOST_TEST(std::abs(f - p[t]) <= 5.0 * sigma + 0.002,
                 "token " << t << ": frequency " << f << " vs probability " << p[t] << " (T="
                          << o.temperature << " k=" << o.top_k << " p=" << o.top_p << ")");
    }
  }
}

// Ties (tokens 2 and 5; 7 and 8) at the boundaries the filters cut, and an impossible token.
const std::vector<float> kLogits = {0.3f, -1.2f, 1.7f, 0.9f, -kInf, 1.7f, -0.4f, 0.5f, 0.5f, 2.4f,
                                    -2.0f, 0.1f};

}  // namespace

BOOST_AUTO_TEST_SUITE(sampling)

BOOST_AUTO_TEST_CASE(options_are_checked) {
  const auto bad = [](SamplingOptions o, const char* text) {
    expect_error(ErrorCode::Arg, text, [&] { check_sampling_options(o, "generate"); });
    expect_error(ErrorCode::Arg, text, [&] { TokenSampler(o, 1, 4, "generate"); });
  };
  bad({-0.5, 0, 1.0, 0}, "temperature -0.5");
  bad({std::numeric_limits<double>::quiet_NaN(), 0, 1.0, 0}, "must be finite and >= 0");
  bad({std::numeric_limits<double>::infinity(), 0, 1.0, 0}, "must be finite and >= 0");
  bad({1.0, -1, 1.0, 0}, "top_k -1 must be >= 0");
  bad({1.0, 0, 0.0, 0}, "top_p 0");
  bad({1.0, 0, 1.5, 0}, "must be in (0, 1]");
  bad({1.0, 0, std::numeric_limits<double>::quiet_NaN(), 0}, "must be in (0, 1]");
  expect_error(ErrorCode::Arg, "batch 0 and vocab 4",
               [] { TokenSampler(SamplingOptions{}, 0, 4); });
  expect_error(ErrorCode::Arg, "batch 1 and vocab 0",
               [] { TokenSampler(SamplingOptions{}, 1, 0); });
  TokenSampler s(SamplingOptions{1.0, 0, 1.0, 0}, 2, 3);
  const float logits[3] = {0.0f, 1.0f, 2.0f};
  expect_error(ErrorCode::Arg, "batch row 2 is outside [0, 2)", [&] { s.next(2, logits); });
  expect_error(ErrorCode::Arg, "batch row -1", [&] { s.next(-1, logits); });
}

BOOST_AUTO_TEST_CASE(greedy_is_the_lowest_index_of_the_maximum) {
  TokenSampler greedy(SamplingOptions{0.0, 3, 0.2, 7}, 1, 12);  // k and p do not matter at T=0
  BOOST_TEST(greedy.next(0, kLogits.data()) == 9);
  const std::vector<float> tie = {1.0f, 3.0f, -kInf, 3.0f};
  BOOST_TEST(argmax_token(tie.data(), 4) == 1);
  const std::vector<float> none = {-kInf, -kInf, -kInf};
  BOOST_TEST(argmax_token(none.data(), 3) == 0);
  const std::vector<float> nan = {1.0f, std::numeric_limits<float>::quiet_NaN(), 9.0f,
                                  std::numeric_limits<float>::quiet_NaN()};
  BOOST_TEST(argmax_token(nan.data(), 4) == 1);  // torch.argmax: the first NaN
  // top_k = 1, or a top_p below the best token's probability, is greedy at any temperature.
  TokenSampler k1(SamplingOptions{5.0, 1, 1.0, 3}, 1, 12), p0(SamplingOptions{5.0, 0, 1e-9, 3},
                                                                1, 12);
  for (int i = 0; i < 200; ++i) {
    BOOST_TEST(k1.next(0, kLogits.data()) == 9);
    BOOST_TEST(p0.next(0, kLogits.data()) == 9);
  }
}

BOOST_AUTO_TEST_CASE(draws_follow_the_filtered_distribution) {
  check_frequencies(kLogits, {1.0, 0, 1.0, 1});
  // Best first: 9, 2, 5, 3, 7, 8, 0, 11, ... so k = 5 keeps 7 and drops its tie 8 (index order).
  check_frequencies(kLogits, {0.7, 5, 1.0, 2});
  check_frequencies(kLogits, {0.7, 3, 1.0, 2});  // 9 and the tied 2 and 5
  check_frequencies(kLogits, {1.3, 0, 0.8, 3});
  check_frequencies(kLogits, {2.0, 4, 0.5, 4});
  check_frequencies(kLogits, {0.25, 0, 0.95, 5});
  std::vector<float> wide(300);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<float>(std::sin(0.37 * i) * 3.0);
  check_frequencies(wide, {1.0, 40, 0.9, 6});
}

BOOST_AUTO_TEST_CASE(infinite_logits) {
  // +inf tokens share all the probability; the rest are never drawn.
  const std::vector<float> logits = {1.0f, kInf, 5.0f, kInf, -kInf, kInf};
  TokenSampler s(SamplingOptions{1.0, 0, 1.0, 11}, 1, 6);
  int count[6] = {};
  for (int i = 0; i < 6000; ++i) ++count[s.next(0, logits.data())];
  BOOST_TEST(count[0] + count[2] + count[4] == 0);
  for (int t : {1, 3, 5}) BOOST_TEST(std::abs(count[t] - 2000) < 200, "token " << t);
  TokenSampler two(SamplingOptions{1.0, 2, 1.0, 11}, 1, 6);  // top-2 of three tied: 1 and 3
  for (int i = 0; i < 100; ++i) {
    const int64_t t = two.next(0, logits.data());
    BOOST_TEST((t == 1 || t == 3));
  }
  TokenSampler s2(SamplingOptions{1.0, 0, 1.0, 0}, 1, 2);
  const std::vector<float> none = {-kInf, -kInf};
  BOOST_TEST(s2.next(0, none.data()) == 0);
  const std::vector<float> nan = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  expect_error(ErrorCode::Constraint, "contain NaN (token 1)", [&] { s2.next(0, nan.data()); });
}

BOOST_AUTO_TEST_CASE(seeded_per_row_and_allocation_free) {
  const SamplingOptions o{1.1, 0, 0.9, 42};
  TokenSampler a(o, 2, 12), b(o, 2, 12), c(SamplingOptions{1.1, 0, 0.9, 43}, 2, 12);
  std::vector<int64_t> row0_alone, row0_interleaved, row1, other_seed;
  for (int i = 0; i < 200; ++i) row0_alone.push_back(a.next(0, kLogits.data()));
  for (int i = 0; i < 200; ++i) {
    row1.push_back(b.next(1, kLogits.data()));  // another row's draws do not move row 0's
    row0_interleaved.push_back(b.next(0, kLogits.data()));
    other_seed.push_back(c.next(0, kLogits.data()));
  }
  BOOST_TEST(row0_alone == row0_interleaved);
  BOOST_TEST(row0_alone != row1);
  BOOST_TEST(row0_alone != other_seed);
  const testing::Allocations counted =
      testing::count_allocations([&] { (void)a.next(1, kLogits.data()); });
  BOOST_TEST(counted.total() == 0u, counted.str());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace tessera
