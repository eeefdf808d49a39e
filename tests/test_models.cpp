// Whole models (issue 14, interfaces.md §1, §2, §5): the recipes against PyTorch, and the graph
// features real models need (dotted node names, learned tensors as values, a tied weight, int64
// ids).
//
// Fixtures: tests/fixtures/gen_model_fixtures.py builds small configurations of the very
// PyTorch classes (torchvision 0.14's VisionTransformer and SwinTransformer, torch.nn.Transformer,
// the reference GPT) with every parameter drawn at random, and stores their state_dict as is with
// inputs and eval-mode outputs. Each is run here through `make_recipe` -> Model -> Plan, the
// state_dict loaded strictly (every key used, none missing).
//
// Tolerance: the contract's, max |y - ref| <= 1e-4 * max(1, max |ref|) in float32. The float32
// chains here (2-4 layers of projections, softmax, LayerNorm) stay within ~1e-6 of torch's
// float32 (the per-op tolerances of tests/test_ops.cpp compound over a few dozen ops).
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/text.h"
#include "io/network_file.h"
#include "io/safetensors.h"
#include "layers/network.h"
#include "recipes/recipes.h"
#include "tests/expect_error.h"

using namespace tessera;

namespace {

using ojson = nlohmann::ordered_json;

struct ModelFixture {
  std::string name, arch;
  std::vector<RecipeSetting> settings;
  int64_t torch_parameters = 0;
  std::map<std::string, Tensor> state, inputs, expected;
};

std::vector<ModelFixture> model_fixtures() {
  std::vector<ModelFixture> out;
  const std::filesystem::path dir = std::filesystem::path(TESSERA_FIXTURE_DIR) / "models";
  std::vector<std::filesystem::path> paths;
  if (std::filesystem::is_directory(dir))
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());
  for (const auto& path : paths) {
    const SafetensorsFile file = SafetensorsFile::open(path.string());
    ModelFixture f;
    f.name = path.stem().string();
    f.arch = file.metadata().at("arch");
    const ojson settings = ojson::parse(file.metadata().at("settings"));
    for (const auto& [k, v] : settings.items()) f.settings.emplace_back(k, v);
    f.torch_parameters = std::stoll(file.metadata().at("parameters"));
    for (const std::string& n : file.names()) {
      if (n.starts_with("@input."))
        f.inputs[n.substr(7)] = file.tensor(n);
      else if (n.starts_with("@expected."))
        f.expected[n.substr(10)] = file.tensor(n);
      else
        f.state[n] = file.tensor(n);
    }
    out.push_back(std::move(f));
  }
  return out;
}

NetworkSpec recipe_spec(const std::string& arch, const std::vector<RecipeSetting>& settings) {
  return parse_network(make_recipe(arch, settings).dump(), "recipe " + arch);
}

// max |got - want| / max(1, max |want|).
double scaled_error(const Tensor& got, const Tensor& want) {
  BOOST_REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  double worst = 0.0, ref = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    ref = std::max(ref, std::abs(w[i]));
    worst = std::max(worst, std::isnan(g[i]) ? INFINITY : std::abs(g[i] - w[i]));
  }
  return worst / std::max(1.0, ref);
}

std::map<std::string, Tensor> run_once(const Model& model,
                                       const std::map<std::string, Tensor>& in) {
  std::map<std::string, TensorDesc> desc;
  for (const auto& [k, t] : in) desc[k] = {t.shape(), t.dtype()};
  Plan plan(model, desc);
  std::map<std::string, Tensor> out;
  for (const auto& [k, t] : plan.run(in)) out[k] = t.clone();
  return out;
}

// A network from JSON text.
NetworkSpec spec_of(const std::string& json) { return parse_network(json, "test"); }

}  // namespace

BOOST_AUTO_TEST_SUITE(models)

BOOST_AUTO_TEST_CASE(recipes_match_pytorch) {
  const std::vector<ModelFixture> all = model_fixtures();
  // gen_model_fixtures.py writes 8 cases; fewer means the directory is missing or stale.
  BOOST_TEST(all.size() >= 8u, "only " << all.size() << " fixtures in tests/fixtures/models");
  for (const ModelFixture& f : all) {
    BOOST_TEST_CONTEXT(f.name) {
      Model model(recipe_spec(f.arch, f.settings), std::nullopt);
      BOOST_TEST(model.parameter_count() == f.torch_parameters);
      model.load_weights(f.state, /*strict=*/true, f.name);
      const auto out = run_once(model, f.inputs);
      BOOST_REQUIRE_EQUAL(out.size(), f.expected.size());
      for (const auto& [k, want] : f.expected) {
        const double err = scaled_error(out.at(k), want);
        BOOST_TEST_MESSAGE(f.name << " (" << f.arch << "): " << k << " " << want.shape_str()
                                  << " vs torch " << err);
        BOOST_TEST(err <= 1e-4, f.name << ": " << k << " error " << err);
      }
    }
  }
}

// The gpt recipe's head reads tok.weight through its `weight` port: the model packs it once
// like its own projections (panel q, step kk, column j = w[16 q + j][kk], zeros past n), lists
// it once among the packed projections (what a panel cache stores) and counts it in its memory.
BOOST_AUTO_TEST_CASE(tied_lm_head_is_packed_once) {
  int checked = 0;
  for (const ModelFixture& f : model_fixtures()) {
    if (f.arch != "gpt") continue;
    Model model(recipe_spec(f.arch, f.settings), std::nullopt);
    model.load_weights(f.state, /*strict=*/true, f.name);
    const Tensor& w = f.state.at("tok.weight");
    const Tensor* panels = nullptr;
    int listed = 0;
    for (const PackedProjection& p : model.packed_projections())
      if (p.key == "tok.weight") {
        panels = p.panels;
        ++listed;
        BOOST_TEST(p.rows == w.size(0));
        BOOST_TEST(p.cols == w.size(1));
      }
    BOOST_TEST_REQUIRE(listed == 1, f.name);
    const int64_t n = w.size(0), k = w.size(1);
    BOOST_TEST_REQUIRE(panels->numel() == (n + 15) / 16 * 16 * k);
    const std::vector<double> rows = w.to_double_vector();
    const float* got = panels->data<float>();
    int64_t wrong = 0;
    for (int64_t r = 0; r < (n + 15) / 16 * 16; ++r)
      for (int64_t kk = 0; kk < k; ++kk)
        wrong += got[(r / 16) * k * 16 + kk * 16 + r % 16] !=
                 (r < n ? static_cast<float>(rows[static_cast<size_t>(r * k + kk)]) : 0.0f);
    BOOST_TEST(wrong == 0, f.name);
    double params = 0.0;
    for (const auto& [name, t] : model.state_dict()) params += static_cast<double>(t.nbytes());
    BOOST_TEST(model.memory_bytes() >= params + static_cast<double>(panels->nbytes()));
    ++checked;
  }
  BOOST_TEST(checked >= 1);
}

BOOST_AUTO_TEST_CASE(gpt_refuses_ids_outside_the_vocabulary_and_long_sequences) {
  const std::vector<RecipeSetting> settings = {{"vocab_size", 11}, {"context", 6},
                                               {"d_model", 8},     {"nhead", 2},
                                               {"num_layers", 1},  {"dim_feedforward", 8}};
  const Model model(recipe_spec("gpt", settings), 1);
  // An id past the vocabulary (or negative): E_SHAPE naming the node, before any row is read.
  for (const int64_t bad : {int64_t{11}, int64_t{-1}}) {
    const Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 2, bad}, {1, 3});
    expect_error(ErrorCode::Shape, "tok (embedding): id " + str(bad),
                 [&] { run_once(model, {{"ids", ids}}); });
  }
  // Longer than the context: E_SHAPE when the plan is made, before anything runs.
  const Tensor long_ids = Tensor::zeros({2, 7}, DType::I64);
  expect_error(ErrorCode::Shape, "pos (embedding): positions 0..6 need 7 rows, num_embeddings=6",
               [&] { Plan(model, {{"ids", {long_ids.shape(), DType::I64}}}); });
  // The whole context is fine; int32 ids are widened and give the same logits as int64.
  const Tensor ids64 = Tensor::from_vector(std::vector<int64_t>{0, 10, 3, 3, 7, 1}, {1, 6});
  const auto a = run_once(model, {{"ids", ids64}});
  const auto b = run_once(model, {{"ids", ids64.to(DType::I32)}});
  BOOST_TEST(scaled_error(a.at("logits"), b.at("logits")) == 0.0);
  // Float ids are not ids.
  expect_error(ErrorCode::DType,
               "input ids: dtype F32 is not accepted (an int64 input takes I64 or I32)", [&] {
                 Plan(model, {{"ids", {{1, 3}, DType::F32}}});
               });
}

BOOST_AUTO_TEST_CASE(dotted_names_resolve_to_the_longest_node) {
  // Nodes "a" and "a.b": "a.b" is the node, "a.out" node a's port, "a.weight" its parameter.
  const NetworkSpec spec = spec_of(R"({
    "inputs": {"x": [2, 4]},
    "nodes": [
      {"name": "a", "op": "linear", "args": {"out_features": 4}, "inputs": {"x": "x"}},
      {"name": "a.b", "op": "relu", "inputs": {"x": "a.out"}},
      {"name": "head", "op": "linear", "args": {"out_features": 4, "bias": false},
       "inputs": {"x": "a.b", "weight": "a.weight"}}
    ],
    "outputs": {"y": "head", "z": "a.b.out"}})");
  Model model(spec, 3);
  // a.weight (16) + a.bias (4); head reads a.weight and owns nothing: counted once.
  BOOST_TEST(model.parameter_count() == 20);
  const auto state = model.state_dict();
  BOOST_TEST(state.size() == 2u);
  BOOST_TEST(state.count("a.weight") == 1u);
  const Tensor x = Tensor::from_vector(std::vector<float>{1, -2, 3, 0.5f, -1, 2, 0, 1}, {2, 4});
  const auto out = run_once(model, {{"x", x}});
  // y = relu(x W^T + b) W^T, computed here in float64.
  const std::vector<double> w = state.at("a.weight").to_double_vector(),
                            b = state.at("a.bias").to_double_vector(), xv = x.to_double_vector();
  std::vector<double> h(8), y(8);
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 4; ++o) {
      double s = b[o];
      for (int k = 0; k < 4; ++k) s += xv[r * 4 + k] * w[o * 4 + k];
      h[r * 4 + o] = std::max(0.0, s);
    }
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 4; ++o) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += h[r * 4 + k] * w[o * 4 + k];
      y[r * 4 + o] = s;
    }
  BOOST_TEST(scaled_error(out.at("z"), Tensor::from_vector(h, {2, 4})) <= 1e-6);
  BOOST_TEST(scaled_error(out.at("y"), Tensor::from_vector(y, {2, 4})) <= 1e-6);
  // A checkpoint with head.weight is unexpected: the head has none of its own.
  std::map<std::string, Tensor> extra = state;
  extra["head.weight"] = Tensor::zeros({4, 4});
  expect_error(ErrorCode::Weights, "unexpected: head.weight",
               [&] { model.load_weights(extra, true, "ckpt"); });
}

BOOST_AUTO_TEST_CASE(sources_that_name_nothing) {
  auto net = [](const std::string& source) {
    return R"({"inputs": {"x": [2, 4]}, "nodes": [
      {"name": "enc.l0", "op": "linear", "args": {"out_features": 4}, "inputs": {"x": "x"}},
      {"name": "n1", "op": "relu", "inputs": {"x": ")" + source + R"("}}],
      "outputs": {"y": "n1"}})";
  };
  expect_error(ErrorCode::Arg,
               "n1 (relu): input port x: node enc.l0 (linear) has no output port or parameter "
               "'scale' (ports: out; parameters: weight, bias)",
               [&] { Network::resolve(spec_of(net("enc.l0.scale"))); });
  expect_error(ErrorCode::Arg, "unknown source 'enc' (not a network input or a node)",
               [&] { Network::resolve(spec_of(net("enc"))); });
  expect_error(ErrorCode::Arg, "unknown source 'enc.l1.out'",
               [&] { Network::resolve(spec_of(net("enc.l1.out"))); });
  // The parameter itself is a value: relu(weight) of shape [4, 4].
  const Network n = Network::resolve(spec_of(net("enc.l0.weight")));
  BOOST_TEST(sym_shape_to_string(
                 n.values()[static_cast<size_t>(n.outputs()[0].second)].type.shape) == "[4, 4]");
}

BOOST_AUTO_TEST_CASE(learned_tensors_are_named_as_their_node) {
  const NetworkSpec spec = spec_of(R"({
    "inputs": {"x": ["B", 3, 4]},
    "nodes": [
      {"name": "encoder.pos_embedding", "op": "parameter", "args": {"shape": [1, 3, 4], "std": 0.02}},
      {"name": "sum", "op": "add", "inputs": {"a": "x", "b": "encoder.pos_embedding"}}],
    "outputs": {"y": "sum"}})");
  Model model(spec, 5);
  BOOST_TEST(model.parameter_count() == 12);
  const auto state = model.state_dict();
  BOOST_REQUIRE(state.count("encoder.pos_embedding") == 1u);
  const Tensor pos = Tensor::from_vector(std::vector<float>(12, 0.25f), {1, 3, 4});
  model.load_weights({{"encoder.pos_embedding", pos}}, true, "ckpt");
  const Tensor x = Tensor::zeros({2, 3, 4});
  const auto out = run_once(model, {{"x", x}});
  BOOST_TEST(scaled_error(out.at("y"), Tensor::full({2, 3, 4}, 0.25)) == 0.0);
  expect_error(ErrorCode::Weights, "encoder.pos_embedding (expected [1, 3, 4], got [3, 4])", [&] {
    model.load_weights({{"encoder.pos_embedding", Tensor::zeros({3, 4})}}, true, "ckpt");
  });
  expect_error(ErrorCode::Arg, "missing argument shape", [] {
    Network::resolve(spec_of(
        R"({"inputs": {}, "nodes": [{"name": "p", "op": "parameter"}], "outputs": {"y": "p"}})"));
  });
}

BOOST_AUTO_TEST_CASE(recipe_arguments_are_checked_like_the_constructor) {
  expect_error(ErrorCode::Arg, "recipe: unknown architecture 'resnet50'",
               [] { make_recipe("resnet50", {}); });
  expect_error(ErrorCode::Arg, "recipe gpt: unknown argument 'width'",
               [] { make_recipe("gpt", {{"width", 3}}); });
  expect_error(ErrorCode::Arg, "recipe gpt: --set d_model is given twice",
               [] { make_recipe("gpt", {{"d_model", 8}, {"d_model", 16}}); });
  expect_error(ErrorCode::Arg, "recipe gpt: d_model must be an integer, got a number 7.5",
               [] { make_recipe("gpt", {{"d_model", 7.5}}); });
  expect_error(ErrorCode::Arg, "norm_layer takes a Python callable or class",
               [] { make_recipe("vit_b_16", {{"norm_layer", "LayerNorm"}}); });
  expect_error(ErrorCode::Arg, "vit_b_16 sets patch_size itself",
               [] { make_recipe("vit_b_16", {{"patch_size", 8}}); });
  expect_error(ErrorCode::Arg, "missing required argument image_size",
               [] { make_recipe("vision_transformer", {}); });
  expect_error(ErrorCode::Constraint, "Input shape indivisible by patch size!",
               [] { make_recipe("vit_b_16", {{"image_size", 200}}); });
  expect_error(ErrorCode::Constraint, "embed_dim must be divisible by num_heads",
               [] { make_recipe("transformer", {{"d_model", 30}}); });
  expect_error(ErrorCode::Constraint, "activation should be relu/gelu, not tanh",
               [] { make_recipe("transformer", {{"activation", "tanh"}}); });
  expect_error(ErrorCode::Arg, "batch_first itself",
               [] { make_recipe("transformer", {{"batch_first", false}}); });
  expect_error(ErrorCode::Constraint, "dropout probability has to be between 0 and 1",
               [] { make_recipe("transformer", {{"dropout", 1.5}}); });
}

BOOST_AUTO_TEST_CASE(full_size_recipes_count_torchs_parameters) {
  // sum(p.numel() for p in model.parameters()) of torchvision 0.14 / torch 1.13 / the reference
  // GPT at their defaults, as printed by scripts/check_full_models.py.
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"vit_b_16", 86567656}, {"vit_b_32", 88224232}, {"vit_l_16", 304326632},
      {"vit_l_32", 306535400}, {"vit_h_14", 632045800}, {"swin_t", 28288354},
      {"swin_s", 49606258},   {"swin_b", 87768224},    {"transformer", 44140544},
      {"gpt", 124439808}};
  for (const auto& [arch, count] : expected)
    BOOST_TEST(Network::resolve(recipe_spec(arch, {})).parameter_count() == count, arch);
}

BOOST_AUTO_TEST_SUITE_END()
