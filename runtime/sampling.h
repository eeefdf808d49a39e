// Choosing the next token from a row of logits, as `tessera generate` does (interfaces.md §6):
// greedy at temperature 0 (the lowest index among equal maxima); otherwise logits / T, the K most
// likely kept (top_k 0 keeps all), renormalised, then the smallest set whose probability reaches P
// (top_p 1 keeps all), and one draw from a seeded generator.
//
// Determinism: every batch row has its own random stream, seeded from (seed, row), and a row's
// draws depend only on its stream and its logits: the same seed gives the same tokens at any
// thread count and whatever the other rows do. Candidates are ordered by (logit descending,
// index ascending), so ties at the top-k or top-p boundary keep the lower index.
//
// Non-finite logits: -inf is probability 0 (never drawn while any finite or +inf logit remains);
// if some logits are +inf, those tokens share all the probability equally; a row that is all
// -inf gives its lowest index. NaN: greedy returns the first NaN's index (torch.argmax treats NaN
// as the largest value); sampling refuses the row (E_CONSTRAINT), as torch.multinomial does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/random.h"

namespace tessera {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all tokens
  double top_p = 1.0;        // in (0, 1]; 1: all tokens
  uint64_t seed = 0;
};

// E_ARG (where = `where`) for a temperature that is negative or not finite, top_k < 0, or top_p
// outside (0, 1].
void check_sampling_options(const SamplingOptions& options, const std::string& where);

// The lowest index of the largest logit (the first NaN's, if any). n >= 1.
int64_t argmax_token(const float* logits, int64_t n);

class TokenSampler {
 public:
  // Options checked (E_ARG); batch >= 1 rows, vocab >= 1 tokens per row (E_ARG otherwise).
  TokenSampler(const SamplingOptions& options, int64_t batch, int64_t vocab,
               const std::string& where = "sampling");

  // The next token of batch row `row` (0 <= row < batch) from its `vocab` logits. Advances that
  // row's random stream by one draw when sampling. Reuses its own scratch: allocates nothing.
  int64_t next(int64_t row, const float* logits);

  const SamplingOptions& options() const { return options_; }

 private:
  SamplingOptions options_;
  int64_t vocab_;
  std::string where_;
  std::vector<Generator> streams_;  // one per batch row
  std::vector<int64_t> order_;      // candidate indices, best first
  std::vector<double> weight_;      // their unnormalised probabilities, in that order
};

}  // namespace tessera
