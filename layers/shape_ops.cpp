#include "layers/shape_ops.h"

#include <algorithm>
#include <cstring>

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

}  // namespace tessera
