// The `attention` layer (shared/reference/attention_op_spec.txt): every fixture of
// tests/fixtures/attention/ (float64 outputs written by gen_attention_fixtures.py from the spec's
// formulas) and the spec's properties checked here directly: rope at T == 1, a zero table,
// causality, dropout, parameter names and counts, the relative-position index, every constraint,
// init/trainable overrides, loading and concurrent forwards.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/expect_error.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "layers/attention.h"
#include "layers/linear.h"

using namespace tessera;

namespace {

struct Diff {
  double rel_fro = 0.0;  // ||out - ref||_F / ||ref||_F
  double max_abs = 0.0;  // max |out - ref|
  double ref_max = 0.0;  // max |ref|
};

Diff compare(const Tensor& out, const Tensor& ref) {
  BOOST_REQUIRE(out.shape() == ref.shape());
  const std::vector<double> o = out.to_double_vector(), r = ref.to_double_vector();
  double num = 0.0, den = 0.0;
  Diff d;
  for (size_t i = 0; i < o.size(); ++i) {
    const double e = o[i] - r[i];
    num += e * e;
    den += r[i] * r[i];
    // A NaN in the output must fail: max() would drop it.
    d.max_abs =
        std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(d.max_abs, std::abs(e));
    d.ref_max = std::max(d.ref_max, std::abs(r[i]));
  }
  d.rel_fro = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  if (std::isnan(d.rel_fro)) d.rel_fro = std::numeric_limits<double>::infinity();
  return d;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  return std::equal(x.begin(), x.end(), y.begin(),
                    [](float p, float q) { return std::memcmp(&p, &q, sizeof p) == 0; });
}

double max_abs_diff(const Tensor& a, const Tensor& b) { return compare(a, b).max_abs; }

// The op's arguments as a network file holds them (spatial_shape as an int or a pair).
AttentionOptions options_from_json(const nlohmann::json& j) {
  AttentionOptions o;
  o.heads = j.at("heads").get<int64_t>();
  o.causal = j.value("causal", false);
  o.dropout = j.value("dropout", 0.0);
  o.bias = j.value("bias", true);
  o.qkv_bias = j.value("qkv_bias", true);
  o.out_bias = j.value("out_bias", true);
  o.rope = j.value("rope", false);
  o.relative_position_bias = j.value("relative_position_bias", false);
  if (j.contains("spatial_shape")) {
    const auto& s = j.at("spatial_shape");
    if (s.is_number_integer()) {
      o.spatial_h = o.spatial_w = s.get<int64_t>();
    } else {
      o.spatial_h = s.at(0).get<int64_t>();
      o.spatial_w = s.at(1).get<int64_t>();
    }
  }
  return o;
}

Tensor random_input(int64_t B, int64_t T, int64_t D, uint64_t seed) {
  Generator gen(seed);
  return Tensor::randn({B, T, D}, gen);
}

AttentionOptions opts(int64_t heads) {
  AttentionOptions o;
  o.heads = heads;
  return o;
}

std::set<std::string> keys(const std::map<std::string, Tensor>& m) {
  std::set<std::string> s;
  for (const auto& kv : m) s.insert(kv.first);
  return s;
}

// Sets every element of `t` to fn(flat index).
template <class Fn>
void fill_with(Tensor& t, Fn fn) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = fn(static_cast<int64_t>(i));
  t.copy_from(Tensor::from_vector(v, t.shape()));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(attention_layer)

// ---------------------------------------------------------------- fixtures (float64 reference)

BOOST_AUTO_TEST_CASE(fixtures_match_float64_reference) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(TESSERA_FIXTURE_DIR) / "attention";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  // gen_attention_fixtures.py writes 49; fewer means the directory is stale or incomplete.
  BOOST_TEST_REQUIRE(files.size() >= 49u);

  struct Worst {
    Diff d;
    std::string name;
    int count = 0;
  };
  std::map<std::string, Worst> worst;
  for (const fs::path& path : files) {
    BOOST_TEST_CONTEXT(path.filename().string()) {
      const SafetensorsFile file = SafetensorsFile::open(path.string());
      const auto& meta = file.metadata();
      BOOST_TEST_REQUIRE(meta.count("config") == 1u);
      BOOST_TEST_REQUIRE(meta.at("expected_dtype") == "float64");
      const AttentionOptions o = options_from_json(nlohmann::json::parse(meta.at("config")));
      std::map<std::string, Tensor> state = file.tensors();
      const Tensor x = state.at("x"), ref = state.at("out");
      state.erase("x");
      state.erase("out");
      BOOST_TEST(std::string(dtype_name(x.dtype())) == meta.at("x_dtype"));
      BOOST_TEST(std::string(dtype_name(state.at("q_proj.weight").dtype())) ==
                 meta.at("weight_dtype"));
      BOOST_TEST((ref.dtype() == DType::F64));

      Attention layer(x.size(2), o, /*seed=*/7);
      // The file holds exactly the layer's parameter names (PyTorch's state_dict).
      BOOST_TEST((keys(layer.state_dict()) == keys(state)));
      const LoadResult lr = layer.load_state_dict(state, /*strict=*/true);
      BOOST_TEST(lr.missing.empty());
      BOOST_TEST(lr.unexpected.empty());
      const Tensor out = layer.forward(x);
      BOOST_TEST((out.dtype() == DType::F32));
      const Diff d = compare(out, ref);
      // float32 compute against float64: ~1e-7 expected; 1e-6 / 1e-5 leave a 10x margin.
      BOOST_TEST(d.rel_fro <= 1e-6);
      BOOST_TEST(d.max_abs <= 1e-5 * std::max(1.0, d.ref_max));
      Worst& w = worst[meta.at("family")];
      ++w.count;
      if (d.rel_fro >= w.d.rel_fro) {
        w.d.rel_fro = d.rel_fro;
        w.name = meta.at("name");
      }
      w.d.max_abs = std::max(w.d.max_abs, d.max_abs);
    }
  }
  for (const char* family : {"plain", "causal", "rope", "relpos", "combos", "lowp"})
    BOOST_TEST(worst.count(family) == 1u, "no fixture of family " << family);
  // Printed unconditionally: the closing note quotes these numbers.
  std::cout << "attention vs float64 reference, worst per family:\n";
  for (const auto& [family, w] : worst)
    std::cout << "  " << family << " (" << w.count << " configs): rel_fro " << w.d.rel_fro << " ("
              << w.name << "), max_abs " << w.d.max_abs << "\n";
}

// ---------------------------------------------------------------- properties of the spec

BOOST_AUTO_TEST_CASE(rope_at_t1_equals_rope_off) {
  for (const bool causal : {false, true}) {
    AttentionOptions with = opts(2), without = opts(2);
    with.rope = true;
    with.causal = without.causal = causal;
    const Attention a(8, with, 3), b(8, without, 3);
    BOOST_TEST((keys(a.state_dict()) == keys(b.state_dict())));
    const Tensor x = random_input(3, 1, 8, 11);
    // The only angle is 0: cos 1, sin 0, so the rotation is the identity bit for bit.
    BOOST_TEST(bitwise_equal(a.forward(x), b.forward(x)));
    // And it is not the identity at T > 1 (the test above would pass with rope ignored).
    const Tensor x5 = random_input(3, 5, 8, 12);
    BOOST_TEST(max_abs_diff(a.forward(x5), b.forward(x5)) > 1e-3);
  }
}

BOOST_AUTO_TEST_CASE(zero_table_equals_no_bias) {
  for (const bool causal : {false, true}) {
    AttentionOptions rel = opts(2), plain = opts(2);
    rel.relative_position_bias = true;
    rel.spatial_h = 2;
    rel.spatial_w = 3;
    rel.causal = plain.causal = causal;
    Attention a(8, rel, 5);
    Attention b(8, plain, 99);
    auto sd = a.state_dict();
    sd.erase("relative_position_bias_table");
    b.load_state_dict(sd);
    const Tensor table = a.parameters().tensor("relative_position_bias_table");
    BOOST_TEST(table.shape() == (Shape{15, 2}));
    const std::vector<double> tv = table.to_double_vector();  // constructed at 0.0
    BOOST_TEST(std::count(tv.begin(), tv.end(), 0.0) == 30);
    const Tensor x = random_input(2, 6, 8, 21);
    // A zero added to the logits changes nothing but may take another kernel path.
    BOOST_TEST(compare(a.forward(x), b.forward(x)).rel_fro <= 1e-6);
    // A non-zero table must change the output, or the check above proves nothing.
    fill_with(a.parameters().mutable_tensor("relative_position_bias_table"),
              [](int64_t i) { return 0.25f * static_cast<float>(i % 7) - 0.5f; });
    BOOST_TEST(max_abs_diff(a.forward(x), b.forward(x)) > 1e-3);
  }
}

BOOST_AUTO_TEST_CASE(causal_output_ignores_later_tokens) {
  AttentionOptions o = opts(2);
  o.causal = true;
  o.rope = true;
  o.relative_position_bias = true;
  o.spatial_h = 3;
  o.spatial_w = 4;
  Attention layer(8, o, 4);
  fill_with(layer.parameters().mutable_tensor("relative_position_bias_table"),
            [](int64_t i) { return std::sin(0.7f * static_cast<float>(i)); });
  const int64_t T = 12, cut = 5;
  const Tensor x = random_input(2, T, 8, 31);
  Tensor x2 = x.clone();
  Generator gen(32);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = cut + 1; t < T; ++t)
      for (int64_t d = 0; d < 8; ++d) x2.set_item({b, t, d}, 10.0 * gen.normal());
  const Tensor y = layer.forward(x), y2 = layer.forward(x2);
  // Rows <= cut are computed from keys <= cut only: identical bit for bit.
  BOOST_TEST(bitwise_equal(y.narrow(1, 0, cut + 1), y2.narrow(1, 0, cut + 1)));
  BOOST_TEST(max_abs_diff(y.narrow(1, cut + 1, T - cut - 1), y2.narrow(1, cut + 1, T - cut - 1)) >
             1e-3);
  // Without causal, the early rows do see the later tokens.
  o.causal = false;
  Attention bidir(8, o, 4);
  bidir.load_state_dict(layer.state_dict());
  BOOST_TEST(max_abs_diff(bidir.forward(x).narrow(1, 0, cut + 1),
                          bidir.forward(x2).narrow(1, 0, cut + 1)) > 1e-3);
}

// ---------------------------------------------------------------- dropout

BOOST_AUTO_TEST_CASE(dropout_zero_in_training_draws_nothing) {
  Attention layer(8, opts(2), 1);
  const Tensor x = random_input(2, 7, 8, 41);
  const Tensor eval = layer.forward(x, 1);
  layer.train();
  BOOST_TEST(layer.training());
  // No draw: the seed cannot matter and training equals eval exactly.
  BOOST_TEST(bitwise_equal(layer.forward(x, 1), eval));
  BOOST_TEST(bitwise_equal(layer.forward(x, 12345), eval));
}

BOOST_AUTO_TEST_CASE(dropout_only_in_training_and_seeded) {
  AttentionOptions o = opts(2);
  o.dropout = 0.3;
  Attention layer(8, o, 1);
  Attention plain(8, opts(2), 1);
  const Tensor x = random_input(2, 9, 8, 42);
  // Eval mode (the default) never drops: equal to the dropout-free layer, whatever the seed.
  BOOST_TEST(!layer.training());
  BOOST_TEST(bitwise_equal(layer.forward(x, 5), plain.forward(x)));
  BOOST_TEST(bitwise_equal(layer.forward(x, 6), plain.forward(x)));
  layer.train();
  const Tensor a = layer.forward(x, 5);
  BOOST_TEST(bitwise_equal(a, layer.forward(x, 5)));        // deterministic for a seed
  BOOST_TEST(max_abs_diff(a, layer.forward(x, 6)) > 1e-3);  // another seed, another mask
  BOOST_TEST(max_abs_diff(a, plain.forward(x)) > 1e-3);
  layer.eval();
  BOOST_TEST(bitwise_equal(layer.forward(x, 5), plain.forward(x)));
}

BOOST_AUTO_TEST_CASE(dropout_rescales_kept_weights) {
  // q = k = 0 gives uniform weights 1/T; v and o are the identity and x is all ones, so
  // out[b, l, d] = (weights of head d/hd kept in row l) / (T (1 - p)): a multiple of
  // 1/(T (1-p)), and its mean over many rows is 1 when the kept fraction is 1 - p.
  const int64_t B = 4, T = 16, D = 4;
  const double p = 0.3;
  AttentionOptions o = opts(2);
  o.bias = false;
  o.dropout = p;
  Attention layer(D, o, 1);
  auto& ps = layer.parameters();
  fill_with(ps.mutable_tensor("q_proj.weight"), [](int64_t) { return 0.0f; });
  fill_with(ps.mutable_tensor("k_proj.weight"), [](int64_t) { return 0.0f; });
  for (const char* name : {"v_proj.weight", "o_proj.weight"})
    fill_with(ps.mutable_tensor(name), [&](int64_t i) { return i / D == i % D ? 1.0f : 0.0f; });
  const Tensor ones = Tensor::full({B, T, D}, 1.0);
  const Tensor eval = layer.forward(ones);
  for (double v : eval.to_double_vector()) BOOST_TEST(std::abs(v - 1.0) < 1e-6);
  layer.train();
  double sum = 0.0;
  int64_t n = 0, off_grid = 0;
  for (uint64_t seed = 0; seed < 50; ++seed)
    for (double v : layer.forward(ones, seed).to_double_vector()) {
      const double kept = v * T * (1.0 - p);
      if (std::abs(kept - std::round(kept)) > 1e-4 || kept < -1e-4 || kept > T + 1e-4) ++off_grid;
      sum += v;
      ++n;
    }
  BOOST_TEST(off_grid == 0);
  // 50 seeds x 4 x 2 heads x 16 rows x 16 keys = 102,400 draws: the kept fraction's standard
  // error is sqrt(0.21 / 102400) = 0.0014, so its mean (scaled by 1/(1-p)) is 1 +- 0.002.
  BOOST_TEST(std::abs(sum / static_cast<double>(n) - 1.0) < 0.015);
}

// ---------------------------------------------------------------- parameters

BOOST_AUTO_TEST_CASE(parameter_counts_of_spec_examples) {
  // Example 1: 4 heads of width 8, D = 32: 4 x (32*32 + 32).
  BOOST_TEST(Attention(32, opts(4)).parameters().count() == 4224);
  // Example 2: causal, D = 16: 4 x (16*16 + 16).
  AttentionOptions e2 = opts(2);
  e2.causal = true;
  BOOST_TEST(Attention(16, e2).parameters().count() == 1088);
  // Example 3: linear 8->16 (144) + attention(rope) at D = 16 (1,088) + linear 16->8 (136).
  AttentionOptions e3 = opts(4);
  e3.rope = true;
  const int64_t n3 = Linear(8, 16, true).parameters().count() +
                     Attention(16, e3).parameters().count() +
                     Linear(16, 8, true).parameters().count();
  BOOST_TEST(n3 == 1368);
  // Example 4: 4x4 grid, 2 heads: 1,088 + 7*7*2.
  AttentionOptions e4 = opts(2);
  e4.relative_position_bias = true;
  e4.spatial_h = e4.spatial_w = 4;
  BOOST_TEST(Attention(16, e4).parameters().count() == 1186);
  // Example 5 (TransGAN): no q/k/v bias, 8x8 grid, 4 heads: 4*32*32 + 32 + 15*15*4.
  AttentionOptions e5 = opts(4);
  e5.qkv_bias = false;
  e5.out_bias = true;
  e5.relative_position_bias = true;
  e5.spatial_h = e5.spatial_w = 8;
  const Attention l5(32, e5);
  BOOST_TEST(l5.parameters().count() == 5028);
  int64_t from_shapes = 0;
  for (const auto& [name, shape] : attention_parameter_shapes(e5, 32))
    from_shapes += shape_numel(shape);
  BOOST_TEST(from_shapes == 5028);
}

BOOST_AUTO_TEST_CASE(parameter_names_follow_bias_rules) {
  const std::set<std::string> weights = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                         "o_proj.weight"};
  const std::set<std::string> qkv_b = {"q_proj.bias", "k_proj.bias", "v_proj.bias"};
  for (int mask = 0; mask < 16; ++mask) {
    AttentionOptions o = opts(2);
    o.bias = mask & 1;
    o.qkv_bias = mask & 2;
    o.out_bias = mask & 4;
    o.relative_position_bias = mask & 8;
    o.spatial_h = 2;
    o.spatial_w = 2;
    std::set<std::string> expect = weights;
    if (o.bias && o.qkv_bias) expect.insert(qkv_b.begin(), qkv_b.end());
    if (o.bias && o.out_bias) expect.insert("o_proj.bias");
    if (o.relative_position_bias) expect.insert("relative_position_bias_table");
    const Attention layer(8, o);
    BOOST_TEST((keys(layer.state_dict()) == expect), "mask " << mask);
    std::set<std::string> declared;
    for (const Parameter& p : layer.parameters().all()) declared.insert(p.name);
    BOOST_TEST((declared == expect), "mask " << mask);
    // The index is a buffer, never a parameter or a state_dict entry.
    BOOST_TEST(layer.state_dict().count("relative_position_index") == 0u);
    BOOST_TEST(layer.relative_position_index().defined() == o.relative_position_bias);
  }
  // Weights are [D, D], biases [D], the table [(2H-1)(2W-1), heads].
  AttentionOptions o = opts(3);
  o.relative_position_bias = true;
  o.spatial_h = 2;
  o.spatial_w = 5;
  const Attention layer(12, o);
  BOOST_TEST(layer.parameters().find("k_proj.weight")->shape == (Shape{12, 12}));
  BOOST_TEST(layer.parameters().find("o_proj.bias")->shape == (Shape{12}));
  BOOST_TEST(layer.parameters().find("relative_position_bias_table")->shape == (Shape{27, 3}));
}

BOOST_AUTO_TEST_CASE(relative_position_index_matches_formula) {
  AttentionOptions o = opts(1);
  o.relative_position_bias = true;
  o.spatial_h = 2;
  o.spatial_w = 3;
  const Attention layer(4, o);
  const Tensor& idx = layer.relative_position_index();
  BOOST_TEST((idx.dtype() == DType::I64));
  BOOST_TEST(idx.shape() == (Shape{6, 6}));
  const int64_t H = 2, W = 3;
  for (int64_t q = 0; q < 6; ++q)
    for (int64_t k = 0; k < 6; ++k) {
      const int64_t rq = q / W, cq = q % W, rk = k / W, ck = k % W;
      const int64_t expect = (rq - rk + H - 1) * (2 * W - 1) + (cq - ck + W - 1);
      BOOST_TEST(idx.at<int64_t>({q, k}) == expect, "q=" << q << " k=" << k);
    }
  // Hand-worked corners of the 3x5 table: the diagonal is the centre (dy=1, dx=2: 1*5 + 2),
  // query (0,0) vs key (1,2) is (dy=0, dx=0), query (1,2) vs key (0,0) the last row 14.
  BOOST_TEST(idx.at<int64_t>({0, 0}) == 7);
  BOOST_TEST(idx.at<int64_t>({4, 4}) == 7);
  BOOST_TEST(idx.at<int64_t>({0, 5}) == 0);
  BOOST_TEST(idx.at<int64_t>({5, 0}) == 14);
  BOOST_TEST(idx.at<int64_t>({1, 3}) == 3);  // (0,1) vs (1,0): dy=0, dx=3
  // The int form of spatial_shape is (n, n); no relative_position_bias, no index.
  BOOST_TEST(!Attention(4, opts(1)).relative_position_index().defined());
}

BOOST_AUTO_TEST_CASE(relative_position_bias_gathers_table_per_head) {
  // One-hot table entries: the bias must reach exactly the (q, k) pairs the formula names.
  // With v = identity, o = identity and q = k = 0 the output row l is sum_k A[l, k] x[k], and
  // a large bias on one pair makes A[l, k] ~ 1 there.
  AttentionOptions o = opts(2);
  o.bias = false;
  o.relative_position_bias = true;
  o.spatial_h = 2;
  o.spatial_w = 2;
  const int64_t D = 4, T = 4;
  Attention layer(D, o);
  auto& ps = layer.parameters();
  fill_with(ps.mutable_tensor("q_proj.weight"), [](int64_t) { return 0.0f; });
  fill_with(ps.mutable_tensor("k_proj.weight"), [](int64_t) { return 0.0f; });
  for (const char* name : {"v_proj.weight", "o_proj.weight"})
    fill_with(ps.mutable_tensor(name), [&](int64_t i) { return i / D == i % D ? 1.0f : 0.0f; });
  // Table [9, 2]: head 0 favours offset (dy, dx) = (+1, 0) (row (1+1)*3 + 1 = 7): the key one
  // row above; head 1 favours (0, -1) (row 1*3 + 0 = 3): the key one column to the right.
  fill_with(ps.mutable_tensor("relative_position_bias_table"),
            [](int64_t i) { return (i == 7 * 2 + 0 || i == 3 * 2 + 1) ? 60.0f : 0.0f; });
  std::vector<float> xv(T * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) xv[t * D + d] = static_cast<float>(10 * t + d);
  const Tensor y = layer.forward(Tensor::from_vector(xv, {1, T, D}));
  // Grid: t0 (0,0) t1 (0,1) / t2 (1,0) t3 (1,1).
  // Head 0 (features 0, 1): q at row 1 attends to the key above it; row-0 queries have no
  // such key and attend uniformly. Head 1 (features 2, 3): q at column 0 attends to the key
  // on its right; column-1 queries attend uniformly.
  const double uniform0 = (0 + 10 + 20 + 30) / 4.0;
  const double expect_h0[4] = {uniform0, uniform0, 0.0, 10.0};   // + d
  const double expect_h1[4] = {10.0, uniform0, 30.0, uniform0};  // + d
  for (int64_t t = 0; t < T; ++t) {
    BOOST_TEST(std::abs(y.item({0, t, 0}) - expect_h0[t]) < 1e-3, "t=" << t);
    BOOST_TEST(std::abs(y.item({0, t, 1}) - (expect_h0[t] + 1)) < 1e-3, "t=" << t);
    BOOST_TEST(std::abs(y.item({0, t, 2}) - (expect_h1[t] + 2)) < 1e-3, "t=" << t);
    BOOST_TEST(std::abs(y.item({0, t, 3}) - (expect_h1[t] + 3)) < 1e-3, "t=" << t);
  }
}

// ---------------------------------------------------------------- constraints

BOOST_AUTO_TEST_CASE(constraint_errors_name_argument_and_values) {
  const std::string where = "n0 (attention)";
  auto build = [&](int64_t dim, AttentionOptions o) { Attention(dim, o, 0, where); };
  expect_error(ErrorCode::Constraint, "n0 (attention): heads=0 must be >= 1",
               [&] { build(8, opts(0)); });
  expect_error(ErrorCode::Constraint, "heads=-2 must be >= 1", [&] { build(8, opts(-2)); });
  try {
    build(32, opts(3));
    BOOST_FAIL("heads=3, D=32 accepted");
  } catch (const Error& e) {
    BOOST_TEST(std::string(e.what()) == "E_CONSTRAINT: n0 (attention): heads=3 must divide D=32");
  }
  for (const double p : {1.0, -0.1, 1.5, std::nan("")}) {
    AttentionOptions o = opts(2);
    o.dropout = p;
    expect_error(ErrorCode::Constraint, "must be >= 0 and < 1", [&] { build(8, o); });
  }
  {
    AttentionOptions o = opts(2);
    o.dropout = 1.0;
    expect_error(ErrorCode::Constraint, "dropout=1.0", [&] { build(8, o); });
    o.dropout = -0.1;
    expect_error(ErrorCode::Constraint, "dropout=-0.1", [&] { build(8, o); });
    o.dropout = 0.999;  // < 1 is fine
    build(8, o);
  }
  {
    AttentionOptions o = opts(3);
    o.rope = true;
    expect_error(ErrorCode::Constraint, "rope needs an even head_dim; head_dim=D/heads=15/3=5",
                 [&] { build(15, o); });
    build(18, o);  // head_dim 6
  }
  {
    AttentionOptions o = opts(2);
    o.relative_position_bias = true;
    expect_error(ErrorCode::Constraint, "spatial_shape=(0, 0)", [&] { build(8, o); });
    o.spatial_h = 4;
    expect_error(ErrorCode::Constraint, "spatial_shape=(4, 0)", [&] { build(8, o); });
    o.spatial_h = 0;
    o.spatial_w = 3;
    expect_error(ErrorCode::Constraint, "relative_position_bias needs spatial_shape",
                 [&] { build(8, o); });
    o.spatial_h = -1;
    expect_error(ErrorCode::Constraint, "spatial_shape=(-1, 3) must be >= 0", [&] { build(8, o); });
    o.spatial_h = int64_t{1} << 40;
    o.spatial_w = int64_t{1} << 40;
    expect_error(ErrorCode::Constraint, "too large", [&] { build(8, o); });
  }
  {
    // spatial_shape without relative_position_bias is ignored, even when it fits no T.
    AttentionOptions o = opts(2);
    o.spatial_h = 3;
    o.spatial_w = 3;
    const Attention layer(8, o);
    BOOST_TEST(layer.forward(random_input(1, 5, 8, 1)).shape() == (Shape{1, 5, 8}));
  }
  expect_error(ErrorCode::Shape, "D=0", [&] { build(0, opts(1)); });
}

BOOST_AUTO_TEST_CASE(sequence_length_against_grid) {
  AttentionOptions o = opts(2);
  o.relative_position_bias = true;
  o.spatial_h = 3;
  o.spatial_w = 4;
  const std::string where = "n1 (attention)";
  validate_attention_options(o, 8, -1, where);  // T open: the grid fixes it
  validate_attention_options(o, 8, 12, where);
  expect_error(ErrorCode::Constraint,
               "n1 (attention): relative_position_bias needs spatial_shape H*W == T; "
               "spatial_shape=(3, 4) gives 12 tokens but T=11",
               [&] { validate_attention_options(o, 8, 11, where); });
  const Attention layer(8, o, 0, where);
  BOOST_TEST(layer.forward(random_input(2, 12, 8, 3)).shape() == (Shape{2, 12, 8}));
  expect_error(ErrorCode::Constraint, "T=13", [&] { layer.forward(random_input(2, 13, 8, 3)); });
  expect_error(ErrorCode::Constraint, "T=1", [&] { layer.forward(random_input(2, 1, 8, 3)); });
  // Non-grid layers take any T, including T == 0 and B == 0.
  const Attention plain(8, opts(2));
  BOOST_TEST(plain.forward(Tensor::zeros({2, 0, 8})).shape() == (Shape{2, 0, 8}));
  BOOST_TEST(plain.forward(Tensor::zeros({0, 4, 8})).shape() == (Shape{0, 4, 8}));
  // The other checks are the constructor's.
  validate_attention_options(opts(2), 8, 5, where);
  expect_error(ErrorCode::Constraint, "heads=3 must divide D=8",
               [&] { validate_attention_options(opts(3), 8, 5, where); });
}

BOOST_AUTO_TEST_CASE(forward_input_checks) {
  const Attention layer(8, opts(2));
  expect_error(ErrorCode::Shape, "[2, 5, 6]", [&] { layer.forward(Tensor::zeros({2, 5, 6})); });
  expect_error(ErrorCode::Shape, "[5, 8]", [&] { layer.forward(Tensor::zeros({5, 8})); });
  expect_error(ErrorCode::DType, "int64", [&] {
    layer.forward(Tensor::zeros({1, 2, 8}, DType::I64));
  });
  // Strided input: a transposed view gives the same result as its contiguous copy.
  const Tensor xt = random_input(4, 3, 8, 9).transpose(0, 1);  // [3, 4, 8], not contiguous
  BOOST_TEST(!xt.is_contiguous());
  BOOST_TEST(bitwise_equal(layer.forward(xt), layer.forward(xt.contiguous())));
}

// ---------------------------------------------------------------- init / trainable

BOOST_AUTO_TEST_CASE(unknown_init_or_trainable_name_is_arg_error) {
  AttentionOptions o = opts(2);
  o.init["q_proj.wieght"] = 0.02;
  expect_error(ErrorCode::Arg, "init names 'q_proj.wieght'", [&] { Attention(8, o); });
  // A real name of another configuration: without bias there is no q_proj.bias.
  o = opts(2);
  o.bias = false;
  o.init["q_proj.bias"] = 0.0;
  expect_error(ErrorCode::Arg, "'q_proj.bias'", [&] { Attention(8, o); });
  o = opts(2);
  o.trainable["relative_position_bias_table"] = false;  // no relative_position_bias
  expect_error(ErrorCode::Arg, "trainable names 'relative_position_bias_table'",
               [&] { Attention(8, o); });
  o = opts(2);
  o.trainable["relative_position_index"] = false;  // a buffer, not a parameter
  expect_error(ErrorCode::Arg, "relative_position_index", [&] { Attention(8, o); });
  o = opts(2);
  o.init["k_proj.weight"] = -0.5;
  expect_error(ErrorCode::Constraint, "init['k_proj.weight']=-0.5", [&] { Attention(8, o); });
}

BOOST_AUTO_TEST_CASE(trainable_flags_are_reported) {
  AttentionOptions o = opts(4);
  o.qkv_bias = false;
  o.relative_position_bias = true;
  o.spatial_h = o.spatial_w = 8;
  o.trainable["relative_position_bias_table"] = false;
  o.trainable["q_proj.weight"] = false;
  o.trainable["o_proj.bias"] = true;
  const Attention layer(32, o);
  for (const Parameter& p : layer.parameters().all()) {
    const bool frozen = p.name == "relative_position_bias_table" || p.name == "q_proj.weight";
    BOOST_TEST(p.trainable == !frozen, p.name);
  }
  const std::string r = layer.repr();
  BOOST_TEST(r.find("Attention(dim=32, heads=4, head_dim=8, causal=False, dropout=0.0, "
                    "rope=False, relative_position_bias=True, spatial_shape=(8, 8)") == 0u,
             r);
  BOOST_TEST(
      r.find("(q_proj): Linear(in_features=32, out_features=32, bias=False)") != std::string::npos,
      r);
  BOOST_TEST(
      r.find("(o_proj): Linear(in_features=32, out_features=32, bias=True)") != std::string::npos,
      r);
  BOOST_TEST(r.find("relative_position_bias_table: [225, 4]") != std::string::npos, r);
  BOOST_TEST(r.find("frozen: q_proj.weight, relative_position_bias_table") != std::string::npos, r);
  // Flags survive loading (they are metadata; loading replaces values only).
  Attention copy(32, o, 3);
  copy.load_state_dict(layer.state_dict());
  BOOST_TEST(!copy.parameters().find("q_proj.weight")->trainable);
  BOOST_TEST(copy.parameters().find("k_proj.weight")->trainable);
}

BOOST_AUTO_TEST_CASE(default_and_override_initialisation) {
  const int64_t D = 64;
  {
    AttentionOptions o = opts(4);
    o.relative_position_bias = true;
    o.spatial_h = o.spatial_w = 8;
    const Attention layer(D, o, 17);
    // nn.Linear's reset: U(+-1/sqrt(in_features)) for weights and biases; the table at 0.0.
    const double bound = 1.0 / std::sqrt(static_cast<double>(D));
    for (const Parameter& p : layer.parameters().all()) {
      const std::vector<double> v = p.value.to_double_vector();
      double max_abs = 0.0, sum_sq = 0.0;
      for (double e : v) {
        max_abs = std::max(max_abs, std::abs(e));
        sum_sq += e * e;
      }
      if (p.name == "relative_position_bias_table") {
        BOOST_TEST(max_abs == 0.0);
      } else {
        // float32 rounding of a draw just below the bound may land on it: half an ulp of slack.
        BOOST_TEST(max_abs <= bound * (1.0 + 1e-7), p.name);
        // U(-b, b) has std b/sqrt(3); >= 64 samples put the estimate well within 40%.
        const double sd = std::sqrt(sum_sq / static_cast<double>(v.size()));
        BOOST_TEST(std::abs(sd / (bound / std::sqrt(3.0)) - 1.0) < 0.4, p.name << " sd " << sd);
      }
    }
    // Different seeds, different draws; the same seed, the same draws.
    const Attention same(D, o, 17), other(D, o, 18);
    BOOST_TEST(bitwise_equal(layer.parameters().tensor("v_proj.weight"),
                             same.parameters().tensor("v_proj.weight")));
    BOOST_TEST(!bitwise_equal(layer.parameters().tensor("v_proj.weight"),
                              other.parameters().tensor("v_proj.weight")));
  }
  {
    AttentionOptions o = opts(4);
    o.relative_position_bias = true;
    o.spatial_h = o.spatial_w = 8;
    o.init["q_proj.weight"] = 0.0;
    o.init["k_proj.weight"] = 0.02;
    o.init["relative_position_bias_table"] = 0.02;
    o.init["o_proj.bias"] = 0.5;
    const Attention layer(D, o, 17);
    const std::vector<double> q = layer.parameters().tensor("q_proj.weight").to_double_vector();
    BOOST_TEST(std::count(q.begin(), q.end(), 0.0) == static_cast<std::ptrdiff_t>(q.size()));
    for (const char* name : {"k_proj.weight", "relative_position_bias_table", "o_proj.bias"}) {
      const double std = o.init.at(name);
      const std::vector<double> v = layer.parameters().tensor(name).to_double_vector();
      double sum = 0.0, sum_sq = 0.0, max_abs = 0.0;
      for (double e : v) {
        sum += e;
        sum_sq += e * e;
        max_abs = std::max(max_abs, std::abs(e));
      }
      const double n = static_cast<double>(v.size());
      const double mean = sum / n, sd = std::sqrt(sum_sq / n - mean * mean);
      // Truncated at 2 std (float32 rounding may add half an ulp).
      BOOST_TEST(max_abs <= 2.0 * std * (1.0 + 1e-6), name);
      // N(0, 1) truncated to [-2, 2] has std 0.8796; n = 64 (o_proj.bias) gives a relative
      // standard error of ~1/sqrt(2n) = 9%, so 30% is a 3-sigma band; n = 900 and 4096 are far
      // tighter. A plain N(0, std) would give 1.0, a uniform U(+-2std) 1.155.
      BOOST_TEST(std::abs(sd / (0.8796 * std) - 1.0) < 0.3, name << " sd " << sd);
      BOOST_TEST(std::abs(mean) < 4.0 * 0.8796 * std / std::sqrt(n), name << " mean " << mean);
    }
    // k_proj.weight has 4096 draws: tighten to 8% (3.5 standard errors of 1.1%) and check that
    // the tails reach past 1.9 std, which a draw clipped much tighter than 2 std would not.
    const std::vector<double> k = layer.parameters().tensor("k_proj.weight").to_double_vector();
    double sum_sq = 0.0, max_abs = 0.0;
    for (double e : k) {
      sum_sq += e * e;
      max_abs = std::max(max_abs, std::abs(e));
    }
    BOOST_TEST(std::abs(std::sqrt(sum_sq / 4096.0) / (0.8796 * 0.02) - 1.0) < 0.08);
    BOOST_TEST(max_abs > 1.9 * 0.02);
    // Parameters not named keep the default initialisation.
    BOOST_TEST(!bitwise_equal(layer.parameters().tensor("v_proj.weight"), Tensor::zeros({D, D})));
  }
}

// ---------------------------------------------------------------- loading

BOOST_AUTO_TEST_CASE(strict_and_non_strict_loading) {
  AttentionOptions o = opts(2);
  o.relative_position_bias = true;
  o.spatial_h = 2;
  o.spatial_w = 2;
  const Attention source(8, o, 1);
  const Tensor x = random_input(2, 4, 8, 5);
  const Tensor expect = source.forward(x);

  // Strict: the full state_dict reproduces the source exactly (packed q/k/v kept in sync).
  Attention layer(8, o, 2);
  BOOST_TEST(max_abs_diff(layer.forward(x), expect) > 1e-3);
  layer.load_state_dict(source.state_dict());
  BOOST_TEST(bitwise_equal(layer.forward(x), expect));

  // Stored in float16 / float64: converted to float32 parameters.
  {
    std::map<std::string, Tensor> half;
    for (const auto& [k, v] : source.state_dict()) half[k] = v.to(DType::F64);
    Attention l(8, o, 3);
    l.load_state_dict(half);
    BOOST_TEST(bitwise_equal(l.forward(x), expect));
    for (auto& [k, v] : half) v = v.to(DType::F16);
    l.load_state_dict(half);
    BOOST_TEST(compare(l.forward(x), expect).rel_fro < 1e-2);
  }

  auto missing = source.state_dict();
  missing.erase("k_proj.bias");
  missing.erase("relative_position_bias_table");
  expect_error(ErrorCode::Weights, "missing: k_proj.bias, relative_position_bias_table",
               [&] { Attention(8, o, 3).load_state_dict(missing); });
  auto extra = source.state_dict();
  extra["relative_position_index"] = Tensor::zeros({4, 4}, DType::I64);
  expect_error(ErrorCode::Weights, "unexpected: relative_position_index",
               [&] { Attention(8, o, 3).load_state_dict(extra); });
  auto bad = source.state_dict();
  bad["v_proj.weight"] = Tensor::zeros({8, 7});
  expect_error(ErrorCode::Weights, "v_proj.weight (expected [8, 8], got [8, 7])",
               [&] { Attention(8, o, 3).load_state_dict(bad); });
  expect_error(ErrorCode::Weights, "v_proj.weight",
               [&] { Attention(8, o, 3).load_state_dict(bad, /*strict=*/false); });
  // A failed load changes nothing.
  {
    Attention l(8, o, 3);
    const Tensor before = l.forward(x);
    BOOST_CHECK_THROW(l.load_state_dict(bad), Error);
    BOOST_TEST(bitwise_equal(l.forward(x), before));
  }

  // Non-strict: missing keys keep their values, unexpected keys are reported and ignored.
  Attention partial(8, o, 3);
  const auto before = partial.state_dict();
  auto mixed = missing;
  mixed["relative_position_index"] = Tensor::zeros({4, 4}, DType::I64);
  const LoadResult r = partial.load_state_dict(mixed, /*strict=*/false);
  BOOST_TEST(
      (r.missing == std::vector<std::string>{"k_proj.bias", "relative_position_bias_table"}));
  BOOST_TEST((r.unexpected == std::vector<std::string>{"relative_position_index"}));
  BOOST_TEST(bitwise_equal(partial.parameters().tensor("k_proj.bias"), before.at("k_proj.bias")));
  BOOST_TEST(bitwise_equal(partial.parameters().tensor("q_proj.weight"),
                           source.parameters().tensor("q_proj.weight")));
  // The forward uses the mix: source weights with partial's k bias (and zero table).
  std::map<std::string, Tensor> mix_state = source.state_dict();
  mix_state["k_proj.bias"] = before.at("k_proj.bias");
  mix_state["relative_position_bias_table"] = before.at("relative_position_bias_table");
  Attention mix(8, o, 4);
  mix.load_state_dict(mix_state);
  BOOST_TEST(bitwise_equal(partial.forward(x), mix.forward(x)));
}

BOOST_AUTO_TEST_CASE(forward_sees_every_way_of_changing_parameters) {
  const Tensor x = random_input(2, 5, 8, 6);
  const Attention target(8, opts(2), 1);
  const Tensor expect = target.forward(x);
  // reset_parameters with the seed's generator equals constructing with that seed.
  {
    Attention l(8, opts(2), 2);
    Generator gen(1);
    l.reset_parameters(gen);
    BOOST_TEST(bitwise_equal(l.forward(x), expect));
  }
  // In-place writes through parameters().
  {
    Attention l(8, opts(2), 2);
    for (const auto& [k, v] : target.state_dict()) l.parameters().mutable_tensor(k).copy_from(v);
    BOOST_TEST(bitwise_equal(l.forward(x), expect));
  }
  // Replacing the tensors, and loading through the ParameterSet directly.
  {
    Attention l(8, opts(2), 2);
    for (const auto& [k, v] : target.state_dict()) l.parameters().mutable_tensor(k) = v.clone();
    BOOST_TEST(bitwise_equal(l.forward(x), expect));
    Attention m(8, opts(2), 2);
    m.parameters().load(target.state_dict(), true, "m");
    BOOST_TEST(bitwise_equal(m.forward(x), expect));
    // ...and a later load_state_dict or reset brings the packed copy back in sync.
    m.load_state_dict(Attention(8, opts(2), 9).state_dict());
    BOOST_TEST(bitwise_equal(m.forward(x), Attention(8, opts(2), 9).forward(x)));
  }
}

BOOST_AUTO_TEST_CASE(copies_own_their_parameters) {
  AttentionOptions o = opts(2);
  o.relative_position_bias = true;
  o.spatial_h = 1;
  o.spatial_w = 5;
  const Tensor x = random_input(2, 5, 8, 7);
  Attention original(8, o, 1);
  const Tensor before = original.forward(x);
  Attention copy = original;
  BOOST_TEST(bitwise_equal(copy.forward(x), before));
  // Loading into or writing through the copy leaves the original alone (q/k/v live in a packed
  // buffer that a member-wise copy would share).
  copy.load_state_dict(Attention(8, o, 2).state_dict());
  copy.parameters().mutable_tensor("o_proj.weight").set_item({0, 0}, 3.0);
  BOOST_TEST(bitwise_equal(original.forward(x), before));
  BOOST_TEST(max_abs_diff(copy.forward(x), before) > 1e-3);
  Attention assigned(8, opts(2), 5);
  assigned = copy;
  BOOST_TEST(bitwise_equal(assigned.forward(x), copy.forward(x)));
  BOOST_TEST(assigned.relative_position_index().defined());
}

// ---------------------------------------------------------------- concurrency

BOOST_AUTO_TEST_CASE(concurrent_forwards_match_single_threaded) {
  AttentionOptions o = opts(4);
  o.causal = true;
  o.rope = true;
  o.relative_position_bias = true;
  o.spatial_h = 4;
  o.spatial_w = 8;
  Attention layer(64, o, 8);
  fill_with(layer.parameters().mutable_tensor("relative_position_bias_table"),
            [](int64_t i) { return 0.1f * std::cos(static_cast<float>(i)); });
  layer.train();  // with dropout 0: exercises the training path without randomness
  std::vector<Tensor> inputs, expect;
  set_num_threads(1);
  for (uint64_t i = 0; i < 4; ++i) {
    inputs.push_back(random_input(3, 32, 64, 100 + i));
    expect.push_back(layer.forward(inputs.back()));
  }
  set_num_threads(0);
  std::vector<double> worst(4, 0.0);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 20; ++rep) {
        const Tensor y = layer.forward(inputs[i]);
        // Thread-count-dependent GEMM blocking may move the last bit; corruption would not
        // stay within 1e-6 of the output's scale.
        const std::vector<float> a = y.to_float_vector(), b = expect[i].to_float_vector();
        for (size_t j = 0; j < a.size(); ++j)
          worst[i] = std::max(worst[i], std::isnan(a[j]) ? 1e30 : std::abs(double(a[j]) - b[j]));
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    double scale = 1.0;
    for (float v : expect[i].to_float_vector()) scale = std::max(scale, double(std::abs(v)));
    BOOST_TEST(worst[i] <= 1e-6 * scale, "thread " << i << ": " << worst[i]);
  }
}

BOOST_AUTO_TEST_SUITE_END()
