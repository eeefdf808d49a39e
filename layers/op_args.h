// What every op's definition uses to read its arguments and check its inputs, so that each op
// states only its own rules and every message has the same form.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "layers/op.h"

namespace tessera {

// Reads a node's args by name with their types and defaults; finish() rejects every argument
// that no read asked for, listing those the op takes (E_ARG).
class Args {
 public:
  Args(const nlohmann::ordered_json& args, const std::string& where, const char* op)
      : args_(args), where_(where), op_(op) {}

  int64_t integer(const char* name);  // required
  int64_t integer(const char* name, int64_t def);
  // null or absent: nullopt (Python's None).
  std::optional<int64_t> optional_integer(const char* name);
  bool boolean(const char* name, bool def);
  double number(const char* name, double def);
  std::string string(const char* name, const std::string& def);
  // The raw value for arguments with their own structure; null when absent.
  const nlohmann::ordered_json* raw(const char* name) { return get(name); }
  void finish() const;
  [[noreturn]] void type_error(const std::string& name, const char* want,
                               const nlohmann::ordered_json& got) const;

 private:
  const nlohmann::ordered_json* get(const char* name);
  int64_t to_integer(const nlohmann::ordered_json& v, const char* name) const;

  const nlohmann::ordered_json& args_;
  const std::string& where_;
  const char* op_;
  std::vector<std::string> known_;
};

// An argument's value for messages, lists spaced as shapes are: "[4, 4]", "7".
std::string shown_arg(const nlohmann::ordered_json& v);
// "x [B, 8, 32]": a port and its type, for messages.
std::string named(const char* port, const ValueType& v);
// E_DTYPE unless the port carries floats.
void require_float(const char* port, const ValueType& v, const char* op, const std::string& where);
// E_DTYPE unless the port carries a mask: bool (true = masked) or float (added to the scores).
void require_mask(const char* port, const ValueType& v, const std::string& where);
// A dim the op's parameters depend on: E_SHAPE unless it is fixed.
int64_t require_fixed(const Dim& d, const std::string& what, const ValueType& v, const char* port,
                      const std::string& where);
// E_CONSTRAINT "name=value must be >= min".
void require_at_least(int64_t value, int64_t min, const char* name, const std::string& where);

// The concrete shape of a port's type (the plan's types are concrete).
inline const SymShape& shape_of(const InputTypes& in, size_t port) { return in[port]->shape; }

}  // namespace tessera
