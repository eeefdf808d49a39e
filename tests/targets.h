// The SIMD targets a suite runs its checks on: those compiled here (HWY_TARGETS, the list the
// library's Highway files dispatch from too) that this CPU supports, each selected in turn with
// hwy::SetSupportedTargetsForTest; the library's kernels re-dispatch on their next call.
#pragma once

#include <hwy/targets.h>

#include <cstdint>
#include <vector>

namespace tessera {

// Best first (Highway gives better targets lower bits).
inline std::vector<int64_t> compiled_targets() {
  std::vector<int64_t> out;
  const int64_t all = hwy::SupportedTargets() & HWY_TARGETS;
  for (int64_t rest = all; rest != 0; rest &= rest - 1) out.push_back(rest & -rest);
  return out;
}

// Restores Highway's own target choice when a scope ends, also when a BOOST_REQUIRE throws out
// of the loop over targets.
struct TargetReset {
  ~TargetReset() { hwy::SetSupportedTargetsForTest(0); }
};

}  // namespace tessera
