// A seeded, platform-independent random stream (SplitMix64 seeding a xoshiro256**), so that
// "--seed 3" initialises the same weights on every machine and standard library.
#pragma once

#include <cstdint>

namespace tessera {

class Generator {
 public:
  explicit Generator(uint64_t seed);
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Standard normal (Box-Muller on two uniforms).
  double normal();

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace tessera
