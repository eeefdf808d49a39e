// Shared by the libFuzzer targets: how a target reports a bug. Built only with -Dfuzz=true.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tessera::fuzz {

// A property the target checks failed: print it and abort, which libFuzzer records as a crash
// (the input is saved as crash-<sha1> for reproduction).
[[noreturn]] inline void bug(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: BUG: %s\n", target, what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tessera::fuzz
