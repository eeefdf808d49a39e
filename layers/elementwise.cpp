#include "backends/cpu/cpu_device.h"
#include "core/text.h"
#include "layers/elementwise.h"

#include <algorithm>
#include <array>
#include <span>

#include "core/limits.h"
#include "core/parallel.h"
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

void add_into(const Tensor& a, const Tensor& b, Tensor& y, const std::string& where) {
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
  const KernelTable& k = cpu_device().kernels();

  if (ac.shape() == bc.shape()) {
    parallel_for(0, n_out, kElementGrain,
                 [&](int64_t i0, int64_t i1) { k.add_f32(i1 - i0, ap + i0, bp + i0, yp + i0); });
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
                   const float* pa = ap + oa;
                   const float* pb = bp + ob;
                   float* py = yp + r * n;
                   if (ia == 1 && ib == 1) {
                     k.add_f32(n, pa, pb, py);
                   } else if (ia == 1) {
                     for (int64_t j = 0; j < n; ++j) py[j] = pa[j] + pb[0];
                   } else if (ib == 1) {
                     for (int64_t j = 0; j < n; ++j) py[j] = pa[0] + pb[j];
                   } else {
                     std::fill(py, py + n, pa[0] + pb[0]);
                   }
                 }
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
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    require_float("x", *in[0], op_, where());
    return {{{in[0]->shape, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes& in) const override { return {elements(in[0]->shape), 0.0}; }
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
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    require_float("x", *in[0], "gelu", where());
    return {{{in[0]->shape, DType::F32}}, {}};
  }
  OpCost cost(const InputTypes& in) const override { return {elements(in[0]->shape), 0.0}; }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer([tanh = tanh_, w = where()](std::span<const Tensor* const> in,
                                                      std::span<Tensor* const> out) {
      gelu_into(*in[0], tanh, *out[0], w);
    });
  }

 private:
  bool tanh_;
};

class AddOp : public Op {
 public:
  AddOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args(node.args, where, "add").finish();
  }
  const char* name() const override { return "add"; }
  std::vector<PortSpec> input_ports() const override { return {{"a"}, {"b"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& a = *in[0];
    const ValueType& b = *in[1];
    require_float("a", a, "add", where());
    require_float("b", b, "add", where());
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
  std::unique_ptr<OpLayer> instantiate(const InputTypes&, std::optional<uint64_t>) const override {
    return function_layer(
        [w = where()](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
          add_into(*in[0], *in[1], *out[0], w);
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
std::unique_ptr<Op> make_add_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<AddOp>(node, where);
}

}  // namespace tessera
