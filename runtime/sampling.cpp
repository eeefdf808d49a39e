#include "runtime/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace tessera {

void check_sampling_options(const SamplingOptions& o, const std::string& where) {
  if (!std::isfinite(o.temperature) || o.temperature < 0.0)
    fail(ErrorCode::Arg, where,
         "temperature " + std::to_string(o.temperature) + " must be finite and >= 0 (0: greedy)");
  if (o.top_k < 0)
    fail(ErrorCode::Arg, where,
         "top_k " + std::to_string(o.top_k) + " must be >= 0 (0 keeps every token)");
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    fail(ErrorCode::Arg, where, "top_p " + std::to_string(o.top_p) + " must be in (0, 1]");
}

int64_t argmax_token(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) return i;
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

TokenSampler::TokenSampler(const SamplingOptions& options, int64_t batch, int64_t vocab,
                           const std::string& where)
    : options_(options), vocab_(vocab), where_(where) {
  check_sampling_options(options, where);
  if (batch < 1 || vocab < 1)
    fail(ErrorCode::Arg, where,
         "batch " + std::to_string(batch) + " and vocab " + std::to_string(vocab) +
             " must be at least 1");
  streams_.reserve(static_cast<size_t>(batch));
  // Row r's stream: the seed mixed with r (SplitMix64 seeding decorrelates neighbours).
  for (int64_t r = 0; r < batch; ++r)
    streams_.emplace_back(options.seed ^ (static_cast<uint64_t>(r) * 0x9e3779b97f4a7c15ull));
  if (options.temperature > 0.0) {
    order_.resize(static_cast<size_t>(vocab));
    weight_.resize(static_cast<size_t>(vocab));
  }
}

int64_t TokenSampler::next(int64_t row, const float* logits) {
  if (row < 0 || row >= static_cast<int64_t>(streams_.size()))
    fail(ErrorCode::Arg, where_,
         "batch row " + std::to_string(row) + " is outside [0, " +
             std::to_string(streams_.size()) + ")");
  if (options_.temperature == 0.0) return argmax_token(logits, vocab_);

  const int64_t n = vocab_;
  int64_t pos_inf = 0, minus_inf = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = logits[i];
    if (std::isnan(v))
      fail(ErrorCode::Constraint, where_,
           "the logits of batch row " + std::to_string(row) + " contain NaN (token " +
               std::to_string(i) + "): nothing to sample from");
    if (std::isinf(v)) (v > 0 ? pos_inf : minus_inf) += 1;
  }
  if (minus_inf == n) return 0;  // every token impossible: the lowest index, as argmax

  // Candidates best first: (logit descending, index ascending). Only as much order as the
  // filters need: top-k needs the k best, top-p needs them sorted, a plain draw needs none.
  std::iota(order_.begin(), order_.end(), int64_t{0});
  const auto better = [logits](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int64_t kept = n;
  if (options_.top_k > 0 && options_.top_k < n) {
    kept = options_.top_k;
    std::nth_element(order_.begin(), order_.begin() + kept, order_.end(), better);
  }
  if (options_.top_p < 1.0 || kept < n)
    std::sort(order_.begin(), order_.begin() + kept, better);

  // Unnormalised probabilities exp((z - z_max) / T); with +inf logits present, those share it all.
  double z_max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < kept; ++j)
    z_max = std::max(z_max, static_cast<double>(logits[order_[j]]));
  double total = 0.0;
  for (int64_t j = 0; j < kept; ++j) {
    const double z = logits[order_[j]];
    double w;
    if (pos_inf > 0)
      w = std::isinf(z) && z > 0 ? 1.0 : 0.0;
    else
      w = std::isinf(z) ? 0.0 : std::exp((z - z_max) / options_.temperature);
    weight_[static_cast<size_t>(j)] = w;
    total += w;
  }
  if (options_.top_p < 1.0) {
    // The smallest prefix (best first) whose probability reaches top_p; at least one token.
    double sum = 0.0;
    int64_t prefix = 0;
    while (prefix < kept) {
      sum += weight_[static_cast<size_t>(prefix)];
      ++prefix;
      if (sum >= options_.top_p * total) break;
    }
    kept = prefix;
    total = sum;
  }
  const double u = streams_[static_cast<size_t>(row)].uniform() * total;
  double sum = 0.0;
  int64_t last_possible = order_[0];
  for (int64_t j = 0; j < kept; ++j) {
    const double w = weight_[static_cast<size_t>(j)];
    if (w <= 0.0) continue;
    sum += w;
    last_possible = order_[j];
    if (u < sum) return order_[j];
  }
  return last_possible;  // u within rounding of the total
}

}  // namespace tessera
