#pragma once
// --target NAME for the Highway benchmarks: run one compiled target instead of the best one.

#include <hwy/targets.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace tessera::bench {

// Restricts Highway's dispatch to the target called `name` (hwy::TargetName: "AVX3", "AVX2",
// ...); false, with a message, when it is not compiled in or this CPU lacks it.
inline bool force_target(const std::string& name) {
  int64_t chosen = 0;
  for (int64_t bit = 1; bit != 0 && bit <= HWY_TARGETS; bit <<= 1)
    if ((bit & hwy::SupportedTargets() & HWY_TARGETS) && name == hwy::TargetName(bit))
      chosen = bit;
  if (chosen == 0) {
    std::fprintf(stderr, "target %s is not compiled or not supported here\n", name.c_str());
    return false;
  }
  hwy::SetSupportedTargetsForTest(chosen);
  return true;
}

}  // namespace tessera::bench
