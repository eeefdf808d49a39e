#include "core/limits.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace tessera {

namespace {

constexpr const char* kBudgetVariable = "TESSERA_MEMORY_BUDGET";

// 0: not set by set_memory_budget().
std::atomic<uint64_t> g_budget{0};

// "512M" -> 536870912; nullopt-like 0 for anything that is not a positive size.
uint64_t parse_size(const std::string& text) {
  uint64_t v = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i)
    if (__builtin_mul_overflow(v, uint64_t{10}, &v) ||
        __builtin_add_overflow(v, static_cast<uint64_t>(text[i] - '0'), &v))
      return 0;
  if (i == 0) return 0;
  int shift = 0;
  if (i + 1 == text.size()) {
    switch (text[i]) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      case 'T':
      case 't':
        shift = 40;
        break;
      default:
        return 0;
    }
  } else if (i != text.size()) {
    return 0;
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return 0;
  return v << shift;
}

// The cgroup v2 memory limit of this process's container, or 0 when there is none ("max") or
// no cgroup v2 file system: under a container limit, half of the host's memory would still be
// enough to get the process killed.
uint64_t cgroup_limit() {
  std::ifstream f("/sys/fs/cgroup/memory.max");
  std::string text;
  if (!(f >> text)) return 0;
  return parse_size(text);
}

uint64_t default_budget() {
  if (const char* env = std::getenv(kBudgetVariable)) {
    const uint64_t v = parse_size(env);
    if (v == 0)
      fail(ErrorCode::Arg, kBudgetVariable,
           std::string("'") + env +
               "' is not a memory size (a positive byte count, optionally with K, M, G or T)");
    return v;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  uint64_t physical = pages > 0 && page > 0
                          ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                          : uint64_t{8} << 30;  // sysconf failed: assume 8 GiB
  if (const uint64_t cg = cgroup_limit(); cg > 0) physical = std::min(physical, cg);
  return std::max<uint64_t>(physical / 2, 1);
}

}  // namespace

uint64_t memory_budget() {
  if (const uint64_t b = g_budget.load(std::memory_order_relaxed); b > 0) return b;
  // Computed once (the environment is read at first use); an invalid variable throws, and the
  // next call tries again.
  static const uint64_t budget = default_budget();
  return budget;
}

void set_memory_budget(uint64_t bytes) { g_budget.store(bytes, std::memory_order_relaxed); }

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t u = 0;
  while (bytes >= 1024.0 && u + 1 < std::size(kUnits)) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, kUnits[u]);
  return buf;
}

void check_memory_budget(double bytes, const std::string& where, const std::string& what) {
  const uint64_t budget = memory_budget();
  if (bytes <= static_cast<double>(budget)) return;
  fail(ErrorCode::Shape, where,
       what + " needs " + format_bytes(bytes) + ", over the memory budget of " +
           format_bytes(static_cast<double>(budget)) + " (" + kBudgetVariable +
           " or tessera::set_memory_budget raise it)");
}

}  // namespace tessera
