// The op harness, in the spirit of ggml's test-backend-ops: every op of the ops table
// (op_names()) declares its cases in one list below (kCaseLists), and every case is checked
// against a float64 reference (tests/reference.cpp) on every SIMD target compiled here and
// supported by this CPU. A new op gets its tests by adding a case list; an op without one fails
// `every_op_has_cases`.
//
// A case is one node: its args, concrete inputs and a reference computing the expected outputs
// from the inputs (as the op sees them) and the node's parameters. An input has a shape, a fill
// (normal, bool or float mask, given values), a stored dtype (F16, BF16, F64: the plan converts
// them), may be a strided view, or may be another port's input (query = key = value is
// self-attention). For each case:
//  1. the one-node network is built into a Model from a seed; random parameters are loaded into
//     it (f64::random_parameters: the layers' resets leave biases at 0 and norm scales at 1,
//     which would hide a dropped bias) and read back with state_dict() for the reference;
//  2. on each target, the op path: make_op, instantiate, load the same parameters, then
//     layer->forward with a Workspace over exactly cost(in).workspace_bytes bytes (64-byte
//     aligned; Workspace::take fails with E_INTERNAL past them), the workspace and the outputs
//     filled with NaN first (a read of scratch, or an output, the forward did not write shows up
//     in the comparison); ws.peak() must not exceed the report;
//  3. on each target, the plan path: the Model through a Plan, whose outputs must be bitwise
//     those of the op path (same layer code, same target, thread-count independent splits).
//
// Shapes: lengths 1, 7, 8, 9, 15, 16, 17, 33 along the vectorised (last) dim, below, at and above
// the 4, 8 and 16 float lanes of SSE4, AVX2 and AVX-512, with and without batch dims, plus a few
// shapes that reach the library's larger paths (linear's packed kernel: >= 32 rows, >= 64
// features and >= 1e6 multiply-adds; attention's query tiles of 256 rows, or fewer at large S),
// and the edges of each op's semantics (broadcasting, negative dims, fully masked rows, S = 0).
//
// Tolerance, per case: max |y - ref| <= tol * max(1, max |ref|) over each output; a NaN fails.
//   chunk, concat, 0: they copy floats (references: index arithmetic in
//   the layout ops  tests/reference.cpp, or the expected shape written out by hand for the
//                  ops that keep the element order: reshape, flatten, squeeze, unsqueeze).
//   add            1e-7: one float add, rounded once (<= 2^-24 = 6e-8 relative).
//   chunk, concat  0: they copy floats.
//   add, sub, mul, 1e-7: one float operation, rounded once (<= 2^-24 = 6e-8 relative).
//   div
//   gelu           2e-6: the float32 erf/tanh polynomial approximations (a few ulp), as the
//                  network suite measures them.
//   silu, tanh,    2e-6: exp or expm1, an add and a divide: at most 3 ulp (test_kernels.cpp
//   sigmoid        measures 2.1-3.0), 2e-6 as gelu.
//   softmax        1e-6: weights <= 1; exp ~1 ulp, a float sum (blocked or compensated), one
//                  reciprocal and a multiply, as the kernel suite's bound.
//   dropout        0: eval mode copies.
//   matmul         1e-5: float32 dot products through the GEMM, as linear (k <= 520 here).
//   layer_norm     1e-5: float32 mean and variance over <= 260 elements (~sqrt(D) ulp).
//   linear         1e-5: float32 dot products of <= 200 terms (~sqrt(k) ulp of sum |x w|).
//   attention,     1e-5: mha_semantics.md's float32 tolerance; float32 projections (as linear)
//   MHA            and an exp of ~5e-7 relative error.
//   shifted_window 1e-5: as attention (the same core and projections over windows of <= 49
//   _attention     tokens; the -100 region mask leaves those weights at ~e^-100, i.e. zero).
//   conv2d         1e-5: as linear, float32 dot products of C/groups*kh*kw <= 768 terms (ViT's
//                  16x16x3 patches), one FMA chain each (~sqrt(k) ulp of sum |x w|).
//   mean,          1e-7: sums in double, one rounding to float32 (<= 2^-24 = 6e-8 relative;
//   adaptive_avg_pool2d  the worst cases use about 0.4 of it, as add does 0.6).
// The worst case of each op uses well under a tenth of its tolerance (add: about 0.6). Run with
// --log_level=message for the targets, that margin per op and target, and the workspace use.
// The worst case of each op uses well under a tenth of its tolerance (add, sub, mul, div: about
// 0.5-0.6, the half ulp of one rounding). Run with --log_level=message for the targets, that
// margin per op and target, and the workspace use.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <bit>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/device.h"
#include "core/parallel.h"
#include "core/random.h"
#include "layers/elementwise.h"
#include "core/tensor.h"
#include "core/text.h"
#include "core/workspace.h"
#include "io/network_file.h"
#include "io/safetensors.h"
#include "layers/attention.h"
#include "layers/conv.h"
#include "layers/multihead_attention.h"
#include "layers/network.h"
#include "layers/op.h"
#include "tests/expect_error.h"
#include "tests/reference.h"
#include "tests/targets.h"

using namespace tessera;

namespace {

using ojson = nlohmann::ordered_json;
using Inputs = std::map<std::string, Tensor>;  // by input port
using Params = std::map<std::string, Tensor>;  // the node's state_dict, names without "n0."

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Lengths along the vectorised dim: below, at and above 4, 8 and 16 lanes, and 2 * 16 + 1.
constexpr int64_t kTails[] = {1, 7, 8, 9, 15, 16, 17, 33};

// One expected output, in the op's output port order.
struct Expected {
  Shape shape;
  std::vector<double> values;
};
using ReferenceFn = std::function<std::vector<Expected>(const Inputs&, const Params&)>;

enum class Fill {
  normal,      // N(0, 1)
  wide,        // N(0, 4): gelu's tails
  offset,      // N(30, 1): a mean far from zero (layer_norm's variance)
  bool_mask,   // 30% true (masked)
  float_mask,  // 20% -inf, the rest N(0, 1)
};

struct OpInput {
  OpInput(std::string port, Shape shape, Fill fill = Fill::normal)
      : port(std::move(port)), shape(std::move(shape)), fill(fill) {}
  // Given values (a mask with fully masked rows).
  OpInput(std::string port, Tensor value)
      : port(std::move(port)), shape(value.shape()), value(std::move(value)) {}

  // Stored as `dtype` (float inputs: the plan converts F16, BF16 and F64 to float32).
  OpInput& as(DType dtype) {
    stored = dtype;
    return *this;
  }
  // Passed as a transposed view (the last two dims swapped in memory): the plan copies a float
  // input into a contiguous buffer and hands a mask to the op as it is.
  OpInput& transposed() {
    strided = true;
    return *this;
  }

  // The same input on another port.
  OpInput& named(std::string name) {
    port = std::move(name);
    return *this;
  }

  // The port reads the same network input as port `of` (listed before it): one tensor passed
  // to both, as `{"query": "x", "key": "x"}` does.
  static OpInput alias(std::string port, std::string of) {
    OpInput i(std::move(port), Shape{});
    i.alias_of = std::move(of);
    return i;
  }

  std::string port;
  Shape shape;
  Fill fill = Fill::normal;
  Tensor value;  // used as given when defined
  DType stored = DType::F32;
  bool strided = false;
  std::string alias_of;
};

struct OpCase {
  ojson args = ojson::object();
  std::vector<OpInput> inputs;
  ReferenceFn reference;
  double tolerance = 1e-5;  // see the head of the file
};

// The one input of most ops.
OpInput x_input(Shape shape, Fill fill = Fill::normal) {
  return OpInput("x", std::move(shape), fill);
}

const Tensor& input(const Inputs& in, const std::string& port) {
  static const Tensor none;
  const auto it = in.find(port);
  return it == in.end() ? none : it->second;
}

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

// Element `idx` of a row-major array of shape `s`.
double element(const std::vector<double>& v, const Shape& s, const std::vector<int64_t>& idx) {
  const std::vector<int64_t> st = f64::strides_of(s);
  int64_t off = 0;
  for (size_t k = 0; k < s.size(); ++k) off += idx[k] * st[k];
  return v[static_cast<size_t>(off)];
}

int64_t wrap(int64_t dim, size_t rank) { return dim < 0 ? dim + static_cast<int64_t>(rank) : dim; }

// Options `o` changed by `edit`: with(heads(2), [](auto& o) { o.rope = true; }).
template <class Options, class Edit>
Options with(Options o, Edit edit) {
  edit(o);
  return o;
}

// ---------------------------------------------------------------- the case lists, one per op

std::vector<OpCase> linear_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, int64_t out, bool bias) {
    OpCase c;
    c.args["out_features"] = out;
    if (!bias) c.args["bias"] = false;
    c.inputs = {x};
    c.reference = [out, bias](const Inputs& in, const Params& p) {
      const Tensor& x = input(in, "x");
      const int64_t K = x.size(-1), rows = x.numel() / K;
      BOOST_TEST(p.count("bias") == (bias ? 1u : 0u));
      return std::vector<Expected>{
          {with_last(x.shape(), out),
           f64::linear(x.to_double_vector(), rows, K, f64::param(p, "weight"), out,
                       f64::param(p, "bias"))}};
    };
    cases.push_back(c);
  };
  // Every tail as in_features, each against another tail as out_features.
  for (size_t i = 0; i < std::size(kTails); ++i)
    add(x_input({3, kTails[i]}), kTails[(i + 3) % std::size(kTails)], true);
  add(x_input({2, 3, 17}), 9, true);  // batch dims
  add(x_input({16}), 7, true);        // one row
  add(x_input({5, 16}), 8, false);
  // The packed kernel: 33 rows (a 32-row panel and a 1-row tail), 257 features (a tail for every
  // tile height: 12 rows AVX-512, 3 AVX2, 1 SSE4); 80 rows at 129; exactly 2 panels at 127.
  add(x_input({33, 128}), 257, true);
  add(x_input({2, 40, 200}), 129, false);
  add(x_input({64, 129}), 127, true);
  // Stored dtypes and strides the plan converts.
  add(x_input({3, 17}).as(DType::F16), 9, true);
  add(x_input({2, 33}).as(DType::BF16), 8, true);
  add(x_input({4, 9}).transposed(), 16, true);
  // The weight another node's parameter (a tied LM head): given on the `weight` port, the node
  // owns only its bias; on both kernel paths (small, and the packed one at >= 32 rows).
  auto tied = [&](Shape x_shape, int64_t out, bool bias) {
    OpCase c;
    c.args["out_features"] = out;
    if (!bias) c.args["bias"] = false;
    const int64_t K = x_shape.back();
    c.inputs = {x_input(std::move(x_shape)), OpInput("weight", {out, K})};
    c.reference = [out, bias](const Inputs& in, const Params& p) {
      const Tensor& x = input(in, "x");
      const int64_t K = x.size(-1), rows = x.numel() / K;
      BOOST_TEST(p.count("weight") == 0u);  // not the node's own
      BOOST_TEST(p.count("bias") == (bias ? 1u : 0u));
      return std::vector<Expected>{{with_last(x.shape(), out),
                                    f64::linear(x.to_double_vector(), rows, K,
                                                input(in, "weight").to_double_vector(), out,
                                                f64::param(p, "bias"))}};
    };
    cases.push_back(c);
  };
  tied({2, 3, 17}, 9, false);
  tied({40, 96}, 131, true);
  return cases;
}

std::vector<OpCase> layer_norm_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, bool affine, double eps) {
    OpCase c;
    if (!affine) c.args["elementwise_affine"] = false;
    if (eps != 1e-5) c.args["eps"] = eps;
    c.inputs = {x};
    c.reference = [affine, eps](const Inputs& in, const Params& p) {
      const Tensor& x = input(in, "x");
      const int64_t D = x.size(-1);
      BOOST_TEST(p.size() == (affine ? 2u : 0u));
      return std::vector<Expected>{
          {x.shape(), f64::layer_norm(x.to_double_vector(), x.numel() / D, D,
                                      f64::param(p, "weight"), f64::param(p, "bias"), eps)}};
    };
    cases.push_back(c);
  };
  for (const int64_t D : kTails) add(x_input({3, D}), true, 1e-5);
  add(x_input({2, 3, 17}), true, 1e-5);
  add(x_input({16}), false, 1e-5);
  add(x_input({4, 9}), false, 1e-3);
  add(x_input({5, 33}, Fill::offset), true, 1e-5);
  add(x_input({2, 260}), true, 1e-5);
  add(x_input({3, 16}).as(DType::F64), true, 1e-5);
  add(x_input({5, 7}).transposed(), true, 1e-5);
  return cases;
}

std::vector<OpCase> gelu_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, bool tanh_form) {
    OpCase c;
    if (tanh_form) c.args["approximate"] = "tanh";
    c.inputs = {x};
    c.tolerance = 2e-6;
    c.reference = [tanh_form](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      std::vector<double> y = x.to_double_vector();
      for (double& v : y) v = f64::gelu(v, tanh_form);
      return std::vector<Expected>{{x.shape(), y}};
    };
    cases.push_back(c);
  };
  for (const int64_t n : kTails) {
    add(x_input({n}), false);
    add(x_input({2, n}), true);
  }
  add(x_input({2, 3, 33}, Fill::wide), false);
  add(x_input({4, 17}, Fill::wide), true);
  add(x_input({1000}), false);  // 62 AVX-512 vectors and a tail of 8
  add(x_input({2, 17}).as(DType::BF16), true);
  add(x_input({9, 4}).transposed(), false);
  return cases;
}

std::vector<OpCase> relu_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x) {
    OpCase c;
    c.inputs = {x};
    c.tolerance = 0.0;  // a select: exact
    c.reference = [](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      std::vector<double> y = x.to_double_vector();
      for (double& v : y) v = v < 0.0 ? 0.0 : v;  // torch.relu: NaN and -0.0 pass through
      return std::vector<Expected>{{x.shape(), y}};
    };
    cases.push_back(c);
  };
  for (const int64_t n : kTails) {
    add(x_input({n}));
    add(x_input({3, n}));
  }
  add(x_input({2, 3, 33}, Fill::wide));
  add(x_input({1000}));  // 62 AVX-512 vectors and a tail of 8
  add(x_input({2, 17}).as(DType::F16));
  add(x_input({9, 4}).transposed());
  return cases;
}

// Int64 ids as given: every row of a 9-row table, negative-free, repeated ids.
Tensor ids_tensor(const std::vector<int64_t>& ids, const Shape& shape, DType stored = DType::I64) {
  return Tensor::from_vector(ids, shape).to(stored);
}

std::vector<OpCase> embedding_cases() {
  std::vector<OpCase> cases;
  auto add = [&](Tensor ids, int64_t num, int64_t dim, ojson extra = ojson::object()) {
    OpCase c;
    c.args = extra;
    c.args["num_embeddings"] = num;
    c.args["embedding_dim"] = dim;
    c.inputs = {OpInput("x", std::move(ids))};
    c.tolerance = 0.0;  // a row copy
    c.reference = [dim](const Inputs& in, const Params& p) {
      const Tensor& x = input(in, "x");
      const std::vector<double> w = f64::param(p, "weight");
      std::vector<double> y;
      for (double id : x.to_double_vector())
        for (int64_t j = 0; j < dim; ++j)
          y.push_back(
              w[static_cast<size_t>(id) * static_cast<size_t>(dim) + static_cast<size_t>(j)]);
      Shape shape = x.shape();
      shape.push_back(dim);
      return std::vector<Expected>{{shape, y}};
    };
    cases.push_back(c);
  };
  for (const int64_t d : kTails) add(ids_tensor({0, 8, 3, 3, 5, 1}, {2, 3}), 9, d);
  add(ids_tensor({4}, {1}), 5, 16);
  add(ids_tensor({2, 0, 1}, {3}, DType::I32), 3, 7);  // int32 ids, widened by the plan
  add(ids_tensor({}, {0, 4}), 4, 8);                  // no ids
  add(ids_tensor({0, 1, 2, 1}, {4}), 3, 9, {{"padding_idx", -2}});  // forward ignores it
  std::vector<int64_t> many;
  for (int64_t i = 0; i < 300; ++i) many.push_back((i * 37) % 50);
  add(ids_tensor(many, {3, 100}), 50, 33);  // several row tasks
  return cases;
}

std::vector<OpCase> arange_cases() {
  std::vector<OpCase> cases;
  auto add = [&](Shape like, int64_t dim) {
    OpCase c;
    c.args["dim"] = dim;
    c.inputs = {x_input(std::move(like)).named("like")};
    c.tolerance = 0.0;
    c.reference = [dim](const Inputs& in, const Params&) {
      const Tensor& like = input(in, "like");
      const int64_t n = like.size(dim);
      std::vector<double> y;
      for (int64_t i = 0; i < n; ++i) y.push_back(static_cast<double>(i));
      return std::vector<Expected>{{Shape{n}, y}};
    };
    cases.push_back(c);
  };
  add({2, 5}, 1);
  add({2, 5}, -2);
  add({3, 0, 4}, 1);
  add({1, 33, 2}, -2);
  return cases;
}

std::vector<OpCase> parameter_cases() {
  std::vector<OpCase> cases;
  for (const Shape& shape : {Shape{1, 1, 9}, Shape{1, 17, 16}, Shape{}, Shape{3, 0}}) {
    OpCase c;
    c.args["shape"] = shape;
    c.args["std"] = 0.02;
    c.tolerance = 0.0;
    c.reference = [shape](const Inputs&, const Params& p) {
      return std::vector<Expected>{{shape, f64::param(p, "")}};
    };
    cases.push_back(c);
  }
  return cases;
}

// torchvision's _patch_merging_pad written out: out[..., i, j, k*C + c] = x[..., 2i + (k & 1),
// 2j + (k >> 1), c], zero past H or W.
std::vector<OpCase> patch_merging_pad_cases() {
  std::vector<OpCase> cases;
  for (const Shape& shape : {Shape{2, 4, 6, 3}, Shape{1, 5, 7, 8}, Shape{3, 1, 1, 17},
                             Shape{2, 2, 3, 4, 9}, Shape{4, 3, 5}, Shape{1, 0, 3, 2}}) {
    OpCase c;
    c.inputs = {x_input(shape)};
    c.tolerance = 0.0;  // copies and zeros
    c.reference = [](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      const int64_t r = x.dim(), H = x.size(r - 3), W = x.size(r - 2), C = x.size(r - 1);
      const int64_t Ho = (H + 1) / 2, Wo = (W + 1) / 2,
                    outer = H * W * C != 0 ? x.numel() / (H * W * C) : 0;
      Shape out = x.shape();
      out[static_cast<size_t>(r - 3)] = Ho;
      out[static_cast<size_t>(r - 2)] = Wo;
      out[static_cast<size_t>(r - 1)] = 4 * C;
      const std::vector<double> xv = x.to_double_vector();
      std::vector<double> y(static_cast<size_t>(shape_numel(out)), 0.0);
      for (int64_t b = 0; b < outer; ++b)
        for (int64_t i = 0; i < Ho; ++i)
          for (int64_t j = 0; j < Wo; ++j)
            for (int64_t k = 0; k < 4; ++k)
              for (int64_t ch = 0; ch < C; ++ch) {
                const int64_t h = 2 * i + (k % 2), w = 2 * j + (k / 2);
                if (h < H && w < W)
                  y[static_cast<size_t>((((b * Ho + i) * Wo + j) * 4 + k) * C + ch)] =
                      xv[static_cast<size_t>(((b * H + h) * W + w) * C + ch)];
              }
      return std::vector<Expected>{{out, y}};
    };
    cases.push_back(c);
  }
  return cases;
}

std::vector<OpCase> add_cases() {
  std::vector<OpCase> cases;
  auto add_inputs = [&](const OpInput& a, const OpInput& b) {
    OpCase c;
    c.inputs = {a, b};
    c.tolerance = 1e-7;
    c.reference = [](const Inputs& in, const Params&) {
      const Tensor &x = input(in, "a"), &y = input(in, "b");
      return std::vector<Expected>{
          {f64::broadcast_shape(x.shape(), y.shape()),
           f64::add(x.to_double_vector(), x.shape(), y.to_double_vector(), y.shape())}};
    };
    cases.push_back(c);
  };
  auto add = [&](const Shape& a, const Shape& b) { add_inputs({"a", a}, {"b", b}); };
  for (const int64_t n : kTails) add({3, n}, {3, n});
  add({2, 1, 9}, {3, 1});
  add({17}, {2, 3, 17});
  add({1}, {2, 16});
  add({5, 1}, {1, 33});
  add({}, {7});
  add({2, 3, 1}, {2, 3, 1});
  add({4, 1, 15}, {4, 5, 15});
  add({2, 8, 1}, {2, 1, 8});
  add_inputs(OpInput("a", {4, 8}).transposed(), OpInput("b", {4, 8}).as(DType::F64));
  add_inputs(OpInput("a", {3, 9}).as(DType::F16), OpInput("b", {9}));
  return cases;
}

// The broadcast shapes add is checked on, for every binary op.
const std::vector<std::pair<Shape, Shape>>& broadcast_pairs() {
  static const std::vector<std::pair<Shape, Shape>> pairs = [] {
    std::vector<std::pair<Shape, Shape>> p;
    for (const int64_t n : kTails) p.push_back({{3, n}, {3, n}});
    p.insert(p.end(), {{{2, 1, 5}, {3, 1}},
                       {{2, 1, 9}, {3, 1}},
                       {{17}, {2, 3, 17}},
                       {{1}, {2, 16}},
                       {{2, 33}, {1}},
                       {{5, 1}, {1, 33}},
                       {{}, {7}},
                       {{2, 3, 1}, {2, 3, 1}},
                       {{4, 1, 15}, {4, 5, 15}},
                       {{2, 8, 1}, {2, 1, 8}},
                       {{1000}, {1000}},
                       {{2, 0, 3}, {3}}});
    return p;
  }();
  return pairs;
}

// sub, mul, div: add's shapes and stored forms, the reference op applied in float64. One IEEE
// operation rounded once: <= 2^-24 relative, as add.
std::vector<OpCase> binary_cases(double (*op)(double, double),
                                 const ojson& args = ojson::object()) {
  std::vector<OpCase> cases;
  auto add_inputs = [&](const OpInput& a, const OpInput& b) {
    OpCase c;
    c.args = args;
    c.inputs = {a, b};
    c.tolerance = 1e-7;
    c.reference = [op](const Inputs& in, const Params&) {
      const Tensor &x = input(in, "a"), &y = input(in, "b");
      return std::vector<Expected>{
          {f64::broadcast_shape(x.shape(), y.shape()),
           f64::binary(x.to_double_vector(), x.shape(), y.to_double_vector(), y.shape(), op)}};
    };
    cases.push_back(c);
  };
  for (const auto& [a, b] : broadcast_pairs()) add_inputs({"a", a}, {"b", b});
  add_inputs(OpInput("a", {4, 8}).transposed(), OpInput("b", {4, 8}).as(DType::F64));
  add_inputs(OpInput("a", {3, 9}).as(DType::F16), OpInput("b", {9}));
  add_inputs(OpInput("a", {2, 17}, Fill::wide), OpInput("b", {2, 1}, Fill::offset));
  return cases;
}

std::vector<OpCase> sub_cases() {
  std::vector<OpCase> cases = binary_cases([](double a, double b) { return a - b; });
  // torch.sub's alpha at its default, written out.
  const std::vector<OpCase> alpha =
      binary_cases([](double a, double b) { return a - b; }, ojson{{"alpha", 1.0}});
  cases.push_back(alpha[2]);
  cases.push_back(alpha[10]);
  return cases;
}
std::vector<OpCase> mul_cases() {
  return binary_cases([](double a, double b) { return a * b; });
}
std::vector<OpCase> div_cases() {
  return binary_cases([](double a, double b) { return a / b; });
}

// Large |x|, where the exp-based maps saturate: tanh and sigmoid reach +-1 and 0/1 (never NaN,
// no exp overflow), silu reaches x and 0. Bounded magnitudes (|x| <= 100) so the scaled
// tolerance still means something; 41 values, a vector body and a tail on every target.
Tensor large_magnitudes() {
  std::vector<float> v = {-100.0f, 100.0f, -88.8f, 88.8f,  -88.0f, 88.0f,  -87.5f,  87.5f,  -50.0f,
                          50.0f,   -20.0f, 20.0f,  -18.8f, 18.8f,  -18.6f, 18.6f,   -10.0f, 10.0f,
                          -9.0f,   9.0f,   -5.0f,  5.0f,   -1e-3f, 1e-3f,  -1e-20f, 1e-20f, 0.0f,
                          -0.0f,   -0.35f, 0.35f,  -0.34f, 0.34f,  -95.0f, 95.0f,   -60.0f, 60.0f,
                          -44.0f,  44.0f,  -0.5f,  0.5f,   3.0f};
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// silu, tanh, sigmoid: maps through exp (or expm1) and a divide, a few ulp of float32 each
// (measured in test_kernels.cpp, unary_maps_match_float64_to_a_few_ulp); 2e-6 as gelu.
std::vector<OpCase> exp_map_cases(double (*f)(double)) {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x) {
    OpCase c;
    c.inputs = {x};
    c.tolerance = 2e-6;
    c.reference = [f](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      std::vector<double> y = x.to_double_vector();
      for (double& v : y) v = f(v);
      return std::vector<Expected>{{x.shape(), y}};
    };
    cases.push_back(c);
  };
  for (const int64_t n : kTails) {
    add(x_input({n}));
    add(x_input({3, n}, Fill::wide));
  }
  add(x_input({2, 3, 33}, Fill::wide));
  add(x_input({1000}));  // 62 AVX-512 vectors and a tail of 8
  add(x_input({2, 0, 5}));
  add(OpInput("x", large_magnitudes()));
  add(x_input({2, 17}).as(DType::F16));
  add(x_input({9, 4}).transposed());
  return cases;
}

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double tanh_ref(double x) { return std::tanh(x); }
double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<OpCase> silu_cases() { return exp_map_cases(silu_ref); }
std::vector<OpCase> tanh_cases() { return exp_map_cases(tanh_ref); }
std::vector<OpCase> sigmoid_cases() { return exp_map_cases(sigmoid_ref); }

// N(0, 1) values with about a quarter -inf, never at index 0 along `dim`, so that no slice
// along dim is all -inf (that gives NaN, which test softmax_all_neg_inf_slices_are_nan checks);
// the last slice has -inf everywhere but index 0 (weight exactly 1).
Tensor with_neg_inf(const Shape& shape, int64_t dim, uint64_t seed) {
  Generator gen(seed);
  Tensor t = Tensor::randn(shape, gen);
  const auto d = static_cast<size_t>(wrap(dim, shape.size()));
  const int64_t n = shape_numel(shape);
  const std::vector<int64_t> st = f64::strides_of(shape);
  float* p = t.data<float>();
  for (int64_t f = 0; f < n; ++f) {
    const std::vector<int64_t> idx = f64::unravel(f, shape);
    const int64_t last_slice = n / shape[d] - 1;
    // The slice index of f: f with its dim-d index taken out.
    const int64_t slice = (f / (st[d] * shape[d])) * st[d] + f % st[d];
    if (idx[d] != 0 && (slice == last_slice || gen.uniform() < 0.25))
      p[f] = -std::numeric_limits<float>::infinity();
  }
  return t;
}

// softmax: the exp is ~1 ulp, the sum float32 (blocked or compensated) and one reciprocal and
// multiply per weight: weights <= 1 within 1e-6, as the kernel suite measures.
std::vector<OpCase> softmax_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, int64_t dim) {
    OpCase c;
    c.args["dim"] = dim;
    c.inputs = {x};
    c.tolerance = 1e-6;
    c.reference = [dim](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      return std::vector<Expected>{{x.shape(), f64::softmax(x.to_double_vector(), x.shape(), dim)}};
    };
    cases.push_back(c);
  };
  for (const int64_t n : kTails) {
    add(x_input({3, n}), -1);    // contiguous rows
    add(x_input({5, n}), 0);     // down columns, n of them: the column kernel's tails
    add(x_input({2, 4, n}), 1);  // an inner dim with outer batches
  }
  uint64_t seed = 50;
  add(OpInput("x", with_neg_inf({4, 17}, -1, seed++)), -1);
  add(OpInput("x", with_neg_inf({4, 17}, 1, seed++)), 1);
  add(OpInput("x", with_neg_inf({9, 33}, 0, seed++)), 0);
  add(OpInput("x", with_neg_inf({3, 7, 9}, 1, seed++)), -2);
  add(OpInput("x", with_neg_inf({2, 5, 3, 16}, 0, seed++)), -4);
  add(x_input({2, 3, 300}), 2);             // past several blocks of softmax_rows_f32's sum
  add(x_input({600, 2}), 0);                // a long column: the compensated sum
  add(x_input({2, 3, 520}), 1);             // 520 columns: 3 column tasks (256, 256, 8)
  add(x_input({4, 33}, Fill::offset), -1);  // mean 30: the max subtracted
  add(x_input({4, 33}, Fill::offset), 0);
  add(x_input({3, 1, 5}), 1);  // a dim of 1: weight 1 (inner 5)
  add(x_input({3, 5, 1}), 1);  // ... and an inner dim of 1: the row path
  add(x_input({}), 0);         // 0-d: one weight of 1
  add(x_input({}), -1);
  add(x_input({2, 0, 4}), 1);  // empty
  add(x_input({2, 0, 4}), -1);
  add(x_input({2, 9}).as(DType::BF16), -1);
  add(x_input({9, 4}).transposed(), 0);
  return cases;
}

// dropout in eval mode: the identity, exact.
std::vector<OpCase> dropout_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, const ojson& args) {
    OpCase c;
    c.args = args;
    c.inputs = {x};
    c.tolerance = 0.0;
    c.reference = [](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      return std::vector<Expected>{{x.shape(), x.to_double_vector()}};
    };
    cases.push_back(c);
  };
  for (const int64_t n : kTails) add(x_input({2, n}), ojson::object());
  add(x_input({2, 3, 17}), {{"p", 0.1}});
  add(x_input({4}), {{"p", 0.0}});
  add(x_input({4}), {{"p", 1.0}});  // p = 1 is legal; in eval mode it changes nothing
  add(x_input({3, 9}), {{"p", 0.5}, {"inplace", true}, {"training", false}});
  add(x_input({}), ojson::object());
  add(x_input({2, 0}), ojson::object());
  add(x_input({3, 5}).transposed(), ojson::object());
  add(x_input({40000}), ojson::object());  // several parallel chunks
  return cases;
}

// matmul: float32 dot products through the backend's GEMM, as linear (~sqrt(k) ulp of
// sum |a b|): 1e-5.
std::vector<OpCase> matmul_cases() {
  std::vector<OpCase> cases;
  auto add_inputs = [&](const OpInput& a, const OpInput& b) {
    OpCase c;
    c.inputs = {a, b};
    c.tolerance = 1e-5;
    c.reference = [](const Inputs& in, const Params&) {
      const Tensor &x = input(in, "a"), &y = input(in, "b");
      auto [shape, values] =
          f64::matmul(x.to_double_vector(), x.shape(), y.to_double_vector(), y.shape());
      return std::vector<Expected>{{shape, values}};
    };
    cases.push_back(c);
  };
  auto add = [&](const Shape& a, const Shape& b) { add_inputs({"a", a}, {"b", b}); };
  // 1-D x 1-D: a dot product, 0-d out.
  add({7}, {7});
  add({33}, {33});
  add({1}, {1});
  // A 1-D operand promoted and its dim removed, against 2-D and batched.
  add({5}, {5, 9});
  add({4, 17}, {17});
  add({8}, {2, 8, 3});
  add({2, 3, 16}, {16});
  add({3, 1, 4, 6}, {6});
  // 2-D, inner and outer dims across the tails.
  for (size_t i = 0; i < std::size(kTails); ++i)
    add({3, kTails[i]}, {kTails[i], kTails[(i + 3) % std::size(kTails)]});
  // Batched, with and without broadcasting of the batch dims.
  add({2, 3, 4}, {2, 4, 5});
  add({2, 1, 4, 3}, {5, 3, 2});
  add({3, 4}, {2, 4, 5});   // a broadcast over b's batch
  add({2, 5, 7}, {7, 16});  // b shared: one GEMM over the folded rows
  add({1, 5, 7}, {3, 7, 2});
  add({4, 1, 9}, {1, 9, 8});
  add({2, 2, 3, 8}, {2, 1, 8, 4});
  // Empty dims: k = 0 gives zeros; m, n or a batch of 0 gives nothing.
  add({3, 0}, {0, 4});
  add({0}, {0});
  add({0, 3}, {3, 4});
  add({2, 3}, {3, 0});
  add({0, 2, 3}, {3, 4});
  // Blocked work: 300 rows of 600 columns (3 row tasks of up to 128 rows); 8 rows of 2048
  // columns (2 column tasks); the fold over 3 batches (300 rows); k = 520, past OpenBLAS's
  // K blocking.
  add({300, 130}, {130, 600});
  add({8, 200}, {200, 2048});
  add({3, 100, 64}, {64, 300});
  add({40, 520}, {520, 70});
  add({4, 64, 64}, {4, 64, 64});  // attention-sized products, several per task
  add_inputs(OpInput("a", {5, 9}).transposed(), OpInput("b", {9, 6}).as(DType::F16));
  add_inputs(OpInput("a", {2, 4, 8}).as(DType::BF16), OpInput("b", {2, 8, 3}).transposed());
  return cases;
}

std::vector<OpCase> chunk_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, int64_t chunks, std::optional<int64_t> dim) {
    OpCase c;
    c.args["chunks"] = chunks;
    if (dim) c.args["dim"] = *dim;
    c.inputs = {x};
    c.tolerance = 0.0;
    c.reference = [chunks, d = dim.value_or(0)](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      const std::vector<double> xv = x.to_double_vector();
      const auto axis = static_cast<size_t>(wrap(d, x.shape().size()));
      Shape piece = x.shape();
      piece[axis] /= chunks;
      std::vector<Expected> out;
      for (int64_t i = 0; i < chunks; ++i) {
        Expected e{piece, {}};
        for (int64_t f = 0; f < shape_numel(piece); ++f) {
          std::vector<int64_t> idx = f64::unravel(f, piece);
          idx[axis] += i * piece[axis];
          e.values.push_back(element(xv, x.shape(), idx));
        }
        out.push_back(e);
      }
      return out;
    };
    cases.push_back(c);
  };
  add(x_input({2, 6, 16}), 2, -1);
  add(x_input({3, 33}), 3, -1);
  add(x_input({4, 9}), 2, std::nullopt);  // torch.chunk's default dim 0
  add(x_input({2, 6, 7}), 3, 1);
  add(x_input({2, 6, 7}), 2, -2);
  add(x_input({4, 2, 8}), 4, -3);
  add(x_input({17}), 1, 0);
  add(x_input({2, 15}), 5, 1);
  add(x_input({3, 2, 34}), 2, 2);
  add(x_input({2, 16}), 16, -1);
  add(x_input({6, 4}).transposed(), 2, -1);
  add(x_input({4, 6}).as(DType::F16), 3, 1);
  return cases;
}

std::vector<OpCase> concat_cases() {
  std::vector<OpCase> cases;
  auto add_inputs = [&](const std::vector<OpInput>& xs, std::optional<int64_t> dim) {
    OpCase c;
    if (dim) c.args["dim"] = *dim;
    c.inputs = xs;
    c.tolerance = 0.0;
    c.reference = [n = xs.size(), d = dim.value_or(0)](const Inputs& in, const Params&) {
      const Tensor& x0 = input(in, "x0");
      const auto axis = static_cast<size_t>(wrap(d, x0.shape().size()));
      Shape shape = x0.shape();
      shape[axis] = 0;
      std::vector<Shape> shapes;
      std::vector<std::vector<double>> values;
      for (size_t i = 0; i < n; ++i) {
        const Tensor& x = input(in, indexed("x", static_cast<int64_t>(i)));
        shapes.push_back(x.shape());
        values.push_back(x.to_double_vector());
        shape[axis] += x.shape()[axis];
      }
      Expected e{shape, {}};
      for (int64_t f = 0; f < shape_numel(shape); ++f) {
        std::vector<int64_t> idx = f64::unravel(f, shape);
        size_t i = 0;  // the part holding idx[axis]
        while (idx[axis] >= shapes[i][axis]) idx[axis] -= shapes[i++][axis];
        e.values.push_back(element(values[i], shapes[i], idx));
      }
      return std::vector<Expected>{e};
    };
    cases.push_back(c);
  };
  auto add = [&](const std::vector<Shape>& shapes, std::optional<int64_t> dim) {
    std::vector<OpInput> xs;
    for (size_t i = 0; i < shapes.size(); ++i)
      xs.emplace_back(indexed("x", static_cast<int64_t>(i)), shapes[i]);
    add_inputs(xs, dim);
  };
  add({{2, 7}, {2, 9}}, -1);
  add({{2, 8}, {2, 1}}, 1);
  add({{3, 2, 8}, {1, 2, 8}}, 0);
  add({{2, 1, 5}, {2, 4, 5}, {2, 3, 5}}, -2);
  add({{7}, {1}, {17}}, std::nullopt);  // torch.cat's default dim 0
  add({{2, 3, 16}, {2, 3, 17}}, -1);
  add({{2, 3, 4}, {2, 3, 4}}, -3);
  add({{1, 33}}, 1);  // one input
  add_inputs({OpInput("x0", {2, 7}).as(DType::F16), OpInput("x1", {2, 9}).transposed()}, 1);
  return cases;
}

// ---- the layout ops: tolerance 0, they copy floats.

OpCase layout_case(ojson args, const OpInput& x, ReferenceFn reference) {
  OpCase c;
  c.args = std::move(args);
  c.inputs = {x};
  c.tolerance = 0.0;
  c.reference = std::move(reference);
  return c;
}

// reshape, flatten, squeeze, unsqueeze keep the row-major order: the expected values are x's, in
// the shape each case writes out by hand.
OpCase same_order_case(ojson args, const OpInput& x, Shape out) {
  return layout_case(std::move(args), x, [out](const Inputs& in, const Params&) {
    return std::vector<Expected>{{out, input(in, "x").to_double_vector()}};
  });
}

// A case whose expected output is f64::<op>(x values, x shape).
template <class Fn>
OpCase reference_case(ojson args, const OpInput& x, Fn fn) {
  return layout_case(std::move(args), x, [fn](const Inputs& in, const Params&) {
    const Tensor& x = input(in, "x");
    const f64::Layout r = fn(x.to_double_vector(), x.shape());
    return std::vector<Expected>{{r.shape, r.values}};
  });
}

std::vector<OpCase> reshape_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, ojson shape, Shape out) {
    cases.push_back(same_order_case({{"shape", std::move(shape)}}, x, std::move(out)));
  };
  for (const int64_t n : kTails) add(x_input({3, n}), {n, -1}, {n, 3});
  add(x_input({2, 3, 4}), {-1, 4}, {6, 4});
  add(x_input({2, 3, 4}), {4, -1}, {4, 6});
  add(x_input({2, 3, 4}), {2, -1, 2, 3}, {2, 2, 2, 3});
  add(x_input({24}), {2, 3, 4}, {2, 3, 4});
  add(x_input({3, 33}), {99}, {99});
  add(x_input({1}), ojson::array(), {});  // one element to 0-d
  add(x_input({}), {1, 1, -1}, {1, 1, 1});
  add(x_input({7}), {7, 1}, {7, 1});
  add(x_input({0, 5}), {-1, 5}, {0, 5});  // empty
  add(x_input({0, 5}), {5, 0, 3}, {5, 0, 3});
  add(x_input({0, int64_t{1} << 40}), {-1, int64_t{1} << 20}, {0, int64_t{1} << 20});
  add(x_input({64, 1024}), {-1, 16}, {4096, 16});  // split over threads
  add(x_input({4, 9}).transposed(), {36}, {36});
  add(x_input({4, 6}).as(DType::F16), {2, -1, 3}, {2, 4, 3});
  return cases;
}

std::vector<OpCase> flatten_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, ojson args, Shape out) {
    cases.push_back(same_order_case(std::move(args), x, std::move(out)));
  };
  for (const int64_t n : kTails) add(x_input({2, 3, n}), {{"start_dim", 1}}, {2, 3 * n});
  add(x_input({2, 3, 4}), ojson::object(), {24});  // torch.flatten's start 0, end -1
  add(x_input({2, 3, 4}), {{"end_dim", 1}}, {6, 4});
  add(x_input({2, 3, 4, 5}), {{"start_dim", -3}, {"end_dim", -2}}, {2, 12, 5});
  add(x_input({2, 3, 4}), {{"start_dim", 1}, {"end_dim", 1}}, {2, 3, 4});
  add(x_input({}), ojson::object(), {1});  // 0-d becomes [1]
  add(x_input({2, 0, 3}), {{"start_dim", 1}}, {2, 0});
  add(x_input({3, 4}).transposed(), ojson::object(), {12});
  return cases;
}

std::vector<OpCase> permute_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, std::vector<int64_t> dims) {
    cases.push_back(
        reference_case({{"dims", dims}}, x, [dims](const std::vector<double>& v, const Shape& s) {
          std::vector<int64_t> w;
          for (int64_t d : dims) w.push_back(wrap(d, s.size()));
          return f64::permute(v, s, w);
        }));
  };
  for (const int64_t n : kTails) add(x_input({n, 7}), {1, 0});
  add(x_input({2, 3, 4}), {2, 0, 1});
  add(x_input({2, 17, 33}), {0, 2, 1});
  add(x_input({2, 3, 4}), {-1, 0, -2});
  add(x_input({2, 3, 4, 5}), {3, 1, 0, 2});
  add(x_input({2, 3, 4}), {0, 1, 2});  // identity
  // Swin's window partition: [B, H/w, w, W/w, w, C] -> [B, H/w, W/w, w, w, C].
  add(x_input({2, 2, 4, 2, 4, 3}), {0, 1, 3, 2, 4, 5});
  add(x_input({}), {});
  add(x_input({3, 0, 2}), {2, 1, 0});
  add(x_input({5, 40, 37}), {2, 0, 1});  // the source's contiguous dim first
  // Large enough to split over threads, the last dim moved (strided reads) and kept.
  add(x_input({8, 96, 64}), {0, 2, 1});
  add(x_input({64, 300, 3}), {1, 0, 2});
  add(x_input({5, 6}).transposed(), {1, 0});
  return cases;
}

std::vector<OpCase> transpose_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, int64_t d0, int64_t d1) {
    cases.push_back(reference_case({{"dim0", d0}, {"dim1", d1}}, x,
                                   [d0, d1](const std::vector<double>& v, const Shape& s) {
                                     std::vector<int64_t> dims;
                                     for (size_t k = 0; k < s.size(); ++k)
                                       dims.push_back(static_cast<int64_t>(k));
                                     if (!s.empty())
                                       std::swap(dims[static_cast<size_t>(wrap(d0, s.size()))],
                                                 dims[static_cast<size_t>(wrap(d1, s.size()))]);
                                     return f64::permute(v, s, dims);
                                   }));
  };
  for (const int64_t n : kTails) add(x_input({3, n}), 0, 1);
  add(x_input({2, 3, 4}), -1, -3);
  add(x_input({2, 5, 7}), 0, 2);
  add(x_input({2, 5, 7}), 1, 1);  // the same dim: a copy
  add(x_input({2, 16, 9}), 1, 2);
  add(x_input({}), 0, -1);                       // 0-d: dims in [-1, 0]
  add(x_input({3, 0, int64_t{1} << 40}), 0, 2);  // no elements, dims whose product overflows
  add(x_input({4, 7}).as(DType::BF16), 0, 1);
  return cases;
}

std::vector<OpCase> unsqueeze_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, int64_t dim, Shape out) {
    cases.push_back(same_order_case({{"dim", dim}}, x, std::move(out)));
  };
  for (const int64_t n : kTails) add(x_input({3, n}), 1, {3, 1, n});
  add(x_input({3, 4}), 0, {1, 3, 4});
  add(x_input({3, 4}), 2, {3, 4, 1});
  add(x_input({3, 4}), -1, {3, 4, 1});
  add(x_input({3, 4}), -3, {1, 3, 4});
  add(x_input({}), 0, {1});
  add(x_input({2, 0}), 1, {2, 1, 0});
  return cases;
}

std::vector<OpCase> squeeze_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, ojson args, Shape out) {
    cases.push_back(same_order_case(std::move(args), x, std::move(out)));
  };
  for (const int64_t n : kTails)
    add(x_input({1, n, 1}), ojson::object(), n == 1 ? Shape{} : Shape{n});
  add(x_input({1, 3, 1, 4}), ojson::object(), {3, 4});
  add(x_input({1, 3, 1, 4}), {{"dim", nullptr}}, {3, 4});
  add(x_input({1, 3, 1, 4}), {{"dim", 0}}, {3, 1, 4});
  add(x_input({1, 3, 1, 4}), {{"dim", -2}}, {1, 3, 4});
  add(x_input({1, 3, 1, 4}), {{"dim", 1}}, {1, 3, 1, 4});  // size 3: a no-op
  add(x_input({1, 3, 1, 4}), {{"dim", {0, 2}}}, {3, 4});
  add(x_input({1, 3, 1, 4}), {{"dim", {-4, 1}}}, {3, 1, 4});
  add(x_input({1, 1}), {{"dim", ojson::array()}}, {1, 1});
  add(x_input({}), {{"dim", 0}}, {});
  add(x_input({1, 0, 1}), ojson::object(), {0});
  return cases;
}

std::vector<OpCase> slice_cases() {
  std::vector<OpCase> cases;
  // Lists per sliced dim; f64::kNoStop for a stop of null.
  auto add = [&](const OpInput& x, ojson args, std::vector<int64_t> dims,
                 std::vector<int64_t> starts, std::vector<int64_t> stops,
                 std::vector<int64_t> steps) {
    cases.push_back(
        reference_case(std::move(args), x, [=](const std::vector<double>& v, const Shape& s) {
          std::vector<int64_t> w;
          for (int64_t d : dims) w.push_back(wrap(d, s.size()));
          return f64::slice(v, s, w, starts, stops, steps);
        }));
  };
  const int64_t none = f64::kNoStop;
  for (const int64_t n : kTails)
    add(x_input({3, n}), {{"dim", -1}, {"start", 1}}, {-1}, {1}, {none}, {1});
  add(x_input({4, 17}), {{"dim", 1}, {"start", 2}}, {1}, {2}, {none}, {1});
  add(x_input({4, 17}), {{"dim", -1}, {"stop", 10}, {"step", 3}}, {-1}, {0}, {10}, {3});
  add(x_input({5, 3}), {{"start", -3}}, {0}, {-3}, {none}, {1});  // default dim 0
  add(x_input({5, 3}), {{"dim", 0}, {"start", -5}, {"stop", -1}}, {0}, {-5}, {-1}, {1});
  add(x_input({5, 8}), {{"dim", 1}, {"start", 1}, {"stop", 100}, {"step", 2}}, {1}, {1}, {100},
      {2});                                                                   // stop clamped
  add(x_input({5, 8}), {{"dim", 1}, {"start", 10}}, {1}, {10}, {none}, {1});  // empty
  add(x_input({5, 8}), {{"dim", 1}, {"start", 3}, {"stop", 3}}, {1}, {3}, {3}, {1});
  add(x_input({5, 8}), {{"dim", 1}, {"start", 6}, {"stop", 2}}, {1}, {6}, {2}, {1});
  add(x_input({5, 8}), {{"dim", 1}, {"start", 2}, {"step", 100}}, {1}, {2}, {none}, {100});
  add(x_input({5, 8}), {{"dim", 0}, {"stop", nullptr}, {"step", 2}}, {0}, {0}, {none}, {2});
  // Swin's patch merging, x[..., 0::2, 1::2, :] and x[..., 1::2, 0::2, :].
  add(x_input({2, 8, 8, 3}), {{"dim", {1, 2}}, {"start", {0, 1}}, {"step", 2}}, {1, 2}, {0, 1},
      {none, none}, {2, 2});
  add(x_input({2, 8, 8, 3}), {{"dim", {-3, -2}}, {"start", {1, 0}}, {"step", {2, 2}}}, {-3, -2},
      {1, 0}, {none, none}, {2, 2});
  add(x_input({6, 9, 4}),
      {{"dim", {0, 1, 2}}, {"start", {0, 1, -3}}, {"stop", {nullptr, 5, 4}}, {"step", {1, 3, 2}}},
      {0, 1, 2}, {0, 1, -3}, {none, 5, 4}, {1, 3, 2});
  add(x_input({4, 9}), {{"dim", ojson::array()}}, {}, {}, {}, {});  // nothing sliced: a copy
  add(x_input({64, 512}), {{"dim", 1}, {"start", 1}, {"step", 2}}, {1}, {1}, {none}, {2});
  add(x_input({6, 5}).transposed(), {{"dim", 1}, {"start", 1}, {"stop", -1}}, {1}, {1}, {-1}, {1});
  return cases;
}

std::vector<OpCase> select_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, int64_t dim, int64_t index) {
    cases.push_back(reference_case({{"dim", dim}, {"index", index}}, x,
                                   [=](const std::vector<double>& v, const Shape& s) {
                                     return f64::select(v, s, wrap(dim, s.size()), index);
                                   }));
  };
  for (const int64_t n : kTails) add(x_input({2, 3, n}), 1, 2);
  add(x_input({2, 17, 33}), 1, 0);  // ViT's class token, x[:, 0]
  add(x_input({2, 3, 4}), 0, -1);
  add(x_input({2, 3, 4}), -1, 0);
  add(x_input({2, 3, 4}), -1, -4);
  add(x_input({5}), 0, 3);  // to 0-d
  add(x_input({5}), 0, -5);
  add(x_input({3, 0}), 0, 1);
  add(x_input({4, 6}).transposed(), 1, 2);
  return cases;
}

std::vector<OpCase> roll_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, ojson args, std::vector<int64_t> shifts,
                 std::vector<int64_t> dims) {
    cases.push_back(
        reference_case(std::move(args), x, [=](const std::vector<double>& v, const Shape& s) {
          std::vector<int64_t> w;
          for (int64_t d : dims) w.push_back(wrap(d, s.size()));
          return f64::Layout{s, f64::roll(v, s, shifts, w)};
        }));
  };
  for (const int64_t n : kTails) add(x_input({3, n}), {{"shifts", 5}, {"dims", -1}}, {5}, {-1});
  add(x_input({2, 3, 4}), {{"shifts", 1}, {"dims", 0}}, {1}, {0});
  add(x_input({2, 3, 4}), {{"shifts", -1}, {"dims", -1}}, {-1}, {-1});
  add(x_input({2, 3, 4}), {{"shifts", {1, 2}}, {"dims", {0, 2}}}, {1, 2}, {0, 2});
  add(x_input({2, 3, 4}), {{"shifts", 7}}, {7}, {});      // flattened
  add(x_input({2, 3, 4}), {{"shifts", -25}}, {-25}, {});  // flattened, |shift| > numel
  add(x_input({2, 3, 4}), {{"shifts", ojson::array({5})}, {"dims", ojson::array()}}, {5}, {});
  add(x_input({2, 3, 4}), {{"shifts", 10}, {"dims", 1}}, {10}, {1});  // shift > size
  add(x_input({2, 3, 4}), {{"shifts", {1, 1}}, {"dims", {1, 1}}}, {1, 1}, {1, 1});
  add(x_input({2, 3, 4}), {{"shifts", -1000000007}, {"dims", 2}}, {-1000000007}, {2});
  // Swin's cyclic shift of the window grid: torch.roll(x, (-3, -3), (1, 2)).
  add(x_input({2, 8, 8, 3}), {{"shifts", {-3, -3}}, {"dims", {1, 2}}}, {-3, -3}, {1, 2});
  add(x_input({2, 0, 3}), {{"shifts", 1}, {"dims", 1}}, {1}, {1});
  add(x_input({}), {{"shifts", 3}}, {3}, {});
  add(x_input({64, 512}), {{"shifts", {3, -100}}, {"dims", {0, 1}}}, {3, -100}, {0, 1});
  add(x_input({5, 4}).transposed(), {{"shifts", 2}, {"dims", 0}}, {2}, {0});
  return cases;
}

std::vector<OpCase> pad_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, std::vector<int64_t> pad, std::optional<double> value) {
    ojson args = {{"pad", pad}};
    if (value) args["value"] = *value;
    cases.push_back(
        reference_case(std::move(args), x, [=](const std::vector<double>& v, const Shape& s) {
          return f64::pad(v, s, pad, value.value_or(0.0));
        }));
  };
  for (const int64_t n : kTails) add(x_input({3, n}), {1, 2}, std::nullopt);
  add(x_input({2, 3, 4}), {1, 1, 2, 0}, 2.5);
  add(x_input({2, 3, 4}), {-1, 2}, std::nullopt);  // crop left, pad right
  add(x_input({2, 3, 4}), {1, -2, -1, 1}, -1.0);
  add(x_input({2, 3, 4}), {0, 0, 0, 0, 1, 1}, std::nullopt);  // dim 0 only
  add(x_input({2, 3, 4}), {}, std::nullopt);                  // a copy
  add(x_input({2, 5}), {-1, -1}, std::nullopt);               // crop only
  add(x_input({2, 3}), {-3, 0}, std::nullopt);                // cropped to 0
  add(x_input({2, 3}), {-3, 2}, 7.0);                         // all of x cropped, 2 pad values
  // Swin pads H and W up to a multiple of the window: [B, H, W, C].
  add(x_input({1, 5, 6, 3}), {0, 0, 0, 2, 0, 3}, std::nullopt);
  add(x_input({}), {}, std::nullopt);
  add(x_input({0, 3}), {0, 0, 1, 1}, 3.0);  // nothing of x, two rows of the value
  add(x_input({64, 500}), {6, 6, 1, 1}, 0.5);
  add(x_input({3, 7}).transposed(), {2, 1}, std::nullopt);
  return cases;
}

std::vector<OpCase> expand_cases() {
  std::vector<OpCase> cases;
  // sizes as given to the op; out: the shape it means, written out.
  auto add = [&](const OpInput& x, std::vector<int64_t> sizes, Shape out) {
    cases.push_back(
        reference_case({{"sizes", sizes}}, x, [=](const std::vector<double>& v, const Shape& s) {
          return f64::Layout{out, f64::expand(v, s, out)};
        }));
  };
  for (const int64_t n : kTails) add(x_input({1, n}), {3, n}, {3, n});
  add(x_input({1, 3}), {4, 3}, {4, 3});
  add(x_input({1, 3}), {2, -1, -1}, {2, 1, 3});  // a new leading dim
  add(x_input({3, 1}), {3, 17}, {3, 17});
  add(x_input({3, 1}), {-1, 33}, {3, 33});
  add(x_input({1, 1, 8}), {2, -1, -1}, {2, 1, 8});  // ViT's class_token.expand(B, -1, -1)
  add(x_input({2, 1, 4}), {3, 2, 5, 4}, {3, 2, 5, 4});
  add(x_input({2, 3}), {2, 3}, {2, 3});
  add(x_input({1}), {0}, {0});
  add(x_input({}), {2, 3}, {2, 3});
  add(x_input({1, 1, 64}), {128, 64, -1}, {128, 64, 64});  // split over threads
  add(x_input({4, 1}).as(DType::F16), {-1, 9}, {4, 9});
  return cases;
}

// The `attention` op's args for these options (defaults left out).
ojson attention_args(const AttentionOptions& o) {
  ojson a;
  a["heads"] = o.heads;
  if (o.causal) a["causal"] = true;
  if (o.dropout != 0.0) a["dropout"] = o.dropout;
  if (!o.bias) a["bias"] = false;
  if (!o.qkv_bias) a["qkv_bias"] = false;
  if (!o.out_bias) a["out_bias"] = false;
  if (o.rope) a["rope"] = true;
  if (o.relative_position_bias) {
    a["relative_position_bias"] = true;
    // An int applies to both axes: write the square grids that way.
    a["spatial_shape"] =
        o.spatial_h == o.spatial_w ? ojson(o.spatial_h) : ojson::array({o.spatial_h, o.spatial_w});
  }
  return a;
}

std::vector<OpCase> attention_cases() {
  std::vector<OpCase> cases;
  auto add = [&](const OpInput& x, AttentionOptions o) {
    OpCase c;
    c.args = attention_args(o);
    c.inputs = {x};
    c.reference = [o](const Inputs& in, const Params& p) {
      const Tensor& x = input(in, "x");
      return std::vector<Expected>{{x.shape(), f64::attention(o, p, x)}};
    };
    cases.push_back(c);
  };
  auto heads = [](int64_t h) {
    AttentionOptions o;
    o.heads = h;
    return o;
  };
  auto grid = [&](int64_t h, int64_t gh, int64_t gw) {
    AttentionOptions o = heads(h);
    o.relative_position_bias = true;
    o.spatial_h = gh;
    o.spatial_w = gw;
    return o;
  };
  add(x_input({2, 7, 8}), heads(1));
  add(x_input({1, 9, 16}), with(heads(2), [](auto& o) { o.causal = true; }));
  add(x_input({2, 17, 16}), with(heads(2), [](auto& o) { o.rope = true; }));
  add(x_input({2, 33, 32}), with(heads(4), [](auto& o) { o.rope = o.causal = true; }));
  add(x_input({3, 5, 7}), heads(1));                                            // head_dim 7
  add(x_input({1, 8, 9}), with(heads(3), [](auto& o) { o.causal = true; }));    // head_dim 3
  add(x_input({1, 16, 34}), heads(2));                                          // head_dim 17
  add(x_input({1, 15, 30}), heads(2));                                          // head_dim 15
  add(x_input({1, 10, 2}), heads(2));                                           // head_dim 1
  add(x_input({2, 12, 33}), with(heads(1), [](auto& o) { o.causal = true; }));  // head_dim 33
  add(x_input({1, 20, 132}), with(heads(2), [](auto& o) { o.rope = true; }));   // head_dim 66
  add(x_input({1, 9, 129}), heads(1));                                          // head_dim 129
  add(x_input({1, 1, 16}),
      with(heads(1), [](auto& o) { o.rope = true; }));  // T = 1: the angle is 0
  add(x_input({2, 15, 16}), grid(2, 3, 5));
  add(x_input({1, 16, 16}), with(grid(2, 4, 4), [](auto& o) {
        o.rope = o.causal = true;
        o.bias = false;
      }));
  add(x_input({2, 7, 8}), with(grid(1, 1, 7), [](auto& o) { o.qkv_bias = false; }));
  add(x_input({1, 6, 32}), with(grid(4, 2, 3), [](auto& o) {
        o.out_bias = false;
        o.causal = true;
      }));
  add(x_input({2, 8, 16}),
      with(heads(2), [](auto& o) { o.qkv_bias = false; }));                     // ViT-style biases
  add(x_input({2, 9, 16}), with(heads(2), [](auto& o) { o.dropout = 0.25; }));  // eval: no dropout
  // The packed linear kernel for the q/k/v projection: 128 rows x 64 -> 192.
  add(x_input({2, 64, 64}), with(heads(4), [](auto& o) { o.rope = true; }));
  // ... and for o_proj too: 256 rows x 64 -> 64.
  add(x_input({4, 64, 64}), with(heads(4), [](auto& o) { o.rope = o.causal = true; }));
  // Two query tiles of the fused kernel (256 rows + 4).
  add(x_input({1, 260, 16}), with(heads(1), [](auto& o) { o.causal = true; }));
  add(x_input({2, 9, 16}).as(DType::F16), with(heads(2), [](auto& o) { o.rope = true; }));
  add(x_input({2, 8, 16}).transposed(), grid(2, 2, 4));
  return cases;
}

// The `multihead_attention` op's args for these options and call flags (defaults left out).
ojson mha_args(const MultiheadAttentionOptions& o, const MhaCall& call) {
  ojson a;
  a["embed_dim"] = o.embed_dim;
  a["num_heads"] = o.num_heads;
  if (o.dropout != 0.0) a["dropout"] = o.dropout;
  if (!o.bias) a["bias"] = false;
  if (o.add_bias_kv) a["add_bias_kv"] = true;
  if (o.add_zero_attn) a["add_zero_attn"] = true;
  if (o.kdim) a["kdim"] = *o.kdim;
  if (o.vdim) a["vdim"] = *o.vdim;
  if (o.batch_first) a["batch_first"] = true;
  if (!call.need_weights) a["need_weights"] = false;
  if (!call.average_attn_weights) a["average_attn_weights"] = false;
  if (call.is_causal) a["is_causal"] = true;
  return a;
}

// A bool mask of this shape, true (masked) where masked(flat index).
template <class Fn>
Tensor bool_mask(const Shape& shape, Fn masked) {
  Tensor m = Tensor::zeros(shape, DType::Bool);
  auto* p = static_cast<uint8_t*>(m.raw_data());
  for (int64_t i = 0; i < m.numel(); ++i) p[i] = masked(i) ? 1 : 0;
  return m;
}

std::vector<OpCase> multihead_attention_cases() {
  std::vector<OpCase> cases;
  // inputs: query, and any of key, value, key_padding_mask, attn_mask.
  auto add = [&](const MultiheadAttentionOptions& o, const MhaCall& call,
                 std::vector<OpInput> inputs) {
    OpCase c;
    c.args = mha_args(o, call);
    c.inputs = std::move(inputs);
    c.reference = [o, call](const Inputs& in, const Params& p) {
      const Tensor& q = input(in, "query");
      const f64::MhaReference r = f64::multihead_attention(
          o, p, q, input(in, "key"), input(in, "value"), input(in, "key_padding_mask"),
          input(in, "attn_mask"), call.is_causal);
      std::vector<Expected> out{{with_last(q.shape(), o.embed_dim), r.out}};
      if (call.need_weights) {
        Shape w;
        if (q.dim() == 3) w.push_back(r.N);
        if (!call.average_attn_weights) w.push_back(r.H);
        w.push_back(r.L);
        w.push_back(r.Sp);
        out.push_back({w, r.returned_weights(call.average_attn_weights)});
      }
      return out;
    };
    cases.push_back(c);
  };
  auto opts = [](int64_t E, int64_t H) {
    MultiheadAttentionOptions o;
    o.embed_dim = E;
    o.num_heads = H;
    return o;
  };
  const MhaCall averaged;  // need_weights, averaged over heads
  const MhaCall fused{false, true, false};
  const MhaCall per_head{true, false, false};
  const MultiheadAttentionOptions e8 = opts(8, 2);
  const Fill kBool = Fill::bool_mask, kFloat = Fill::float_mask;

  // Self-attention (one packed projection), each way of returning weights.
  add(e8, averaged, {{"query", {5, 2, 8}}});
  add(e8, fused, {{"query", {5, 2, 8}}});
  add(e8, per_head, {{"query", {5, 2, 8}}});
  // batch_first; separate key and value; unbatched (value defaults to key).
  add(with(e8, [](auto& o) { o.batch_first = true; }), averaged,
      {{"query", {2, 5, 8}}, {"key", {2, 7, 8}}, {"value", {2, 7, 8}}});
  add(e8, per_head, {{"query", {4, 8}}, {"key", {6, 8}}});
  // kdim / vdim: separate q/k/v weights.
  add(with(e8,
           [](auto& o) {
             o.kdim = 5;
             o.vdim = 7;
           }),
      averaged, {{"query", {3, 2, 8}}, {"key", {6, 2, 5}}, {"value", {6, 2, 7}}});
  add(with(e8, [](auto& o) { o.vdim = 3; }), fused,
      {{"query", {3, 2, 8}}, {"key", {6, 2, 8}}, {"value", {6, 2, 3}}});
  // Appended key/value positions.
  add(with(e8, [](auto& o) { o.add_bias_kv = true; }), per_head,
      {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}});
  add(with(e8, [](auto& o) { o.add_zero_attn = true; }), averaged, {{"query", {4, 2, 8}}});
  add(with(e8, [](auto& o) { o.add_bias_kv = o.add_zero_attn = true; }), averaged,
      {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}, {"key_padding_mask", {2, 5}, kBool}});
  // Masks: bool and float key_padding_mask and attn_mask, 2-D and 3-D.
  add(e8, averaged,
      {{"query", {4, 2, 8}}, {"key", {6, 2, 8}}, {"key_padding_mask", {2, 6}, kFloat}});
  add(e8, per_head, {{"query", {4, 2, 8}}, {"key", {6, 2, 8}}, {"attn_mask", {4, 6}, kFloat}});
  add(e8, averaged, {{"query", {4, 2, 8}}, {"key", {6, 2, 8}}, {"attn_mask", {4, 4, 6}, kBool}});
  add(e8, fused,
      {{"query", {4, 2, 8}},
       {"key", {6, 2, 8}},
       {"attn_mask", {4, 4, 6}, kFloat},
       {"key_padding_mask", {2, 6}, kBool}});
  // Fully masked rows attend to nothing: zero weights, output = out_proj.bias. Batch 1's keys
  // all padded; attn_mask row 2 all masked.
  const Tensor pad_batch1 = bool_mask({2, 5}, [](int64_t i) { return i >= 5; });
  const Tensor row2 = bool_mask({4, 5}, [](int64_t i) { return i / 5 == 2; });
  add(e8, averaged, {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}, {"key_padding_mask", pad_batch1}});
  add(e8, fused, {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}, {"key_padding_mask", pad_batch1}});
  add(e8, per_head, {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}, {"attn_mask", row2}});
  add(e8, fused, {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}, {"attn_mask", row2}});
  // A mask S' wide (bias_k's column included) is applied as given.
  add(with(e8, [](auto& o) { o.add_bias_kv = true; }), averaged,
      {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}, {"attn_mask", {4, 6}, kFloat}});
  // is_causal: upper-left aligned when L != S; only a hint when an attn_mask is given.
  add(e8, MhaCall{true, true, true}, {{"query", {5, 2, 8}}, {"key", {7, 2, 8}}});
  add(e8, MhaCall{true, false, true},
      {{"query", {5, 2, 8}}, {"key", {7, 2, 8}}, {"attn_mask", {5, 7}, kFloat}});
  add(with(e8, [](auto& o) { o.batch_first = true; }), MhaCall{false, true, true},
      {{"query", {2, 9, 8}}});
  add(with(e8, [](auto& o) { o.add_zero_attn = true; }), MhaCall{true, true, true},
      {{"query", {5, 2, 8}}, {"key_padding_mask", {2, 5}, kBool}});
  // No biases; dropout (eval: none applied).
  add(with(e8, [](auto& o) { o.bias = false; }), averaged,
      {{"query", {5, 2, 8}}, {"key", {3, 2, 8}}});
  add(with(e8, [](auto& o) { o.dropout = 0.3; }), averaged, {{"query", {5, 2, 8}}});
  // Tails along E and head_dim: E 17 (one head), E 33 (head_dim 11), E 16 unbatched.
  add(opts(17, 1), averaged, {{"query", {9, 1, 17}}});
  add(opts(4, 4), averaged, {{"query", {5, 2, 4}}, {"key", {3, 2, 4}}});  // head_dim 1
  add(opts(65, 1), fused, {{"query", {6, 1, 65}}, {"key", {20, 1, 65}}});
  add(opts(130, 2), per_head, {{"query", {6, 1, 130}}, {"key", {20, 1, 130}}});
  add(opts(33, 3), per_head, {{"query", {7, 2, 33}}, {"key", {16, 2, 33}}});
  add(opts(16, 2), fused, {{"query", {15, 16}}, {"key_padding_mask", {15}, kBool}});
  add(opts(16, 4), MhaCall{true, false, false},
      {{"query", {16, 16}}, {"attn_mask", {4, 16, 16}, kFloat}});
  // The packed linear kernel for the in-projection (96 rows x 64 -> 192).
  add(opts(64, 4), averaged, {{"query", {48, 2, 64}}});
  add(opts(64, 4), fused, {{"query", {48, 2, 64}}});
  // Separate k and v projections, k's through the packed kernel (128 rows x 130 -> 64); k and v
  // from one tensor (128 rows x 64 -> 2 x 64); batch_first through the packed kernel.
  add(with(opts(64, 4),
           [](auto& o) {
             o.kdim = 130;
             o.vdim = 32;
           }),
      averaged, {{"query", {8, 1, 64}}, {"key", {128, 1, 130}}, {"value", {128, 1, 32}}});
  add(opts(64, 4), fused, {{"query", {8, 1, 64}}, {"key", {128, 1, 64}}});
  add(with(opts(64, 4), [](auto& o) { o.batch_first = true; }), per_head, {{"query", {2, 48, 64}}});
  // Appended positions with every mask form: 3-D attn_mask S or S' wide, unbatched, causal.
  const MultiheadAttentionOptions both =
      with(e8, [](auto& o) { o.add_bias_kv = o.add_zero_attn = true; });
  add(both, per_head, {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}, {"attn_mask", {4, 4, 5}, kBool}});
  add(both, fused, {{"query", {4, 2, 8}}, {"key", {5, 2, 8}}, {"attn_mask", {4, 4, 7}, kFloat}});
  add(both, averaged,
      {{"query", {4, 8}},
       {"key", {5, 8}},
       {"attn_mask", {2, 4, 5}, kFloat},
       {"key_padding_mask", {5}, kFloat}});
  add(with(e8, [](auto& o) { o.add_bias_kv = true; }), MhaCall{true, false, true},
      {{"query", {5, 2, 8}}, {"key", {7, 2, 8}}});
  add(both, MhaCall{false, true, true}, {{"query", {7, 2, 8}}, {"key", {5, 2, 8}}});
  // One network input as query, key and value is self-attention (one packed projection), as is
  // query alone; the same shapes from separate inputs are not.
  add(with(e8, [](auto& o) { o.add_bias_kv = true; }), averaged,
      {{"query", {6, 2, 8}}, OpInput::alias("key", "query"), OpInput::alias("value", "query")});
  add(e8, fused, {{"query", {6, 2, 8}}, {"key", {6, 2, 8}}, OpInput::alias("value", "query")});
  add(e8, per_head, {{"query", {6, 2, 8}}, {"key", {6, 2, 8}}, {"value", {6, 2, 8}}});
  add(with(e8, [](auto& o) { o.batch_first = true; }), averaged,
      {{"query", {2, 6, 8}}, {"key", {2, 6, 8}}, OpInput::alias("value", "key")});
  // Query tiles sized from S: at S = 1000, 131 rows (averaged weights), 65 (per head); 300 rows
  // are two tiles and a tail on each.
  add(e8, averaged, {{"query", {300, 1, 8}}, {"key", {1000, 1, 8}}});
  add(e8, per_head, {{"query", {300, 1, 8}}, {"key", {1000, 1, 8}}});
  add(e8, fused, {{"query", {300, 1, 8}}, {"key", {1000, 1, 8}}});
  // Query tiles: 260 rows are a 256-row tile and a 4-row one, on every path.
  add(e8, averaged, {{"query", {260, 1, 8}}, {"key", {9, 1, 8}}});
  add(e8, per_head, {{"query", {260, 1, 8}}, {"key", {9, 1, 8}}});
  add(e8, fused, {{"query", {260, 1, 8}}, {"key", {9, 1, 8}}});
  // Stored dtypes and strides: floats converted by the plan, masks handed over strided.
  add(e8, averaged,
      {OpInput("query", {4, 2, 8}).as(DType::F64), OpInput("key", {6, 2, 8}).transposed(),
       OpInput("value", {6, 2, 8}).as(DType::BF16),
       OpInput("key_padding_mask", {2, 6}, kBool).transposed()});
  add(e8, per_head,
      {{"query", {4, 2, 8}},
       {"key", {6, 2, 8}},
       OpInput("attn_mask", {4, 6}, kFloat).transposed()});
  add(e8, fused,
      {{"query", {4, 2, 8}}, {"key", {6, 2, 8}}, OpInput("attn_mask", {4, 6}, kBool).transposed()});
  // No keys at all (S = 0): every query attends to nothing, unless a zero position is appended.
  add(e8, averaged, {{"query", {4, 2, 8}}, {"key", {0, 2, 8}}});
  add(with(e8, [](auto& o) { o.add_zero_attn = true; }), fused,
      {{"query", {4, 2, 8}}, {"key", {0, 2, 8}}});
  return cases;
}

// An int-or-pair argument as torch's _pair reads it; `def` when absent.
std::pair<int64_t, int64_t> pair_arg(const ojson& args, const char* name, int64_t def) {
  if (!args.contains(name)) return {def, def};
  const ojson& v = args[name];
  if (v.is_array()) return {v[0].get<int64_t>(), v[1].get<int64_t>()};
  return {v.get<int64_t>(), v.get<int64_t>()};
}

std::vector<OpCase> conv2d_cases() {
  std::vector<OpCase> cases;
  // `args` without in_channels (x's channel dim); the geometry as nn.Conv2d reads the args.
  auto add = [&](const OpInput& x, const ojson& args) {
    const bool batched = x.shape.size() == 4;
    f64::Conv2dGeometry g;
    g.batch = batched ? x.shape[0] : 1;
    g.channels = x.shape[batched ? 1 : 0];
    g.height = x.shape[batched ? 2 : 1];
    g.width = x.shape[batched ? 3 : 2];
    g.out_channels = args["out_channels"].get<int64_t>();
    std::tie(g.kernel_h, g.kernel_w) = pair_arg(args, "kernel_size", 0);
    std::tie(g.stride_h, g.stride_w) = pair_arg(args, "stride", 1);
    std::tie(g.dilation_h, g.dilation_w) = pair_arg(args, "dilation", 1);
    g.groups = args.value("groups", int64_t{1});
    if (args.contains("padding") && args["padding"].is_string()) {
      if (args["padding"] == "same") {
        // PyTorch's 'same': dilation * (kernel - 1) zeros, the odd one after.
        const int64_t th = g.dilation_h * (g.kernel_h - 1), tw = g.dilation_w * (g.kernel_w - 1);
        g.pad_top = th / 2;
        g.pad_bottom = th - th / 2;
        g.pad_left = tw / 2;
        g.pad_right = tw - tw / 2;
      }
    } else {
      std::tie(g.pad_top, g.pad_left) = pair_arg(args, "padding", 0);
      g.pad_bottom = g.pad_top;
      g.pad_right = g.pad_left;
    }
    const bool bias = args.value("bias", true);
    OpCase c;
    c.args = ojson{{"in_channels", g.channels}};
    for (const auto& [key, value] : args.items()) c.args[key] = value;
    c.inputs = {x};
    c.reference = [g, bias, batched](const Inputs& in, const Params& p) {
      BOOST_TEST(p.count("bias") == (bias ? 1u : 0u));
      Shape out = {g.out_channels, g.out_h(), g.out_w()};
      if (batched) out.insert(out.begin(), g.batch);
      return std::vector<Expected>{
          {out, f64::conv2d(g, input(in, "x").to_double_vector(), f64::param(p, "weight"),
                            f64::param(p, "bias"))}};
    };
    cases.push_back(c);
  };
  auto k3 = [](int64_t out) { return ojson{{"out_channels", out}, {"kernel_size", 3}}; };
  auto with_args = [](ojson a, const ojson& more) {
    for (const auto& [key, value] : more.items()) a[key] = value;
    return a;
  };
  // The GEMM paths (layers/conv.cpp, conv_layout): OpenBLAS; the packed kernel from 32 channels
  // per group and 1024 patches per forward; 1x1 stride-1 unpadded kernels on the input in place.
  // Every tail as the output width (3x3, padding 1), against another tail of output channels.
  for (size_t i = 0; i < std::size(kTails); ++i)
    add(x_input({2, 3, 4 + static_cast<int64_t>(i % 3), kTails[i]}),
        with_args(k3(kTails[(i + 3) % std::size(kTails)]), {{"padding", 1}}));
  // Stride, padding (int, pair, 'same' with odd and even kernels, 'valid'), dilation.
  add(x_input({2, 4, 9, 9}), with_args(k3(8), {{"stride", 2}, {"padding", 1}}));
  add(x_input({1, 3, 8, 7}),
      {{"out_channels", 5}, {"kernel_size", {3, 2}}, {"stride", {2, 1}}, {"padding", {0, 2}}});
  add(x_input({2, 3, 6, 7}), with_args(k3(4), {{"padding", "same"}}));
  add(x_input({1, 2, 5, 6}), {{"out_channels", 3}, {"kernel_size", 4}, {"padding", "same"}});
  add(x_input({2, 3, 7, 9}),
      {{"out_channels", 4}, {"kernel_size", {4, 2}}, {"dilation", {1, 3}}, {"padding", "same"}});
  add(x_input({1, 3, 9, 8}), with_args(k3(34), {{"padding", "same"}, {"dilation", 2}}));
  add(x_input({2, 4, 24, 24}), with_args(k3(33), {{"padding", "same"}, {"dilation", 2}}));
  add(x_input({2, 3, 7, 8}), with_args(k3(4), {{"padding", "valid"}}));
  add(x_input({2, 3, 11, 10}), with_args(k3(6), {{"dilation", 2}}));
  add(x_input({1, 3, 12, 11}), {{"out_channels", 5},
                                {"kernel_size", {2, 3}},
                                {"dilation", {3, 2}},
                                {"padding", {2, 1}},
                                {"stride", {2, 3}}});
  // Groups: two; three of 32 output channels each (a whole panel per group: the packed kernel at
  // 1152 patches); depthwise, and depthwise with two filters per channel.
  add(x_input({2, 4, 7, 9}), with_args(k3(6), {{"groups", 2}, {"padding", 1}}));
  add(x_input({1, 6, 9, 8}), with_args(k3(96), {{"groups", 3}, {"padding", 1}}));
  add(x_input({2, 6, 24, 24}), with_args(k3(96), {{"groups", 3}, {"padding", 1}}));
  add(x_input({2, 8, 9, 17}), with_args(k3(8), {{"groups", 8}, {"padding", 1}}));
  add(x_input({1, 4, 7, 7}),
      {{"out_channels", 8}, {"kernel_size", 5}, {"groups", 4}, {"padding", 2}});
  // No bias, on both GEMM paths.
  add(x_input({2, 3, 25, 25}), with_args(k3(40), {{"bias", false}}));
  add(x_input({2, 3, 8, 9}), with_args(k3(5), {{"bias", false}}));
  // Unbatched [C, H, W].
  add(x_input({3, 10, 9}), with_args(k3(6), {{"padding", 1}}));
  add(x_input({3, 9, 8}), {{"out_channels", 33}, {"kernel_size", {2, 3}}, {"stride", 2}});
  add(x_input({3, 40, 40}), {{"out_channels", 33}, {"kernel_size", {2, 3}}});
  // Patch embeddings (kernel = stride): ViT's 16x16 and Swin's 4x4 on 64x64 images, ViT-B/16's
  // geometry at 224 (196 patches of 768), a size the patches do not tile (30 = 7*4 + 2), and
  // Swin-T's 96 channels over 1024 patches (the packed kernel).
  add(x_input({2, 3, 64, 64}), {{"out_channels", 48}, {"kernel_size", 16}, {"stride", 16}});
  add(x_input({2, 3, 64, 64}), {{"out_channels", 24}, {"kernel_size", 4}, {"stride", 4}});
  add(x_input({1, 3, 224, 224}), {{"out_channels", 64}, {"kernel_size", 16}, {"stride", 16}});
  add(x_input({2, 3, 30, 30}), {{"out_channels", 40}, {"kernel_size", 4}, {"stride", 4}});
  add(x_input({4, 3, 64, 64}),
      {{"out_channels", 96}, {"kernel_size", 4}, {"stride", {4, 4}}, {"padding", "valid"}});
  // Odd sizes; a kernel as large as the padded input (a 1x1 output); 1x1 kernels, in place
  // (grouped too) and gathered (strided, padded: a border of bias only).
  add(x_input({3, 5, 13, 17}), {{"out_channels", 7},
                                {"kernel_size", {5, 3}},
                                {"stride", {3, 2}},
                                {"padding", {2, 1}},
                                {"dilation", {1, 2}}});
  add(x_input({1, 2, 3, 3}), {{"out_channels", 3}, {"kernel_size", 5}, {"padding", 1}});
  add(x_input({2, 3, 1, 1}), {{"out_channels", 9}, {"kernel_size", 1}});
  add(x_input({2, 16, 5, 7}), {{"out_channels", 64}, {"kernel_size", 1}});
  add(x_input({2, 8, 5, 9}), {{"out_channels", 12}, {"kernel_size", 1}, {"groups", 4}});
  add(x_input({2, 8, 9, 9}), {{"out_channels", 16}, {"kernel_size", 1}, {"stride", 2}});
  add(x_input({1, 4, 3, 5}), {{"out_channels", 6}, {"kernel_size", 1}, {"padding", 1}});
  add(x_input({1, 2, 1, 33}), {{"out_channels", 4}, {"kernel_size", {1, 3}}, {"padding", {0, 1}}});
  // Kernel widths the gather has no fixed-size copy for (6, 9), and the other fixed ones (7, 8,
  // 14, 32; 1 to 5 are above).
  add(x_input({1, 3, 12, 13}),
      {{"out_channels", 5}, {"kernel_size", {2, 6}}, {"stride", {1, 2}}, {"padding", {0, 2}}});
  add(x_input({2, 2, 9, 20}), {{"out_channels", 3}, {"kernel_size", {1, 9}}, {"stride", 3}});
  add(x_input({1, 2, 14, 15}), {{"out_channels", 6}, {"kernel_size", 7}, {"stride", 7}});
  add(x_input({1, 2, 9, 17}), {{"out_channels", 4}, {"kernel_size", 8}, {"padding", {0, 1}}});
  add(x_input({1, 3, 28, 28}), {{"out_channels", 8}, {"kernel_size", 14}, {"stride", 14}});
  add(x_input({1, 1, 32, 64}), {{"out_channels", 2}, {"kernel_size", 32}, {"stride", 32}});
  // Two blocks of output rows (2^20 floats of patches each: 87 rows of 30 patches of 400), the
  // first holding two whole images and part of the third; both GEMM paths.
  add(x_input({3, 16, 30, 30}), {{"out_channels", 40}, {"kernel_size", 5}, {"padding", 2}});
  add(x_input({3, 16, 30, 30}), {{"out_channels", 8}, {"kernel_size", 5}, {"padding", 2}});
  // One output row over the block size: blocks of a single row.
  add(x_input({1, 64, 5, 1027}), {{"out_channels", 8}, {"kernel_size", 4}});
  // An empty batch; stored dtypes and strides the plan converts.
  add(x_input({0, 3, 8, 8}), k3(4));
  add(x_input({2, 3, 7, 9}).as(DType::F16), k3(4));
  add(x_input({2, 3, 8, 6}).transposed(), with_args(k3(4), {{"padding", 1}}));
  return cases;
}

std::vector<OpCase> mean_cases() {
  std::vector<OpCase> cases;
  // dim: left out when nullopt, else as given (an int, a list or null).
  auto add = [&](const OpInput& x, std::optional<ojson> dim, bool keepdim) {
    OpCase c;
    if (dim) c.args["dim"] = *dim;
    if (keepdim) c.args["keepdim"] = true;
    c.inputs = {x};
    c.tolerance = 1e-7;
    c.reference = [dim, keepdim](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      const Shape& s = x.shape();
      std::vector<bool> reduced(s.size(), true);  // absent, null or []: every dim
      std::vector<int64_t> dims;
      if (dim && dim->is_number()) dims.push_back(dim->get<int64_t>());
      if (dim && dim->is_array())
        for (const ojson& d : *dim) dims.push_back(d.get<int64_t>());
      if (!dims.empty()) reduced.assign(s.size(), false);
      for (const int64_t d : dims)
        if (!s.empty()) reduced[static_cast<size_t>(wrap(d, s.size()))] = true;
      Shape out;
      for (size_t i = 0; i < s.size(); ++i) {
        if (!reduced[i])
          out.push_back(s[i]);
        else if (keepdim)
          out.push_back(1);
      }
      return std::vector<Expected>{{out, f64::mean(x.to_double_vector(), s, reduced)}};
    };
    cases.push_back(c);
  };
  for (const int64_t n : kTails) {
    add(x_input({3, n}), ojson(-1), false);
    add(x_input({n, 5}), ojson(0), true);
  }
  add(x_input({2, 3, 17}), ojson::array({0, 2}), false);
  add(x_input({2, 3, 17}), ojson::array({2, 0}), true);
  add(x_input({2, 3, 17}), std::nullopt, false);   // every dim
  add(x_input({2, 3, 17}), ojson::array(), true);  // torch 1.13: [] is every dim too
  add(x_input({2, 3, 17}), ojson(nullptr), false);
  add(x_input({2, 49, 96}), ojson(1), false);  // tokens averaged (7x7 windows of 96 channels)
  add(x_input({2, 7, 7, 33}), ojson::array({-3, -2}), false);
  add(x_input({2, 9, 16}), ojson::array({-1, -2}), true);
  add(x_input({}), ojson(0), false);  // a scalar: dim 0 and -1 name it
  add(x_input({}), ojson(-1), true);
  add(x_input({}), std::nullopt, false);
  add(x_input({0, 3}), ojson(1), false);  // nothing to average into: an empty output
  add(x_input({4, 1, 5}), ojson(1), false);
  add(x_input({1, 1}), ojson(0), false);
  add(x_input({2, 3, 300}), ojson(1), false);  // kept rows over one 256-column chunk
  add(x_input({2, 3, 300}), ojson(2), true);
  add(x_input({3, 4, 5, 6}), ojson::array({0, 2}), false);  // reduced, kept, reduced, kept
  add(x_input({3, 4, 5, 6}), ojson::array({1, 3}), true);   // kept, reduced, kept, reduced
  add(x_input({2, 3, 1, 4, 5}), ojson::array({1, 2, 3}), false);
  add(x_input({5, 33}, Fill::offset), ojson(-1), false);
  add(x_input({40, 1000}, Fill::offset), ojson(0), false);
  add(x_input({3, 17}).as(DType::F16), ojson(0), false);
  add(x_input({4, 9}).transposed(), ojson(-1), true);
  return cases;
}

std::vector<OpCase> adaptive_avg_pool2d_cases() {
  std::vector<OpCase> cases;
  // output_size: an int, or [h, w] with nulls keeping the input size.
  auto add = [&](const OpInput& x, const ojson& output_size) {
    OpCase c;
    c.args["output_size"] = output_size;
    c.inputs = {x};
    c.tolerance = 1e-7;
    c.reference = [output_size](const Inputs& in, const Params&) {
      const Tensor& x = input(in, "x");
      Shape out = x.shape();
      const ojson h = output_size.is_array() ? output_size[0] : output_size;
      const ojson w = output_size.is_array() ? output_size[1] : output_size;
      if (!h.is_null()) out[out.size() - 2] = h.get<int64_t>();
      if (!w.is_null()) out.back() = w.get<int64_t>();
      return std::vector<Expected>{
          {out, f64::adaptive_avg_pool2d(x.to_double_vector(), x.shape(), out[out.size() - 2],
                                         out.back())}};
    };
    cases.push_back(c);
  };
  for (const int64_t n : kTails) add(x_input({1, 2, 3, n}), ojson::array({2, (n + 1) / 2}));
  add(x_input({2, 3, 7, 7}), 1);    // global average pooling
  add(x_input({2, 96, 7, 7}), 1);   // Swin-T's head: 7x7 windows of 768 channels, narrowed
  add(x_input({1, 4, 14, 14}), 7);  // windows of 2x2, no overlap
  add(x_input({2, 3, 5, 7}), ojson::array({3, 2}));      // overlapping windows
  add(x_input({3, 10, 9}), ojson::array({4, nullptr}));  // unbatched; W kept
  add(x_input({1, 2, 3, 5}), ojson::array({7, 8}));      // larger than the input: cells repeat
  add(x_input({2, 2, 4, 6}), ojson::array({nullptr, nullptr}));
  add(x_input({1, 1, 1, 1}), 3);
  add(x_input({1, 2, 4, 4}), 0);  // an empty output
  add(x_input({0, 3, 5, 5}), 2);  // an empty batch
  add(x_input({2, 3, 9, 8}).as(DType::BF16), ojson::array({2, 3}));
  add(x_input({2, 3, 6, 5}).transposed(), 2);
  return cases;
}

// torchvision's ShiftedWindowAttention: x [B, H, W, C]; window and shift as [h, w].
std::vector<OpCase> shifted_window_attention_cases() {
  std::vector<OpCase> cases;
  auto add = [&](Shape x, int64_t heads, std::pair<int64_t, int64_t> window,
                 std::pair<int64_t, int64_t> shift, bool qkv_bias = true, bool proj_bias = true,
                 bool int_args = false) {
    OpCase c;
    const int64_t C = x.back();
    c.args["dim"] = C;
    c.args["window_size"] =
        int_args ? ojson(window.first) : ojson::array({window.first, window.second});
    if (shift.first != 0 || shift.second != 0)
      c.args["shift_size"] =
          int_args ? ojson(shift.first) : ojson::array({shift.first, shift.second});
    c.args["num_heads"] = heads;
    if (!qkv_bias) c.args["qkv_bias"] = false;
    if (!proj_bias) c.args["proj_bias"] = false;
    c.inputs = {x_input(std::move(x))};
    f64::SwinOptionsRef o;
    o.heads = heads;
    o.window_h = window.first;
    o.window_w = window.second;
    o.shift_h = shift.first;
    o.shift_w = shift.second;
    c.reference = [o, qkv_bias, proj_bias](const Inputs& in, const Params& p) {
      BOOST_TEST(p.count("qkv.bias") == (qkv_bias ? 1u : 0u));
      BOOST_TEST(p.count("proj.bias") == (proj_bias ? 1u : 0u));
      const Tensor& x = input(in, "x");
      return std::vector<Expected>{{x.shape(), f64::shifted_window_attention(o, p, x)}};
    };
    cases.push_back(c);
  };
  add({1, 4, 4, 8}, 2, {2, 2}, {0, 0});                 // W-MSA, no padding
  add({2, 4, 4, 8}, 2, {2, 2}, {1, 1});                 // SW-MSA
  add({1, 7, 5, 16}, 2, {4, 4}, {2, 2});                // padded to 8x8, shifted
  add({2, 7, 5, 16}, 4, {4, 4}, {0, 0});                // padded, not shifted
  add({1, 3, 3, 8}, 1, {4, 4}, {2, 2});                 // window >= padded map: shift forced 0
  add({1, 3, 9, 8}, 2, {4, 4}, {2, 2});                 // forced 0 in H only (mask on W only)
  add({1, 6, 8, 12}, 3, {3, 4}, {1, 2});                // non-square window
  add({2, 5, 7, 6}, 2, {2, 3}, {1, 1}, false, true);    // no qkv bias, padded
  add({1, 4, 6, 8}, 2, {2, 3}, {1, 2}, true, false);    // no proj bias
  add({1, 6, 6, 16}, 4, {3, 3}, {1, 1}, false, false, true);  // int args
  for (const int64_t C : kTails)
    add({1, 5, 6, C}, 1, {3, 3}, {1, 1});               // SIMD tails as head_dim
  add({1, 8, 8, 34}, 2, {4, 4}, {2, 2});                // head_dim 17
  add({1, 14, 14, 32}, 2, {7, 7}, {3, 3});              // Swin-T's 7x7 windows
  add({1, 14, 14, 64}, 2, {7, 7}, {0, 0});              // ... fused path, linear's packed kernel
  // Swin-T's first stage, two images of 16 windows (2.9 MiB of qkv): the windows taken in groups
  // of 2-8 per image wherever the L2 is 0.5-2 MiB (windows_per_group).
  add({2, 28, 28, 96}, 3, {7, 7}, {3, 3});
  add({1, 8, 8, 8}, 2, {4, 4}, {5, 9});                 // shifts past the window and the map
  add({0, 4, 4, 8}, 2, {2, 2}, {1, 1});                 // empty batch
  add({2, 0, 4, 8}, 2, {2, 2}, {1, 1});                 // empty map
  return cases;
}

// Every op of the ops table and its cases. Adding an op: add its case list here.
struct CaseList {
  const char* op;
  std::vector<OpCase> (*cases)();
};
const CaseList kCaseLists[] = {
    {"attention", attention_cases}, {"multihead_attention", multihead_attention_cases},
    {"linear", linear_cases},       {"layer_norm", layer_norm_cases},
    {"gelu", gelu_cases},           {"add", add_cases},
    {"chunk", chunk_cases},         {"concat", concat_cases},
    {"relu", relu_cases},
    {"embedding", embedding_cases}, {"arange", arange_cases},
    {"parameter", parameter_cases},
    {"reshape", reshape_cases},
    {"flatten", flatten_cases},
    {"permute", permute_cases},
    {"transpose", transpose_cases},
    {"unsqueeze", unsqueeze_cases},
    {"squeeze", squeeze_cases},
    {"slice", slice_cases},
    {"select", select_cases},
    {"roll", roll_cases},
    {"pad", pad_cases},
    {"expand", expand_cases},
    {"patch_merging_pad", patch_merging_pad_cases},
    {"conv2d", conv2d_cases},  // layers/conv.cpp
    {"mean", mean_cases},
    {"adaptive_avg_pool2d", adaptive_avg_pool2d_cases},
    {"relu", relu_cases},           {"sub", sub_cases},
    {"mul", mul_cases},             {"div", div_cases},
    {"silu", silu_cases},           {"tanh", tanh_cases},
    {"sigmoid", sigmoid_cases},     {"softmax", softmax_cases},
    {"dropout", dropout_cases},     {"matmul", matmul_cases},
    {"shifted_window_attention", shifted_window_attention_cases},
};

// ---------------------------------------------------------------- the harness

// "linear {"out_features":9} x=[3, 1]": names the case in every message.
std::string label_of(const std::string& op, const OpCase& c, const Inputs& in) {
  std::string s = op + " " + c.args.dump();
  for (const OpInput& i : c.inputs) {
    if (!i.alias_of.empty()) {
      s += " " + i.port + "=" + i.alias_of;
      continue;
    }
    const Tensor& t = input(in, i.port);
    s += " " + i.port + "=" + t.shape_str();
    if (t.dtype() != DType::F32) s += std::string("(") + dtype_name(t.dtype()) + ")";
    if (!t.is_contiguous()) s += "(strided)";
  }
  return s;
}

Tensor draw_values(Fill fill, const Shape& shape, Generator& gen) {
  switch (fill) {
    case Fill::normal:
      return Tensor::randn(shape, gen);
    case Fill::wide:
      return Tensor::randn(shape, gen, 0.0, 4.0);
    case Fill::offset:
      return Tensor::randn(shape, gen, 30.0, 1.0);
    case Fill::bool_mask:
      return f64::random_mask(shape, true, gen);
    case Fill::float_mask:
      return f64::random_mask(shape, false, gen);
  }
  return Tensor();
}

// The input as the plan is given it.
Tensor draw(const OpInput& i, Generator& gen) {
  if (i.value.defined()) return i.value;
  Shape shape = i.shape;
  if (i.strided) std::swap(shape[shape.size() - 2], shape.back());
  Tensor t = draw_values(i.fill, shape, gen);
  if (t.dtype() != DType::Bool) t = t.to(i.stored);
  return i.strided ? t.transpose(-2, -1) : t;
}

// The input as the op sees it (OpLayer::forward): a float one contiguous float32, a mask as
// given.
Tensor as_seen_by_op(const Tensor& t) {
  if (t.dtype() == DType::Bool) return t;
  if (t.dtype() == DType::I64 || t.dtype() == DType::I32) return t.to(DType::I64).contiguous();
  return t.to(DType::F32).contiguous();
}

// One case, made ready to run: its network, inputs, parameters and expected outputs.
struct Prepared {
  std::string label;
  NetworkSpec spec;
  std::vector<std::string> out_ports;
  Inputs inputs;  // as stored, for the plan
  Inputs seen;    // as the op sees them (as_seen_by_op), for the op path and the reference
  std::map<std::string, Tensor> state;  // Model::state_dict() after loading the random ones
  Params params;                        // the same without the node prefix
  std::vector<Expected> expected;
};

constexpr uint64_t kSeed = 7;

Prepared prepare(const std::string& op, const OpCase& c, uint64_t seed) {
  Prepared p;
  Generator gen(seed);
  for (const OpInput& i : c.inputs) {
    if (!i.alias_of.empty()) {
      BOOST_REQUIRE(p.seen.count(i.alias_of));
      p.seen[i.port] = p.seen.at(i.alias_of);
      continue;
    }
    p.inputs[i.port] = draw(i, gen);
    p.seen[i.port] = as_seen_by_op(p.inputs[i.port]);
  }
  p.label = label_of(op, c, p.inputs);
  // Port -> the network input it reads (named after the port that draws it).
  auto source = [](const OpInput& i) { return i.alias_of.empty() ? i.port : i.alias_of; };

  NetworkNode node{"n0", op, c.args, {}};
  for (const OpInput& i : c.inputs) node.inputs.emplace_back(i.port, source(i));
  p.out_ports = make_op(node)->output_ports();
  ojson net;
  net["inputs"] = ojson::object();
  for (const auto& [port, t] : p.inputs)
    net["inputs"][port] = t.dtype() == DType::Bool ? ojson{{"shape", t.shape()}, {"dtype", "bool"}}
                          : t.dtype() == DType::I64 || t.dtype() == DType::I32
                              ? ojson{{"shape", t.shape()}, {"dtype", "int64"}}
                              : ojson(t.shape());
  ojson n = {{"name", "n0"}, {"op", op}, {"args", c.args}, {"inputs", ojson::object()}};
  for (const OpInput& i : c.inputs) n["inputs"][i.port] = source(i);
  net["nodes"] = ojson::array({n});
  for (const std::string& port : p.out_ports) net["outputs"][port] = "n0." + port;
  p.spec = parse_network(net.dump(), p.label);

  Model model(p.spec, kSeed);
  std::map<std::string, Tensor> random;
  for (const auto& [name, t] : f64::random_parameters(model.network().nodes()[0].parameters, gen))
    random[parameter_key("n0", name)] = t;
  model.load_weights(random, /*strict=*/true, p.label);
  p.state = model.state_dict();
  // Names within the node: "n0.weight" -> "weight"; "n0" (a `parameter` node's tensor) -> "".
  for (const auto& [name, t] : p.state) p.params[name == "n0" ? "" : name.substr(3)] = t;
  p.expected = c.reference(p.seen, p.params);
  return p;
}

// max |got - want| / max(1, max |want|), and where the worst element is; infinity for a NaN
// or a shape mismatch.
struct Mismatch {
  double scaled = 0.0;
  std::string detail;
};

Mismatch compare(const Tensor& got, const Expected& want) {
  Mismatch e;
  if (got.shape() != want.shape) {
    e.scaled = kInf;
    e.detail = "shape " + got.shape_str() + ", expected " + shape_to_string(want.shape);
    return e;
  }
  const std::vector<double> g = got.to_double_vector();
  BOOST_REQUIRE_EQUAL(g.size(), want.values.size());
  double ref_max = 0.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    ref_max = std::max(ref_max, std::abs(want.values[i]));
    const double d =
        std::isnan(g[i]) || std::isnan(want.values[i]) ? kInf : std::abs(g[i] - want.values[i]);
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  e.scaled = worst / std::max(1.0, ref_max);
  if (!g.empty()) {
    std::ostringstream os;
    os << "max |y - ref| " << worst << " at flat index " << at << ": got " << g[at] << ", expected "
       << want.values[at] << " (max |ref| " << ref_max << ")";
    e.detail = os.str();
  }
  return e;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

struct OpRun {
  std::vector<Tensor> outputs;  // empty when the forward failed (reported)
  size_t reported = 0;          // cost(in).workspace_bytes
  size_t peak = 0;              // what the forward took at most
};

// The op path: the op's layer run on exactly the workspace it reports, NaN-filled.
OpRun run_op(const Prepared& p) {
  const std::unique_ptr<Op> op = make_op(p.spec.nodes[0]);
  std::vector<ValueType> types;
  std::vector<const Tensor*> in_tensors;
  for (const PortSpec& port : op->input_ports()) {
    const Tensor& t = input(p.seen, port.name);
    in_tensors.push_back(t.defined() ? &t : nullptr);
  }
  types.reserve(in_tensors.size());
  InputTypes in;
  for (const Tensor* t : in_tensors) {
    if (!t) {
      in.push_back(nullptr);
      continue;
    }
    types.push_back({fixed_shape(t->shape()), t->dtype()});
    in.push_back(&types.back());
  }
  SymbolBindings bound;
  const InferResult inferred = op->infer(in, bound);
  const std::unique_ptr<OpLayer> layer = op->instantiate(in, kSeed);
  if (layer->parameters()) {
    layer->load(p.params);
    // As a Model holds them (Model::load_weights): projection weights packed once.
    layer->parameters()->pack_projections(cpu_device());
  }

  const double reported = op->cost(in).workspace_bytes;
  const auto bytes = static_cast<size_t>(reported);
  BOOST_TEST(static_cast<double>(bytes) == reported, "workspace_bytes " << reported);
  // 64-byte aligned (Tensor storage), at least one float so the base is never null (a null base
  // would make the Workspace count instead of hand out).
  const Tensor buffer =
      Tensor::full({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float)) + 1}, kNaN);
  BOOST_REQUIRE(reinterpret_cast<uintptr_t>(buffer.raw_data()) % Workspace::kAlignment == 0);
  Workspace ws(buffer.raw_data(), bytes);

  OpRun run;
  run.reported = bytes;
  std::vector<Tensor>& outs = run.outputs;
  // NaN (or, for int64 outputs, -7): an element the forward does not write shows up.
  for (const ValueType& v : inferred.outputs)
    outs.push_back(v.dtype == DType::I64 ? Tensor::full(concrete_shape(v.shape), -7.0, DType::I64)
                                         : Tensor::full(concrete_shape(v.shape), kNaN));
  std::vector<Tensor*> out_ptrs;
  for (Tensor& t : outs) out_ptrs.push_back(&t);
  try {
    layer->forward(in_tensors, out_ptrs, ws);
  } catch (const Error& e) {
    BOOST_ERROR("op path: forward on a workspace of the reported "
                << bytes << " bytes failed: " << e.what());
    outs.clear();
    return run;
  }
  run.peak = ws.peak();
  BOOST_TEST(run.peak <= bytes, "workspace peak " << run.peak << " > reported " << bytes);
  return run;
}

// The plan path: a Model with the case's parameters through a Plan. Outputs copied out.
std::vector<Tensor> run_plan(const Prepared& p) {
  Model model(p.spec, kSeed);
  model.load_weights(p.state, /*strict=*/true, p.label);
  std::map<std::string, TensorDesc> descs;
  for (const auto& [name, t] : p.inputs) descs[name] = TensorDesc{t.shape(), t.dtype()};
  Plan plan(model, descs);
  const auto& results = plan.run(p.inputs);
  std::vector<Tensor> outs;
  for (const std::string& port : p.out_ports) {
    const auto it = std::find_if(results.begin(), results.end(),
                                 [&](const auto& r) { return r.first == port; });
    BOOST_REQUIRE(it != results.end());
    outs.push_back(it->second.clone());
  }
  return outs;
}

// Checks each output against the case's reference; returns the worst error / tolerance.
double check_outputs(const Prepared& p, const std::vector<Tensor>& outs, double tolerance,
                     const char* path) {
  BOOST_REQUIRE_EQUAL(outs.size(), p.expected.size());
  double worst = 0.0;
  for (size_t k = 0; k < outs.size(); ++k) {
    const Mismatch e = compare(outs[k], p.expected[k]);
    BOOST_TEST(e.scaled <= tolerance, path << " output " << p.out_ports[k] << ": " << e.detail
                                           << " > tolerance " << tolerance);
    worst = std::max(worst, tolerance > 0 ? e.scaled / tolerance : (e.scaled > 0 ? kInf : 0.0));
  }
  return worst;
}

// What one op's cases measured, for the log: the margin and the workspace use.
struct OpStats {
  std::map<int64_t, double> worst;   // per target: worst error / tolerance (op path)
  int runs = 0, with_workspace = 0;  // op-path runs, and those taking workspace
  double tightest = 1.0;             // the least peak / reported among those

  std::string summary() const {
    std::ostringstream os;
    os << "worst error / tolerance:";
    for (const auto& [target, ratio] : worst) os << " " << hwy::TargetName(target) << " " << ratio;
    os << "; workspace in " << with_workspace << " of " << runs << " runs";
    if (with_workspace > 0) os << ", least peak / reported " << tightest;
    return os.str();
  }
};

// One case on every target: the op path and the plan path against the reference, and against
// each other. An error thrown on the way (a case the op rejects) fails the case, not the suite.
void run_case(const std::string& op, const OpCase& c, uint64_t seed,
              const std::vector<int64_t>& targets, OpStats& stats) {
  hwy::SetSupportedTargetsForTest(0);
  Prepared p;
  try {
    p = prepare(op, c, seed);
  } catch (const Error& e) {
    BOOST_ERROR(op << " " << c.args.dump() << ": " << e.what());
    return;
  }
  for (const int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    BOOST_TEST_CONTEXT(p.label << " on " << hwy::TargetName(target)) {
      try {
        const OpRun run = run_op(p);
        ++stats.runs;
        if (run.reported > 0) {
          ++stats.with_workspace;
          stats.tightest = std::min(stats.tightest, static_cast<double>(run.peak) / run.reported);
        }
        if (!run.outputs.empty())
          stats.worst[target] =
              std::max(stats.worst[target], check_outputs(p, run.outputs, c.tolerance, "op path"));
        const std::vector<Tensor> plan_out = run_plan(p);
        check_outputs(p, plan_out, c.tolerance, "plan path");
        for (size_t k = 0; k < run.outputs.size() && k < plan_out.size(); ++k)
          BOOST_TEST(bitwise_equal(run.outputs[k], plan_out[k]),
                     "plan output " << p.out_ports[k] << " differs from the op path's");
      } catch (const Error& e) {
        BOOST_ERROR(e.what());
      }
      // The kernels really ran on this target.
      BOOST_TEST(std::string(cpu_device().simd_target()) == hwy::TargetName(target));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ops)

BOOST_AUTO_TEST_CASE(every_op_has_cases) {
  for (const std::string& op : op_names()) {
    const auto it = std::find_if(std::begin(kCaseLists), std::end(kCaseLists),
                                 [&](const CaseList& l) { return l.op == op; });
    BOOST_TEST(it != std::end(kCaseLists), "op " << op << " has no case list in test_ops.cpp");
    if (it != std::end(kCaseLists)) BOOST_TEST(!it->cases().empty(), "op " << op << ": no cases");
  }
  for (const CaseList& l : kCaseLists)
    BOOST_TEST(std::count(op_names().begin(), op_names().end(), l.op) == 1,
               "case list for " << l.op << ", which is not in the ops table");
}

BOOST_AUTO_TEST_CASE(cases_match_float64_reference_on_every_target) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> targets = compiled_targets();
  BOOST_REQUIRE(!targets.empty());
  std::string names;
  for (const int64_t t : targets) names += std::string(" ") + hwy::TargetName(t);
  BOOST_TEST_MESSAGE("ops: every case on the targets" << names);

  TargetReset reset;
  size_t total = 0;
  for (const CaseList& list : kCaseLists) {
    const std::vector<OpCase> cases = list.cases();
    OpStats stats;
    for (size_t i = 0; i < cases.size(); ++i) run_case(list.op, cases[i], 1000 + i, targets, stats);
    total += cases.size();
    BOOST_TEST_MESSAGE("ops: " << list.op << ", " << cases.size() << " cases, " << stats.summary());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST_MESSAGE("ops: " << total << " cases x " << targets.size() << " targets in " << seconds
                             << " s");
}

// torch.relu's special values, bit for bit on every target: NaN stays NaN, -0.0 stays -0.0
// (x < 0 is false for both), -inf becomes 0 (a Max against zero would turn NaN into 0 on x86).
BOOST_AUTO_TEST_CASE(relu_keeps_nan_and_negative_zero) {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {-0.0f, nan, -1.0f, 2.0f, -inf, inf, 0.0f, -1e-30f};
  values.resize(37, -3.5f);  // past two AVX-512 vectors: vector body and scalar tail
  values[19] = nan;
  values[36] = -0.0f;
  const Tensor x = Tensor::from_vector(values, {37});
  TargetReset reset;
  for (const int64_t target : compiled_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    Tensor y = Tensor::empty({37});
    unary_map_into("relu", x, y, "test");
    for (size_t i = 0; i < values.size(); ++i) {
      const float v = values[i], got = y.data<float>()[i];
      const float want = v < 0.0f ? 0.0f : v;
      BOOST_TEST((std::isnan(want) ? std::isnan(got) : std::bit_cast<uint32_t>(got) ==
                                                            std::bit_cast<uint32_t>(want)),
                 hwy::TargetName(target) << " relu(" << v << ") = " << got);
    }
  }
}

// ---- the layout ops: inference on open dims, and the errors of each (layers/shape_ops.cpp)

namespace {

Dim n(int64_t v) { return Dim::fixed(v); }
Dim sym(const char* s) { return Dim::open(s); }

// The output shape of a one-node network's op on x, as text: "[B, T*8]".
std::string layout_out(const std::string& op, const ojson& args, const SymShape& x,
                       SymbolBindings bound = {}, DType dtype = DType::F32) {
  NetworkNode node{"n0", op, args, {{"x", "x"}}};
  const std::unique_ptr<Op> o = make_op(node);
  const ValueType t{x, dtype};
  const InferResult r = o->infer(InputTypes{&t}, bound);
  BOOST_REQUIRE_EQUAL(r.outputs.size(), 1u);
  BOOST_TEST(r.parameters.empty());
  return sym_shape_to_string(r.outputs[0].shape);
}

void expect_layout_error(ErrorCode code, const std::string& text, const std::string& op,
                         const ojson& args, const SymShape& x, SymbolBindings bound = {}) {
  expect_error(code, text, [&] { layout_out(op, args, x, bound); });
}

// The network resolves with open dims; binding x to `shape` fails.
void expect_bind_error(ErrorCode code, const std::string& text, const std::string& op,
                       const ojson& args, const ojson& declared, const Shape& shape) {
  ojson net = {
      {"inputs", {{"x", declared}}},
      {"nodes",
       ojson::array({{{"name", "n0"}, {"op", op}, {"args", args}, {"inputs", {{"x", "x"}}}}})},
      {"outputs", {{"y", "n0"}}}};
  // Through text: the parser reads non-negative dims as JSON's unsigned numbers.
  const Network network = Network::resolve(parse_network(net.dump(), "test.json"));
  expect_error(code, text, [&] { network.bind({ValueType{fixed_shape(shape), DType::F32}}); });
}

}  // namespace

BOOST_AUTO_TEST_CASE(layout_ops_infer_open_dims) {
  const SymShape btc{sym("B"), sym("T"), n(8)};
  // reshape: open dims that appear on both sides cancel; what is left gives the -1.
  BOOST_TEST(layout_out("reshape", {{"shape", ojson::array({"B", -1})}}, btc) == "[B, T*8]");
  BOOST_TEST(layout_out("reshape", {{"shape", ojson::array({"B", "T", -1})}}, btc) == "[B, T, 8]");
  BOOST_TEST(layout_out("reshape", {{"shape", ojson::array({"B", "T", 2, 4})}}, btc) ==
             "[B, T, 2, 4]");
  BOOST_TEST(layout_out("reshape", {{"shape", {-1, 4}}}, {sym("B"), n(16)}) == "[B*4, 4]");
  BOOST_TEST(layout_out("reshape", {{"shape", {-1, 16}}}, btc) == "[(B*T)/2, 16]");
  BOOST_TEST(layout_out("reshape", {{"shape", ojson::array({"N", -1})}}, {n(6), n(4)}) ==
             "[N, 24/N]");
  // Symbols the resolver has bound are numbers; unbound ones stay open.
  BOOST_TEST(layout_out("reshape", {{"shape", ojson::array({"B", -1})}}, {n(6), n(4)},
                        {{"B", 3}}) == "[3, 8]");
  BOOST_TEST(layout_out("reshape", {{"shape", ojson::array({"B", "T", 8})}}, {n(2), n(5), n(8)},
                        {{"B", 2}, {"T", 5}}) == "[2, 5, 8]");
  BOOST_TEST(layout_out("reshape", {{"shape", ojson::array({"B", 4})}}, {sym("B"), n(4)},
                        {{"T", 3}}) == "[B, 4]");
  expect_layout_error(ErrorCode::Shape, "24 elements are not a multiple of 5", "reshape",
                      {{"shape", ojson::array({"B", -1})}}, {n(6), n(4)}, {{"B", 5}});
  expect_layout_error(ErrorCode::Shape, "24 elements vs 20", "reshape",
                      {{"shape", ojson::array({"B", "T"})}}, {n(6), n(4)}, {{"B", 5}, {"T", 4}});
  // Undecidable with open dims (B may be 0): checked once bound.
  BOOST_TEST(layout_out("reshape", {{"shape", ojson::array({"B", 3})}}, {sym("B"), n(2)}) ==
             "[B, 3]");
  BOOST_TEST(layout_out("reshape", {{"shape", {-1, 4}}}, {sym("B"), n(6)}) == "[(B*3)/2, 4]");
  expect_bind_error(ErrorCode::Shape, "cannot reshape x [1, 6] into shape=[-1, 4]", "reshape",
                    {{"shape", {-1, 4}}}, ojson::array({"B", 6}), {1, 6});
  // expand: symbols as sizes (ViT's class_token.expand(B, -1, -1)).
  BOOST_TEST(layout_out("expand", {{"sizes", ojson::array({"B", -1, -1})}}, {n(1), n(1), n(8)}) ==
             "[B, 1, 8]");
  BOOST_TEST(layout_out("expand", {{"sizes", ojson::array({"B", -1, -1})}}, {n(1), n(1), n(8)},
                        {{"B", 4}}) == "[4, 1, 8]");
  BOOST_TEST(layout_out("expand", {{"sizes", {-1, 5}}}, {sym("B"), n(1)}) == "[B, 5]");
  BOOST_TEST(layout_out("expand", {{"sizes", {2, 3}}}, {sym("B"), n(3)}) == "[2, 3]");
  BOOST_TEST(layout_out("expand", {{"sizes", ojson::array({"T", 3})}}, {n(1), n(3)}) == "[T, 3]");
  BOOST_TEST(layout_out("expand", {{"sizes", ojson::array({"T", "B"})}}, {sym("T"), n(1)}) ==
             "[T, B]");
  expect_bind_error(ErrorCode::Shape, "dim 0 has size 2 (only a size-1 dim can expand)", "expand",
                    {{"sizes", {3, -1}}}, ojson::array({"B", 4}), {2, 4});
  // flatten, permute, transpose, unsqueeze carry open dims along.
  BOOST_TEST(layout_out("flatten", {{"start_dim", 1}}, btc) == "[B, T*8]");
  BOOST_TEST(layout_out("permute", {{"dims", {2, 0, 1}}}, btc) == "[8, B, T]");
  BOOST_TEST(layout_out("transpose", {{"dim0", 0}, {"dim1", -1}}, btc) == "[8, T, B]");
  BOOST_TEST(layout_out("unsqueeze", {{"dim", -1}}, btc) == "[B, T, 8, 1]");
  // slice: counted from the end, the length is known for every size; otherwise an expression.
  BOOST_TEST(layout_out("slice", {{"dim", 1}, {"start", -1}}, btc) == "[B, 1, 8]");
  BOOST_TEST(layout_out("slice", {{"dim", 1}, {"start", -5}, {"stop", -2}}, btc) == "[B, 3, 8]");
  BOOST_TEST(layout_out("slice", {{"dim", 1}, {"start", 1}}, btc) == "[B, T[1:], 8]");
  BOOST_TEST(layout_out("slice", {{"dim", {0, 1}}, {"step", 2}}, btc) == "[B[::2], T[::2], 8]");
  BOOST_TEST(layout_out("slice", {{"dim", 1}, {"stop", 4}}, btc) == "[B, T[:4], 8]");
  BOOST_TEST(layout_out("slice", {{"dim", 1}}, btc) == "[B, T, 8]");
  expect_bind_error(ErrorCode::Shape, "start=-4 is before the start of dim 1 of size 3", "slice",
                    {{"dim", 1}, {"start", -4}}, ojson::array({"B", "T"}), {2, 3});
  // select: the index is checked when the dim is bound.
  BOOST_TEST(layout_out("select", {{"dim", 1}, {"index", 7}}, btc) == "[B, 8]");
  expect_bind_error(ErrorCode::Shape, "index=3 is out of range for dim 1 of size 3", "select",
                    {{"dim", 1}, {"index", 3}}, ojson::array({"B", "T"}), {2, 3});
  // pad: an open dim grows or shrinks by the pads.
  BOOST_TEST(layout_out("pad", {{"pad", {1, 2}}}, {sym("B"), sym("T")}) == "[B, T+3]");
  BOOST_TEST(layout_out("pad", {{"pad", {-1, 0, 0, 0}}}, {sym("B"), sym("T")}) == "[B, T-1]");
  BOOST_TEST(layout_out("pad", {{"pad", {0, 0, 1, 1}}}, {sym("B"), sym("T")}) == "[B+2, T]");
  expect_bind_error(ErrorCode::Shape, "crop more than its 1 elements", "pad", {{"pad", {-1, -1}}},
                    ojson::array({"B", "T"}), {2, 1});
  // Shapes without elements may have dims whose product overflows.
  const int64_t big = int64_t{1} << 40;
  BOOST_TEST(layout_out("reshape", {{"shape", {-1, big}}}, {n(0), n(big), n(big)}) ==
             "[0, 1099511627776]");
  BOOST_TEST(layout_out("expand", {{"sizes", {0, big, big}}}, {n(1)}) ==
             "[0, 1099511627776, 1099511627776]");
  BOOST_TEST(layout_out("pad", {{"pad", {0, 0, -1, 0}}}, {n(1), n(big)}) == "[0, 1099511627776]");
  // roll keeps the shape.
  BOOST_TEST(layout_out("roll", {{"shifts", {1, -2}}, {"dims", {0, 1}}}, btc) == "[B, T, 8]");
  // squeeze: fixed dims decide; an open one it would test is refused.
  BOOST_TEST(layout_out("squeeze", {{"dim", 2}}, {sym("B"), n(1), n(1)}) == "[B, 1]");
  BOOST_TEST(layout_out("squeeze", {{"dim", {1, 2}}}, {sym("B"), n(1), n(8)}) == "[B, 8]");
}

BOOST_AUTO_TEST_CASE(layout_op_errors) {
  const SymShape x234{n(2), n(3), n(4)};
  // permute: not a permutation is E_CONSTRAINT (the rank is len(dims), known when the node is
  // read); an x of another rank E_SHAPE.
  expect_layout_error(ErrorCode::Constraint, "dims=[0, 0] is not a permutation of the 2 dims",
                      "permute", {{"dims", {0, 0}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Constraint, "is not a permutation", "permute", {{"dims", {0, -2}}},
                      {n(2), n(3)});
  expect_layout_error(ErrorCode::Constraint, "is not a permutation", "permute", {{"dims", {0, 2}}},
                      {n(2), n(3)});
  expect_layout_error(ErrorCode::Shape, "x [2, 3, 4] has 3 dims; dims permutes 2", "permute",
                      {{"dims", {1, 0}}}, x234);
  expect_layout_error(ErrorCode::Arg, "argument dims must be a list of integers", "permute",
                      {{"dims", 1}}, {n(2)});
  expect_layout_error(ErrorCode::Arg, "argument dims[1] must be an integer", "permute",
                      {{"dims", {0, "a"}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Arg, "missing required argument dims", "permute", ojson::object(),
                      {n(2)});
  // transpose, unsqueeze, flatten: dims out of range (E_CONSTRAINT, as every op's dim).
  expect_layout_error(ErrorCode::Constraint, "dim=2 is out of range for a rank-2 input",
                      "transpose", {{"dim0", 2}, {"dim1", 0}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Arg, "missing required argument dim1", "transpose", {{"dim0", 0}},
                      {n(2), n(3)});
  expect_layout_error(ErrorCode::Constraint, "dim=3 is out of range for a rank-3 output",
                      "unsqueeze", {{"dim", 3}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Shape, "over the rank limit of 64", "unsqueeze", {{"dim", 0}},
                      SymShape(64, n(1)));
  expect_layout_error(ErrorCode::Constraint, "start_dim=2 comes after end_dim=1", "flatten",
                      {{"start_dim", 2}, {"end_dim", 1}}, x234);
  expect_layout_error(ErrorCode::Constraint, "dim=3 is out of range", "flatten", {{"start_dim", 3}},
                      x234);
  // squeeze.
  expect_layout_error(ErrorCode::Shape, "dim 0 of x [B, 1] is open (B)", "squeeze", ojson::object(),
                      {sym("B"), n(1)});
  expect_layout_error(ErrorCode::Shape, "is open (T)", "squeeze", {{"dim", -1}}, {n(2), sym("T")});
  expect_layout_error(ErrorCode::Constraint, "names dim 0 more than once", "squeeze",
                      {{"dim", {0, -3}}}, {n(1), n(3), n(1)});
  // reshape.
  expect_layout_error(ErrorCode::Shape,
                      "cannot reshape x [2, 3] into shape=[4, 2]: 6 elements vs 8", "reshape",
                      {{"shape", {4, 2}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Shape, "6 elements are not a multiple of 4", "reshape",
                      {{"shape", {-1, 4}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Constraint, "shape=[-1, -1] has more than one -1", "reshape",
                      {{"shape", {-1, -1}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Shape, "the -1 could be any size", "reshape", {{"shape", {0, -1}}},
                      {n(0), n(5)});
  expect_layout_error(ErrorCode::Shape, "the -1 could be any size", "reshape",
                      {{"shape", ojson::array({"B", 0, -1})}}, {sym("B"), n(5)});
  expect_layout_error(ErrorCode::Constraint, "shape[0]=-2 must be >= -1", "reshape",
                      {{"shape", {-2, 3}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Arg, "argument shape[0] must be an integer or a symbol name",
                      "reshape", {{"shape", ojson::array({"B T"})}}, {n(2)});
  expect_layout_error(ErrorCode::Arg, "argument shape[0] must be an integer or a symbol name",
                      "reshape", {{"shape", {1.5}}}, {n(2)});
  expect_layout_error(ErrorCode::Arg, "argument shape must be a list", "reshape", {{"shape", 6}},
                      {n(6)});
  expect_layout_error(ErrorCode::Arg, "unknown argument 'size' (reshape takes shape)", "reshape",
                      {{"shape", {6}}, {"size", 6}}, {n(6)});
  expect_layout_error(ErrorCode::Shape, "more than 2^63 - 1 elements", "reshape",
                      {{"shape", ojson::array({"B", 4294967296, 4294967296})}}, {sym("B")});
  // slice.
  expect_layout_error(ErrorCode::Constraint, "step=0 must be >= 1", "slice",
                      {{"dim", 0}, {"step", 0}}, {n(5)});
  expect_layout_error(ErrorCode::Constraint, "step=-1 must be >= 1", "slice",
                      {{"dim", {0, 1}}, {"step", {1, -1}}}, {n(5), n(5)});
  expect_layout_error(ErrorCode::Shape, "start=-6 is before the start of dim 0 of size 5", "slice",
                      {{"dim", 0}, {"start", -6}}, {n(5)});
  expect_layout_error(ErrorCode::Shape, "stop=-9 is before the start of dim 1 of size 8", "slice",
                      {{"dim", -1}, {"stop", -9}}, {n(2), n(8)});
  expect_layout_error(ErrorCode::Constraint, "names dim 1 more than once", "slice",
                      {{"dim", {1, -1}}}, {n(5), n(5)});
  expect_layout_error(ErrorCode::Constraint, "start=[0, 1, 2] has 3 entries; dim=[0, 1] names 2",
                      "slice", {{"dim", {0, 1}}, {"start", {0, 1, 2}}}, {n(5), n(5)});
  expect_layout_error(ErrorCode::Constraint, "has 1 entries", "slice",
                      {{"dim", {0, 1}}, {"stop", {3}}}, {n(5), n(5)});
  expect_layout_error(ErrorCode::Constraint, "dim=2 is out of range for a rank-2 input", "slice",
                      {{"dim", 2}}, {n(5), n(5)});
  expect_layout_error(ErrorCode::Arg, "argument stop must be an integer", "slice",
                      {{"dim", 0}, {"stop", "end"}}, {n(5)});
  // select.
  expect_layout_error(ErrorCode::Shape,
                      "index=3 is out of range for dim 1 of size 3 (valid: -3 .. 2)", "select",
                      {{"dim", 1}, {"index", 3}}, x234);
  expect_layout_error(ErrorCode::Shape, "index=-4 is out of range", "select",
                      {{"dim", -2}, {"index", -4}}, x234);
  expect_layout_error(ErrorCode::Shape, "index=0 is out of range for dim 0 of size 0", "select",
                      {{"dim", 0}, {"index", 0}}, {n(0), n(3)});
  expect_layout_error(ErrorCode::Constraint, "select needs at least one dim", "select",
                      {{"dim", 0}, {"index", 0}}, {});
  // roll.
  expect_layout_error(ErrorCode::Constraint, "shifts=[1, 2] and dims=null must align", "roll",
                      {{"shifts", {1, 2}}}, x234);
  expect_layout_error(ErrorCode::Constraint, "shifts=[1] and dims=[0, 1] must align", "roll",
                      {{"shifts", {1}}, {"dims", {0, 1}}}, x234);
  expect_layout_error(ErrorCode::Constraint, "dim=3 is out of range", "roll",
                      {{"shifts", 1}, {"dims", 3}}, x234);
  expect_layout_error(ErrorCode::Arg, "missing required argument shifts", "roll", {{"dims", 0}},
                      x234);
  // pad.
  expect_layout_error(ErrorCode::Constraint, "pad=[1, 2, 3] has an odd number of entries", "pad",
                      {{"pad", {1, 2, 3}}}, x234);
  expect_layout_error(ErrorCode::Unsupported, "mode='reflect' is not supported", "pad",
                      {{"pad", {1, 1}}, {"mode", "reflect"}}, x234);
  expect_layout_error(ErrorCode::Constraint, "mode='wrap' must be 'constant'", "pad",
                      {{"pad", {1, 1}}, {"mode", "wrap"}}, x234);
  expect_layout_error(ErrorCode::Shape,
                      "pad=[1, 1, 1, 1, 1, 1, 1, 1] pads 4 dims; x [2, 3, 4] has 3", "pad",
                      {{"pad", {1, 1, 1, 1, 1, 1, 1, 1}}}, x234);
  expect_layout_error(ErrorCode::Shape, "pads -5 and 0 of dim 2 crop more than its 4 elements",
                      "pad", {{"pad", {-5, 0}}}, x234);
  expect_layout_error(ErrorCode::Shape, "crop more than its 4 elements", "pad", {{"pad", {-5, 4}}},
                      x234);  // out would be 3: PyTorch's IndexError too
  expect_layout_error(ErrorCode::Shape, "crop more than its 3 elements", "pad",
                      {{"pad", {0, 0, -2, -2}}}, x234);
  expect_layout_error(ErrorCode::Shape, "overflows int64", "pad", {{"pad", {INT64_MAX, 1}}}, x234);
  expect_layout_error(ErrorCode::Shape, "more than 2^63 - 1 elements", "pad",
                      {{"pad", {INT64_MAX - 4, 0}}}, x234);
  expect_layout_error(ErrorCode::Shape, "overflow int64", "pad", {{"pad", {INT64_MIN, 0}}},
                      {sym("T")});
  expect_layout_error(ErrorCode::Constraint, "value=1e+300 does not fit float32", "pad",
                      {{"pad", {1, 1}}, {"value", 1e300}}, x234);
  // expand.
  expect_layout_error(ErrorCode::Shape,
                      "cannot expand x [2, 3] to sizes=[4, 3]: dim 0 has size 2 (only a size-1 "
                      "dim can expand), expand asks for 4",
                      "expand", {{"sizes", {4, 3}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Shape, "fewer than the dims of x [2, 3]", "expand",
                      {{"sizes", {3}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Shape, "-1 in dim 0, a new leading dim", "expand",
                      {{"sizes", {-1, 2, 3}}}, {n(2), n(3)});
  expect_layout_error(ErrorCode::Constraint, "sizes[0]=-2 must be >= -1", "expand",
                      {{"sizes", {-2}}}, {n(1)});
  expect_layout_error(ErrorCode::Shape, "more than 2^63 - 1 elements", "expand",
                      {{"sizes", {4294967296, 4294967296}}}, {n(1), n(1)});
  // Every layout op takes floats only.
  expect_error(ErrorCode::DType, "x has dtype bool; flatten needs a float input",
               [] { layout_out("flatten", ojson::object(), {n(2)}, {}, DType::Bool); });
}

// Every GEMM path gives the same bits on one thread and on two: the work splits by shape only.
BOOST_AUTO_TEST_CASE(conv2d_results_do_not_depend_on_threads) {
  struct Geometry {
    Shape x;
    int64_t out, kernel, stride, pad, groups;
  };
  const Geometry geometries[] = {
      {{4, 3, 64, 64}, 96, 4, 4, 0, 1},    // packed kernel
      {{2, 6, 24, 24}, 96, 3, 1, 1, 3},    // packed kernel, groups
      {{2, 3, 64, 64}, 48, 16, 16, 0, 1},  // OpenBLAS
      {{3, 16, 30, 30}, 8, 5, 1, 2, 1},    // OpenBLAS, two blocks
      {{2, 16, 20, 20}, 40, 1, 1, 0, 2},   // pointwise
  };
  Generator gen(3);
  for (const Geometry& g : geometries) {
    Conv2dOptions o;
    o.in_channels = g.x[1];
    o.out_channels = g.out;
    o.kernel_h = o.kernel_w = g.kernel;
    o.stride_h = o.stride_w = g.stride;
    o.pad_top = o.pad_bottom = o.pad_left = o.pad_right = g.pad;
    o.groups = g.groups;
    Conv2dShape s;
    s.batch = g.x[0];
    s.height = g.x[2];
    s.width = g.x[3];
    s.out_h = conv2d_output_size(s.height, 2 * g.pad, g.kernel, g.stride, 1, "height", "test");
    s.out_w = conv2d_output_size(s.width, 2 * g.pad, g.kernel, g.stride, 1, "width", "test");
    const Tensor x = Tensor::randn(g.x, gen);
    const Tensor w = Tensor::randn({g.out, o.in_channels / g.groups, g.kernel, g.kernel}, gen);
    const Tensor b = Tensor::randn({g.out}, gen);
    const size_t bytes = conv2d_workspace_bytes(cpu_device(), o, s);
    const Tensor scratch = Tensor::empty({static_cast<int64_t>(bytes / sizeof(float)) + 1});
    std::vector<Tensor> ys;
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      ys.push_back(Tensor::full({s.batch, g.out, s.out_h, s.out_w}, kNaN));
      Workspace ws(scratch.raw_data(), bytes);
      conv2d_forward_f32(cpu_device(), o, s, x.data<float>(), w.data<float>(), b.data<float>(),
                         ys.back().data<float>(), ws);
    }
    set_num_threads(0);
    BOOST_TEST(bitwise_equal(ys[0], ys[1]), "x " << shape_to_string(g.x) << " -> " << g.out);
  }
}

// A one-node network on input x (a JSON shape or {"shape", "dtype"}) resolved, for the errors
// that infer and the op's constructor raise.
void resolve_one(const std::string& x, const std::string& op, const std::string& args) {
  Network::resolve(parse_network(
      std::string(R"({"inputs": {"x": )") + x + R"(}, "nodes": [{"name": "n0", "op": ")" + op +
          R"(", "args": )" + args + R"(, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})",
      "test.json"));
}

BOOST_AUTO_TEST_CASE(conv2d_mean_pool_reject_bad_args_and_shapes) {
  auto conv = [](const std::string& x, const std::string& more) {
    return [x, more] {
      resolve_one(x, "conv2d", R"({"in_channels": 4, "out_channels": 6)" + more + "}");
    };
  };
  const std::string x = "[1, 4, 8, 8]";
  expect_error(ErrorCode::Constraint,
               "n0 (conv2d): groups=4 must divide in_channels=4 and "
               "out_channels=6",
               conv(x, R"(, "kernel_size": 3, "groups": 4)"));
  expect_error(ErrorCode::Shape,
               "the padded input height 3 + 2 is smaller than the dilated "
               "kernel 7",
               conv("[1, 4, 3, 9]", R"(, "kernel_size": 7, "padding": 1)"));
  expect_error(ErrorCode::Shape,
               "the padded input width 8 + 0 is smaller than the dilated kernel 9",
               conv(x, R"(, "kernel_size": [1, 5], "dilation": 2)"));
  expect_error(ErrorCode::Shape, "x [1, 3, 8, 8] has 3 channels (dim 1), in_channels=4",
               conv("[1, 3, 8, 8]", R"(, "kernel_size": 3)"));
  expect_error(ErrorCode::Shape, "x [3, 8, 8] has 3 channels (dim 0), in_channels=4",
               conv("[3, 8, 8]", R"(, "kernel_size": 3)"));
  expect_error(ErrorCode::Constraint, "padding='same' is not supported for strided convolutions",
               conv(x, R"(, "kernel_size": 3, "stride": 2, "padding": "same")"));
  expect_error(ErrorCode::Constraint, "padding='full' must be 'valid', 'same'",
               conv(x, R"(, "kernel_size": 3, "padding": "full")"));
  expect_error(ErrorCode::Unsupported, "padding_mode='reflect' is not supported",
               conv(x, R"(, "kernel_size": 3, "padding_mode": "reflect")"));
  expect_error(ErrorCode::Constraint, "padding_mode='mirror' must be one of",
               conv(x, R"(, "kernel_size": 3, "padding_mode": "mirror")"));
  expect_error(ErrorCode::Arg, "missing required argument kernel_size", conv(x, ""));
  expect_error(ErrorCode::Arg, "argument kernel_size must be an int or a pair of ints, got array",
               conv(x, R"(, "kernel_size": [3, 3, 3])"));
  expect_error(ErrorCode::Arg, "argument stride must be an int or a pair of ints, got string",
               conv(x, R"(, "kernel_size": 3, "stride": "2")"));
  expect_error(ErrorCode::Constraint, "stride=[1, 0] must be >= 1",
               conv(x, R"(, "kernel_size": 3, "stride": [1, 0])"));
  expect_error(ErrorCode::Constraint, "kernel_size=0 must be >= 1",
               conv(x, R"(, "kernel_size": 0)"));
  expect_error(ErrorCode::Constraint, "padding=-1 must be >= 0",
               conv(x, R"(, "kernel_size": 3, "padding": -1)"));
  expect_error(ErrorCode::Constraint, "dilation=0 must be >= 1",
               conv(x, R"(, "kernel_size": 3, "dilation": 0)"));
  expect_error(ErrorCode::Constraint, "kernel_size=[1, 2147483648] must be <= 2147483647",
               conv(x, R"(, "kernel_size": [1, 2147483648])"));
  expect_error(ErrorCode::Constraint, "is too large",
               conv(x, R"(, "kernel_size": 2147483647, "out_channels": 4294967296)"));
  expect_error(ErrorCode::Constraint, "out_channels=0 must be >= 1", [] {
    resolve_one("[1, 4, 8, 8]", "conv2d",
                R"({"in_channels": 4, "out_channels": 0, "kernel_size": 1})");
  });
  expect_error(ErrorCode::Arg, "unknown argument 'padding_value'",
               conv(x, R"(, "kernel_size": 3, "padding_value": 0)"));
  expect_error(ErrorCode::Shape, "x [4, 8] is not [N, C, H, W] or [C, H, W]",
               conv("[4, 8]", R"(, "kernel_size": 3)"));
  expect_error(ErrorCode::Shape, "has an empty spatial dim",
               conv("[1, 4, 0, 8]", R"(, "kernel_size": 1, "padding": 1)"));
  expect_error(ErrorCode::DType, "x has dtype bool; conv2d needs a float input",
               conv(R"({"shape": [1, 4, 8, 8], "dtype": "bool"})", R"(, "kernel_size": 3)"));

  // Open dims: the output size as an expression, checked once the dims are bound.
  const NetworkSpec open =
      parse_network(std::string(R"({"inputs": {"x": ["B", 3, "H", "W"]}, "nodes": [
      {"name": "p", "op": "conv2d", "args": {"in_channels": 3, "out_channels": 8,
                                             "kernel_size": 16, "stride": 16}, "inputs": {"x": "x"}},
      {"name": "c", "op": "conv2d", "args": {"in_channels": 8, "out_channels": 8, "kernel_size": 3,
                                             "stride": 2, "padding": 1}, "inputs": {"x": "p"}},
      {"name": "v", "op": "conv2d", "args": {"in_channels": 8, "out_channels": 4, "kernel_size": 3},
       "inputs": {"x": "c"}}], "outputs": {"y": "v"}})"),
                    "test.json");
  const Network net = Network::resolve(open);
  BOOST_TEST(sym_shape_to_string(net.values().back().type.shape) ==
             "[B, 4, (H/16+1)/2-2, (W/16+1)/2-2]");
  const Network bound = Network::resolve(open, {{"x", {2, 3, 224, 96}}});
  BOOST_TEST(sym_shape_to_string(bound.values().back().type.shape) == "[2, 4, 5, 1]");
  expect_error(ErrorCode::Shape,
               "p (conv2d): the padded input height 15 + 0 is smaller than the "
               "dilated kernel 16",
               [&] {
                 Network::resolve(open, {{"x", {1, 3, 15, 64}}});
               });
  expect_error(ErrorCode::Shape, "v (conv2d): the padded input width 2 + 0 is smaller", [&] {
    Network::resolve(open, {{"x", {1, 3, 96, 64}}});
  });

  // FLOPs: 2 * N * out * oh * ow * (in / groups) * kh * kw, plus one add per output for the bias.
  {
    NetworkNode node{"n0",
                     "conv2d",
                     ojson::parse(R"({"in_channels": 4, "out_channels": 6, "kernel_size": [3, 2],
                                      "groups": 2, "stride": 2})"),
                     {{"x", "x"}}};
    const std::unique_ptr<Op> op = make_op(node);
    const ValueType x{fixed_shape({2, 4, 9, 8}), DType::F32};
    const InputTypes in = {&x};
    const double outputs = 2.0 * 6 * 4 * 4;
    BOOST_TEST(op->cost(in).flops == 2.0 * outputs * 2 * 3 * 2 + outputs);
  }

  auto mean = [](const std::string& x, const std::string& args) {
    return [x, args] { resolve_one(x, "mean", args); };
  };
  expect_error(ErrorCode::Constraint, "n0 (mean): dim=3 is out of range for a rank-3 input",
               mean("[2, 3, 4]", R"({"dim": 3})"));
  expect_error(ErrorCode::Constraint, "dim=-2 is out of range for a rank-1 input",
               mean("[]", R"({"dim": [-2]})"));
  expect_error(ErrorCode::Constraint, "dim 1 appears more than once in dim",
               mean("[2, 3, 4]", R"({"dim": [1, -2]})"));
  expect_error(ErrorCode::Arg, "argument dim must be an int, a list of ints or null, got string",
               mean("[2, 3, 4]", R"({"dim": "1"})"));
  expect_error(ErrorCode::Arg, "argument keepdim must be a boolean",
               mean("[2, 3, 4]", R"({"keepdim": 1})"));
  expect_error(ErrorCode::Arg, "unknown argument 'dtype'", mean("[2, 3]", R"({"dtype": "f32"})"));
  {
    // An empty reduction is 0/0, as torch.mean gives (the harness compares no NaN).
    const Tensor x = Tensor::zeros({0, 3});
    Tensor y = Tensor::empty({3});
    const int64_t dims[] = {0};
    mean_into(x, dims, false, y, "test");
    for (const float v : y.to_float_vector()) BOOST_TEST(std::isnan(v));
  }

  auto pool = [](const std::string& x, const std::string& args) {
    return [x, args] { resolve_one(x, "adaptive_avg_pool2d", args); };
  };
  expect_error(ErrorCode::Constraint, "output_size=[2, -1] must be >= 0",
               pool("[1, 2, 4, 4]", R"({"output_size": [2, -1]})"));
  expect_error(ErrorCode::Arg, "argument output_size must be an int, or a pair of ints or nulls",
               pool("[1, 2, 4, 4]", R"({"output_size": [1, 2, 3]})"));
  expect_error(ErrorCode::Arg, "argument output_size must be",
               pool("[1, 2, 4, 4]", R"({"output_size": null})"));
  expect_error(ErrorCode::Arg, "missing required argument output_size", pool("[1, 2, 4, 4]", "{}"));
  expect_error(ErrorCode::Shape, "x [1, 1, 2, 4, 4] is not [N, C, H, W] or [C, H, W]",
               pool("[1, 1, 2, 4, 4]", R"({"output_size": 2})"));
  expect_error(ErrorCode::Shape, "x [2, 0, 4] has an empty dim 1",
               pool("[2, 0, 4]", R"({"output_size": 2})"));
}

// silu, tanh and sigmoid at the special values, on every target, as PyTorch gives them:
// infinities saturate (silu(-inf) is NaN, as PyTorch's -inf / inf), NaN stays NaN, the sign of
// zero is kept, and no large |x| overflows an exp into NaN.
BOOST_AUTO_TEST_CASE(exp_maps_special_values) {
  const float inf = std::numeric_limits<float>::infinity(), nan = kNaN,
              big = std::numeric_limits<float>::max();
  struct Special {
    float x, silu, tanh, sigmoid;
  };
  // A want of 0 for a tiny result: |got| <= 1e-37 (PyTorch may give a subnormal).
  const Special specials[] = {
      {-inf, nan, -1.0f, 0.0f},       {inf, inf, 1.0f, 1.0f},
      {nan, nan, nan, nan},           {-0.0f, -0.0f, -0.0f, 0.5f},
      {0.0f, 0.0f, 0.0f, 0.5f},       {-100.0f, -0.0f, -1.0f, 0.0f},
      {100.0f, 100.0f, 1.0f, 1.0f},   {-1e30f, -0.0f, -1.0f, 0.0f},
      {1e30f, 1e30f, 1.0f, 1.0f},     {-big, -0.0f, -1.0f, 0.0f},
      {big, big, 1.0f, 1.0f},         {-89.0f, -0.0f, -1.0f, 0.0f},
      {1e-30f, 5e-31f, 1e-30f, 0.5f}, {-1e-30f, -5e-31f, -1e-30f, 0.5f},
  };
  std::vector<float> values;
  for (int copy = 0; copy < 3; ++copy)  // 42 values: vector bodies and a tail
    for (const Special& sp : specials) values.push_back(sp.x);
  const Tensor x = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  auto check = [](float got, float want, const char* map, float v, int64_t target) {
    bool ok;
    if (std::isnan(want)) {
      ok = std::isnan(got);
    } else if (want == 0.0f) {
      ok = std::abs(got) <= 1e-37f && std::signbit(got) == std::signbit(want);
    } else if (std::isinf(want)) {
      ok = got == want;
    } else {
      ok = std::abs(got - want) <= 2e-6f * std::abs(want);
    }
    BOOST_TEST(ok, hwy::TargetName(target)
                       << " " << map << "(" << v << ") = " << got << ", expected " << want);
  };
  TargetReset reset;
  for (const int64_t target : compiled_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    Tensor y_silu = Tensor::empty(x.shape()), y_tanh = Tensor::empty(x.shape()),
           y_sigmoid = Tensor::empty(x.shape());
    unary_map_into("silu", x, y_silu, "test");
    unary_map_into("tanh", x, y_tanh, "test");
    unary_map_into("sigmoid", x, y_sigmoid, "test");
    for (size_t i = 0; i < values.size(); ++i) {
      const Special& sp = specials[i % std::size(specials)];
      check(y_silu.data<float>()[i], sp.silu, "silu", sp.x, target);
      check(y_tanh.data<float>()[i], sp.tanh, "tanh", sp.x, target);
      check(y_sigmoid.data<float>()[i], sp.sigmoid, "sigmoid", sp.x, target);
    }
  }
}

// torch.softmax gives NaN for a slice of all -inf (x - max is -inf - -inf), and for a slice
// holding NaN or +inf; the other slices are unaffected. The harness's cases avoid these (a NaN
// fails its comparison): here, on every target, along the last dim (the row kernel) and along
// others (the column kernel).
BOOST_AUTO_TEST_CASE(softmax_all_neg_inf_slices_are_nan) {
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    Shape shape;
    int64_t dim;
  };
  const Case cases[] = {{{4, 9}, -1},    {{4, 17}, 1}, {{9, 4}, 0},
                        {{3, 5, 19}, 1}, {{1, 3}, 1},  {{3, 1}, 0}};
  TargetReset reset;
  for (const int64_t target : compiled_targets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Case& c : cases) {
      Generator gen(3);
      Tensor x = Tensor::randn(c.shape, gen);
      const auto d = static_cast<size_t>(wrap(c.dim, c.shape.size()));
      const std::vector<int64_t> st = f64::strides_of(c.shape);
      const int64_t len = c.shape[d], slices = x.numel() / len;
      // Slice 0 all -inf; slice 1 (if any) holds a NaN; slice 2 (if any) a +inf; the rest
      // normal with some -inf.
      auto at = [&](int64_t slice, int64_t i) {
        return (slice / st[d]) * st[d] * len + slice % st[d] + i * st[d];
      };
      float* p = x.data<float>();
      for (int64_t i = 0; i < len; ++i) p[at(0, i)] = -inf;
      if (slices > 1) p[at(1, len - 1)] = kNaN;
      if (slices > 2) p[at(2, 0)] = inf;
      if (slices > 3 && len > 1) p[at(3, 1)] = -inf;
      Tensor y = Tensor::empty(c.shape);
      softmax_into(x, c.dim, y, "test");
      const std::vector<double> ref = f64::softmax(x.to_double_vector(), c.shape, c.dim);
      const float* q = y.data<float>();
      for (int64_t slice = 0; slice < slices; ++slice) {
        for (int64_t i = 0; i < len; ++i) {
          const float got = q[at(slice, i)];
          const bool want_nan = slice < 3;
          const bool ok = want_nan ? std::isnan(got)
                                   : std::abs(got - ref[static_cast<size_t>(at(slice, i))]) <= 1e-6;
          BOOST_TEST(ok, hwy::TargetName(target)
                             << " softmax " << shape_to_string(c.shape) << " dim " << c.dim
                             << " slice " << slice << " element " << i << " = " << got);
        }
      }
    }
  }
}

// Bad arguments and shapes of the math ops, each refused when the network is resolved with the
// code interfaces.md gives it and a message naming the node, the argument and the shapes.
BOOST_AUTO_TEST_CASE(math_ops_reject_bad_args_and_shapes) {
  auto resolve = [](const std::string& json) {
    Network::resolve(parse_network(json, "test.json"));
  };
  // One node `op` on inputs a and b of the given JSON shapes.
  auto binary = [](const std::string& op, const std::string& a, const std::string& b,
                   const std::string& args = "{}") {
    return R"({"inputs": {"a": )" + a + R"(, "b": )" + b +
           R"(}, "nodes": [{"name": "n0", "op": ")" + op + R"(", "args": )" + args +
           R"(, "inputs": {"a": "a", "b": "b"}}], "outputs": {"y": "n0"}})";
  };
  auto unary = [](const std::string& op, const std::string& x, const std::string& args) {
    return R"({"inputs": {"x": )" + x + R"(}, "nodes": [{"name": "n0", "op": ")" + op +
           R"(", "args": )" + args + R"(, "inputs": {"x": "x"}}], "outputs": {"y": "n0"}})";
  };
  expect_error(ErrorCode::Shape,
               "n0 (matmul): a [2, 3] and b [4, 2] cannot be multiplied: inner dims 3 vs 4",
               [&] { resolve(binary("matmul", "[2, 3]", "[4, 2]")); });
  expect_error(ErrorCode::Shape, "a [5] and b [4] cannot be multiplied: inner dims 5 vs 4",
               [&] { resolve(binary("matmul", "[5]", "[4]")); });
  expect_error(ErrorCode::Shape, "a [2, 7] and b [3] cannot be multiplied: inner dims 7 vs 3",
               [&] { resolve(binary("matmul", "[2, 7]", "[3]")); });
  expect_error(ErrorCode::Shape,
               "a [2, 2, 3] and b [3, 3, 2] do not broadcast in their batch dims (dim 0): 2 vs 3",
               [&] { resolve(binary("matmul", "[2, 2, 3]", "[3, 3, 2]")); });
  expect_error(ErrorCode::Shape, "a [] and b [3]: matmul needs inputs of at least 1 dim",
               [&] { resolve(binary("matmul", "[]", "[3]")); });
  expect_error(ErrorCode::Arg, "n0 (matmul): unknown argument",
               [&] { resolve(binary("matmul", "[2, 3]", "[3, 2]", R"({"out": 1})")); });
  for (const char* op : {"sub", "mul", "div"})
    expect_error(ErrorCode::Shape, "a [2, 3] and b [4] do not broadcast (dim 1): 3 vs 4",
                 [&] { resolve(binary(op, "[2, 3]", "[4]")); });
  expect_error(ErrorCode::Shape, "a [2, 1, 5] and b [3, 4] do not broadcast (dim 2): 5 vs 4",
               [&] { resolve(binary("mul", "[2, 1, 5]", "[3, 4]")); });
  expect_error(ErrorCode::Unsupported, "n0 (sub): alpha=2.0 is not supported",
               [&] { resolve(binary("sub", "[2, 3]", "[3]", R"({"alpha": 2})")); });
  expect_error(ErrorCode::Arg, "n0 (mul): unknown argument",
               [&] { resolve(binary("mul", "[2, 3]", "[3]", R"({"alpha": 1})")); });
  expect_error(ErrorCode::Constraint, "n0 (dropout): p=1.5 must be in [0, 1]",
               [&] { resolve(unary("dropout", "[2, 3]", R"({"p": 1.5})")); });
  expect_error(ErrorCode::Constraint, "p=-0.1 must be in [0, 1]",
               [&] { resolve(unary("dropout", "[2, 3]", R"({"p": -0.1})")); });
  expect_error(ErrorCode::Unsupported, "n0 (dropout): training=true is not supported",
               [&] { resolve(unary("dropout", "[2, 3]", R"({"training": true})")); });
  expect_error(ErrorCode::Arg, "argument training must be a boolean",
               [&] { resolve(unary("dropout", "[2, 3]", R"({"training": 1})")); });
  expect_error(ErrorCode::Constraint,
               "n0 (softmax): dim=2 is out of range for a rank-2 input (valid: -2 .. 1)",
               [&] { resolve(unary("softmax", "[2, 3]", R"({"dim": 2})")); });
  expect_error(ErrorCode::Constraint, "dim=-3 is out of range for a rank-2 input",
               [&] { resolve(unary("softmax", "[2, 3]", R"({"dim": -3})")); });
  expect_error(ErrorCode::Constraint, "dim=1 is out of range for a rank-1 input (valid: -1 .. 0)",
               [&] { resolve(unary("softmax", "[]", R"({"dim": 1})")); });
  expect_error(ErrorCode::Arg, "n0 (softmax): missing required argument dim",
               [&] { resolve(unary("softmax", "[2, 3]", "{}")); });
  for (const char* op : {"silu", "tanh", "sigmoid"})
    expect_error(ErrorCode::Arg, "unknown argument",
                 [&] { resolve(unary(op, "[2, 3]", R"({"inplace": true})")); });
  expect_error(ErrorCode::DType, "n0 (softmax): x has dtype bool", [&] {
    resolve(unary("softmax", R"({"shape": [2, 3], "dtype": "bool"})", R"({"dim": 0})"));
  });

  // Open dims: the inner-dim check waits until the shapes are bound.
  const std::string open = binary("matmul", R"(["B", "K"])", "[4, 2]");
  const Network net = Network::resolve(parse_network(open, "test.json"));
  BOOST_TEST(net.summary().find("-> [B, 2]") != std::string::npos, net.summary());
  expect_error(ErrorCode::Shape, "a [2, 3] and b [4, 2] cannot be multiplied: inner dims 3 vs 4",
               [&] {
                 Network::resolve(parse_network(open, "test.json"), {{"a", {2, 3}}});
               });
  Network::resolve(parse_network(open, "test.json"), {{"a", {2, 4}}});
}

// ---------------------------------------------------------------- shifted_window_attention

// A one-node network: `node` (shifted_window_attention, `args`) on x of this JSON shape.
NetworkSpec swin_network(const std::string& node, const std::string& x, const std::string& args) {
  return parse_network(std::string(R"({"inputs": {"x": )") + x + R"(}, "nodes": [{"name": ")" +
                           node + R"(", "op": "shifted_window_attention", "args": )" + args +
                           R"(, "inputs": {"x": "x"}}], "outputs": {"y": ")" + node + R"("}})",
                       "test.json");
}

std::string shape_json(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// tests/fixtures/swin/: torchvision's module (gen_swin_fixtures.py), its whole state_dict with
// the relative_position_index buffer, loaded strictly through a one-node network.
BOOST_AUTO_TEST_CASE(shifted_window_attention_matches_torchvision) {
  const std::string dir = std::string(TESSERA_FIXTURE_DIR) + "/swin/";
  for (const char* name : {"padded_shifted", "nonsquare_noqkvbias", "unshifted_noprojbias",
                           "shift_past_window"}) {
    BOOST_TEST_CONTEXT(name) {
      const SafetensorsFile file = SafetensorsFile::open(dir + name + ".safetensors");
      const std::string node = file.metadata().at("node");
      std::map<std::string, Tensor> state = file.tensors();
      const Tensor x = state.at("x"), ref = state.at("out");
      state.erase("x");
      state.erase("out");
      BOOST_TEST(state.count(node + ".relative_position_index") == 1u);
      Model model(swin_network(node, shape_json(x.shape()), file.metadata().at("config")), 7);
      const WeightsReport r = model.load_weights(state, /*strict=*/true, name);
      BOOST_TEST(r.missing.empty());
      BOOST_TEST(r.unexpected.empty());
      Plan plan(model, {{"x", TensorDesc{x.shape(), DType::F32}}});
      const Tensor out = plan.run({{"x", x}})[0].second;
      const std::vector<double> y = out.to_double_vector(), want = ref.to_double_vector();
      BOOST_REQUIRE_EQUAL(y.size(), want.size());
      double worst = 0.0, ref_max = 0.0;
      for (size_t i = 0; i < y.size(); ++i) {
        worst = std::max(worst, std::abs(y[i] - want[i]));
        ref_max = std::max(ref_max, std::abs(want[i]));
      }
      BOOST_TEST_MESSAGE("swin fixture " << name << ": max |y - torch| = " << worst
                                         << " (max |ref| " << ref_max << ")");
      BOOST_TEST(worst <= 1e-5 * std::max(1.0, ref_max));

      // A relative_position_index other than the one the arguments give is E_WEIGHTS; an absent
      // one is fine.
      std::map<std::string, Tensor> wrong = state;
      Tensor index = state.at(node + ".relative_position_index").clone();
      index.data<int64_t>()[1] += 1;
      wrong[node + ".relative_position_index"] = index;
      Model other(swin_network(node, shape_json(x.shape()), file.metadata().at("config")), 7);
      expect_error(ErrorCode::Weights, node + ".relative_position_index (a buffer",
                   [&] { other.load_weights(wrong, true, "w.safetensors"); });
      wrong.erase(node + ".relative_position_index");
      BOOST_TEST(other.load_weights(wrong, true, "w.safetensors").missing.empty());
    }
  }
}

BOOST_AUTO_TEST_CASE(shifted_window_attention_index_is_torchvisions) {
  // The op's buffer against the reference's coordinate construction, for square and not.
  for (const auto& [wh, ww] : {std::pair<int64_t, int64_t>{7, 7}, {3, 4}, {1, 5}, {2, 1}}) {
    const std::string args = R"({"dim": 4, "num_heads": 1, "window_size": [)" +
                             std::to_string(wh) + ", " + std::to_string(ww) + "]}";
    const Network net = Network::resolve(swin_network("n0", "[1, 8, 8, 4]", args));
    const auto buffers = net.nodes()[0].op->persistent_buffers();
    BOOST_REQUIRE_EQUAL(buffers.size(), 1u);
    BOOST_TEST(buffers[0].first == "relative_position_index");
    BOOST_TEST((buffers[0].second.dtype() == DType::I64));
    const Tensor& t = buffers[0].second;
    const std::vector<int64_t> want = f64::swin_relative_position_index(wh, ww);
    BOOST_REQUIRE_EQUAL(t.numel(), static_cast<int64_t>(want.size()));
    BOOST_TEST((t.shape() == Shape{wh * ww * wh * ww}));
    for (size_t i = 0; i < want.size(); ++i)
      BOOST_TEST(t.data<int64_t>()[i] == want[i]);
  }
}

BOOST_AUTO_TEST_CASE(shifted_window_attention_results_do_not_depend_on_threads) {
  // Shifted (the core's tiled path with region ids) and not (the fused kernel).
  const std::pair<const char*, const char*> cases[] = {
      {"[2, 28, 21, 32]", R"({"dim": 32, "num_heads": 4, "window_size": 7, "shift_size": 3})"},
      {"[1, 9, 16, 32]", R"({"dim": 32, "num_heads": 4, "window_size": 7, "shift_size": 3})"},
      {"[2, 28, 21, 32]", R"({"dim": 32, "num_heads": 2, "window_size": [7, 8]})"},
      // Groups of windows (windows_per_group), run by one thread each on two.
      {"[2, 28, 28, 96]", R"({"dim": 96, "num_heads": 3, "window_size": 7, "shift_size": 3})"},
  };
  for (const auto& [shape_text, args] : cases) {
    const std::string shape = shape_text;
    Model model(swin_network("n0", shape, args), 5);
    const Shape s = nlohmann::json::parse(shape).get<Shape>();
    Generator gen(9);
    const Tensor x = Tensor::randn(s, gen);
    std::vector<Tensor> ys;
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      Plan plan(model, {{"x", TensorDesc{s, DType::F32}}});
      ys.push_back(plan.run({{"x", x}})[0].second.clone());
    }
    set_num_threads(0);
    BOOST_TEST(bitwise_equal(ys[0], ys[1]), shape);
  }
}

BOOST_AUTO_TEST_CASE(shifted_window_attention_rejects_bad_args_and_shapes) {
  auto swin = [](const std::string& x, const std::string& args) {
    return [x, args] { Network::resolve(swin_network("n0", x, args)); };
  };
  const std::string x = "[1, 8, 8, 16]";
  const std::string base = R"("dim": 16, "num_heads": 2)";
  expect_error(ErrorCode::Constraint,
               "n0 (shifted_window_attention): num_heads=3 must divide dim=16",
               swin(x, R"({"dim": 16, "num_heads": 3, "window_size": 4})"));
  expect_error(ErrorCode::Constraint, "num_heads=0 must be >= 1",
               swin(x, R"({"dim": 16, "num_heads": 0, "window_size": 4})"));
  expect_error(ErrorCode::Constraint, "dim=0 must be >= 1",
               swin(x, R"({"dim": 0, "num_heads": 1, "window_size": 4})"));
  expect_error(ErrorCode::Constraint, "window_size=[4, 4, 4] must have length 2",
               swin(x, "{" + base + R"(, "window_size": [4, 4, 4]})"));
  expect_error(ErrorCode::Constraint, "shift_size=[2] must have length 2",
               swin(x, "{" + base + R"(, "window_size": 4, "shift_size": [2]})"));
  expect_error(ErrorCode::Constraint, "window_size=[0, 4] must be >= 1",
               swin(x, "{" + base + R"(, "window_size": [0, 4]})"));
  expect_error(ErrorCode::Constraint, "shift_size=-1 must be >= 0",
               swin(x, "{" + base + R"(, "window_size": 4, "shift_size": -1})"));
  expect_error(ErrorCode::Constraint, "must hold at most 4096 tokens",
               swin(x, "{" + base + R"(, "window_size": [65, 64]})"));
  expect_error(ErrorCode::Constraint, "must hold at most 4096 tokens",
               swin(x, "{" + base + R"(, "window_size": [4294967296, 4294967296]})"));
  expect_error(ErrorCode::Constraint, "window_size=[1, 18446744073709551615] does not fit int64",
               swin(x, "{" + base + R"(, "window_size": [1, 18446744073709551615]})"));
  // Huge shifts: no overflow (torch.roll takes them modulo the size).
  Network::resolve(swin_network(
      "n0", x,
      "{" + base +
          R"(, "window_size": 4, "shift_size": [9223372036854775807, 9223372036854775807]})"));
  expect_error(ErrorCode::Constraint, "attention_dropout=1.5 must be in [0, 1]",
               swin(x, "{" + base + R"(, "window_size": 4, "attention_dropout": 1.5})"));
  expect_error(ErrorCode::Constraint, "dropout=-0.1 must be in [0, 1]",
               swin(x, "{" + base + R"(, "window_size": 4, "dropout": -0.1})"));
  expect_error(ErrorCode::Arg, "missing required argument window_size", swin(x, "{" + base + "}"));
  expect_error(ErrorCode::Arg, "missing required argument num_heads",
               swin(x, R"({"dim": 16, "window_size": 4})"));
  expect_error(ErrorCode::Arg, "argument window_size must be an int or a list of 2 ints",
               swin(x, "{" + base + R"(, "window_size": "7"})"));
  expect_error(ErrorCode::Arg, "argument shift_size must be an int or a list of 2 ints",
               swin(x, "{" + base + R"(, "window_size": 4, "shift_size": [1.5, 1]})"));
  expect_error(ErrorCode::Arg, "argument qkv_bias must be a boolean",
               swin(x, "{" + base + R"(, "window_size": 4, "qkv_bias": 1})"));
  expect_error(ErrorCode::Arg, "unknown argument",
               swin(x, "{" + base + R"(, "window_size": 4, "logit_scale": 1})"));
  expect_error(ErrorCode::Shape, "x [1, 8, 8, 12] has C=12, dim=16",
               swin("[1, 8, 8, 12]", "{" + base + R"(, "window_size": 4})"));
  expect_error(ErrorCode::Shape, "is not [B, H, W, C]",
               swin("[8, 8, 16]", "{" + base + R"(, "window_size": 4})"));
  // An open H (any image size) resolves, with the output shape of x.
  swin(R"([1, "H", 8, 16])", "{" + base + R"(, "window_size": 4})")();
  expect_error(ErrorCode::Shape, "the channel dim C",
               swin(R"([1, 8, 8, "C"])", "{" + base + R"(, "window_size": 4})"));
  expect_error(ErrorCode::Shape, "too large to partition into windows",
               swin("[1, 4611686018427387904, 8, 16]", "{" + base + R"(, "window_size": 4})"));
  expect_error(ErrorCode::DType, "n0 (shifted_window_attention): x has dtype bool",
               swin(R"({"shape": [1, 8, 8, 16], "dtype": "bool"})",
                    "{" + base + R"(, "window_size": 4})"));
  // An open batch resolves; its size checks wait until it is bound.
  const Network net = Network::resolve(swin_network(
      "n0", R"(["B", 7, 5, 16])", "{" + base + R"(, "window_size": 4, "shift_size": 2})"));
  BOOST_TEST(net.summary().find("[B, 7, 5, 16]") != std::string::npos, net.summary());
  expect_error(ErrorCode::Shape, "too large to partition into windows", [&] {
    Network::resolve(swin_network("n0", R"(["B", 7, 5, 16])",
                                  "{" + base + R"(, "window_size": 4, "shift_size": 2})"),
                     {{"x", {int64_t{1} << 50, 7, 5, 16}}});
  });
}

BOOST_AUTO_TEST_SUITE_END()
