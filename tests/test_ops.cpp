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
#include "core/random.h"
#include "layers/elementwise.h"
#include "core/tensor.h"
#include "core/text.h"
#include "core/workspace.h"
#include "io/network_file.h"
#include "layers/attention.h"
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
    {"relu", relu_cases},           {"sub", sub_cases},
    {"mul", mul_cases},             {"div", div_cases},
    {"silu", silu_cases},           {"tanh", tanh_cases},
    {"sigmoid", sigmoid_cases},     {"softmax", softmax_cases},
    {"dropout", dropout_cases},     {"matmul", matmul_cases},
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
  return t.dtype() == DType::Bool ? t : t.to(DType::F32).contiguous();
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
                                                   : ojson(t.shape());
  ojson n = {{"name", "n0"}, {"op", op}, {"args", c.args}, {"inputs", ojson::object()}};
  for (const OpInput& i : c.inputs) n["inputs"][i.port] = source(i);
  net["nodes"] = ojson::array({n});
  for (const std::string& port : p.out_ports) net["outputs"][port] = "n0." + port;
  p.spec = parse_network(net.dump(), p.label);

  Model model(p.spec, kSeed);
  std::map<std::string, Tensor> random;
  for (const auto& [name, t] : f64::random_parameters(model.network().nodes()[0].parameters, gen))
    random["n0." + name] = t;
  model.load_weights(random, /*strict=*/true, p.label);
  p.state = model.state_dict();
  for (const auto& [name, t] : p.state) p.params[name.substr(3)] = t;
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
  if (layer->parameters()) layer->load(p.params);

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
  for (const ValueType& v : inferred.outputs)
    outs.push_back(Tensor::full(concrete_shape(v.shape), kNaN));
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

BOOST_AUTO_TEST_SUITE_END()
