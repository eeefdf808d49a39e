// Shape algebra for the network's symbolic shapes (interfaces.md §2): a dimension is a number or
// open. An open dimension is a symbol of the network file ("B"), bound to one value when the
// network runs, or an expression an op derived from symbols ("T/2", "2*T+4"), known only once
// they are bound. io/ parses shapes into these, layers/ infers through them, apps/ prints them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

using Shape = std::vector<int64_t>;

struct Dim {
  int64_t value = -1;  // >= 0 when fixed
  std::string text;    // the symbol or expression when open

  static Dim fixed(int64_t v) { return Dim{v, {}}; }
  static Dim open(std::string s) { return Dim{-1, std::move(s)}; }
  bool is_fixed() const { return value >= 0; }
  // An open dimension named by a symbol of the network file (bindable), not an expression.
  bool is_symbol() const;
  std::string str() const { return is_fixed() ? std::to_string(value) : text; }
  bool operator==(const Dim&) const = default;
};
using SymShape = std::vector<Dim>;

// "[B, 8, 32]"
std::string sym_shape_to_string(const SymShape& shape);
// True when `name` can be a symbol: [A-Za-z_][A-Za-z0-9_]*.
bool is_symbol_name(const std::string& name);

// A fully fixed shape as a SymShape, and back (E_INTERNAL when a dim is open).
SymShape fixed_shape(const Shape& shape);
Shape concrete_shape(const SymShape& shape);
bool is_fixed(const SymShape& shape);

// Two dims that are certainly different: both fixed and unequal. An open one may still turn out
// equal, so its check waits until it is bound.
bool differ(const Dim& a, const Dim& b);

// Fixed operands give fixed results (overflow is E_SHAPE at `where`); an open operand gives an
// expression that prints what the dimension will be and compares by its text.
Dim dim_mul(const Dim& a, const Dim& b, const std::string& where);
Dim dim_div(const Dim& a, int64_t n);
// Sum of dims: fixed ones folded into one constant, repeated open terms counted ("T+T+4" prints
// "2*T+4").
Dim dim_sum(const std::vector<Dim>& dims, const std::string& where);
// PyTorch broadcasting of two dims: 1 stretches; open against fixed c != 1 gives c (the open one
// must be 1 or c); two different open dims give their max. E_SHAPE "<what>: a vs b" on a clash.
Dim dim_broadcast(const Dim& a, const Dim& b, const std::string& what, const std::string& where);

// `dim` counted from the end when negative, for a tensor of `rank` dims: E_CONSTRAINT at `where`
// when out of range ("dim=3 is out of range for a rank-2 <noun> (valid: -2 .. 1)").
int64_t wrap_dim(int64_t dim, int64_t rank, const std::string& where, const char* noun = "tensor");

// Element count as a double, for memory and FLOP estimates: products of hostile dims cannot
// overflow on the way to a budget check. Fixed dims only (open ones count as their -1 value).
double elements(const Shape& shape);
double elements(const SymShape& shape);

}  // namespace tessera
