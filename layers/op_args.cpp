#include "layers/op_args.h"

#include <algorithm>

#include "core/text.h"

namespace tessera {

using ojson = nlohmann::ordered_json;

const ojson* Args::get(const char* name) {
  known_.emplace_back(name);
  const auto it = args_.find(name);
  return it == args_.end() ? nullptr : &*it;
}

int64_t Args::to_integer(const ojson& v, const char* name) const {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(ErrorCode::Constraint, where_,
           std::string("argument ") + name + "=" + v.dump() + " does not fit int64");
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (!v.is_number_integer()) type_error(name, "an integer", v);
  return v.get<int64_t>();
}

int64_t Args::integer(const char* name) {
  const ojson* v = get(name);
  if (!v) fail(ErrorCode::Arg, where_, std::string("missing required argument ") + name);
  return to_integer(*v, name);
}

int64_t Args::integer(const char* name, int64_t def) {
  const ojson* v = get(name);
  return v ? to_integer(*v, name) : def;
}

std::optional<int64_t> Args::optional_integer(const char* name) {
  const ojson* v = get(name);
  if (!v || v->is_null()) return std::nullopt;
  return to_integer(*v, name);
}

bool Args::boolean(const char* name, bool def) {
  const ojson* v = get(name);
  if (!v) return def;
  if (!v->is_boolean()) type_error(name, "a boolean", *v);
  return v->get<bool>();
}

double Args::number(const char* name, double def) {
  const ojson* v = get(name);
  if (!v) return def;
  if (!v->is_number()) type_error(name, "a number", *v);
  return v->get<double>();
}

std::string Args::string(const char* name, const std::string& def) {
  const ojson* v = get(name);
  if (!v) return def;
  if (!v->is_string()) type_error(name, "a string", *v);
  return v->get<std::string>();
}

void Args::finish() const {
  for (const auto& [key, value] : args_.items()) {
    (void)value;
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    fail(ErrorCode::Arg, where_,
         "unknown argument '" + key + "' (" + op_ + " takes " + join(known_) + ")");
  }
}

void Args::type_error(const std::string& name, const char* want, const ojson& got) const {
  fail(ErrorCode::Arg, where_,
       "argument " + name + " must be " + want + ", got " + json_type(got) + " " + got.dump());
}

std::string shown_arg(const nlohmann::ordered_json& v) {
  if (!v.is_array()) return v.dump();
  std::vector<std::string> items;
  for (const auto& e : v) items.push_back(e.dump());
  std::string text = "[";
  text += join(items);
  text += "]";
  return text;
}

std::string named(const char* port, const ValueType& v) {
  return std::string(port) + " " + sym_shape_to_string(v.shape);
}

void require_float(const char* port, const ValueType& v, const char* op, const std::string& where) {
  if (!dtype_is_floating(v.dtype))
    fail(ErrorCode::DType, where,
         std::string(port) + " has dtype " + dtype_name(v.dtype) + "; " + op +
             " needs a float input");
}

void require_mask(const char* port, const ValueType& v, const std::string& where) {
  if (v.dtype != DType::Bool && !dtype_is_floating(v.dtype))
    fail(ErrorCode::DType, where,
         std::string(port) + " has dtype " + dtype_name(v.dtype) +
             "; a mask is bool (true = masked) or float (added to the scores)");
}

int64_t require_fixed(const Dim& d, const std::string& what, const ValueType& v, const char* port,
                      const std::string& where) {
  if (!d.is_fixed())
    fail(ErrorCode::Shape, where,
         what + " of " + named(port, v) + " is open (" + d.text +
             "); it sets the parameter shapes and must be fixed");
  return d.value;
}

void require_at_least(int64_t value, int64_t min, const char* name, const std::string& where) {
  if (value < min)
    fail(ErrorCode::Constraint, where,
         std::string(name) + "=" + std::to_string(value) + " must be >= " + std::to_string(min));
}

}  // namespace tessera
