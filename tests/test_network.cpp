// Networks: the file parser, the resolver (symbolic shapes, every error path), summary against
// the spec's five examples, the ops against float64 loops (here and in tests/reference.cpp),
// weights, and the plan's buffer reuse. Expected values come from the spec text and from index
// arithmetic, never from the code under test.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/expect_error.h"
#include "core/random.h"
#include "io/network_file.h"
#include "io/safetensors.h"
#include "backends/cpu/cpu_device.h"
#include "layers/attention.h"
#include "layers/linear.h"
#include "layers/network.h"
#include "layers/elementwise.h"
#include "layers/norm.h"
#include "layers/shape_ops.h"
#include "core/parallel.h"
#include "tests/reference.h"

using namespace tessera;

namespace {

NetworkSpec spec_of(const std::string& json) { return parse_network(json, "test.json"); }

void expect_resolve_error(ErrorCode code, const std::string& text, const std::string& json) {
  expect_error(code, text, [&] { Network::resolve(spec_of(json)); });
}

// A network of one node on input x of the given JSON shape.
std::string one_node(const std::string& shape, const std::string& op, const std::string& args,
                     const std::string& inputs = R"({"x": "x"})") {
  return R"({"inputs": {"x": )" + shape + R"(}, "nodes": [{"name": "n0", "op": ")" + op +
         R"(", "args": )" + args + R"(, "inputs": )" + inputs + R"(}], "outputs": {"y": "n0"}})";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) out.push_back(line);
  return out;
}

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return Tensor::randn(shape, gen);
}

// Runs `model` once on these inputs through a fresh plan; outputs copied out.
std::map<std::string, Tensor> run_once(const Model& model,
                                       const std::map<std::string, Tensor>& in) {
  std::map<std::string, TensorDesc> descs;
  for (const auto& [name, t] : in) descs[name] = TensorDesc{t.shape(), t.dtype()};
  Plan plan(model, descs);
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : plan.run(in)) out[name] = t.clone();
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(network)

// ---------------------------------------------------------------- the spec's five examples

BOOST_AUTO_TEST_CASE(spec_examples_summary) {
  // Network: and Parameters: lines copied from shared/reference/attention_op_spec.txt.
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"Network: [B, 8, 32] -> [B, 8, 32] dtype=float32", "Parameters: 4,224"},
      {"Network: [B, 6, 16] -> [B, 6, 16] dtype=float32", "Parameters: 1,088"},
      {"Network: [B, 10, 8] -> [B, 10, 8] dtype=float32", "Parameters: 1,368"},
      {"Network: [B, 16, 16] -> [B, 16, 16] dtype=float32", "Parameters: 1,186"},
      {"Network: [B, 64, 32] -> [B, 64, 32] dtype=float32", "Parameters: 5,028"},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    const std::string path = std::string(TESSERA_SOURCE_DIR) + "/examples/spec/example" +
                             std::to_string(i + 1) + ".json";
    const auto out = lines(Network::resolve(load_network(path)).summary());
    BOOST_REQUIRE_GE(out.size(), 3u);
    BOOST_TEST(out.front() == expected[i].first, path);
    BOOST_TEST(out.back() == expected[i].second, path);
  }
}

BOOST_AUTO_TEST_CASE(summary_table_exact) {
  // interfaces.md §3, verbatim.
  const std::string ex1 =
      read_file(std::string(TESSERA_SOURCE_DIR) + "/examples/spec/example1.json");
  BOOST_TEST(Network::resolve(spec_of(ex1)).summary() ==
             "Network: [B, 8, 32] -> [B, 8, 32] dtype=float32\n"
             "index  name  operation  input shapes  output shapes\n"
             "0      n0    attention  x=[B, 8, 32]  out=[B, 8, 32]\n"
             "Parameters: 4,224\n");
  // Example 3: each column as wide as its widest cell plus two spaces.
  const std::string ex3 =
      read_file(std::string(TESSERA_SOURCE_DIR) + "/examples/spec/example3.json");
  BOOST_TEST(Network::resolve(spec_of(ex3)).summary() ==
             "Network: [B, 10, 8] -> [B, 10, 8] dtype=float32\n"
             "index  name  operation  input shapes   output shapes\n"
             "0      n0    linear     x=[B, 10, 8]   out=[B, 10, 16]\n"
             "1      n1    attention  x=[B, 10, 16]  out=[B, 10, 16]\n"
             "2      n2    linear     x=[B, 10, 16]  out=[B, 10, 8]\n"
             "Parameters: 1,368\n");
}

BOOST_AUTO_TEST_CASE(summary_several_inputs_and_outputs) {
  const std::string json = R"({
    "inputs": {"q": ["L", "N", 8], "mask": {"shape": ["N", "S"], "dtype": "bool"},
               "kv": ["S", "N", 8]},
    "nodes": [{"name": "m", "op": "multihead_attention",
               "args": {"embed_dim": 8, "num_heads": 2, "average_attn_weights": false},
               "inputs": {"query": "q", "key": "kv", "key_padding_mask": "mask"}}],
    "outputs": {"out": "m", "w": "m.weights"}})";
  const auto out = lines(Network::resolve(spec_of(json)).summary());
  BOOST_TEST(out[0] ==
             "Network: q=[L, N, 8], mask=[N, S], kv=[S, N, 8] -> out=[L, N, 8], "
             "w=[N, 2, L, S] dtype=float32");
  BOOST_TEST(out[2] ==
             "0      m     multihead_attention  query=[L, N, 8], key=[S, N, 8], "
             "key_padding_mask=[N, S]  out=[L, N, 8], weights=[N, 2, L, S]");
  BOOST_TEST(out[1] == "index  name  operation            input shapes" + std::string(45, ' ') +
                           "output shapes");
  // in_proj 3*8*8 + 24, out_proj 64 + 8.
  BOOST_TEST(out.back() == "Parameters: 288");
}

// ---------------------------------------------------------------- symbolic dimensions

BOOST_AUTO_TEST_CASE(symbols_stay_open_until_bound) {
  const std::string json = R"({
    "inputs": {"x": ["B", "T", 32], "y": ["B", "T", 32]},
    "nodes": [{"name": "s", "op": "add", "inputs": {"a": "x", "b": "y"}},
              {"name": "p", "op": "linear", "args": {"out_features": 4}, "inputs": {"x": "s"}}],
    "outputs": {"out": "p"}})";
  const Network open = Network::resolve(spec_of(json));
  BOOST_TEST(lines(open.summary())[0] ==
             "Network: x=[B, T, 32], y=[B, T, 32] -> [B, T, 4] dtype=float32");
  // Binding x binds B and T in y too: one symbol, one value.
  const Network bound = Network::resolve(spec_of(json), {{"x", {2, 7, 32}}});
  BOOST_TEST(lines(bound.summary())[0] ==
             "Network: x=[2, 7, 32], y=[2, 7, 32] -> [2, 7, 4] dtype=float32");
  BOOST_TEST(bound.bindings().at("B") == 2);
  BOOST_TEST(bound.bindings().at("T") == 7);

  expect_error(
      ErrorCode::Shape,
      "input y: shape [3, 7, 32] does not fit [B, T, 32]: dim 0 (B) is 3, but B=2 from input x",
      [&] {
        Network::resolve(spec_of(json), {{"x", {2, 7, 32}}, {"y", {3, 7, 32}}});
      });
  expect_error(ErrorCode::Shape, "dim 2 is 31, the network fixes it to 32", [&] {
    Network::resolve(spec_of(json), {{"x", {2, 7, 31}}});
  });
  expect_error(ErrorCode::Shape, "(rank 2, not 3)", [&] {
    Network::resolve(spec_of(json), {{"x", {2, 7}}});
  });
  expect_error(ErrorCode::Arg, "'z' is not a network input (inputs: x, y)", [&] {
    Network::resolve(spec_of(json), {{"z", {2}}});
  });
}

BOOST_AUTO_TEST_CASE(spatial_shape_fixes_open_T) {
  // T is open in the file; the 4x4 grid of n1 fixes it to 16, and every shape, including the
  // input and the node before, prints it.
  const std::string json = R"({
    "inputs": {"x": ["B", "T", 8]},
    "nodes": [{"name": "n0", "op": "linear", "args": {"out_features": 16}, "inputs": {"x": "x"}},
              {"name": "n1", "op": "attention", "args": {"heads": 2, "relative_position_bias": true,
                                                          "spatial_shape": 4}, "inputs": {"x": "n0"}}],
    "outputs": {"y": "n1"}})";
  const Network net = Network::resolve(spec_of(json));
  const auto out = lines(net.summary());
  BOOST_TEST(out[0] == "Network: [B, 16, 8] -> [B, 16, 16] dtype=float32");
  BOOST_TEST(out[2] == "0      n0    linear     x=[B, 16, 8]   out=[B, 16, 16]");
  BOOST_TEST(net.bindings().at("T") == 16);
  // 8*16+16 + 4*(16*16+16) + 49*2
  BOOST_TEST(net.parameter_count() == 144 + 1088 + 98);

  // A bound T that disagrees with the grid, and two grids that disagree.
  expect_error(ErrorCode::Constraint,
               "n1 (attention): relative_position_bias needs spatial_shape H*W == T", [&] {
                 Network::resolve(spec_of(json), {{"x", {2, 15, 8}}});
               });
  expect_resolve_error(ErrorCode::Constraint, "n1 (attention)", R"({
    "inputs": {"x": ["B", "T", 16]},
    "nodes": [{"name": "n0", "op": "attention", "args": {"heads": 2, "relative_position_bias": true,
                                                          "spatial_shape": 4}, "inputs": {"x": "x"}},
              {"name": "n1", "op": "attention", "args": {"heads": 2, "relative_position_bias": true,
                                                          "spatial_shape": [5, 5]}, "inputs": {"x": "n0"}}],
    "outputs": {"y": "n1"}})");
}

BOOST_AUTO_TEST_CASE(derived_dims_print_as_expressions) {
  const std::string json = R"({
    "inputs": {"x": ["B", "T", 32]},
    "nodes": [{"name": "c", "op": "chunk", "args": {"chunks": 2, "dim": 1}, "inputs": {"x": "x"}},
              {"name": "j", "op": "concat", "args": {"dim": 1}, "inputs": {"x0": "c.out1", "x1": "x", "x2": "x"}}],
    "outputs": {"y": "j"}})";
  const auto out = lines(Network::resolve(spec_of(json)).summary());
  BOOST_TEST(out[2].ends_with("  out0=[B, T/2, 32], out1=[B, T/2, 32]"));
  BOOST_TEST(
      out[3].ends_with("x0=[B, T/2, 32], x1=[B, T, 32], x2=[B, T, 32]  out=[B, (T/2)+2*T, 32]"));
  // Bound, they are numbers, and the chunk constraint is checked.
  BOOST_TEST(lines(Network::resolve(spec_of(json), {{"x", {1, 6, 32}}}).summary())[0] ==
             "Network: [1, 6, 32] -> [1, 15, 32] dtype=float32");
  expect_error(ErrorCode::Constraint,
               "c (chunk): dim 1 of x [1, 5, 32] has size 5, not a multiple of chunks=2", [&] {
                 Network::resolve(spec_of(json), {{"x", {1, 5, 32}}});
               });
}

// ---------------------------------------------------------------- resolver errors

BOOST_AUTO_TEST_CASE(format_and_io_errors) {
  expect_error(ErrorCode::Format, "test.json: not valid JSON", [] { spec_of(R"({"inputs": )"); });
  expect_error(ErrorCode::IO, "/nonexistent/net.json: cannot open",
               [] { load_network("/nonexistent/net.json"); });
  expect_error(ErrorCode::IO, "is a directory", [] { load_network(TESSERA_SOURCE_DIR); });
}

BOOST_AUTO_TEST_CASE(structure_errors_are_arg) {
  expect_error(ErrorCode::Arg, "test.json: the network must be a JSON object",
               [] { spec_of("[]"); });
  expect_error(ErrorCode::Arg, "unknown key 'node'", [] {
    spec_of(R"({"inputs": {}, "nodes": [], "outputs": {"y": "x"}, "node": []})");
  });
  expect_error(ErrorCode::Arg, "missing 'outputs'",
               [] { spec_of(R"({"inputs": {}, "nodes": []})"); });
  expect_error(ErrorCode::Arg, "the network has no outputs",
               [] { spec_of(R"({"inputs": {"x": [1]}, "nodes": [], "outputs": {}})"); });
  expect_error(ErrorCode::Arg,
               "input x: a dimension must be an integer or a symbol string, got a number",
               [] { spec_of(one_node("[2.5]", "gelu", "{}")); });
  expect_error(ErrorCode::Shape, "input x: dimension -2 is negative",
               [] { spec_of(one_node("[-2]", "gelu", "{}")); });
  expect_error(ErrorCode::Arg, "open dimension 'B T' is not a symbol name",
               [] { spec_of(one_node(R"(["B T"])", "gelu", "{}")); });
  expect_error(ErrorCode::Arg, "n0 (attention): unknown version @2",
               [] { spec_of(one_node("[1, 2, 4]", "attention@2", R"({"heads": 1})")); });
  expect_error(ErrorCode::Arg, "unknown key 'arg'", [] {
    spec_of(
        R"({"inputs": {"x": [1]}, "nodes": [{"name": "n0", "op": "gelu", "arg": {}}], "outputs": {"y": "n0"}})");
  });
  expect_error(ErrorCode::Arg, "the name x is already taken", [] {
    spec_of(
        R"({"inputs": {"x": [1]}, "nodes": [{"name": "x", "op": "gelu", "inputs": {"x": "x"}}], "outputs": {"y": "x"}})");
  });
  for (const char* name : {"a..b", ".a", "a."})
    expect_error(ErrorCode::Arg, "has an empty '.'-separated part", [&] {
      spec_of(std::string(R"({"inputs": {"x": [1]}, "nodes": [{"name": ")") + name +
              R"(", "op": "gelu", "inputs": {"x": "x"}}], "outputs": {"y": "x"}})");
    });
  expect_error(ErrorCode::DType, "'complex' is not a dtype", [] {
    spec_of(R"({"dtype": "complex", "inputs": {}, "nodes": [], "outputs": {"y": "x"}})");
  });
  // "attention@1" is "attention".
  BOOST_TEST(spec_of(one_node("[1, 2, 4]", "attention@1", R"({"heads": 1})")).nodes[0].op ==
             "attention");
}

BOOST_AUTO_TEST_CASE(unknown_ops_args_ports_sources) {
  expect_resolve_error(ErrorCode::Arg,
                       "n0 (conv): unknown op 'conv' (ops: attention, multihead_attention, linear",
                       one_node("[1, 2, 4]", "conv", "{}"));
  expect_resolve_error(ErrorCode::Arg,
                       "n0 (attention): unknown argument 'head' (attention takes heads, causal",
                       one_node("[1, 2, 4]", "attention", R"({"heads": 2, "head": 2})"));
  expect_resolve_error(ErrorCode::Arg, "n0 (attention): missing required argument heads",
                       one_node("[1, 2, 4]", "attention", "{}"));
  expect_resolve_error(ErrorCode::Arg, "argument heads must be an integer, got string \"2\"",
                       one_node("[1, 2, 4]", "attention", R"({"heads": "2"})"));
  expect_resolve_error(ErrorCode::Arg, "argument causal must be a boolean, got an integer 1",
                       one_node("[1, 2, 4]", "attention", R"({"heads": 2, "causal": 1})"));
  expect_resolve_error(
      ErrorCode::Arg, "argument spatial_shape must be an int or a pair of ints",
      one_node("[1, 2, 4]", "attention", R"({"heads": 2, "spatial_shape": [1, 2, 3]})"));
  expect_resolve_error(
      ErrorCode::Arg, "init names 'table'",
      one_node("[1, 2, 4]", "attention", R"({"heads": 2, "init": {"table": 0.02}})"));
  expect_resolve_error(
      ErrorCode::Arg, "trainable names 'relative_position_bias_table'",
      one_node("[1, 2, 4]", "attention",
               R"({"heads": 2, "trainable": {"relative_position_bias_table": false}})"));
  expect_resolve_error(ErrorCode::Arg, "unknown input port 'input' (attention takes x)",
                       one_node("[1, 2, 4]", "attention", R"({"heads": 2})", R"({"input": "x"})"));
  expect_resolve_error(ErrorCode::Arg, "n0 (add): missing input port b",
                       one_node("[1, 2, 4]", "add", "{}", R"({"a": "x"})"));
  expect_resolve_error(ErrorCode::Arg, "n0 (concat): missing input port x1",
                       one_node("[1, 2, 4]", "concat", "{}", R"({"x0": "x", "x2": "x"})"));
  expect_resolve_error(ErrorCode::Arg, "unknown input port 'y0' (concat takes x0, x1, ...)",
                       one_node("[1, 2, 4]", "concat", "{}", R"({"y0": "x"})"));
  expect_resolve_error(ErrorCode::Arg, "input port x: unknown source 'z'",
                       one_node("[1, 2, 4]", "gelu", "{}", R"({"x": "z"})"));
  expect_resolve_error(ErrorCode::Arg, "refers to node n0, this node itself",
                       one_node("[1, 2, 4]", "gelu", "{}", R"({"x": "n0"})"));
  expect_resolve_error(ErrorCode::Arg, "source 'n1' refers to node n1, which comes later", R"({
    "inputs": {"x": [2, 4]},
    "nodes": [{"name": "n0", "op": "gelu", "inputs": {"x": "n1"}},
              {"name": "n1", "op": "gelu", "inputs": {"x": "x"}}],
    "outputs": {"y": "n1"}})");
  // need_weights=false removes the weights port.
  expect_resolve_error(
      ErrorCode::Arg,
      "output w: node m (multihead_attention) has no output port or parameter 'weights' (ports: "
      "out; parameters: in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias)",
      R"({
    "inputs": {"q": [3, 2, 8]},
    "nodes": [{"name": "m", "op": "multihead_attention",
               "args": {"embed_dim": 8, "num_heads": 2, "need_weights": false}, "inputs": {"query": "q"}}],
    "outputs": {"y": "m", "w": "m.weights"}})");
  expect_resolve_error(ErrorCode::Arg, "output y: unknown source 'n9'",
                       R"({"inputs": {"x": [1]}, "nodes": [], "outputs": {"y": "n9"}})");
}

BOOST_AUTO_TEST_CASE(constraint_errors) {
  // interfaces.md §3's example, verbatim.
  expect_resolve_error(ErrorCode::Constraint, "n0 (attention): heads=3 must divide D=32",
                       one_node(R"(["B", 8, 32])", "attention", R"({"heads": 3})"));
  expect_resolve_error(ErrorCode::Constraint, "rope needs an even head_dim",
                       one_node("[1, 4, 12]", "attention", R"({"heads": 4, "rope": true})"));
  expect_resolve_error(
      ErrorCode::Constraint, "relative_position_bias needs spatial_shape",
      one_node("[1, 4, 8]", "attention", R"({"heads": 2, "relative_position_bias": true})"));
  expect_resolve_error(ErrorCode::Constraint, "dropout=1.0 must be >= 0 and < 1",
                       one_node("[1, 4, 8]", "attention", R"({"heads": 2, "dropout": 1.0})"));
  expect_resolve_error(ErrorCode::Constraint, "n0 (linear): out_features=0 must be >= 1",
                       one_node("[1, 4, 8]", "linear", R"({"out_features": 0})"));
  expect_resolve_error(ErrorCode::Constraint, "approximate='fast' must be 'none' or 'tanh'",
                       one_node("[1, 4, 8]", "gelu", R"({"approximate": "fast"})"));
  expect_resolve_error(ErrorCode::Constraint,
                       "dim 2 of x [1, 4, 9] has size 9, not a multiple of chunks=2",
                       one_node("[1, 4, 9]", "chunk", R"({"chunks": 2, "dim": -1})"));
  expect_resolve_error(ErrorCode::Constraint, "dim=3 is out of range for a rank-3 input",
                       one_node("[1, 4, 8]", "chunk", R"({"chunks": 2, "dim": 3})"));
  expect_resolve_error(ErrorCode::Constraint, "eps=-1.0 must be finite and >= 0",
                       one_node("[1, 4, 8]", "layer_norm", R"({"eps": -1.0})"));
  expect_resolve_error(ErrorCode::Constraint, "num_heads=3 must divide embed_dim=8",
                       one_node("[3, 2, 8]", "multihead_attention",
                                R"({"embed_dim": 8, "num_heads": 3})", R"({"query": "x"})"));
}

BOOST_AUTO_TEST_CASE(shape_and_dtype_errors) {
  expect_resolve_error(ErrorCode::Shape, "n0 (attention): x [B, 8] is not [B, T, D]",
                       one_node(R"(["B", 8])", "attention", R"({"heads": 2})"));
  expect_resolve_error(ErrorCode::Shape, "the last dim (in_features) of x [B, D] is open (D)",
                       one_node(R"(["B", "D"])", "linear", R"({"out_features": 2})"));
  expect_resolve_error(ErrorCode::Shape, "a [2, 3] and b [4] do not broadcast (dim 1): 3 vs 4", R"({
    "inputs": {"x": [2, 3], "y": [4]},
    "nodes": [{"name": "n0", "op": "add", "inputs": {"a": "x", "b": "y"}}],
    "outputs": {"out": "n0"}})");
  expect_resolve_error(ErrorCode::Shape,
                       "x1 [2, 4] does not match x0 [2, 3] in dim 1 (only dim 0 may differ)", R"({
    "inputs": {"x": [2, 3], "y": [2, 4]},
    "nodes": [{"name": "n0", "op": "concat", "inputs": {"x0": "x", "x1": "y"}}],
    "outputs": {"out": "n0"}})");
  expect_resolve_error(ErrorCode::Shape, "query [3, 2, 6] must end in embed_dim=8",
                       one_node("[3, 2, 6]", "multihead_attention",
                                R"({"embed_dim": 8, "num_heads": 2})", R"({"query": "x"})"));
  expect_resolve_error(ErrorCode::Shape, "key_padding_mask [2, 4] must be [2, 3]", R"({
    "inputs": {"q": [3, 2, 8], "m": {"shape": [2, 4], "dtype": "bool"}},
    "nodes": [{"name": "n0", "op": "multihead_attention", "args": {"embed_dim": 8, "num_heads": 2},
               "inputs": {"query": "q", "key_padding_mask": "m"}}],
    "outputs": {"out": "n0"}})");
  expect_resolve_error(ErrorCode::DType,
                       "n0 (linear): x has dtype bool; linear needs a float input",
                       R"({"inputs": {"x": {"shape": [2, 4], "dtype": "bool"}},
                           "nodes": [{"name": "n0", "op": "linear", "args": {"out_features": 2}, "inputs": {"x": "x"}}],
                           "outputs": {"y": "n0"}})");
  expect_resolve_error(
      ErrorCode::DType, "input x: dtype uint8 is not supported for network inputs",
      R"({"inputs": {"x": {"shape": [2, 4], "dtype": "uint8"}}, "nodes": [], "outputs": {"y": "x"}})");
  expect_resolve_error(
      ErrorCode::Unsupported, "dtype=float16 is not supported",
      R"({"dtype": "float16", "inputs": {"x": [2, 4]}, "nodes": [], "outputs": {"y": "x"}})");
  expect_resolve_error(
      ErrorCode::DType, "dtype=bool is not a compute dtype",
      R"({"dtype": "bool", "inputs": {"x": [2, 4]}, "nodes": [], "outputs": {"y": "x"}})");
}

// ---------------------------------------------------------------- ops against float64 loops

BOOST_AUTO_TEST_CASE(layer_norm_matches_float64) {
  for (const int64_t D : {1, 7, 64, 67}) {
    const Tensor x = random_tensor({3, 5, D}, 10 + static_cast<uint64_t>(D));
    const Tensor g = random_tensor({D}, 20), b = random_tensor({D}, 30);
    for (const bool affine : {true, false}) {
      Tensor y = Tensor::empty({3, 5, D});
      layer_norm_into(x, affine ? g : Tensor(), affine ? b : Tensor(), 1e-5, y, "test");
      const std::vector<double> none;
      const std::vector<double> ref =
          f64::layer_norm(x.to_double_vector(), 15, D, affine ? g.to_double_vector() : none,
                          affine ? b.to_double_vector() : none, 1e-5);
      BOOST_TEST(max_abs_diff(y.to_double_vector(), ref) <= 2e-5,
                 "D=" << D << " affine=" << affine);
    }
  }
}

BOOST_AUTO_TEST_CASE(gelu_matches_float64) {
  for (const int64_t n : {1, 15, 16, 17, 1000, 40000}) {
    Tensor x = random_tensor({n}, static_cast<uint64_t>(n));
    x.set_item({0}, -12.0);  // the far tail: erf saturates
    for (const bool approx : {false, true}) {
      Tensor y = Tensor::empty({n});
      gelu_into(x, approx, y, "test");
      const auto xv = x.to_double_vector(), yv = y.to_double_vector();
      double worst = 0;
      for (size_t i = 0; i < xv.size(); ++i) {
        const double v = xv[i];
        const double ref = f64::gelu(v, approx);
        worst = std::max(worst, std::abs(yv[i] - ref) / std::max(1.0, std::abs(ref)));
      }
      BOOST_TEST(worst <= 2e-6, "n=" << n << " tanh=" << approx);
    }
  }
}

BOOST_AUTO_TEST_CASE(add_broadcasts_as_pytorch) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}},       {{2, 1, 4}, {3, 1}}, {{1}, {2, 3}},
      {{5, 1}, {1, 33}},      {{2, 3, 1}, {2, 3, 1}}, {{}, {3}},           {{4, 1, 2}, {4, 5, 2}}};
  for (const auto& [sa, sb] : cases) {
    const Tensor a = random_tensor(sa, 1), b = random_tensor(sb, 2);
    const Shape so = broadcast_shapes(sa, sb, "test");
    Tensor y = Tensor::empty(so);
    add_into(a, b, y, "test");
    const std::vector<double> ref = f64::add(a.to_double_vector(), sa, b.to_double_vector(), sb);
    BOOST_TEST(max_abs_diff(y.to_double_vector(), ref) <= 1e-6,
               shape_to_string(sa) << " + " << shape_to_string(sb));
  }
  BOOST_TEST(broadcast_shapes({2, 1, 4}, {3, 1}, "t") == (Shape{2, 3, 4}));
  expect_error(ErrorCode::Shape, "do not broadcast", [] { broadcast_shapes({2, 3}, {4}, "t"); });
}

BOOST_AUTO_TEST_CASE(chunk_and_concat_match_index_arithmetic) {
  const Shape s = {2, 6, 3};
  const Tensor x = random_tensor(s, 5);
  const auto xv = x.to_double_vector();
  for (const int64_t dim : {0, 1, -1, 2}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    const int64_t chunks = s[static_cast<size_t>(d)];  // pieces of size 1 along d
    Shape piece = s;
    piece[static_cast<size_t>(d)] = 1;
    std::vector<Tensor> outs;
    for (int64_t i = 0; i < chunks; ++i) outs.push_back(Tensor::empty(piece));
    std::vector<Tensor*> ptrs;
    for (Tensor& t : outs) ptrs.push_back(&t);
    chunk_into(x, dim, ptrs, "test");
    for (int64_t i = 0; i < chunks; ++i) {
      const auto ov = outs[static_cast<size_t>(i)].to_double_vector();
      for (int64_t f = 0; f < shape_numel(piece); ++f) {
        auto idx = f64::unravel(f, piece);
        idx[static_cast<size_t>(d)] = i;
        const auto st = f64::strides_of(s);
        int64_t off = 0;
        for (size_t k = 0; k < 3; ++k) off += idx[k] * st[k];
        BOOST_TEST(ov[static_cast<size_t>(f)] == xv[static_cast<size_t>(off)]);
      }
    }
    // Concatenating the pieces back gives x.
    std::vector<const Tensor*> cins;
    for (const Tensor& t : outs) cins.push_back(&t);
    Tensor back = Tensor::empty(s);
    concat_into(cins, dim, back, "test");
    BOOST_TEST(max_abs_diff(back.to_double_vector(), xv) == 0.0);
  }
  // Unequal pieces along dim 1: [2, 1, 3] ++ [2, 5, 3].
  const Tensor a = random_tensor({2, 1, 3}, 6), b = random_tensor({2, 5, 3}, 7);
  Tensor y = Tensor::empty({2, 6, 3});
  concat_into({&a, &b}, 1, y, "test");
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t t = 0; t < 6; ++t)
      for (int64_t c = 0; c < 3; ++c)
        BOOST_TEST(y.item({n, t, c}) == (t == 0 ? a.item({n, 0, c}) : b.item({n, t - 1, c})));
  std::vector<Tensor> bad(4, Tensor::empty({2, 1, 3}));
  expect_error(ErrorCode::Constraint, "not a multiple of chunks=4", [&] {
    std::vector<Tensor*> p;
    for (Tensor& t : bad) p.push_back(&t);
    chunk_into(x, 1, p, "test");
  });
}

// ---------------------------------------------------------------- networks end to end

BOOST_AUTO_TEST_CASE(network_ops_compose) {
  // y = concat(gelu(chunk0), layer_norm(chunk1)) + b  ; chunk along the last dim.
  const std::string json = R"({
    "inputs": {"x": ["B", 8], "b": [8]},
    "nodes": [{"name": "c", "op": "chunk", "args": {"chunks": 2, "dim": -1}, "inputs": {"x": "x"}},
              {"name": "g", "op": "gelu", "args": {"approximate": "tanh"}, "inputs": {"x": "c.out0"}},
              {"name": "ln", "op": "layer_norm", "args": {"elementwise_affine": false}, "inputs": {"x": "c.out1"}},
              {"name": "j", "op": "concat", "args": {"dim": 1}, "inputs": {"x0": "g", "x1": "ln"}},
              {"name": "s", "op": "add", "inputs": {"a": "j", "b": "b"}}],
    "outputs": {"y": "s"}})";
  Model model(spec_of(json));
  BOOST_TEST(model.parameter_count() == 0);
  const Tensor x = random_tensor({3, 8}, 1), b = random_tensor({8}, 2);
  const Tensor y = run_once(model, {{"x", x}, {"b", b}}).at("y");
  BOOST_REQUIRE(y.shape() == (Shape{3, 8}));
  for (int64_t r = 0; r < 3; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 4; j < 8; ++j) mean += x.item({r, j}) / 4;
    for (int64_t j = 4; j < 8; ++j) var += std::pow(x.item({r, j}) - mean, 2) / 4;
    for (int64_t j = 0; j < 8; ++j) {
      const double v = x.item({r, j});
      const double h = j < 4 ? f64::gelu(v, true) : (v - mean) / std::sqrt(var + 1e-5);
      BOOST_TEST(std::abs(y.item({r, j}) - (h + b.item({j}))) <= 1e-5);
    }
  }
}

BOOST_AUTO_TEST_CASE(linear_and_attention_nodes_run_their_layers) {
  const std::string json = R"({
    "inputs": {"x": ["B", "T", 8]},
    "nodes": [{"name": "p", "op": "linear", "args": {"out_features": 16}, "inputs": {"x": "x"}},
              {"name": "a", "op": "attention", "args": {"heads": 4, "rope": true, "causal": true}, "inputs": {"x": "p"}}],
    "outputs": {"y": "a", "h": "p"}})";
  Model model(spec_of(json), 7);
  const Tensor x = random_tensor({2, 5, 8}, 3);
  const auto out = run_once(model, {{"x", x}});
  // The same layers, built and called directly with the model's parameters.
  const auto state = model.state_dict();
  Linear lin(8, 16, true);
  lin.parameters().load({{"weight", state.at("p.weight")}, {"bias", state.at("p.bias")}}, true,
                        "t");
  lin.parameters().pack_projections(cpu_device());  // as the model's layer is
  AttentionOptions o;
  o.heads = 4;
  o.rope = true;
  o.causal = true;
  Attention att(16, o);
  std::map<std::string, Tensor> sub;
  for (const auto& [k, v] : state)
    if (k.starts_with("a.")) sub[k.substr(2)] = v;
  att.load_state_dict(sub, true);
  const Tensor h = lin.forward(x);
  BOOST_TEST(max_abs_diff(out.at("h").to_double_vector(), h.to_double_vector()) == 0.0);
  BOOST_TEST(max_abs_diff(out.at("y").to_double_vector(), att.forward(h).to_double_vector()) <=
             1e-6);
  // Seeds: the same seed gives the same parameters, another seed others.
  BOOST_TEST(max_abs_diff(Model(spec_of(json), 7).state_dict().at("p.weight").to_double_vector(),
                          state.at("p.weight").to_double_vector()) == 0.0);
  BOOST_TEST(max_abs_diff(Model(spec_of(json), 8).state_dict().at("p.weight").to_double_vector(),
                          state.at("p.weight").to_double_vector()) > 0.0);
}

BOOST_AUTO_TEST_CASE(multihead_attention_node) {
  const std::string json = R"({
    "inputs": {"q": [4, 2, 8], "k": [6, 2, 8], "m": {"shape": [2, 6], "dtype": "bool"}},
    "nodes": [{"name": "mha", "op": "multihead_attention", "args": {"embed_dim": 8, "num_heads": 2},
               "inputs": {"query": "q", "key": "k", "key_padding_mask": "m"}}],
    "outputs": {"out": "mha", "w": "mha.weights"}})";
  Model model(spec_of(json), 1);
  const Tensor q = random_tensor({4, 2, 8}, 1), k = random_tensor({6, 2, 8}, 2);
  std::vector<bool> mv(12, false);
  mv[5] = mv[11] = true;  // the last key of each batch element is padding
  const Tensor m = Tensor::from_vector(mv, {2, 6});
  const auto out = run_once(model, {{"q", q}, {"k", k}, {"m", m}});
  BOOST_TEST(out.at("out").shape() == (Shape{4, 2, 8}));
  BOOST_TEST(out.at("w").shape() == (Shape{2, 4, 6}));
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t l = 0; l < 4; ++l) {
      BOOST_TEST(out.at("w").item({n, l, 5}) == 0.0);  // masked key: weight exactly 0
      double row = 0;
      for (int64_t s = 0; s < 6; ++s) row += out.at("w").item({n, l, s});
      BOOST_TEST(std::abs(row - 1.0) <= 1e-5);
    }
}

BOOST_AUTO_TEST_CASE(parameters_named_as_pytorch) {
  // interfaces.md §1: separate q/k/v weights when kdim or vdim differs from E; biases and
  // bias_k/bias_v by their flags; attention's biases narrowed by qkv_bias/out_bias.
  const std::string json = R"({
    "inputs": {"q": [1, 5, 8], "k": [7, 5, 4], "v": [7, 5, 6], "x": [2, 5, 8]},
    "nodes": [{"name": "m", "op": "multihead_attention",
               "args": {"embed_dim": 8, "num_heads": 2, "kdim": 4, "vdim": 6, "add_bias_kv": true,
                        "add_zero_attn": true},
               "inputs": {"query": "q", "key": "k", "value": "v"}},
              {"name": "p", "op": "multihead_attention",
               "args": {"embed_dim": 8, "num_heads": 4, "bias": false, "batch_first": true,
                        "kdim": null, "need_weights": false},
               "inputs": {"query": "m"}},
              {"name": "a", "op": "attention",
               "args": {"heads": 2, "qkv_bias": false, "relative_position_bias": true,
                        "spatial_shape": [1, 5], "init": {"relative_position_bias_table": 0.02},
                        "trainable": {"o_proj.bias": false}},
               "inputs": {"x": "x"}}],
    "outputs": {"y": "p", "w": "m.weights", "z": "a"}})";
  const Network net = Network::resolve(spec_of(json));
  std::map<std::string, Shape> params;
  for (const ResolvedNode& n : net.nodes())
    for (const auto& [name, shape] : n.parameters) params[n.name + "." + name] = shape;
  const std::map<std::string, Shape> expected = {
      {"m.q_proj_weight", {8, 8}},   {"m.k_proj_weight", {8, 4}},
      {"m.v_proj_weight", {8, 6}},   {"m.in_proj_bias", {24}},
      {"m.bias_k", {1, 1, 8}},       {"m.bias_v", {1, 1, 8}},
      {"m.out_proj.weight", {8, 8}}, {"m.out_proj.bias", {8}},
      {"p.in_proj_weight", {24, 8}}, {"p.out_proj.weight", {8, 8}},
      {"a.q_proj.weight", {8, 8}},   {"a.k_proj.weight", {8, 8}},
      {"a.v_proj.weight", {8, 8}},   {"a.o_proj.weight", {8, 8}},
      {"a.o_proj.bias", {8}},        {"a.relative_position_bias_table", {1 * 9, 2}}};
  BOOST_TEST(params == expected);
  // m is sequence-first: q [L=1, N=5, 8]; weights [N, L, S'] with S' = 7 + bias_kv + zero_attn.
  const auto shape_of = [&](size_t output) {
    return sym_shape_to_string(
        net.values()[static_cast<size_t>(net.outputs()[output].second)].type.shape);
  };
  BOOST_TEST(shape_of(1) == "[5, 1, 9]");
  BOOST_TEST(shape_of(0) == "[1, 5, 8]");
  BOOST_TEST(net.nodes()[1].output_ports == std::vector<std::string>{"out"});
  // The layers declare exactly these (the Model checks), init reaches the table, and the
  // whole network runs.
  const Model model(net);
  const auto table = model.state_dict().at("a.relative_position_bias_table").to_double_vector();
  double max_abs = 0;
  for (double v : table) max_abs = std::max(max_abs, std::abs(v));
  BOOST_TEST(max_abs > 0.0);
  BOOST_TEST(max_abs <= 0.04 + 1e-7);  // truncated at two standard deviations
  const auto out = run_once(model, {{"q", random_tensor({1, 5, 8}, 1)},
                                    {"k", random_tensor({7, 5, 4}, 2)},
                                    {"v", random_tensor({7, 5, 6}, 3)},
                                    {"x", random_tensor({2, 5, 8}, 4)}});
  BOOST_TEST(out.at("w").shape() == (Shape{5, 1, 9}));
  BOOST_TEST(out.at("z").shape() == (Shape{2, 5, 8}));
}

// ---------------------------------------------------------------- plans

BOOST_AUTO_TEST_CASE(plan_reuses_buffers_and_never_reallocates) {
  // x -> l1 -> l2 -> l3 -> l4: l1 and l3 can share a buffer, l2 and l4 another.
  const std::string json = R"({
    "inputs": {"x": ["B", 16]},
    "nodes": [{"name": "l1", "op": "linear", "args": {"out_features": 32}, "inputs": {"x": "x"}},
              {"name": "l2", "op": "linear", "args": {"out_features": 32}, "inputs": {"x": "l1"}},
              {"name": "l3", "op": "linear", "args": {"out_features": 32}, "inputs": {"x": "l2"}},
              {"name": "l4", "op": "linear", "args": {"out_features": 32}, "inputs": {"x": "l3"}}],
    "outputs": {"y": "l4"}})";
  Model model(spec_of(json));
  Plan plan(model, {{"x", TensorDesc{{4, 16}, DType::F32}}});
  BOOST_TEST(plan.buffers().size() == 2u);
  const auto& vb = plan.value_buffers();  // values: x, l1, l2, l3, l4
  BOOST_TEST(vb[0] == -1);
  BOOST_TEST(vb[1] == vb[3]);
  BOOST_TEST(vb[2] == vb[4]);
  BOOST_TEST(vb[1] != vb[2]);
  for (const auto& b : plan.buffers()) BOOST_TEST(b.bytes == 4u * 32u * sizeof(float));
  // 4 GEMMs of 4x16x32 and 3 of 4x32x32.
  BOOST_TEST(plan.flops() == 2.0 * 4 * 16 * 32 + 3 * 2.0 * 4 * 32 * 32);

  const auto before = plan.buffers();
  const Tensor x = random_tensor({4, 16}, 1);
  const std::vector<double> first = plan.run({{"x", x}})[0].second.to_double_vector();
  const void* out_ptr = plan.run({{"x", x}})[0].second.raw_data();
  const std::vector<double> second = plan.value(4).to_double_vector();
  const auto after = plan.buffers();
  BOOST_REQUIRE_EQUAL(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    BOOST_TEST(before[i].data == after[i].data);
    BOOST_TEST(before[i].bytes == after[i].bytes);
  }
  // The output lives in the plan's buffer, and repeated runs agree exactly.
  BOOST_TEST(out_ptr == before[static_cast<size_t>(vb[4])].data);
  BOOST_TEST(first == second);
}

// Fusion: a linear whose output only a relu / gelu reads applies the activation itself, in
// place, and the activation's output shares its buffer (here g1 must survive l2 and l3 in l1's
// buffer). The same network with every activation input also returned as an output (two
// readers: nothing fuses) must give the same bits, on each panel path: a few rows (matvec), one
// task (small product) and a task split (400 x 48 x 96).
BOOST_AUTO_TEST_CASE(plan_fuses_activations_into_linears_with_the_same_bits) {
  const auto network = [](bool expose) {
    std::string outputs = R"("y": "y")";
    if (expose) outputs += R"(, "h1": "l1", "h2": "l2", "h4": "l4")";
    return R"({
    "inputs": {"x": ["B", 48]},
    "nodes": [{"name": "l1", "op": "linear", "args": {"out_features": 96}, "inputs": {"x": "x"}},
              {"name": "g1", "op": "gelu", "inputs": {"x": "l1"}},
              {"name": "l2", "op": "linear", "args": {"out_features": 96}, "inputs": {"x": "g1"}},
              {"name": "r2", "op": "relu", "inputs": {"x": "l2"}},
              {"name": "l3", "op": "linear", "args": {"out_features": 96}, "inputs": {"x": "r2"}},
              {"name": "s", "op": "add", "inputs": {"a": "g1", "b": "l3"}},
              {"name": "l4", "op": "linear", "args": {"out_features": 80, "bias": false},
               "inputs": {"x": "s"}},
              {"name": "g4", "op": "gelu", "args": {"approximate": "tanh"}, "inputs": {"x": "l4"}},
              {"name": "y", "op": "add", "inputs": {"a": "g4", "b": "g4"}}],
    "outputs": {)" + outputs + "}}";
  };
  {
    // (A model's projections are packed: the rows paths are linear_forward_f32's test below.)
    const Model fused(spec_of(network(false)), 7), plain(spec_of(network(true)), 7);
    BOOST_TEST_REQUIRE(fused.state_dict().at("l4.weight").to_double_vector() ==
                       plain.state_dict().at("l4.weight").to_double_vector());
    for (const int64_t rows : {3, 100, 400}) {
      const Tensor x = random_tensor({rows, 48}, 50 + static_cast<uint64_t>(rows));
      Plan plan(fused, {{"x", TensorDesc{{rows, 48}, DType::F32}}});
      Plan reference(plain, {{"x", TensorDesc{{rows, 48}, DType::F32}}});
      const std::vector<Activation> want = {Activation::gelu, Activation::none, Activation::relu,
                                            Activation::none, Activation::none, Activation::none,
                                            Activation::gelu_tanh, Activation::none,
                                            Activation::none};
      BOOST_TEST((plan.node_activations() == want));
      BOOST_TEST((plan.fused_into() == std::vector<int>{-1, 0, -1, 2, -1, -1, -1, 6, -1}));
      for (Activation a : reference.node_activations()) BOOST_TEST((a == Activation::none));
      // g1 (value 2) lives in l1's (value 1) buffer.
      BOOST_TEST(plan.value_buffers()[2] == plan.value_buffers()[1]);
      for (int run = 0; run < 2; ++run) {  // the second run reads buffers the first left behind
        const std::vector<double> got = plan.run({{"x", x}})[0].second.to_double_vector();
        const std::vector<double> ref = reference.run({{"x", x}})[0].second.to_double_vector();
        BOOST_TEST((got == ref), "rows " << rows << ": fused differs, max |diff| "
                                         << max_abs_diff(got, ref));
      }
    }
  }
}

// Fusion: an add whose output the layer_norm right after it reads runs inside that node. s1 is
// read again later (the fused node writes it), s2 is not (the sum goes to scratch). The same
// network with a dropout (a copy) between each add and its norm fuses nothing and must give the
// same bits, also on two threads. The fused norm's output must not take the buffer of a value the
// add reads (their lifetimes reach the norm's node now); a broadcasting add does not fuse.
BOOST_AUTO_TEST_CASE(plan_fuses_adds_into_the_layer_norm_after_them_with_the_same_bits) {
  const auto network = [](bool split) {
    const auto norm = [split](const std::string& n, const std::string& in) {
      if (!split)
        return R"({"name": ")" + n + R"(", "op": "layer_norm", "inputs": {"x": ")" + in + R"("}},)";
      return R"({"name": ")" + n +
             R"(_d", "op": "dropout", "args": {"p": 0.0}, "inputs": {"x": ")" + in +
             R"("}}, {"name": ")" + n + R"(", "op": "layer_norm", "inputs": {"x": ")" + n +
             R"(_d"}},)";
    };
    return R"({
    "inputs": {"x": ["B", 40], "bias": [40]},
    "nodes": [{"name": "l1", "op": "linear", "args": {"out_features": 40}, "inputs": {"x": "x"}},
              {"name": "s1", "op": "add", "inputs": {"a": "x", "b": "l1"}},
              )" + norm("n1", "s1") + R"(
              {"name": "l2", "op": "linear", "args": {"out_features": 40}, "inputs": {"x": "n1"}},
              {"name": "s2", "op": "add", "inputs": {"a": "s1", "b": "l2"}},
              )" + norm("n2", "s2") + R"(
              {"name": "s3", "op": "add", "inputs": {"a": "n2", "b": "bias"}},
              )" + norm("n3", "s3") + R"(
              {"name": "y", "op": "linear", "args": {"out_features": 24}, "inputs": {"x": "n3"}}],
    "outputs": {"y": "y"}})";
  };
  const Model fused(spec_of(network(false)), 11);
  Model plain(spec_of(network(true)), 12);
  plain.load_weights(fused.state_dict(), true, "the fused model");
  const Network& net = fused.network();
  const auto node_index = [&](const std::string& name) {
    for (size_t i = 0; i < net.nodes().size(); ++i)
      if (net.nodes()[i].name == name) return static_cast<int>(i);
    return -1;
  };
  const auto value_of = [&](const std::string& name) {
    return net.nodes()[static_cast<size_t>(node_index(name))].outputs[0];
  };
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    for (const int64_t rows : {1, 7, 300}) {
      const Tensor x = random_tensor({rows, 40}, 60 + static_cast<uint64_t>(rows));
      const Tensor bias = random_tensor({40}, 61);
      const std::map<std::string, TensorDesc> desc = {{"x", TensorDesc{{rows, 40}, DType::F32}},
                                                      {"bias", TensorDesc{{40}, DType::F32}}};
      Plan plan(fused, desc), reference(plain, desc);
      std::vector<int> want(net.nodes().size(), -1);
      want[static_cast<size_t>(node_index("n1"))] = node_index("s1");
      want[static_cast<size_t>(node_index("n2"))] = node_index("s2");
      BOOST_TEST((plan.summed_adds() == want));  // s3 broadcasts bias [40]: not fused
      BOOST_TEST(plan.fused_into()[static_cast<size_t>(node_index("s1"))] == node_index("n1"));
      BOOST_TEST(plan.fused_into()[static_cast<size_t>(node_index("s3"))] == -1);
      for (int v : reference.summed_adds()) BOOST_TEST(v == -1);
      const auto& vb = plan.value_buffers();
      for (const char* read : {"s1", "l2"})
        BOOST_TEST(vb[static_cast<size_t>(value_of("n2"))] !=
                   vb[static_cast<size_t>(value_of(read))]);
      for (int run = 0; run < 2; ++run) {
        const std::vector<double> got =
            plan.run({{"x", x}, {"bias", bias}})[0].second.to_double_vector();
        const std::vector<double> ref =
            reference.run({{"x", x}, {"bias", bias}})[0].second.to_double_vector();
        BOOST_TEST((got == ref), "threads " << threads << " rows " << rows
                                            << ": fused differs, max |diff| "
                                            << max_abs_diff(got, ref));
      }
    }
  }
  set_num_threads(0);
}

// linear_forward_f32 with an activation equals the plain product followed by the elementwise
// kernel, bit for bit, on the packed panels and on w's rows (matvec, one GEMM, a split by rows).
BOOST_AUTO_TEST_CASE(linear_forward_applies_activations_as_the_elementwise_kernels) {
  const Device& dev = cpu_device();
  const KernelTable& kt = dev.kernels();
  const LinearKernels& lk = *kt.linear(DType::F32);
  constexpr int64_t K = 48, N = 100;
  const int64_t npanels = (N + lk.weight_panel - 1) / lk.weight_panel;
  const Tensor w = random_tensor({N, K}, 61), b = random_tensor({N}, 62);
  Tensor panels = Tensor::empty({npanels * lk.weight_panel * K});
  lk.pack_weights(N, K, w.data<float>(), K, 0, npanels, panels.data<float>());
  for (const bool with_panels : {false, true})
    for (const int64_t rows : {3, 100, 400})
      for (const Activation act : {Activation::relu, Activation::gelu, Activation::gelu_tanh}) {
        const Tensor x = random_tensor({rows, K}, 63 + static_cast<uint64_t>(rows));
        Tensor y = Tensor::empty({rows, N}), ref = Tensor::empty({rows, N});
        Tensor ws = Tensor::empty({linear_workspace_floats(dev, rows, K, N) + 1});
        const ProjectionWeight weight(w.data<float>(),
                                      with_panels ? panels.data<float>() : nullptr);
        linear_forward_f32(dev, rows, K, N, x.data<float>(), K, weight, b.data<float>(),
                           y.data<float>(), N, ws.data<float>(), act);
        linear_forward_f32(dev, rows, K, N, x.data<float>(), K, weight, b.data<float>(),
                           ref.data<float>(), N, ws.data<float>());
        float* r = ref.data<float>();
        if (act == Activation::relu)
          kt.unary_map_f32("relu")(rows * N, r, r);
        else
          kt.gelu_f32(rows * N, r, r, act == Activation::gelu_tanh);
        BOOST_TEST((y.to_double_vector() == ref.to_double_vector()),
                   activation_name(act) << " rows " << rows << (with_panels ? " panels" : " rows"));
      }
}

// linear_forward_rows_f32 (Swin's partition folded into its projections): x's rows read and
// y's written through one pointer each, here in reverse order. With panels the bits of
// linear_forward_f32 on the same rows (one thread and two: the task split); without (a weight
// the device did not pack), a float64 product's values, row by row; rows past y's untouched.
BOOST_AUTO_TEST_CASE(linear_forward_rows_reads_and_writes_through_row_pointers) {
  const Device& dev = cpu_device();
  const LinearKernels& lk = *dev.kernels().linear(DType::F32);
  constexpr int64_t K = 48, N = 100;  // 300 rows: 2.9 MFLOP, split in tasks
  const int64_t npanels = (N + lk.weight_panel - 1) / lk.weight_panel;
  const Tensor w = random_tensor({N, K}, 71), b = random_tensor({N}, 72);
  Tensor panels = Tensor::empty({npanels * lk.weight_panel * K});
  lk.pack_weights(N, K, w.data<float>(), K, 0, npanels, panels.data<float>());
  for (const int threads : {1, 2})
    for (const bool with_panels : {false, true})
      for (const int64_t rows : {1, 3, 37, 300}) {
        set_num_threads(threads);
        const Tensor x = random_tensor({rows, K}, 73 + static_cast<uint64_t>(rows));
        Tensor y = Tensor::full({rows + 1, N}, -7.0f), ref = Tensor::empty({rows, N});
        const ProjectionWeight weight(w.data<float>(),
                                      with_panels ? panels.data<float>() : nullptr);
        std::vector<const float*> x_rows(static_cast<size_t>(rows));
        std::vector<float*> y_rows(x_rows.size());
        for (int64_t i = 0; i < rows; ++i) {
          x_rows[static_cast<size_t>(i)] = x.data<float>() + (rows - 1 - i) * K;
          y_rows[static_cast<size_t>(i)] = y.data<float>() + (rows - 1 - i) * N;
        }
        linear_forward_rows_f32(dev, rows, K, N, RowsInF32{nullptr, 0, x_rows.data()}, weight,
                                b.data<float>(), RowsOutF32{nullptr, 0, y_rows.data()});
        const std::vector<double> got = y.to_double_vector();
        for (int64_t j = 0; j < N; ++j) BOOST_TEST(got[static_cast<size_t>(rows * N + j)] == -7.0);
        std::string where = "threads " + std::to_string(threads) + " rows " +
                            std::to_string(rows) + (with_panels ? " panels" : " w rows");
        if (with_panels) {
          Tensor ws = Tensor::empty({linear_workspace_floats(dev, rows, K, N) + 1});
          linear_forward_f32(dev, rows, K, N, x.data<float>(), K, weight, b.data<float>(),
                             ref.data<float>(), N, ws.data<float>());
          const std::vector<double> want = ref.to_double_vector();
          BOOST_TEST(std::equal(want.begin(), want.end(), got.begin()), where);
          continue;
        }
        const float* xv = x.data<float>();
        const float* wv = w.data<float>();
        double worst = 0.0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < N; ++j) {
            double sum = b.data<float>()[j];
            for (int64_t kk = 0; kk < K; ++kk)
              sum += static_cast<double>(xv[r * K + kk]) * wv[j * K + kk];
            worst = std::max(worst, std::abs(got[static_cast<size_t>(r * N + j)] - sum));
          }
        BOOST_TEST(worst <= 1e-5, where << ": max |y - float64| = " << worst);
      }
  set_num_threads(0);
}

BOOST_AUTO_TEST_CASE(plan_shares_unequal_buffers_by_lifetime) {
  // Widths 64, 8, 128, 8: the 64-float and 128-float values never overlap, so they share one
  // buffer grown to 128; the two 8-wide values share another.
  const std::string json = R"({
    "inputs": {"x": [1, 4]},
    "nodes": [{"name": "a", "op": "linear", "args": {"out_features": 64}, "inputs": {"x": "x"}},
              {"name": "b", "op": "linear", "args": {"out_features": 8}, "inputs": {"x": "a"}},
              {"name": "c", "op": "linear", "args": {"out_features": 128}, "inputs": {"x": "b"}},
              {"name": "d", "op": "linear", "args": {"out_features": 8}, "inputs": {"x": "c"}}],
    "outputs": {"y": "d"}})";
  Model model(spec_of(json));
  Plan plan(model, {{"x", TensorDesc{{1, 4}, DType::F32}}});
  BOOST_TEST(plan.buffers().size() == 2u);
  size_t total = 0;
  for (const auto& b : plan.buffers()) total += b.bytes;
  BOOST_TEST(total == (128u + 8u) * sizeof(float));
}

BOOST_AUTO_TEST_CASE(plan_input_checks_and_conversion) {
  const std::string json = one_node(R"(["B", 4])", "linear", R"({"out_features": 3})");
  Model model(spec_of(json));
  expect_error(ErrorCode::Arg, "missing network input x", [&] { Plan p(model, {}); });
  expect_error(ErrorCode::Arg, "z is not a network input", [&] {
    Plan p(model, {{"x", TensorDesc{{2, 4}}}, {"z", TensorDesc{{2, 4}}}});
  });
  expect_error(ErrorCode::Shape, "input x: shape [2, 5] does not fit [B, 4]", [&] {
    Plan p(model, {{"x", TensorDesc{{2, 5}}}});
  });
  expect_error(ErrorCode::DType, "input x: dtype I32 is not accepted", [&] {
    Plan p(model, {{"x", TensorDesc{{2, 4}, DType::I32}}});
  });
  Plan plan(model, {{"x", TensorDesc{{2, 4}, DType::F32}}});
  expect_error(ErrorCode::Shape, "shape [3, 4] is not the planned [2, 4]", [&] {
    plan.run({{"x", random_tensor({3, 4}, 1)}});
  });
  expect_error(ErrorCode::DType, "dtype F64 is not the planned F32", [&] {
    plan.run({{"x", random_tensor({2, 4}, 1).to(DType::F64)}});
  });
  // F16 and F64 inputs are converted to float32: same result as the float32 values they hold.
  const Tensor x16 = random_tensor({2, 4}, 2).to(DType::F16);
  const auto ref = run_once(model, {{"x", x16.to(DType::F32)}}).at("y").to_double_vector();
  BOOST_TEST(max_abs_diff(run_once(model, {{"x", x16}}).at("y").to_double_vector(), ref) == 0.0);
  BOOST_TEST(max_abs_diff(run_once(model, {{"x", x16.to(DType::F64)}}).at("y").to_double_vector(),
                          ref) == 0.0);
  // A strided float32 input (a transposed view) is read correctly.
  const Tensor xt = random_tensor({4, 2}, 3).transpose(0, 1);
  BOOST_TEST(max_abs_diff(run_once(model, {{"x", xt}}).at("y").to_double_vector(),
                          run_once(model, {{"x", xt.contiguous()}}).at("y").to_double_vector()) ==
             0.0);
}

BOOST_AUTO_TEST_CASE(one_model_many_threads) {
  const std::string json =
      read_file(std::string(TESSERA_SOURCE_DIR) + "/examples/encoder/encoder.json");
  const Model model(spec_of(json), 3);
  const Tensor x1 = random_tensor({2, 16, 64}, 1), x2 = random_tensor({1, 9, 64}, 2);
  const auto ref1 = run_once(model, {{"x", x1}}).at("y").to_double_vector();
  const auto ref2 = run_once(model, {{"x", x2}}).at("y").to_double_vector();
  // Each thread its own plan, the parameters shared: results as on one thread.
  std::vector<double> got1, got2;
  std::thread t1([&] {
    Plan p(model, {{"x", TensorDesc{{2, 16, 64}}}});
    for (int i = 0; i < 20; ++i) got1 = p.run({{"x", x1}})[0].second.to_double_vector();
  });
  std::thread t2([&] {
    Plan p(model, {{"x", TensorDesc{{1, 9, 64}}}});
    for (int i = 0; i < 20; ++i) got2 = p.run({{"x", x2}})[0].second.to_double_vector();
  });
  t1.join();
  t2.join();
  BOOST_TEST(max_abs_diff(got1, ref1) <= 1e-6);
  BOOST_TEST(max_abs_diff(got2, ref2) <= 1e-6);
}

BOOST_AUTO_TEST_CASE(flops_follow_the_convention) {
  const std::string ex1 =
      read_file(std::string(TESSERA_SOURCE_DIR) + "/examples/spec/example1.json");
  Model model(spec_of(ex1));
  Plan plan(model, {{"x", TensorDesc{{2, 8, 32}}}});
  // 4 projections 2*(B*T)*D*D, plus q k^T and p v: 2*B*T*T*D each.
  BOOST_TEST(plan.flops() == 4 * 2.0 * 16 * 32 * 32 + 2 * 2.0 * 2 * 8 * 8 * 32);
}

// ---------------------------------------------------------------- weights

BOOST_AUTO_TEST_CASE(weights_strict_names_every_problem) {
  const std::string json = R"({
    "inputs": {"x": [2, 4]},
    "nodes": [{"name": "l", "op": "linear", "args": {"out_features": 3}, "inputs": {"x": "x"}},
              {"name": "n", "op": "layer_norm", "inputs": {"x": "l"}}],
    "outputs": {"y": "n"}})";
  Model model(spec_of(json));
  const auto before = model.state_dict();
  std::map<std::string, Tensor> state = {
      {"l.weight", random_tensor({3, 5}, 1)},  // mis-shaped
      {"n.weight", random_tensor({3}, 2)},
      {"extra.w", random_tensor({1}, 3)},
      {"l.bias_typo", random_tensor({3}, 4)},
  };
  expect_error(ErrorCode::Weights,
               "w.safetensors: missing: l.bias, n.bias; unexpected: extra.w, l.bias_typo; "
               "mis-shaped: l.weight (expected [3, 4], got [3, 5])",
               [&] { model.load_weights(state, true, "w.safetensors"); });
  // Non-strict still refuses a mis-shaped weight, naming only it.
  expect_error(ErrorCode::Weights,
               "w.safetensors: mis-shaped: l.weight (expected [3, 4], got [3, 5])",
               [&] { model.load_weights(state, false, "w.safetensors"); });
  // Nothing changed.
  for (const auto& [k, v] : before)
    BOOST_TEST(max_abs_diff(model.state_dict().at(k).to_double_vector(), v.to_double_vector()) ==
               0.0);

  state["l.weight"] = random_tensor({3, 4}, 5).to(DType::F16);  // converted to float32
  const WeightsReport r = model.load_weights(state, false, "w.safetensors");
  BOOST_TEST(r.missing == (std::vector<std::string>{"l.bias", "n.bias"}));
  BOOST_TEST(r.unexpected == (std::vector<std::string>{"extra.w", "l.bias_typo"}));
  BOOST_TEST(max_abs_diff(model.state_dict().at("l.weight").to_double_vector(),
                          state["l.weight"].to_double_vector()) == 0.0);
  BOOST_TEST(max_abs_diff(model.state_dict().at("n.weight").to_double_vector(),
                          state["n.weight"].to_double_vector()) == 0.0);
  // A complete, exact state loads strictly; a tensor of an unreadable dtype is named.
  std::map<std::string, Tensor> full = model.state_dict();
  BOOST_TEST(model.load_weights(full, true, "w").missing.empty());
  full.erase("n.bias");
  expect_error(ErrorCode::Weights, "mis-shaped: n.bias (dtype F8_E4M3", [&] {
    model.load_weights(full, true, "w", {{"n.bias", "F8_E4M3"}});
  });
  expect_error(ErrorCode::Weights, "unexpected: other", [&] {
    model.load_weights(model.state_dict(), true, "w", {{"other", "F8_E4M3"}});
  });
}

BOOST_AUTO_TEST_CASE(checkpoint_carries_its_network) {
  const std::string path =
      std::string(TESSERA_SOURCE_DIR) + "/examples/encoder/encoder.safetensors";
  BOOST_TEST(is_safetensors_path(path));
  std::optional<SafetensorsFile> ckpt;
  const NetworkSpec spec = load_network(path, &ckpt);
  BOOST_REQUIRE(ckpt.has_value());
  BOOST_TEST(spec.nodes.size() == 17u);
  BOOST_TEST(spec.origin == path + " (tessera.network)");
  Model model(spec);
  BOOST_TEST(model.load_weights(ckpt->tensors(), true, path).missing.empty());
  // A checkpoint without a network is refused as a network file.
  const std::string input = std::string(TESSERA_SOURCE_DIR) + "/examples/encoder/input.safetensors";
  expect_error(ErrorCode::Arg, "the checkpoint carries no network", [&] { load_network(input); });
}

BOOST_AUTO_TEST_SUITE_END()
