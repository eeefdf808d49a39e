#include "layers/elementwise.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>

#include "backends/cpu/cpu_device.h"
#include "core/limits.h"
#include "core/parallel.h"
#include "core/text.h"
#include "layers/op_args.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

// Dims of at most kMaxRank, on the stack: the forward allocates nothing.
using DimArray = std::array<int64_t, kMaxRank>;

// broadcast_shapes into `out`; returns the rank.
size_t broadcast_into(std::span<const int64_t> a, std::span<const int64_t> b, DimArray& out,
                      const std::string& where) {
  const size_t rank = std::max(a.size(), b.size());
  if (rank > out.size())
    fail(ErrorCode::Shape, where,
         "rank " + str(static_cast<int64_t>(rank)) + " is over the limit of " + str(kMaxRank));
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(ErrorCode::Shape, where,
           "shapes " + shape_to_string(Shape(a.begin(), a.end())) + " and " +
               shape_to_string(Shape(b.begin(), b.end())) + " do not broadcast (dim " +
               str(static_cast<int64_t>(i)) + ": " + str(da) + " vs " + str(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  return rank;
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where) {
  DimArray out{};
  const size_t rank = broadcast_into(a, b, out, where);
  return Shape(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(rank));
}

void gelu_into(const Tensor& x, bool tanh_approx, Tensor& y, const std::string& where) {
  Tensor xs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  check_output(y, xc.shape(), "y", where);
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  const KernelTable& k = cpu_device().kernels();
  parallel_for(0, xc.numel(), kElementGrain,
               [&](int64_t i0, int64_t i1) { k.gelu_f32(i1 - i0, xp + i0, yp + i0, tanh_approx); });
}

void unary_map_into(const char* map, const Tensor& x, Tensor& y, const std::string& where) {
  const UnaryMapF32 fn = cpu_device().kernels().unary_map_f32(map);
  if (!fn) fail(ErrorCode::Internal, where, std::string("the backend has no kernel for ") + map);
  Tensor xs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  check_output(y, xc.shape(), "y", where);
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  parallel_for(0, xc.numel(), kElementGrain,
               [&](int64_t i0, int64_t i1) { fn(i1 - i0, xp + i0, yp + i0); });
}

void binary_into(const char* op, const Tensor& a, const Tensor& b, Tensor& y,
                 const std::string& where) {
  const BinaryMapF32 fn = cpu_device().kernels().binary_map_f32(op);
  if (!fn) fail(ErrorCode::Internal, where, std::string("the backend has no kernel for ") + op);
  Tensor as, bs;
  const Tensor& ac = f32_contiguous(a, as, "a", where);
  const Tensor& bc = f32_contiguous(b, bs, "b", where);
  DimArray out{};
  const size_t rank = broadcast_into(ac.shape(), bc.shape(), out, where);
  check_output(y, std::span<const int64_t>(out.data(), rank), "y", where);
  const int64_t n_out = y.numel();
  if (n_out == 0) return;
  const float* ap = ac.data<float>();
  const float* bp = bc.data<float>();
  float* yp = y.data<float>();

  if (ac.shape() == bc.shape()) {
    parallel_for(0, n_out, kElementGrain,
                 [&](int64_t i0, int64_t i1) { fn(i1 - i0, ap + i0, 1, bp + i0, 1, yp + i0); });
    return;
  }
  // Broadcast: element strides of a and b over the output's dims (0 where they stretch). The
  // last dim is the row the kernel sees; it is contiguous (stride 1) or stretched (stride 0).
  DimArray sa{}, sb{};
  auto strides_for = [&](const Shape& s, DimArray& st) {
    int64_t stride = 1;
    for (size_t i = rank; i-- > rank - s.size();) {
      const int64_t d = s[i - (rank - s.size())];
      st[i] = (d == 1 && out[i] != 1) ? 0 : stride;
      stride *= d;
    }
  };
  strides_for(ac.shape(), sa);
  strides_for(bc.shape(), sb);
  const int64_t n = rank ? out[rank - 1] : 1;
  const int64_t rows = n ? n_out / n : 0;
  const int64_t ia = rank ? sa[rank - 1] : 0, ib = rank ? sb[rank - 1] : 0;
  parallel_for(0, rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(n, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   int64_t oa = 0, ob = 0, rem = r;
                   for (size_t i = rank - 1; i-- > 0;) {
                     const int64_t idx = rem % out[i];
                     rem /= out[i];
                     oa += idx * sa[i];
                     ob += idx * sb[i];
                   }
                   fn(n, ap + oa, ia, bp + ob, ib, yp + r * n);
                 }
               });
}

void add_into(const Tensor& a, const Tensor& b, Tensor& y, const std::string& where) {
  binary_into("add", a, b, y, where);
}

void softmax_into(const Tensor& x, int64_t dim, Tensor& y, const std::string& where) {
  Tensor xs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  // A 0-d tensor takes dim -1 or 0, as PyTorch: one row of one element.
  const int64_t d = wrap_dim(dim, std::max<int64_t>(xc.dim(), 1), where, "input");
  check_output(y, xc.shape(), "y", where);
  const Shape& s = xc.shape();
  const int64_t n = s.empty() ? 1 : s[static_cast<size_t>(d)];
  const int64_t outer = s.empty() ? 1 : product(s, 0, static_cast<size_t>(d));
  const int64_t inner = s.empty() ? 1 : product(s, static_cast<size_t>(d) + 1, s.size());
  if (n == 0 || outer == 0 || inner == 0) return;
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  const KernelTable& k = cpu_device().kernels();
  if (inner == 1) {
    // Contiguous rows: the row kernel attention uses. Its contract turns a row of all -inf into
    // zeros (a query with no admissible key); torch.softmax gives NaN there (every x - max is
    // -inf - -inf). Such a row is the only one the kernel leaves all zero: in any other row the
    // max entry weighs exp(0) / sum >= 1/n > 0 (or the row is NaN). So a scan that stops at the
    // first non-zero weight, usually the first, finds them.
    parallel_for(0, outer, std::max<int64_t>(1, kElementGrain / n), [&](int64_t r0, int64_t r1) {
      k.softmax_rows_f32(r1 - r0, n, xp + r0 * n, n, 1.0f, nullptr, 0, yp + r0 * n, n);
      for (int64_t r = r0; r < r1; ++r) {
        float* row = yp + r * n;
        if (std::all_of(row, row + n, [](float v) { return v == 0.0f; }))
          std::fill(row, row + n, std::numeric_limits<float>::quiet_NaN());
      }
    });
    return;
  }
  // Another dim: each outer index is an [n, inner] block, softmax down its columns. Work items
  // are (outer index, block of kColumns columns), so a softmax over dim 0 of one big matrix
  // still splits; a split by shape only, and columns are independent anyway.
  constexpr int64_t kColumns = 256;  // 1 KiB of each row: 16 AVX-512 vectors, 4 kernel blocks
  const int64_t column_blocks = (inner + kColumns - 1) / kColumns;
  const int64_t block_elements = n * std::min(inner, kColumns);
  parallel_for(0, outer * column_blocks, std::max<int64_t>(1, kElementGrain / block_elements),
               [&](int64_t w0, int64_t w1) {
                 for (int64_t w = w0; w < w1; ++w) {
                   const int64_t o = w / column_blocks, c0 = (w % column_blocks) * kColumns;
                   const int64_t offset = o * n * inner + c0;
                   k.softmax_columns_f32(n, std::min(kColumns, inner - c0), xp + offset, inner,
                                         yp + offset, inner);
                 }
               });
}

void copy_into(const Tensor& x, Tensor& y, const std::string& where) {
  Tensor xs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  check_output(y, xc.shape(), "y", where);
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  if (xp == yp) return;
  parallel_for(0, xc.numel(), kElementGrain, [&](int64_t i0, int64_t i1) {
    std::memcpy(yp + i0, xp + i0, static_cast<size_t>(i1 - i0) * sizeof(float));
  });
}

// ---------------------------------------------------------------- the ops

namespace {

// An elementwise map y = f(x) with no arguments, PyTorch semantics, over the backend kernel of
// the same name (backends/cpu/elementwise_f32.cc, unary_maps_f32). One FLOP per element.
class UnaryMapOp : public Op {
 public:
  UnaryMapOp(const NetworkNode& node, const std::string& where, const char* op)
      : Op(where), op_(op) {
    Args(node.args, where, op).finish();
  }
  const char* name() const override { return op_; }
  Activation as_activation() const override {
    return std::string_view(op_) == "relu" ? Activation::relu : Activation::none;
  }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    require_float("x", *in[0], op_, where());
    return {{{in[0]->shape, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes& in) const override { return {elements(in[0]->shape), 0.0}; }
  StepRole step_role(const InputTypes&, const std::string&, std::string&) const override {
    return StepRole::per_position;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [op = op_, w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          unary_map_into(op, *in[0], *out[0], w);
        });
  }

 private:
  const char* op_;
};

class GeluOp : public Op {
 public:
  GeluOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "gelu");
    const std::string approx = a.string("approximate", "none");
    a.finish();
    if (approx != "none" && approx != "tanh")
      fail(ErrorCode::Constraint, where, "approximate='" + approx + "' must be 'none' or 'tanh'");
    tanh_ = approx == "tanh";
  }
  const char* name() const override { return "gelu"; }
  Activation as_activation() const override {
    return tanh_ ? Activation::gelu_tanh : Activation::gelu;
  }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    require_float("x", *in[0], "gelu", where());
    return {{{in[0]->shape, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes& in) const override { return {elements(in[0]->shape), 0.0}; }
  StepRole step_role(const InputTypes&, const std::string&, std::string&) const override {
    return StepRole::per_position;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer([tanh = tanh_, w = where()](std::span<const Tensor* const> in,
                                                      std::span<Tensor* const> out) {
      gelu_into(*in[0], tanh, *out[0], w);
    });
  }

 private:
  bool tanh_;
};

// A broadcasting binary op (add, sub, mul, div) over the backend's binary map of the same name.
// One FLOP per element produced.
class BinaryOp : public Op {
 public:
  BinaryOp(const NetworkNode& node, const std::string& where, const char* op) : Op(where), op_(op) {
    Args a(node.args, where, op);
    if (std::string_view(op) == "sub") {
      // torch.sub's alpha (a - alpha * b): the default only. PyTorch rounds a - alpha * b once
      // (an FMA) on its vector path; a kernel for that is not worth it before a network needs it.
      const double alpha = a.number("alpha", 1.0);
      if (alpha != 1.0)
        fail(ErrorCode::Unsupported, where,
             "alpha=" + py_float(alpha) + " is not supported (only the default 1)");
    }
    a.finish();
  }
  const char* name() const override { return op_; }
  bool is_add() const override { return std::string_view(op_) == "add"; }
  std::vector<PortSpec> input_ports() const override { return {{"a"}, {"b"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& a = *in[0];
    const ValueType& b = *in[1];
    require_float("a", a, op_, where());
    require_float("b", b, op_, where());
    const size_t rank = std::max(a.shape.size(), b.shape.size());
    SymShape out(rank);
    for (size_t i = 0; i < rank; ++i) {
      const Dim da =
          i < rank - a.shape.size() ? Dim::fixed(1) : a.shape[i - (rank - a.shape.size())];
      const Dim db =
          i < rank - b.shape.size() ? Dim::fixed(1) : b.shape[i - (rank - b.shape.size())];
      out[i] = dim_broadcast(da, db,
                             named("a", a) + " and " + named("b", b) + " do not broadcast (dim " +
                                 str(static_cast<int64_t>(i)) + ")",
                             where());
    }
    return {{{out, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes& in) const override {
    SymbolBindings none;
    return {elements(infer(in, none).outputs[0].shape), 0.0};
  }
  // Per position when each operand has the sequence dim where the result has it, or broadcasts
  // there (size 1 or too few dims): a [T, D] operand fixed to the context would not be.
  StepRole step_role(const InputTypes& in, const std::string& seq,
                     std::string& why) const override {
    SymbolBindings none;
    const SymShape out = infer(in, none).outputs[0].shape;
    const int64_t axis = seq_axis(out, seq);
    if (axis < 0) return StepRole::per_position;
    const int64_t from_end = static_cast<int64_t>(out.size()) - axis;
    for (size_t k = 0; k < 2; ++k) {
      const SymShape& s = in[k]->shape;
      const int64_t rank = static_cast<int64_t>(s.size());
      if (rank < from_end) continue;
      const Dim& d = s[static_cast<size_t>(rank - from_end)];
      if ((d.is_fixed() && d.value == 1) || (!d.is_fixed() && d.text == seq)) continue;
      why = std::string(k == 0 ? "a " : "b ") + sym_shape_to_string(s) + " does not follow the " +
            "sequence dim " + seq + " of the result " + sym_shape_to_string(out);
      return StepRole::none;
    }
    return StepRole::per_position;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [op = op_, w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          binary_into(op, *in[0], *in[1], *out[0], w);
        });
  }

 private:
  const char* op_;
};

// torch.softmax(x, dim). One FLOP per element produced (the elementwise convention; the exp,
// max, sum and scale are about 20 vector ops per vector).
class SoftmaxOp : public Op {
 public:
  SoftmaxOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "softmax");
    dim_ = a.integer("dim");
    a.finish();
  }
  const char* name() const override { return "softmax"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    require_float("x", *in[0], "softmax", where());
    // A 0-d input takes dim -1 or 0, as PyTorch.
    wrap_dim(dim_, std::max<int64_t>(static_cast<int64_t>(in[0]->shape.size()), 1), where(),
             "input");
    return {{{in[0]->shape, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes& in) const override { return {elements(in[0]->shape), 0.0}; }
  StepRole step_role(const InputTypes& in, const std::string& seq,
                     std::string& why) const override {
    const int64_t rank = std::max<int64_t>(static_cast<int64_t>(in[0]->shape.size()), 1);
    const int64_t d = dim_ < 0 ? dim_ + rank : dim_;
    if (d != seq_axis(in[0]->shape, seq)) return StepRole::per_position;
    why = "softmax over the sequence dim " + seq;
    return StepRole::none;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [dim = dim_, w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          softmax_into(*in[0], dim, *out[0], w);
        });
  }

 private:
  int64_t dim_;
};

// torch.nn.functional.dropout in eval mode: the identity (out is a copy of x). tessera never
// trains, so training=true is E_UNSUPPORTED rather than silently not dropping. No FLOPs (data
// movement).
class DropoutOp : public Op {
 public:
  DropoutOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "dropout");
    const double p = a.number("p", 0.5);
    a.boolean("inplace", false);  // no effect on a copy into the plan's buffer
    const bool training = a.boolean("training", false);
    a.finish();
    if (!(p >= 0.0 && p <= 1.0))
      fail(ErrorCode::Constraint, where, "p=" + py_float(p) + " must be in [0, 1]");
    if (training)
      fail(ErrorCode::Unsupported, where,
           "training=true is not supported: tessera runs in eval mode, where dropout is the "
           "identity");
  }
  const char* name() const override { return "dropout"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    require_float("x", *in[0], "dropout", where());
    return {{{in[0]->shape, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes&) const override { return {}; }
  StepRole step_role(const InputTypes&, const std::string&, std::string&) const override {
    return StepRole::per_position;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          copy_into(*in[0], *out[0], w);
        });
  }
};

}  // namespace

std::unique_ptr<Op> make_gelu_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<GeluOp>(node, where);
}
std::unique_ptr<Op> make_relu_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<UnaryMapOp>(node, where, "relu");
}
std::unique_ptr<Op> make_silu_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<UnaryMapOp>(node, where, "silu");
}
std::unique_ptr<Op> make_sigmoid_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<UnaryMapOp>(node, where, "sigmoid");
}
std::unique_ptr<Op> make_tanh_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<UnaryMapOp>(node, where, "tanh");
}
std::unique_ptr<Op> make_add_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<BinaryOp>(node, where, "add");
}
std::unique_ptr<Op> make_sub_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<BinaryOp>(node, where, "sub");
}
std::unique_ptr<Op> make_mul_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<BinaryOp>(node, where, "mul");
}
std::unique_ptr<Op> make_div_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<BinaryOp>(node, where, "div");
}
std::unique_ptr<Op> make_softmax_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<SoftmaxOp>(node, where);
}
std::unique_ptr<Op> make_dropout_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<DropoutOp>(node, where);
}

}  // namespace tessera
