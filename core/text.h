// Small text helpers for messages, summaries and reprs, one of each for the whole runtime.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// A number in a message: "3", "-2".
inline std::string str(int64_t v) { return std::to_string(v); }
// "a, b, c"
std::string join(const std::vector<std::string>& items, const char* sep = ", ");
// 4224 -> "4,224"
std::string thousands(int64_t n);
std::string thousands(uint64_t n);
// Python's repr of a float: shortest round-trip digits, ".0" on integral values ("0.0", "0.1",
// "1e-05"), "nan", "inf", "-inf"; so messages and reprs read like the network file.
std::string py_float(double v);
const char* py_bool(bool b);
// "x3", "out0": indexed port names. (Built by appending: GCC 12 at -O3 warns falsely,
// -Wrestrict, on "literal" + std::to_string(i), PR105329.)
std::string indexed(const char* prefix, int64_t i);

}  // namespace tessera
