#include "layers/shape_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "core/limits.h"
#include "core/parallel.h"
#include "core/text.h"
#include "layers/op_args.h"
#include "layers/tensor_checks.h"

namespace tessera {

void chunk_into(const Tensor& x, int64_t dim, std::span<Tensor* const> outs,
                const std::string& where) {
  Tensor xs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  if (xc.dim() < 1) fail(ErrorCode::Shape, where, "chunk needs at least one dim, x is []");
  const int64_t d = wrap_dim(dim, xc.dim(), where);
  const int64_t chunks = static_cast<int64_t>(outs.size());
  const int64_t size = xc.size(d);
  if (chunks < 1 || size % chunks != 0)
    fail(ErrorCode::Constraint, where,
         "dim " + str(d) + " of x " + xc.shape_str() + " has size " + str(size) +
             ", not a multiple of chunks=" + str(chunks));
  const int64_t piece = size / chunks;
  for (int64_t i = 0; i < chunks; ++i) {
    const Tensor& o = *outs[static_cast<size_t>(i)];
    const bool fits = o.defined() && o.dim() == xc.dim() && o.size(d) == piece && [&] {
      for (int64_t j = 0; j < xc.dim(); ++j)
        if (j != d && o.size(j) != xc.size(j)) return false;
      return true;
    }();
    if (!fits) {
      Shape piece_shape = xc.shape();
      piece_shape[static_cast<size_t>(d)] = piece;
      check_output(o, piece_shape, indexed("out", i).c_str(), where);
    }
    check_output(o, o.shape(), indexed("out", i).c_str(), where);  // contiguous float32
  }
  const int64_t outer = product(xc.shape(), 0, static_cast<size_t>(d));
  const int64_t block = piece * product(xc.shape(), static_cast<size_t>(d) + 1, xc.shape().size());
  if (block == 0) return;
  const float* xp = xc.data<float>();
  // Work item (o, i): one contiguous block of `block` floats from row o into piece i.
  parallel_for(
      0, outer * chunks, std::max<int64_t>(1, kElementGrain / block), [&](int64_t w0, int64_t w1) {
        for (int64_t w = w0; w < w1; ++w) {
          const int64_t o = w / chunks, i = w % chunks;
          std::memcpy(outs[static_cast<size_t>(i)]->data<float>() + o * block,
                      xp + (o * chunks + i) * block, static_cast<size_t>(block) * sizeof(float));
        }
      });
}

void concat_into(std::span<const Tensor* const> xs, int64_t dim, Tensor& y,
                 const std::string& where) {
  if (xs.empty()) fail(ErrorCode::Arg, where, "concat needs at least one input");
  // The plan passes contiguous float32 inputs: read them in place. A C++ caller's other inputs
  // are copied first (one vector of copies, outside any plan).
  const bool in_place = std::all_of(xs.begin(), xs.end(), [](const Tensor* x) {
    return x->defined() && x->dtype() == DType::F32 && x->is_contiguous();
  });
  std::vector<Tensor> scratch;
  std::vector<const Tensor*> copies;
  if (!in_place) {
    scratch.resize(xs.size());
    for (size_t i = 0; i < xs.size(); ++i)
      copies.push_back(&f32_contiguous(*xs[i], scratch[i],
                                       indexed("x", static_cast<int64_t>(i)).c_str(), where));
    xs = copies;
  }
  const Tensor& x0 = *xs[0];
  const int64_t rank = x0.dim();
  if (rank < 1) fail(ErrorCode::Shape, where, "concat needs at least one dim, x0 is []");
  const int64_t d = wrap_dim(dim, rank, where);
  int64_t joined = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Shape& s = xs[i]->shape();
    bool fits = static_cast<int64_t>(s.size()) == rank;
    for (int64_t j = 0; fits && j < rank; ++j)
      fits = j == d || s[static_cast<size_t>(j)] == x0.shape()[static_cast<size_t>(j)];
    if (!fits)
      fail(ErrorCode::Shape, where,
           indexed("x", static_cast<int64_t>(i)) + " " + shape_to_string(s) +
               " does not match x0 " + x0.shape_str() + " outside dim " + str(d));
    joined += s[static_cast<size_t>(d)];
  }
  bool fits = y.defined() && y.dim() == rank && y.size(d) == joined;
  for (int64_t j = 0; fits && j < rank; ++j) fits = j == d || y.size(j) == x0.size(j);
  if (!fits) {
    Shape out = x0.shape();
    out[static_cast<size_t>(d)] = joined;
    check_output(y, out, "y", where);
  }
  check_output(y, y.shape(), "y", where);  // contiguous float32
  const int64_t outer = product(y.shape(), 0, static_cast<size_t>(d));
  const int64_t inner = product(y.shape(), static_cast<size_t>(d) + 1, y.shape().size());
  const int64_t row = joined * inner;  // floats per outer index in y
  if (row == 0) return;
  float* yp = y.data<float>();
  parallel_for(0, outer, std::max<int64_t>(1, kElementGrain / row), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      float* dst = yp + o * row;
      for (const Tensor* x : xs) {
        const int64_t block = x->size(d) * inner;
        std::memcpy(dst, x->data<float>() + o * block, static_cast<size_t>(block) * sizeof(float));
        dst += block;
      }
    }
  });
}

// ---------------------------------------------------------------- the ops

namespace {

class ChunkOp : public Op {
 public:
  ChunkOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "chunk");
    chunks_ = a.integer("chunks");
    dim_ = a.integer("dim", 0);  // torch.chunk's default
    a.finish();
    require_at_least(chunks_, 1, "chunks", where);
    // One output port per chunk: bound the count so a typo cannot ask for 10^12 ports.
    if (chunks_ > 65536)
      fail(ErrorCode::Constraint, where, "chunks=" + str(chunks_) + " must be <= 65536");
  }
  const char* name() const override { return "chunk"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override {
    std::vector<std::string> ports;
    for (int64_t i = 0; i < chunks_; ++i) ports.push_back(indexed("out", i));
    return ports;
  }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "chunk", where());
    if (x.shape.empty()) fail(ErrorCode::Shape, where(), "chunk needs at least one dim, x is []");
    const auto d =
        static_cast<size_t>(wrap_dim(dim_, static_cast<int64_t>(x.shape.size()), where(), "input"));
    const Dim size = x.shape[d];
    if (size.is_fixed() && size.value % chunks_ != 0)
      fail(ErrorCode::Constraint, where(),
           "dim " + str(static_cast<int64_t>(d)) + " of " + named("x", x) + " has size " +
               str(size.value) + ", not a multiple of chunks=" + str(chunks_));
    SymShape piece = x.shape;
    piece[d] = dim_div(size, chunks_);
    InferResult r;
    r.outputs.assign(static_cast<size_t>(chunks_), ValueType{piece, DType::F32});
    return r;
  }
  OpCost cost(const InputTypes&) const override { return {}; }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [dim = dim_, w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          chunk_into(*in[0], dim, out, w);
        });
  }

 private:
  int64_t chunks_, dim_;
};

class ConcatOp : public Op {
 public:
  ConcatOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "concat");
    dim_ = a.integer("dim", 0);  // torch.cat's default
    a.finish();
    // Ports x0 .. x{n-1}: n is however many the node connects, without gaps.
    std::vector<bool> seen;
    for (const auto& [port, source] : node.inputs) {
      (void)source;
      const bool digits =
          port.size() > 1 && port[0] == 'x' &&
          std::all_of(port.begin() + 1, port.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
          (port.size() == 2 || port[1] != '0') && port.size() <= 7;
      if (!digits)
        fail(ErrorCode::Arg, where, "unknown input port '" + port + "' (concat takes x0, x1, ...)");
      const auto i = static_cast<size_t>(std::stol(port.substr(1)));
      if (seen.size() <= i) seen.resize(i + 1, false);
      seen[i] = true;
    }
    if (seen.empty())
      fail(ErrorCode::Arg, where, "missing input port x0 (concat takes x0, x1, ...)");
    for (size_t i = 0; i < seen.size(); ++i)
      if (!seen[i])
        fail(ErrorCode::Arg, where,
             "missing input port x" + std::to_string(i) + " (ports run x0 .. x" +
                 std::to_string(seen.size() - 1) + " without gaps)");
    inputs_ = static_cast<int64_t>(seen.size());
  }
  const char* name() const override { return "concat"; }
  std::vector<PortSpec> input_ports() const override {
    std::vector<PortSpec> ports;
    for (int64_t i = 0; i < inputs_; ++i) ports.push_back({indexed("x", i)});
    return ports;
  }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x0 = *in[0];
    for (size_t i = 0; i < in.size(); ++i)
      require_float(indexed("x", static_cast<int64_t>(i)).c_str(), *in[i], "concat", where());
    if (x0.shape.empty())
      fail(ErrorCode::Shape, where(), "concat needs at least one dim, x0 is []");
    const auto d = static_cast<size_t>(
        wrap_dim(dim_, static_cast<int64_t>(x0.shape.size()), where(), "input"));
    SymShape out = x0.shape;
    std::vector<Dim> sizes;
    for (size_t i = 0; i < in.size(); ++i) {
      const SymShape& s = in[i]->shape;
      const std::string xi = indexed("x", static_cast<int64_t>(i));
      if (s.size() != x0.shape.size())
        fail(ErrorCode::Shape, where(),
             named(xi.c_str(), *in[i]) + " has rank " + str(static_cast<int64_t>(s.size())) +
                 ", x0 " + sym_shape_to_string(x0.shape) + " has rank " +
                 str(static_cast<int64_t>(x0.shape.size())));
      for (size_t j = 0; j < s.size(); ++j) {
        if (j == d) continue;
        if (differ(s[j], out[j]))
          fail(ErrorCode::Shape, where(),
               named(xi.c_str(), *in[i]) + " does not match x0 " + sym_shape_to_string(x0.shape) +
                   " in dim " + str(static_cast<int64_t>(j)) + " (only dim " +
                   str(static_cast<int64_t>(d)) + " may differ)");
        if (!out[j].is_fixed() && s[j].is_fixed()) out[j] = s[j];
      }
      sizes.push_back(s[d]);
    }
    out[d] = dim_sum(sizes, where());
    return {{{out, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes&) const override { return {}; }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [dim = dim_, w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          concat_into(in, dim, *out[0], w);
        });
  }

 private:
  int64_t dim_;
  int64_t inputs_ = 0;
};

}  // namespace

std::unique_ptr<Op> make_chunk_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<ChunkOp>(node, where);
}
std::unique_ptr<Op> make_concat_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<ConcatOp>(node, where);
}

// ---------------------------------------------------------------- layout ops
//
// reshape, flatten, permute, transpose, unsqueeze, squeeze, slice, select, roll, pad, expand:
// one float input x, one output out, PyTorch 1.13 semantics, no FLOPs, no workspace. Each op's
// arguments are read into a small copyable Spec (its layer keeps a copy), which infers the
// output type and runs the forward:
//   - reshape, flatten, unsqueeze, squeeze keep the row-major element order: the forward is one
//     memcpy of the contiguous input into the output buffer the plan gave it;
//   - the others gather: a CopyPlan says, per output dim, which source index each output index
//     reads (a stride, a crop or padding, a rotation), and gather_f32 walks the output row by
//     row, copying each innermost run with memcpy when it is contiguous in the source.

namespace {

using ojson = nlohmann::ordered_json;
using DimArray = std::array<int64_t, kMaxRank>;

// ---- reading list arguments

// One integer of a list argument, as Args::integer reads a scalar one.
int64_t list_integer(Args& a, const std::string& name, const ojson& v, const std::string& where) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(ErrorCode::Constraint, where,
         std::string("argument ") + name + "=" + v.dump() + " does not fit int64");
  if (!v.is_number_integer()) a.type_error(name, "an integer", v);
  return v.get<int64_t>();
}

// "name[i]", for messages about one entry of a list argument.
std::string entry_name(const char* name, size_t i) {
  std::string s = name;
  s += '[';
  s += std::to_string(i);
  s += ']';
  return s;
}

// An integer or a list of integers (at most kMaxRank of them). nullopt when absent or null.
std::optional<std::vector<int64_t>> integer_list(Args& a, const char* name,
                                                 const std::string& where,
                                                 bool* was_list = nullptr) {
  const ojson* v = a.raw(name);
  if (!v || v->is_null()) return std::nullopt;
  if (was_list) *was_list = v->is_array();
  if (!v->is_array()) return std::vector<int64_t>{list_integer(a, name, *v, where)};
  if (v->size() > static_cast<size_t>(kMaxRank))
    fail(ErrorCode::Constraint, where,
         std::string("argument ") + name + " has " + str(static_cast<int64_t>(v->size())) +
             " entries, over the rank limit of " + str(kMaxRank));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->size(); ++i)
    out.push_back(list_integer(a, entry_name(name, i), (*v)[i], where));
  return out;
}

// "[0, -1]" for messages.
std::string list_text(const std::vector<int64_t>& v) {
  std::vector<std::string> parts;
  for (int64_t x : v) parts.push_back(str(x));
  return "[" + join(parts) + "]";
}

// An entry of reshape's `shape` or expand's `sizes`: an integer (-1: inferred or kept) or the
// name of a network symbol, fixed through the bindings when bound and kept open otherwise.
struct SizeEntry {
  int64_t value = -1;
  std::string symbol;  // non-empty for a symbol
};

std::vector<SizeEntry> size_entries(Args& a, const char* name, const std::string& where) {
  const ojson* v = a.raw(name);
  if (!v) fail(ErrorCode::Arg, where, std::string("missing required argument ") + name);
  if (!v->is_array()) a.type_error(name, "a list of integers and symbol names", *v);
  if (v->size() > static_cast<size_t>(kMaxRank))
    fail(ErrorCode::Constraint, where,
         std::string("argument ") + name + " has " + str(static_cast<int64_t>(v->size())) +
             " entries, over the rank limit of " + str(kMaxRank));
  std::vector<SizeEntry> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const ojson& e = (*v)[i];
    const std::string n = entry_name(name, i);
    SizeEntry entry;
    if (e.is_string()) {
      entry.symbol = e.get<std::string>();
      if (!is_symbol_name(entry.symbol))
        a.type_error(n, "an integer or a symbol name ([A-Za-z_][A-Za-z0-9_]*)", e);
    } else {
      if (!e.is_number_integer()) a.type_error(n, "an integer or a symbol name", e);
      entry.value = list_integer(a, n, e, where);
      if (entry.value < -1)
        fail(ErrorCode::Constraint, where, n + "=" + str(entry.value) + " must be >= -1");
    }
    out.push_back(std::move(entry));
  }
  return out;
}

std::string entries_text(const std::vector<SizeEntry>& entries) {
  std::vector<std::string> parts;
  for (const SizeEntry& e : entries) parts.push_back(e.symbol.empty() ? str(e.value) : e.symbol);
  return "[" + join(parts) + "]";
}

// The entry as a Dim: a bound symbol is fixed, an unbound one open; -1 stays -1 (an open Dim
// with no text: the caller replaces it).
Dim entry_dim(const SizeEntry& e, const SymbolBindings& bound) {
  if (e.symbol.empty()) return Dim{e.value, {}};
  const auto it = bound.find(e.symbol);
  return it != bound.end() ? Dim::fixed(it->second) : Dim::open(e.symbol);
}

// ---- shape arithmetic

// An expression operand: symbols and numbers bare, anything else parenthesised.
std::string operand(const Dim& d) {
  return d.is_fixed() || is_symbol_name(d.text) ? d.str() : "(" + d.text + ")";
}

// Product of fixed dims; E_SHAPE on int64 overflow (none with a 0 dim: [0, 2^40, 2^40] holds
// no elements and is a valid shape).
int64_t checked_product(const Shape& dims, const std::string& what, const std::string& where) {
  if (std::find(dims.begin(), dims.end(), 0) != dims.end()) return 0;
  int64_t p = 1;
  for (int64_t d : dims)
    if (__builtin_mul_overflow(p, d, &p))
      fail(ErrorCode::Shape, where, what + " has more than 2^63 - 1 elements");
  return p;
}

// torch's dim wrapping, which treats a 0-d tensor as 1-d for dim arguments (x.transpose(0, -1),
// x.squeeze(0) and x.flatten() take a 0-d x).
int64_t wrap_dim_scalar(int64_t dim, int64_t rank, const std::string& where) {
  return wrap_dim(dim, std::max<int64_t>(rank, 1), where, "input");
}

// Python's x[start:stop:step] along a dim of size n, except that a start or stop below -n is
// refused (Python and PyTorch clamp it to 0): a negative index counts from the end, and one
// that reaches past the start is far more likely a mistake than a request for the whole dim.
// A start or stop beyond n is clamped to n as in Python (x[:10] of 5 elements is all 5).
struct SliceRange {
  int64_t start = 0;
  int64_t length = 0;
};

SliceRange slice_range(int64_t n, int64_t start, std::optional<int64_t> stop, int64_t step,
                       int64_t dim, const std::string& where) {
  auto bound = [&](int64_t v, const char* name) {
    if (v < -n)
      fail(ErrorCode::Shape, where,
           std::string(name) + "=" + str(v) + " is before the start of dim " + str(dim) +
               " of size " + str(n) + " (a negative index may reach back to -" + str(n) + ")");
    return v < 0 ? v + n : std::min(v, n);
  };
  const int64_t s = bound(start, "start");
  const int64_t e = stop ? bound(*stop, "stop") : n;
  // 0 <= e - s <= n; the division rounds up.
  return {s, e > s ? (e - s - 1) / step + 1 : 0};
}

// x.select(dim, index): index in [-n, n).
int64_t select_index(int64_t n, int64_t index, int64_t dim, const std::string& where) {
  if (index < -n || index >= n)
    fail(ErrorCode::Shape, where,
         "index=" + str(index) + " is out of range for dim " + str(dim) + " of size " + str(n) +
             (n > 0 ? " (valid: " + str(-n) + " .. " + str(n - 1) + ")" : std::string()));
  return index < 0 ? index + n : index;
}

// Elements the negative pads of one dim crop; nullopt when that is more than any dim holds.
std::optional<int64_t> crop_of(int64_t lo, int64_t hi) {
  int64_t crop = 0;
  for (const int64_t p : {lo, hi})
    if (p < 0 && (p == INT64_MIN || __builtin_add_overflow(crop, -p, &crop))) return std::nullopt;
  return crop;
}

// The pads (lo before, hi after) of one dim of size n: a negative pad crops, and the two crops
// together may take at most the whole dim (PyTorch narrows the input by them; cropping more is
// its IndexError). Returns the output size; E_SHAPE on int64 overflow.
int64_t padded_size(int64_t n, int64_t lo, int64_t hi, int64_t dim, const std::string& where) {
  const std::optional<int64_t> crop = crop_of(lo, hi);
  if (!crop || *crop > n)
    fail(ErrorCode::Shape, where,
         "pads " + str(lo) + " and " + str(hi) + " of dim " + str(dim) + " crop more than its " +
             str(n) + " elements");
  int64_t out;
  if (__builtin_add_overflow(n, lo, &out) || __builtin_add_overflow(out, hi, &out))
    fail(ErrorCode::Shape, where,
         "padding dim " + str(dim) + " of size " + str(n) + " by " + str(lo) + " and " + str(hi) +
             " overflows int64");
  return out;
}

// ---- the copy engine

// One output dim of a gather. Output index i of it reads source index
//   j = (i - shift) mod size   when shift > 0 (roll; then before = 0 and extent = size),
//   j = i - before             otherwise; where j is outside [0, extent) the output is the fill
//                              value (pad),
// and the source element is at offset + sum over dims of j * stride.
struct CopyAxis {
  int64_t size = 1;
  int64_t stride = 0;
  int64_t before = 0;
  int64_t extent = 1;
  int64_t shift = 0;
  bool plain() const { return before == 0 && extent == size && shift == 0; }
};

// A gather from a float32 source into a contiguous float32 output of the axes' sizes; on the
// stack (at most kMaxRank axes, 2.5 KB), so a forward allocates nothing.
struct CopyPlan {
  std::array<CopyAxis, kMaxRank> axes{};
  size_t rank = 0;
  int64_t offset = 0;
  float fill = 0.0f;

  CopyAxis& add(int64_t size, int64_t stride, const std::string& where) {
    if (rank == axes.size())
      fail(ErrorCode::Internal, where, "a copy of more than " + str(kMaxRank) + " dims");
    axes[rank] = {size, stride, 0, size, 0};
    return axes[rank++];
  }
};

// n elements from src + offset, `stride` apart, into dst.
void copy_run(float* dst, const float* src, int64_t offset, int64_t n, int64_t stride) {
  if (n <= 0) return;
  const float* s = src + offset;
  if (stride == 1) {
    std::memcpy(dst, s, static_cast<size_t>(n) * sizeof(float));
  } else if (stride == 0) {
    std::fill(dst, dst + n, *s);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = s[i * stride];
  }
}

// Rows of contiguous runs copy at memcpy speed (~10 GB/s on one Zen 3 thread here); a transpose
// of the last two dims reads one float per cache line (~2 GB/s for [8, 768, 196] -> [8, 196,
// 768], 4 ms; 16 x 16 tiles measured no faster: the hardware prefetcher already follows the
// constant stride, and the 768 lines a row touches stay in L2).
void gather_f32(const CopyPlan& given, const float* src, float* dst) {
  // Size-1 dims that read index 0 are dropped, and neighbours that are one run in the source
  // merged: a slice of the middle dim of [B, T, C] copies rows of C floats, a select of dim 0 of
  // a contiguous tensor a single run.
  CopyPlan p;
  p.offset = given.offset;
  p.fill = given.fill;
  for (size_t k = 0; k < given.rank; ++k) {
    const CopyAxis& a = given.axes[k];
    if (a.size == 0) return;
    if (a.size == 1 && a.plain()) continue;
    if (p.rank > 0) {
      CopyAxis& b = p.axes[p.rank - 1];
      if (b.plain() && a.plain() && b.stride == a.stride * a.size) {
        b.size *= a.size;
        b.extent = b.size;
        b.stride = a.stride;
        continue;
      }
    }
    p.axes[p.rank++] = a;
  }
  if (p.rank == 0) {
    dst[0] = src[p.offset];
    return;
  }
  const size_t outer = p.rank - 1;
  const CopyAxis inner = p.axes[outer];
  const int64_t n = inner.size;
  int64_t rows = 1;
  for (size_t k = 0; k < outer; ++k) rows *= p.axes[k].size;
  // Rows by the shape only: the split never depends on the thread count.
  parallel_for(0, rows, std::max<int64_t>(1, kElementGrain / n), [&](int64_t r0, int64_t r1) {
    DimArray idx;  // the outer index of row r
    int64_t rem = r0;
    for (size_t k = outer; k-- > 0;) {
      idx[k] = rem % p.axes[k].size;
      rem /= p.axes[k].size;
    }
    for (int64_t r = r0; r < r1; ++r) {
      float* d = dst + r * n;
      int64_t off = p.offset;
      bool fill = false;
      for (size_t k = 0; k < outer && !fill; ++k) {
        const CopyAxis& a = p.axes[k];
        int64_t j = idx[k];
        if (a.shift > 0) {
          j -= a.shift;
          if (j < 0) j += a.size;
        } else {
          j -= a.before;
          fill = j < 0 || j >= a.extent;
        }
        off += j * a.stride;
      }
      if (fill) {
        std::fill(d, d + n, p.fill);
      } else if (inner.shift > 0) {
        copy_run(d, src, off + (n - inner.shift) * inner.stride, inner.shift, inner.stride);
        copy_run(d + inner.shift, src, off, n - inner.shift, inner.stride);
      } else {
        std::fill(d, d + inner.before, p.fill);
        copy_run(d + inner.before, src, off, inner.extent, inner.stride);
        std::fill(d + inner.before + inner.extent, d + n, p.fill);
      }
      for (size_t k = outer; k-- > 0;) {
        if (++idx[k] < p.axes[k].size) break;
        idx[k] = 0;
      }
    }
  });
}

// The plan's output into y (which must have the plan's sizes) from x.
void gather_into(const CopyPlan& plan, const Tensor& x, Tensor& y, const std::string& where) {
  DimArray sizes;
  for (size_t k = 0; k < plan.rank; ++k) sizes[k] = plan.axes[k].size;
  check_output(y, std::span<const int64_t>(sizes.data(), plan.rank), "out", where);
  if (y.numel() == 0) return;
  gather_f32(plan, x.data<float>(), y.data<float>());
}

// Row-major strides of x's shape, on the stack; saturated as contiguous_strides does (only an
// x without elements can have dims whose products overflow, and nothing of it is read).
DimArray strides_of(const Shape& s) {
  DimArray st;
  int64_t stride = 1;
  for (size_t k = s.size(); k-- > 0;) {
    st[k] = stride;
    if (__builtin_mul_overflow(stride, s[k], &stride)) stride = INT64_MAX;
  }
  return st;
}

// The plan that copies x as it is (each axis its own dim, nothing moved yet).
CopyPlan identity_plan(const Shape& s, const std::string& where) {
  CopyPlan p;
  const DimArray st = strides_of(s);
  for (size_t k = 0; k < s.size(); ++k) p.add(s[k], st[k], where);
  return p;
}

// The forward of reshape, flatten, squeeze and unsqueeze: the elements in the same order.
void copy_elements(const Tensor& x, Tensor& y, const std::string& where) {
  check_output(y, y.shape(), "out", where);  // contiguous float32
  if (y.numel() != x.numel())
    fail(ErrorCode::Shape, where,
         "out " + y.shape_str() + " does not hold the " + str(x.numel()) + " elements of x " +
             x.shape_str());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  // 64K floats per hand-off: a memcpy moves them in ~25 us, far above a worker's wake-up.
  parallel_for(0, x.numel(), 4 * kElementGrain, [&](int64_t i0, int64_t i1) {
    std::memcpy(yp + i0, xp + i0, static_cast<size_t>(i1 - i0) * sizeof(float));
  });
}

// ---- the op around a Spec

// A Spec reads its op's arguments (constructor, from Args), checks what it can without an input
// (validate), infers the output shape, and runs the forward on a contiguous float32 x.
template <class Spec>
class LayoutOp : public Op {
 public:
  LayoutOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, Spec::kName);
    spec_ = Spec(a, where);
    a.finish();
    spec_.validate(where);
  }
  const char* name() const override { return Spec::kName; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings& bound) const override {
    const ValueType& x = *in[0];
    require_float("x", x, Spec::kName, where());
    const SymShape out = spec_.infer(x, bound, where());
    if (out.size() > static_cast<size_t>(kMaxRank))
      fail(ErrorCode::Shape, where(),
           "out would have " + str(static_cast<int64_t>(out.size())) +
               " dims, over the rank limit of " + str(kMaxRank));
    if (is_fixed(out))
      checked_product(concrete_shape(out), "out " + sym_shape_to_string(out), where());
    return {{{out, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes&) const override { return {}; }  // data movement: no FLOPs
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer([spec = spec_, w = where()](std::span<const Tensor* const> in,
                                                      std::span<Tensor* const> out) {
      Tensor xs;
      const Tensor& x = f32_contiguous(*in[0], xs, "x", w);
      Tensor& y = *out[0];
      if (y.numel() == 0) return check_output(y, y.shape(), "out", w);  // nothing to write
      spec.forward(x, y, w);
    });
  }

 private:
  Spec spec_;
};

// ---- reshape

// x.reshape(shape): at most one -1 (inferred from the element count); entries may name network
// symbols ("B"), fixed through the bindings the resolver passes when bound. The element counts
// must match (E_SHAPE), checked once every dim involved is fixed: an open dim may be any size,
// 0 included (then torch accepts any shape without a -1), so only the bind-time check is exact.
struct ReshapeSpec {
  static constexpr const char* kName = "reshape";
  std::vector<SizeEntry> shape;

  ReshapeSpec() = default;
  ReshapeSpec(Args& a, const std::string& where) : shape(size_entries(a, "shape", where)) {}
  void validate(const std::string& where) const {
    if (std::count_if(shape.begin(), shape.end(),
                      [](const SizeEntry& e) { return e.symbol.empty() && e.value == -1; }) > 1)
      fail(ErrorCode::Constraint, where,
           "shape=" + entries_text(shape) + " has more than one -1 (only one dim can be inferred)");
  }

  SymShape infer(const ValueType& x, const SymbolBindings& bound, const std::string& where) const {
    SymShape out;
    std::optional<size_t> inferred;
    for (const SizeEntry& e : shape) {
      if (e.symbol.empty() && e.value == -1) inferred = out.size();
      out.push_back(entry_dim(e, bound));
    }
    // Open dims of x and of the known entries that are the same symbol or expression cancel:
    // [B, T, 8] -> [B, -1] infers T*8, [B, T, 2, 4] -> [B, T, -1] infers 8.
    std::vector<Dim> num, den;
    Shape x_fixed, known;
    std::vector<bool> cancelled(out.size(), false);
    for (const Dim& d : x.shape) {
      if (d.is_fixed()) {
        x_fixed.push_back(d.value);
        continue;
      }
      bool matched = false;
      for (size_t k = 0; k < out.size() && !matched; ++k)
        if (!cancelled[k] && k != inferred && out[k] == d) matched = cancelled[k] = true;
      if (!matched) num.push_back(d);
    }
    for (size_t k = 0; k < out.size(); ++k) {
      if (k == inferred || cancelled[k]) continue;
      if (out[k].is_fixed())
        known.push_back(out[k].value);
      else
        den.push_back(out[k]);
    }
    const int64_t n_fixed = checked_product(x_fixed, named("x", x), where);
    const int64_t known_fixed = checked_product(known, "shape=" + entries_text(shape), where);
    const std::string mismatch =
        "cannot reshape " + named("x", x) + " into shape=" + entries_text(shape);
    if (!inferred) {
      // Exact only when nothing is open (cancelled symbols could be 0 and match anything).
      if (is_fixed(x.shape) && is_fixed(out) && n_fixed != known_fixed)
        fail(ErrorCode::Shape, where,
             mismatch + ": " + str(n_fixed) + " elements vs " + str(known_fixed));
      return out;
    }
    // -1: torch refuses it when the other entries hold no elements (any size would fit); a
    // cancelled symbol of size 0 makes that happen too, which the bind-time check sees.
    if (known_fixed == 0)
      fail(ErrorCode::Shape, where,
           mismatch + ": the other entries have 0 elements, so the -1 could be any size");
    Dim& d = out[*inferred];
    if (n_fixed == 0) {
      d = Dim::fixed(0);
    } else if (num.empty() && den.empty()) {
      // Nothing open is left: the quotient is exact whenever the cancelled symbols are not 0.
      if (n_fixed % known_fixed != 0)
        fail(
            ErrorCode::Shape, where,
            mismatch + ": " + str(n_fixed) + " elements are not a multiple of " + str(known_fixed));
      d = Dim::fixed(n_fixed / known_fixed);
    } else {
      // An expression, for the summary; the bind-time pass computes the number.
      const int64_t g = std::gcd(n_fixed, known_fixed);
      auto product_of = [&](const std::vector<Dim>& factors, int64_t c) {
        std::optional<Dim> p;
        for (const Dim& f : factors) p = p ? dim_mul(*p, f, where) : f;
        if (!p) return Dim::fixed(c);
        return c == 1 ? *p : dim_mul(*p, Dim::fixed(c), where);
      };
      const Dim top = product_of(num, n_fixed / g), bottom = product_of(den, known_fixed / g);
      if (bottom.is_fixed())
        d = bottom.value == 1 ? top : dim_div(top, bottom.value);
      else
        d = Dim::open(operand(top) + "/" + operand(bottom));
    }
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    copy_elements(x, y, where);
  }
};

// ---- flatten

// torch.flatten(x, start_dim, end_dim): dims start_dim .. end_dim (inclusive) become one; a 0-d
// x becomes [1].
struct FlattenSpec {
  static constexpr const char* kName = "flatten";
  int64_t start_dim = 0, end_dim = -1;

  FlattenSpec() = default;
  FlattenSpec(Args& a, const std::string&)
      : start_dim(a.integer("start_dim", 0)), end_dim(a.integer("end_dim", -1)) {}
  void validate(const std::string&) const {}

  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    const auto rank = static_cast<int64_t>(x.shape.size());
    const int64_t s = wrap_dim_scalar(start_dim, rank, where);
    const int64_t e = wrap_dim_scalar(end_dim, rank, where);
    if (s > e)
      fail(ErrorCode::Constraint, where,
           "start_dim=" + str(start_dim) + " comes after end_dim=" + str(end_dim) + " for " +
               named("x", x));
    if (rank == 0) return {Dim::fixed(1)};
    SymShape out(x.shape.begin(), x.shape.begin() + s);
    Dim joined = x.shape[static_cast<size_t>(s)];
    for (int64_t k = s + 1; k <= e; ++k)
      joined = dim_mul(joined, x.shape[static_cast<size_t>(k)], where);
    out.push_back(joined);
    out.insert(out.end(), x.shape.begin() + e + 1, x.shape.end());
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    copy_elements(x, y, where);
  }
};

// ---- permute and transpose

// x.permute(dims): out dim k is x dim dims[k]. dims must be a permutation of 0 .. n-1 (each
// possibly counted from the end): E_CONSTRAINT otherwise, when the node is read (n is
// len(dims)); an x of another rank than n is E_SHAPE.
struct PermuteSpec {
  static constexpr const char* kName = "permute";
  std::vector<int64_t> dims;  // wrapped by validate

  PermuteSpec() = default;
  PermuteSpec(Args& a, const std::string& where) {
    bool list = false;
    dims = integer_list(a, "dims", where, &list).value_or(std::vector<int64_t>{});
    if (!a.raw("dims")) fail(ErrorCode::Arg, where, "missing required argument dims");
    if (!list) a.type_error("dims", "a list of integers", *a.raw("dims"));
  }
  void validate(const std::string& where) {
    const std::vector<int64_t> given = dims;
    const auto n = static_cast<int64_t>(dims.size());
    std::vector<bool> seen(dims.size(), false);
    for (int64_t& d : dims) {
      const int64_t w = d < 0 ? d + n : d;
      if (w < 0 || w >= n || seen[static_cast<size_t>(w)])
        fail(ErrorCode::Constraint, where,
             "dims=" + list_text(given) + " is not a permutation of the " + str(n) + " dims 0 .. " +
                 str(n - 1) + " (each once, negative counting from the end)");
      seen[static_cast<size_t>(w)] = true;
      d = w;
    }
  }

  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    if (x.shape.size() != dims.size())
      fail(ErrorCode::Shape, where,
           named("x", x) + " has " + str(static_cast<int64_t>(x.shape.size())) +
               " dims; dims permutes " + str(static_cast<int64_t>(dims.size())));
    SymShape out;
    for (int64_t d : dims) out.push_back(x.shape[static_cast<size_t>(d)]);
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    const DimArray st = strides_of(x.shape());
    CopyPlan p;
    for (int64_t d : dims) p.add(x.size(d), st[static_cast<size_t>(d)], where);
    gather_into(p, x, y, where);
  }
};

// x.transpose(dim0, dim1).
struct TransposeSpec {
  static constexpr const char* kName = "transpose";
  int64_t dim0 = 0, dim1 = 0;

  TransposeSpec() = default;
  TransposeSpec(Args& a, const std::string&) : dim0(a.integer("dim0")), dim1(a.integer("dim1")) {}
  void validate(const std::string&) const {}

  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    const auto rank = static_cast<int64_t>(x.shape.size());
    const int64_t a = wrap_dim_scalar(dim0, rank, where), b = wrap_dim_scalar(dim1, rank, where);
    SymShape out = x.shape;
    if (rank > 0) std::swap(out[static_cast<size_t>(a)], out[static_cast<size_t>(b)]);
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    if (x.dim() == 0) return copy_elements(x, y, where);
    CopyPlan p = identity_plan(x.shape(), where);
    std::swap(p.axes[static_cast<size_t>(wrap_dim(dim0, x.dim(), where))],
              p.axes[static_cast<size_t>(wrap_dim(dim1, x.dim(), where))]);
    gather_into(p, x, y, where);
  }
};

// ---- unsqueeze and squeeze

// x.unsqueeze(dim): a dim of size 1 inserted at dim, in [-rank-1, rank].
struct UnsqueezeSpec {
  static constexpr const char* kName = "unsqueeze";
  int64_t dim = 0;

  UnsqueezeSpec() = default;
  UnsqueezeSpec(Args& a, const std::string&) : dim(a.integer("dim")) {}
  void validate(const std::string&) const {}

  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    const auto rank = static_cast<int64_t>(x.shape.size());
    const int64_t d = wrap_dim(dim, rank + 1, where, "output");
    SymShape out = x.shape;
    out.insert(out.begin() + d, Dim::fixed(1));
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    copy_elements(x, y, where);
  }
};

// x.squeeze() / x.squeeze(dim) / x.squeeze(dims) (the list form is torch 2.0's): removes the
// named dims (all when dim is absent or null) whose size is 1; other sizes stay (PyTorch: a
// no-op). Whether an open dim goes depends on its value, and with it the rank of everything
// downstream: a dim squeeze would test that is open is E_SHAPE (name the dims with `dim`).
struct SqueezeSpec {
  static constexpr const char* kName = "squeeze";
  std::optional<std::vector<int64_t>> dims;

  SqueezeSpec() = default;
  SqueezeSpec(Args& a, const std::string& where) : dims(integer_list(a, "dim", where)) {}
  void validate(const std::string&) const {}

  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    const auto rank = static_cast<int64_t>(x.shape.size());
    std::vector<bool> tested(x.shape.size(), !dims);
    if (dims)
      for (int64_t d : *dims) {
        const int64_t w = wrap_dim_scalar(d, rank, where);
        if (rank == 0) continue;
        if (tested[static_cast<size_t>(w)])
          fail(ErrorCode::Constraint, where,
               "dim=" + list_text(*dims) + " names dim " + str(w) + " more than once");
        tested[static_cast<size_t>(w)] = true;
      }
    SymShape out;
    for (size_t k = 0; k < x.shape.size(); ++k) {
      const Dim& d = x.shape[k];
      if (!tested[k]) {
        out.push_back(d);
        continue;
      }
      if (!d.is_fixed())
        fail(ErrorCode::Shape, where,
             "dim " + str(static_cast<int64_t>(k)) + " of " + named("x", x) + " is open (" +
                 d.text + "): whether squeeze removes it, and so the output rank, would depend " +
                 "on its value" + (dims ? std::string() : "; name the dims to squeeze with dim"));
      if (d.value != 1) out.push_back(d);
    }
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    copy_elements(x, y, where);
  }
};

// ---- slice and select

// x[..., start:stop:step, ...] along one dim or several (slice_range has the index rules).
// start, stop and step are each one value for every dim or a list as long as dim.
struct SliceSpec {
  static constexpr const char* kName = "slice";
  std::vector<int64_t> dims;
  std::vector<int64_t> starts, steps;
  std::vector<std::optional<int64_t>> stops;

  SliceSpec() = default;
  SliceSpec(Args& a, const std::string& where) {
    dims = integer_list(a, "dim", where).value_or(std::vector<int64_t>{0});  // aten::slice's 0
    const size_t n = dims.size();
    // One value for every dim, or a list of n.
    auto per_dim = [&](const char* name, int64_t def) {
      bool list = false;
      std::vector<int64_t> v =
          integer_list(a, name, where, &list).value_or(std::vector<int64_t>{def});
      if (!list) return std::vector<int64_t>(n, v[0]);
      if (v.size() != n)
        fail(ErrorCode::Constraint, where,
             std::string(name) + "=" + list_text(v) + " has " +
                 str(static_cast<int64_t>(v.size())) + " entries; dim=" + list_text(dims) +
                 " names " + str(static_cast<int64_t>(n)));
      return v;
    };
    starts = per_dim("start", 0);
    steps = per_dim("step", 1);
    const ojson* stop = a.raw("stop");
    if (!stop || !stop->is_array()) {
      std::optional<int64_t> s;
      if (stop && !stop->is_null()) s = list_integer(a, "stop", *stop, where);
      stops.assign(n, s);
    } else {
      if (stop->size() != n)
        fail(ErrorCode::Constraint, where,
             "stop=" + stop->dump() + " has " + str(static_cast<int64_t>(stop->size())) +
                 " entries; dim=" + list_text(dims) + " names " + str(static_cast<int64_t>(n)));
      for (size_t i = 0; i < n; ++i) {
        const ojson& e = (*stop)[i];
        if (e.is_null())
          stops.emplace_back();
        else
          stops.emplace_back(list_integer(a, entry_name("stop", i), e, where));
      }
    }
  }
  void validate(const std::string& where) const {
    for (int64_t s : steps)
      if (s < 1) fail(ErrorCode::Constraint, where, "step=" + str(s) + " must be >= 1");
  }

  // The wrapped dims (as many as dims; on the stack, for the forward), E_CONSTRAINT when one
  // repeats.
  DimArray wrapped(int64_t rank, const std::string& where) const {
    if (rank == 0 && !dims.empty())
      fail(ErrorCode::Constraint, where, "slice needs at least one dim, x is []");
    DimArray w;
    for (size_t i = 0; i < dims.size(); ++i) {
      w[i] = wrap_dim(dims[i], rank, where, "input");
      if (std::find(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(i), w[i]) !=
          w.begin() + static_cast<std::ptrdiff_t>(i))
        fail(ErrorCode::Constraint, where,
             "dim=" + list_text(dims) + " names dim " + str(w[i]) + " more than once");
    }
    return w;
  }

  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    const DimArray w = wrapped(static_cast<int64_t>(x.shape.size()), where);
    SymShape out = x.shape;
    for (size_t i = 0; i < dims.size(); ++i) {
      Dim& d = out[static_cast<size_t>(w[i])];
      const int64_t start = starts[i], step = steps[i];
      const std::optional<int64_t> stop = stops[i];
      if (d.is_fixed()) {
        d = Dim::fixed(slice_range(d.value, start, stop, step, w[i], where).length);
      } else if (start < 0 && (!stop || *stop < 0)) {
        // Counted from the end: the length is the same for every size that admits the bounds
        // (x[:, -1:] has one row whatever T is, once T >= 1), the smallest being n.
        if (start == INT64_MIN || (stop && *stop == INT64_MIN))
          fail(ErrorCode::Shape, where,
               "a bound of -2^63 is before the start of dim " + str(w[i]) + " of any size");
        const int64_t n = std::max<int64_t>(-start, stop ? -*stop : 0);
        d = Dim::fixed(slice_range(n, start, stop, step, w[i], where).length);
      } else if (start != 0 || stop || step != 1) {
        std::string text = operand(d) + "[" + (start != 0 ? str(start) : std::string()) + ":" +
                           (stop ? str(*stop) : std::string());
        if (step != 1) text += ":" + str(step);
        d = Dim::open(text + "]");
      }
    }
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    const DimArray w = wrapped(x.dim(), where);
    CopyPlan p = identity_plan(x.shape(), where);
    for (size_t i = 0; i < dims.size(); ++i) {
      CopyAxis& a = p.axes[static_cast<size_t>(w[i])];
      const SliceRange r = slice_range(a.size, starts[i], stops[i], steps[i], w[i], where);
      if (r.length > 0) p.offset += r.start * a.stride;
      if (r.length > 1) a.stride *= steps[i];  // r.start + (length - 1) * step < size
      a.size = a.extent = r.length;
    }
    gather_into(p, x, y, where);
  }
};

// x.select(dim, index): the dim removed, index counted from the end when negative; out of range
// is E_SHAPE (checked when the dim is bound, if it is open).
struct SelectSpec {
  static constexpr const char* kName = "select";
  int64_t dim = 0, index = 0;

  SelectSpec() = default;
  SelectSpec(Args& a, const std::string&) : dim(a.integer("dim")), index(a.integer("index")) {}
  void validate(const std::string&) const {}

  int64_t wrapped(int64_t rank, const std::string& where) const {
    if (rank == 0) fail(ErrorCode::Constraint, where, "select needs at least one dim, x is []");
    return wrap_dim(dim, rank, where, "input");
  }
  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    const int64_t d = wrapped(static_cast<int64_t>(x.shape.size()), where);
    const Dim& size = x.shape[static_cast<size_t>(d)];
    if (size.is_fixed()) select_index(size.value, index, d, where);
    SymShape out = x.shape;
    out.erase(out.begin() + d);
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    const int64_t d = wrapped(x.dim(), where);
    const DimArray st = strides_of(x.shape());
    CopyPlan p;
    p.offset = select_index(x.size(d), index, d, where) * st[static_cast<size_t>(d)];
    for (int64_t k = 0; k < x.dim(); ++k)
      if (k != d) p.add(x.size(k), st[static_cast<size_t>(k)], where);
    gather_into(p, x, y, where);
  }
};

// ---- roll

// torch.roll(x, shifts, dims): out[..., (i + shift) mod n, ...] = x[..., i, ...] along each dim
// (a dim named twice rolls by the sum); without dims, the flattened x rolls by its one shift.
// Any int64 shift, negative or beyond the size, is taken mod the size.
struct RollSpec {
  static constexpr const char* kName = "roll";
  std::vector<int64_t> shifts;
  std::optional<std::vector<int64_t>> dims;

  RollSpec() = default;
  RollSpec(Args& a, const std::string& where) {
    const std::optional<std::vector<int64_t>> s = integer_list(a, "shifts", where);
    if (!s) fail(ErrorCode::Arg, where, "missing required argument shifts");
    shifts = *s;
    dims = integer_list(a, "dims", where);
    if (dims && dims->empty()) dims.reset();  // torch's default dims=[]: the flattened x
  }
  void validate(const std::string& where) const {
    const size_t n_dims = dims ? dims->size() : 1;
    if (shifts.empty() || shifts.size() != n_dims)
      fail(ErrorCode::Constraint, where,
           "shifts=" + list_text(shifts) +
               " and dims=" + (dims ? list_text(*dims) : std::string("null")) +
               " must align: one shift per dim, or one shift and no dims (the flattened x)");
  }

  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    if (dims)
      for (int64_t d : *dims) wrap_dim(d, static_cast<int64_t>(x.shape.size()), where, "input");
    return x.shape;
  }
  // shift mod n, in [0, n).
  static int64_t normalised(int64_t shift, int64_t n) {
    const int64_t r = shift % n;
    return r < 0 ? r + n : r;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    CopyPlan p;
    if (!dims) {
      // The flattened x: one axis of numel elements, into y of x's shape.
      check_output(y, x.shape(), "out", where);
      const int64_t n = x.numel();
      if (n == 0) return;
      p.add(n, 1, where).shift = normalised(shifts[0], n);
      return gather_f32(p, x.data<float>(), y.data<float>());
    } else {
      p = identity_plan(x.shape(), where);
      for (size_t i = 0; i < dims->size(); ++i) {
        CopyAxis& a = p.axes[static_cast<size_t>(wrap_dim((*dims)[i], x.dim(), where, "input"))];
        if (a.size > 0) a.shift = (a.shift + normalised(shifts[i], a.size)) % a.size;
      }
    }
    gather_into(p, x, y, where);
  }
};

// ---- pad

// torch.nn.functional.pad(x, pad, mode="constant", value): pad = [lo, hi] pairs from the last dim
// backwards ([left, right, top, bottom] pads dims -1 and -2); padded_size has the crop rules.
// Other modes (reflect, replicate, circular) are E_UNSUPPORTED.
struct PadSpec {
  static constexpr const char* kName = "pad";
  std::vector<int64_t> pad;
  std::string mode = "constant";
  double value = 0.0;

  PadSpec() = default;
  PadSpec(Args& a, const std::string& where) {
    const ojson* p = a.raw("pad");
    if (!p) fail(ErrorCode::Arg, where, "missing required argument pad");
    if (!p->is_array()) a.type_error("pad", "a list of integers", *p);
    if (p->size() > 2 * static_cast<size_t>(kMaxRank))
      fail(ErrorCode::Constraint, where,
           "pad has " + str(static_cast<int64_t>(p->size())) +
               " entries, over 2 * the rank limit of " + str(kMaxRank));
    for (size_t i = 0; i < p->size(); ++i)
      pad.push_back(list_integer(a, entry_name("pad", i), (*p)[i], where));
    mode = a.string("mode", "constant");
    const ojson* v = a.raw("value");
    if (v && !v->is_null()) {
      if (!v->is_number()) a.type_error("value", "a number", *v);
      value = v->get<double>();
    }
  }
  void validate(const std::string& where) const {
    if (mode == "reflect" || mode == "replicate" || mode == "circular")
      fail(ErrorCode::Unsupported, where, "mode='" + mode + "' is not supported (only 'constant')");
    if (mode != "constant")
      fail(ErrorCode::Constraint, where,
           "mode='" + mode +
               "' must be 'constant' ('reflect', 'replicate' and 'circular' are not "
               "supported)");
    // PyTorch: "value cannot be converted to type float without overflow".
    if (std::abs(value) > std::numeric_limits<float>::max())
      fail(ErrorCode::Constraint, where, "value=" + py_float(value) + " does not fit float32");
    if (pad.size() % 2 != 0)
      fail(ErrorCode::Constraint, where,
           "pad=" + list_text(pad) + " has an odd number of entries (pairs from the last dim)");
  }

  // Pads of dim k of a rank-r x: (lo, hi), zero for a dim pad does not reach.
  std::pair<int64_t, int64_t> pads_of(size_t k, size_t rank) const {
    const size_t from_end = rank - 1 - k;
    if (2 * from_end >= pad.size()) return {0, 0};
    return {pad[2 * from_end], pad[2 * from_end + 1]};
  }
  SymShape infer(const ValueType& x, const SymbolBindings&, const std::string& where) const {
    const size_t rank = x.shape.size();
    if (pad.size() / 2 > rank)
      fail(ErrorCode::Shape, where,
           "pad=" + list_text(pad) + " pads " + str(static_cast<int64_t>(pad.size() / 2)) +
               " dims; " + named("x", x) + " has " + str(static_cast<int64_t>(rank)));
    SymShape out = x.shape;
    for (size_t k = 0; k < rank; ++k) {
      const auto [lo, hi] = pads_of(k, rank);
      Dim& d = out[k];
      if (lo == 0 && hi == 0) continue;
      if (d.is_fixed()) {
        d = Dim::fixed(padded_size(d.value, lo, hi, static_cast<int64_t>(k), where));
        continue;
      }
      // Open: the crop is checked once the dim is bound, unless no size could take it.
      int64_t total;
      if (!crop_of(lo, hi) || __builtin_add_overflow(lo, hi, &total))
        fail(ErrorCode::Shape, where,
             "pads " + str(lo) + " and " + str(hi) + " of dim " + str(static_cast<int64_t>(k)) +
                 " of " + named("x", x) + " overflow int64");
      if (total > 0)
        d = dim_sum({d, Dim::fixed(total)}, where);
      else if (total < 0)  // > INT64_MIN: the crop fits int64
        d = Dim::open(operand(d) + "-" + str(-total));
    }
    return out;
  }
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    const size_t rank = static_cast<size_t>(x.dim());
    CopyPlan p = identity_plan(x.shape(), where);
    p.fill = static_cast<float>(value);  // in float range (validate)
    for (size_t k = 0; k < rank; ++k) {
      const auto [lo, hi] = pads_of(k, rank);
      CopyAxis& a = p.axes[k];
      const int64_t n = a.size;
      a.size = padded_size(n, lo, hi, static_cast<int64_t>(k), where);
      a.before = std::max<int64_t>(lo, 0);
      a.extent = n - std::max<int64_t>(0, -lo) - std::max<int64_t>(0, -hi);
      p.offset += std::max<int64_t>(0, -lo) * a.stride;
    }
    gather_into(p, x, y, where);
  }
};

// ---- expand

// x.expand(sizes): x aligned with the last sizes; -1 keeps a dim, only a dim of size 1 may take
// another size (E_SHAPE), leading new dims take any size >= 0 (not -1). Entries may name network
// symbols, as reshape's do: class_token.expand("B", -1, -1).
struct ExpandSpec {
  static constexpr const char* kName = "expand";
  std::vector<SizeEntry> sizes;

  ExpandSpec() = default;
  ExpandSpec(Args& a, const std::string& where) : sizes(size_entries(a, "sizes", where)) {}
  void validate(const std::string&) const {}

  SymShape infer(const ValueType& x, const SymbolBindings& bound, const std::string& where) const {
    const size_t rank = x.shape.size(), n = sizes.size();
    if (n < rank)
      fail(ErrorCode::Shape, where,
           "sizes=" + entries_text(sizes) + " has " + str(static_cast<int64_t>(n)) +
               " entries, fewer than the dims of " + named("x", x));
    const size_t lead = n - rank;
    SymShape out;
    for (size_t k = 0; k < n; ++k) {
      const Dim want = entry_dim(sizes[k], bound);
      const bool keep = sizes[k].symbol.empty() && sizes[k].value == -1;
      if (k < lead) {
        if (keep)
          fail(ErrorCode::Shape, where,
               "sizes=" + entries_text(sizes) + ": -1 in dim " + str(static_cast<int64_t>(k)) +
                   ", a new leading dim (x " + sym_shape_to_string(x.shape) +
                   " has no size to keep)");
        out.push_back(want);
        continue;
      }
      const Dim& have = x.shape[k - lead];
      if (keep || have == want) {
        out.push_back(have);
      } else if (have.is_fixed() && have.value == 1) {
        out.push_back(want);
      } else if (have.is_fixed() && want.is_fixed()) {
        fail(ErrorCode::Shape, where,
             "cannot expand " + named("x", x) + " to sizes=" + entries_text(sizes) + ": dim " +
                 str(static_cast<int64_t>(k - lead)) + " has size " + str(have.value) +
                 " (only a size-1 dim can expand), expand asks for " + str(want.value));
      } else {
        // An open side: x's dim must be 1 or equal the size, known once bound. A fixed side
        // is the size then (a fixed x dim other than 1 must be matched exactly).
        out.push_back(have.is_fixed() ? have : want);
      }
    }
    return out;
  }
  // Broadcasts x to y's shape: the plan's shapes, the symbols bound.
  void forward(const Tensor& x, Tensor& y, const std::string& where) const {
    const size_t rank = static_cast<size_t>(x.dim()), n = static_cast<size_t>(y.dim());
    if (n < rank || n != sizes.size())
      fail(ErrorCode::Shape, where, "out " + y.shape_str() + " does not fit x " + x.shape_str());
    const DimArray st = strides_of(x.shape());
    CopyPlan p;
    for (size_t k = 0; k < n; ++k) {
      const int64_t size = y.size(static_cast<int64_t>(k));
      if (k < n - rank) {
        p.add(size, 0, where);
        continue;
      }
      const int64_t have = x.size(static_cast<int64_t>(k - (n - rank)));
      if (have != size && have != 1)
        fail(ErrorCode::Shape, where, "out " + y.shape_str() + " does not fit x " + x.shape_str());
      p.add(size, have == size ? st[k - (n - rank)] : 0, where);
    }
    gather_into(p, x, y, where);
  }
};

}  // namespace

std::unique_ptr<Op> make_reshape_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<ReshapeSpec>>(node, where);
}
std::unique_ptr<Op> make_flatten_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<FlattenSpec>>(node, where);
}
std::unique_ptr<Op> make_permute_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<PermuteSpec>>(node, where);
}
std::unique_ptr<Op> make_transpose_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<TransposeSpec>>(node, where);
}
std::unique_ptr<Op> make_unsqueeze_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<UnsqueezeSpec>>(node, where);
}
std::unique_ptr<Op> make_squeeze_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<SqueezeSpec>>(node, where);
}
std::unique_ptr<Op> make_slice_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<SliceSpec>>(node, where);
}
std::unique_ptr<Op> make_select_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<SelectSpec>>(node, where);
}
std::unique_ptr<Op> make_roll_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<RollSpec>>(node, where);
}
std::unique_ptr<Op> make_pad_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<PadSpec>>(node, where);
}
std::unique_ptr<Op> make_expand_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayoutOp<ExpandSpec>>(node, where);
}

// ---------------------------------------------------------------- patch_merging_pad

namespace {

// torchvision 0.14's _patch_merging_pad (Swin's PatchMerging before its norm and reduction):
// x [..., H, W, C] padded with zeros to even H and W, then cat([x0, x1, x2, x3], -1) of the four
// stride-2 phases x[..., r::2, c::2, :] in the order (r, c) = (0, 0), (1, 0), (0, 1), (1, 1):
// out [..., ceil(H/2), ceil(W/2), 4C]. One op rather than pad + four slices + concat because the
// padding depends on H and W, which a network file may leave open.
class PatchMergingPadOp : public Op {
 public:
  PatchMergingPadOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args(node.args, where, "patch_merging_pad").finish();
  }
  const char* name() const override { return "patch_merging_pad"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "patch_merging_pad", where());
    if (x.shape.size() < 3)
      fail(ErrorCode::Shape, where(), named("x", x) + " needs [..., H, W, C] (rank >= 3)");
    SymShape out = x.shape;
    const size_t r = out.size();
    const std::string w = where();
    auto half_up = [&](const Dim& d) {
      return d.is_fixed() ? Dim::fixed((d.value + 1) / 2)
                          : dim_div(dim_sum({d, Dim::fixed(1)}, w), 2);
    };
    out[r - 3] = half_up(out[r - 3]);
    out[r - 2] = half_up(out[r - 2]);
    out[r - 1] = dim_mul(out[r - 1], Dim::fixed(4), w);
    InferResult res;
    res.outputs.push_back({out, DType::F32});
    return res;
  }
  OpCost cost(const InputTypes&) const override { return {}; }  // data movement
  std::unique_ptr<OpLayer> instantiate(const InputTypes&,
                                       std::optional<uint64_t>) const override {
    return function_layer([](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
      const Tensor& x = *in[0];
      Tensor& y = *out[0];
      const int64_t r = x.dim();
      const int64_t H = x.size(r - 3), W = x.size(r - 2), C = x.size(r - 1);
      const int64_t Ho = (H + 1) / 2, Wo = (W + 1) / 2;
      int64_t outer = 1;
      for (int64_t d = 0; d < r - 3; ++d) outer *= x.size(d);
      if (y.numel() == 0) return;
      const float* xp = x.data<float>();
      float* yp = y.data<float>();
      const size_t row = sizeof(float) * static_cast<size_t>(C);
      // One task per output row (b, i): 4 * Wo rows of C floats copied or zeroed.
      parallel_for(0, outer * Ho,
                   std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, 4 * Wo * C)),
                   [&](int64_t t0, int64_t t1) {
                     for (int64_t t = t0; t < t1; ++t) {
                       const int64_t b = t / Ho, i = t % Ho;
                       for (int64_t j = 0; j < Wo; ++j) {
                         float* dst = yp + ((t * Wo) + j) * 4 * C;
                         for (int k = 0; k < 4; ++k) {
                           const int64_t h = 2 * i + (k & 1), w = 2 * j + (k >> 1);
                           if (h < H && w < W)
                             std::memcpy(dst + k * C, xp + ((b * H + h) * W + w) * C, row);
                           else
                             std::fill(dst + k * C, dst + (k + 1) * C, 0.0f);
                         }
                       }
                     }
                   });
    });
  }
};

}  // namespace

std::unique_ptr<Op> make_patch_merging_pad_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<PatchMergingPadOp>(node, where);
}

}  // namespace tessera
