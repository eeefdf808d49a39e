#include "core/shape.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/text.h"

namespace tessera {

namespace {

std::string paren(const Dim& d) {
  return d.is_fixed() || is_symbol_name(d.text) ? d.str() : "(" + d.text + ")";
}

}  // namespace

bool Dim::is_symbol() const { return !is_fixed() && is_symbol_name(text); }

std::string sym_shape_to_string(const SymShape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + shape[i].str();
  return s + "]";
}

bool is_symbol_name(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

SymShape fixed_shape(const Shape& shape) {
  SymShape s;
  for (int64_t d : shape) s.push_back(Dim::fixed(d));
  return s;
}

bool is_fixed(const SymShape& shape) {
  return std::all_of(shape.begin(), shape.end(), [](const Dim& d) { return d.is_fixed(); });
}

Shape concrete_shape(const SymShape& shape) {
  Shape s;
  for (const Dim& d : shape) {
    if (!d.is_fixed())
      fail(ErrorCode::Internal, "network", "shape " + sym_shape_to_string(shape) + " is open");
    s.push_back(d.value);
  }
  return s;
}

bool differ(const Dim& a, const Dim& b) {
  return a.is_fixed() && b.is_fixed() && a.value != b.value;
}

Dim dim_mul(const Dim& a, const Dim& b, const std::string& where) {
  if (a.is_fixed() && b.is_fixed()) {
    int64_t p;
    if (__builtin_mul_overflow(a.value, b.value, &p))
      fail(ErrorCode::Shape, where, str(a.value) + "*" + str(b.value) + " overflows int64");
    return Dim::fixed(p);
  }
  return Dim::open(paren(a) + "*" + paren(b));
}

Dim dim_div(const Dim& a, int64_t n) {
  return a.is_fixed() ? Dim::fixed(a.value / n) : Dim::open(paren(a) + "/" + str(n));
}

Dim dim_sum(const std::vector<Dim>& dims, const std::string& where) {
  int64_t constant = 0;
  std::vector<std::pair<std::string, int64_t>> terms;
  for (const Dim& d : dims) {
    if (d.is_fixed()) {
      if (__builtin_add_overflow(constant, d.value, &constant))
        fail(ErrorCode::Shape, where, "a sum of dims overflows int64");
      continue;
    }
    const std::string t = paren(d);
    auto it = std::find_if(terms.begin(), terms.end(), [&](const auto& p) { return p.first == t; });
    if (it == terms.end())
      terms.emplace_back(t, 1);
    else
      ++it->second;
  }
  if (terms.empty()) return Dim::fixed(constant);
  std::string s;
  for (const auto& [t, n] : terms) {
    if (!s.empty()) s += '+';
    if (n > 1) s += str(n) + '*';
    s += t;
  }
  if (constant > 0) {
    s += '+';
    s += str(constant);
  }
  return Dim::open(s);
}

Dim dim_broadcast(const Dim& a, const Dim& b, const std::string& what, const std::string& where) {
  if (a == b) return a;
  if (a.is_fixed() && a.value == 1) return b;
  if (b.is_fixed() && b.value == 1) return a;
  if (a.is_fixed() && b.is_fixed())
    fail(ErrorCode::Shape, where, what + ": " + str(a.value) + " vs " + str(b.value));
  if (a.is_fixed()) return a;
  if (b.is_fixed()) return b;
  return Dim::open("max(" + a.text + ", " + b.text + ")");
}

int64_t wrap_dim(int64_t dim, int64_t rank, const std::string& where, const char* noun) {
  if (dim < -rank || dim >= rank)
    fail(ErrorCode::Constraint, where,
         "dim=" + str(dim) + " is out of range for a rank-" + str(rank) + " " + noun +
             " (valid: " + str(-rank) + " .. " + str(rank - 1) + ")");
  return dim < 0 ? dim + rank : dim;
}

double elements(const Shape& shape) {
  double n = 1.0;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

double elements(const SymShape& shape) {
  double n = 1.0;
  for (const Dim& d : shape) n *= static_cast<double>(d.value);
  return n;
}

}  // namespace tessera
