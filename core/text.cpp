#include "core/text.h"

#include <charconv>
#include <cmath>

namespace tessera {

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

std::string thousands(uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string thousands(int64_t n) {
  if (n >= 0) return thousands(static_cast<uint64_t>(n));
  // Built by appending: GCC 12 -O3 warns falsely (-Wrestrict, PR105329) on "-" + std::string.
  std::string s = "-";
  s += thousands(static_cast<uint64_t>(0) - static_cast<uint64_t>(n));
  return s;
}

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

const char* py_bool(bool b) { return b ? "True" : "False"; }

std::string indexed(const char* prefix, int64_t i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

}  // namespace tessera
