// MultiheadAttention (shared/docs/mha_semantics.md) against
//  - the PyTorch fixtures of tests/fixtures/gen_mha_fixtures.py (torch 1.13 float32 outputs, or
//    float64 formula outputs where 1.13 predates the 2.x rules), at the page's tolerance
//    max |ours - torch| <= 1e-5 * max(1, max |torch|);
//  - an independent float64 reference with naive loops straight from the page's formulas
//    (tests/reference.cpp, shared with the ops suite), on random configurations: relative
//    Frobenius error <= 1e-6, plus properties that need no reference (batch_first transpose,
//    unbatched == batch of one, bool == -inf float mask, per-head weights average to the averaged
//    ones, rows sum to 1 or are all zero);
//  - every error path (E_CONSTRAINT, E_SHAPE, E_DTYPE, E_UNSUPPORTED, E_WEIGHTS, E_ARG);
//  - four threads calling forward on one module at once.
// Run with --log_level=message to see the worst errors measured.
#include <algorithm>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "layers/multihead_attention.h"
#include "tests/reference.h"

using namespace tessera;

namespace {

constexpr double kTorchTolerance = 1e-5;    // mha_semantics.md, relative to max(1, max |torch|)
constexpr double kFloat64Tolerance = 1e-6;  // mha_semantics.md, relative Frobenius
constexpr double kInf = std::numeric_limits<double>::infinity();

template <class Fn>
void expect_error(ErrorCode code, Fn&& fn, const std::vector<std::string>& fragments = {}) {
  try {
    fn();
  } catch (const Error& e) {
    BOOST_TEST(std::string(error_code_name(e.code())) == error_code_name(code), e.what());
    const std::string what = e.what();
    for (const std::string& f : fragments)
      BOOST_TEST(what.find(f) != std::string::npos, "'" << f << "' missing from: " << what);
    return;
  }
  BOOST_FAIL("expected " << error_code_name(code));
}

// max |a - b|; infinity when either holds a NaN or the shapes differ.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return kInf;
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  double m = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) || std::isnan(y[i])) return kInf;
    if (x[i] == y[i]) continue;  // equal infinities
    m = std::max(m, std::abs(x[i] - y[i]));
  }
  return m;
}

double max_abs(const Tensor& a) {
  double m = 0.0;
  for (double v : a.to_double_vector()) m = std::max(m, std::abs(v));
  return m;
}

// The page's torch tolerance measure: max |ours - expected| / max(1, max |expected|).
double torch_error(const Tensor& ours, const Tensor& expected) {
  return max_abs_diff(ours, expected) / std::max(1.0, max_abs(expected));
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// ||ours - ref||_F / ||ref||_F (the absolute norm when ref is all zeros).
double rel_frobenius(const std::vector<double>& ours, const std::vector<double>& ref) {
  if (ours.size() != ref.size()) return kInf;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ours[i])) return kInf;
    num += (ours[i] - ref[i]) * (ours[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Worst {
  double value = 0.0;
  std::string where;
  void update(double v, const std::string& w) {
    if (v > value || std::isnan(v)) {
      value = v;
      where = w;
    }
  }
};

// ------------------------------------------------------------------------------ fixtures

struct Fixture {
  std::string name;
  nlohmann::json config;
  std::string source;  // "torch" or "float64"
  std::map<std::string, Tensor> weights;
  std::map<std::string, Tensor> tensors;
  Tensor get(const std::string& n) const {
    auto it = tensors.find(n);
    return it == tensors.end() ? Tensor() : it->second;
  }
  bool need_weights() const { return config.at("need_weights").get<bool>(); }
  bool average() const { return config.at("average_attn_weights").get<bool>(); }
  bool is_causal() const { return config.at("is_causal").get<bool>(); }
};

std::vector<std::string> fixture_paths() {
  std::vector<std::string> paths;
  const std::filesystem::path dir = std::filesystem::path(TESSERA_FIXTURE_DIR) / "mha";
  if (std::filesystem::is_directory(dir))
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  return paths;
}

Fixture load_fixture(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  Fixture f;
  f.name = file.metadata().at("name");
  f.config = nlohmann::json::parse(file.metadata().at("config"));
  f.source = file.metadata().at("expected_source");
  for (const std::string& n : file.names()) {
    if (n.rfind("w.", 0) == 0)
      f.weights[n.substr(2)] = file.tensor(n);
    else
      f.tensors[n] = file.tensor(n);
  }
  return f;
}

const std::vector<Fixture>& fixtures() {
  static const std::vector<Fixture> all = [] {
    std::vector<Fixture> v;
    for (const std::string& p : fixture_paths()) v.push_back(load_fixture(p));
    return v;
  }();
  return all;
}

MultiheadAttentionOptions options_from(const nlohmann::json& c) {
  MultiheadAttentionOptions o;
  o.embed_dim = c.at("embed_dim").get<int64_t>();
  o.num_heads = c.at("num_heads").get<int64_t>();
  o.dropout = c.at("dropout").get<double>();
  o.bias = c.at("bias").get<bool>();
  o.add_bias_kv = c.at("add_bias_kv").get<bool>();
  o.add_zero_attn = c.at("add_zero_attn").get<bool>();
  if (!c.at("kdim").is_null()) o.kdim = c.at("kdim").get<int64_t>();
  if (!c.at("vdim").is_null()) o.vdim = c.at("vdim").get<int64_t>();
  o.batch_first = c.at("batch_first").get<bool>();
  return o;
}

MultiheadAttention module_for(const Fixture& f) {
  MultiheadAttention m(options_from(f.config));
  m.load_state_dict(f.weights, /*strict=*/true);
  return m;
}

MultiheadAttentionOutput run_fixture(const MultiheadAttention& m, const Fixture& f,
                                     bool need_weights, const Tensor& query) {
  return m.forward(query, f.get("key"), f.get("value"), f.get("key_padding_mask"), need_weights,
                   f.get("attn_mask"), f.average(), f.is_causal());
}

MultiheadAttentionOutput run_fixture(const MultiheadAttention& m, const Fixture& f,
                                     bool need_weights) {
  return run_fixture(m, f, need_weights, f.get("query"));
}

// ------------------------------------------------------------------- float64 reference

// The page's formulas with naive loops in double (tests/reference.cpp), reading the module's
// parameters and the call's inputs.
f64::MhaReference reference_forward(const MultiheadAttention& m, const Tensor& query,
                                    const Tensor& key, const Tensor& value, const Tensor& kpm,
                                    const Tensor& attn_mask, bool is_causal) {
  return f64::multihead_attention(m.options(), m.state_dict(), query, key, value, kpm, attn_mask,
                                  is_causal);
}

// ------------------------------------------------------------------- random configurations

struct RandomCase {
  MultiheadAttentionOptions opt;
  std::map<std::string, Tensor> state;
  Tensor query, key, value, kpm, attn_mask;
  bool batched = true, is_causal = false, average = true;
  std::string label;
};

// Random parameters for every declared slot: unit-variance projections (U(+-sqrt(3/in))),
// non-zero biases (the module's own reset zeroes them, which would hide a dropped bias).
std::map<std::string, Tensor> random_state(const MultiheadAttention& m, Generator& g) {
  std::vector<std::pair<std::string, Shape>> shapes;
  for (const Parameter& p : m.parameters().all()) shapes.emplace_back(p.name, p.shape);
  return f64::random_parameters(shapes, g);
}

RandomCase random_case(uint64_t seed) {
  Generator g(seed);
  auto pick = [&](int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(g.uniform() * static_cast<double>(hi - lo + 1));
  };
  auto coin = [&](double p) { return g.uniform() < p; };
  RandomCase c;
  const int64_t dims[] = {4, 6, 8, 12, 16};
  const int64_t E = dims[pick(0, 4)];
  std::vector<int64_t> divisors;
  for (int64_t h = 1; h <= E; ++h)
    if (E % h == 0) divisors.push_back(h);
  c.opt.embed_dim = E;
  c.opt.num_heads = divisors[pick(0, static_cast<int64_t>(divisors.size()) - 1)];
  if (coin(0.35)) c.opt.kdim = pick(1, 9);
  if (coin(0.35)) c.opt.vdim = pick(1, 9);
  c.opt.bias = coin(0.7);
  c.opt.add_bias_kv = coin(0.3);
  c.opt.add_zero_attn = coin(0.3);
  c.opt.batch_first = coin(0.5);
  MultiheadAttention shape_only(c.opt);
  c.state = random_state(shape_only, g);
  const int64_t kd = shape_only.kdim(), vd = shape_only.vdim();

  c.batched = coin(0.75);
  const int64_t N = c.batched ? pick(1, 3) : 1;
  const int64_t L = pick(1, 7);
  const bool self = shape_only.packed_in_proj() && coin(0.4);
  const int64_t S = self ? L : (coin(0.05) ? 0 : pick(1, 7));
  const bool bf = c.batched && c.opt.batch_first;
  auto seq_shape = [&](int64_t T, int64_t C) {
    return !c.batched ? Shape{T, C} : bf ? Shape{N, T, C} : Shape{T, N, C};
  };
  c.query = Tensor::randn(seq_shape(L, E), g);
  if (self) {
    c.key = c.value = c.query;
  } else {
    c.key = Tensor::randn(seq_shape(S, kd), g);
    c.value = kd == vd && coin(0.3) ? c.key : Tensor::randn(seq_shape(S, vd), g);
  }
  const int64_t H = c.opt.num_heads;
  switch (pick(0, 4)) {
    case 1:
      c.attn_mask = f64::random_mask({L, S}, true, g);
      break;
    case 2:
      c.attn_mask = f64::random_mask({L, S}, false, g);
      break;
    case 3:
      c.attn_mask = f64::random_mask({c.batched ? N * H : H, L, S}, true, g);
      break;
    case 4:
      c.attn_mask = f64::random_mask({c.batched ? N * H : H, L, S}, false, g);
      break;
    default:
      break;
  }
  switch (pick(0, 2)) {
    case 1:
      c.kpm = f64::random_mask(c.batched ? Shape{N, S} : Shape{S}, true, g);
      break;
    case 2:
      c.kpm = f64::random_mask(c.batched ? Shape{N, S} : Shape{S}, false, g);
      break;
    default:
      break;
  }
  c.is_causal = coin(0.3);
  c.average = coin(0.5);
  c.label = "seed " + std::to_string(seed) + " E=" + std::to_string(E) + " H=" + std::to_string(H) +
            " kdim=" + std::to_string(kd) + " vdim=" + std::to_string(vd) +
            " N=" + std::to_string(N) + " L=" + std::to_string(L) + " S=" + std::to_string(S) +
            (c.batched ? "" : " unbatched") + (bf ? " batch_first" : "") +
            (c.opt.add_bias_kv ? " bias_kv" : "") + (c.opt.add_zero_attn ? " zero_attn" : "") +
            (c.opt.bias ? "" : " no-bias") + (self ? " self" : "") +
            (c.attn_mask.defined() ? " attn_mask" + c.attn_mask.shape_str() : "") +
            (c.kpm.defined() ? " kpm" : "") + (c.is_causal ? " causal" : "");
  return c;
}

MultiheadAttention module_for(const RandomCase& c) {
  MultiheadAttention m(c.opt);
  m.load_state_dict(c.state);
  return m;
}

MultiheadAttentionOutput run_case(const MultiheadAttention& m, const RandomCase& c,
                                  bool need_weights = true) {
  return m.forward(c.query, c.key, c.value, c.kpm, need_weights, c.attn_mask, c.average,
                   c.is_causal);
}

constexpr uint64_t kRandomCases = 400;

// A small module and inputs for the error and property tests: E=8, H=2, L=5, S=7, N=2.
MultiheadAttentionOptions small_options() {
  MultiheadAttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  return o;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(multihead_attention)

// ------------------------------------------------------------------------------ fixtures

BOOST_AUTO_TEST_CASE(fixtures_match_pytorch) {
  const auto& all = fixtures();
  // gen_mha_fixtures.py writes 69 cases; fewer means the directory is missing or stale.
  BOOST_TEST(all.size() >= 69u, "only " << all.size() << " fixtures in tests/fixtures/mha");
  Worst torch_out, torch_w, f64_out, f64_w;
  for (const Fixture& f : all) {
    BOOST_TEST_CONTEXT("fixture " << f.name) {
      const MultiheadAttention m = module_for(f);
      const MultiheadAttentionOutput r = run_fixture(m, f, f.need_weights());
      const Tensor& expected = f.tensors.at("expected.output");
      BOOST_TEST((r.output.dtype() == DType::F32));
      BOOST_TEST(r.output.is_contiguous());
      BOOST_TEST(r.output.shape_str() == expected.shape_str());
      const double e_out = torch_error(r.output, expected);
      BOOST_TEST(e_out <= kTorchTolerance, "output error " << e_out);
      (f.source == "torch" ? torch_out : f64_out).update(e_out, f.name);
      if (f.need_weights()) {
        const Tensor& ew = f.tensors.at("expected.weights");
        BOOST_TEST(r.weights.defined());
        BOOST_TEST((r.weights.dtype() == DType::F32));
        BOOST_TEST(r.weights.is_contiguous());
        BOOST_TEST(r.weights.shape_str() == ew.shape_str());
        const double e_w = torch_error(r.weights, ew);
        BOOST_TEST(e_w <= kTorchTolerance, "weights error " << e_w);
        (f.source == "torch" ? torch_w : f64_w).update(e_w, f.name);
      } else {
        BOOST_TEST(!r.weights.defined());
      }
    }
  }
  BOOST_TEST_MESSAGE("MHA vs torch 1.13 (max|d|/max(1,max|torch|)): output "
                     << torch_out.value << " (" << torch_out.where << "), weights " << torch_w.value
                     << " (" << torch_w.where << ")");
  BOOST_TEST_MESSAGE("MHA vs float64 formula fixtures: output "
                     << f64_out.value << " (" << f64_out.where << "), weights " << f64_w.value
                     << " (" << f64_w.where << ")");
}

BOOST_AUTO_TEST_CASE(fixtures_need_weights_false_matches_true) {
  Worst worst;
  for (const Fixture& f : fixtures()) {
    BOOST_TEST_CONTEXT("fixture " << f.name) {
      const MultiheadAttention m = module_for(f);
      const Tensor with = run_fixture(m, f, true).output;
      const MultiheadAttentionOutput without = run_fixture(m, f, false);
      BOOST_TEST(!without.weights.defined());
      // Float32 rounding of E-term sums at these sizes: a few 1e-7 of the output scale.
      const double e = torch_error(without.output, with);
      BOOST_TEST(e <= 1e-6, "need_weights false vs true " << e);
      worst.update(e, f.name);
    }
  }
  BOOST_TEST_MESSAGE("MHA need_weights=false vs true, worst " << worst.value << " (" << worst.where
                                                              << ")");
}

// The same values through differently laid out inputs: rows padded to a wider stride (read in
// place), a permuted layout (copied), and, for self-attention, query/key/value passed explicitly
// rather than defaulted.
BOOST_AUTO_TEST_CASE(fixtures_strided_and_explicit_inputs) {
  for (const Fixture& f : fixtures()) {
    BOOST_TEST_CONTEXT("fixture " << f.name) {
      const MultiheadAttention m = module_for(f);
      const Tensor query = f.get("query");
      const MultiheadAttentionOutput base = run_fixture(m, f, true);
      const bool self = !f.tensors.count("key") && !f.tensors.count("value");
      if (self) {
        const MultiheadAttentionOutput explicit_qkv =
            m.forward(query, query, query, f.get("key_padding_mask"), true, f.get("attn_mask"),
                      f.average(), f.is_causal());
        BOOST_TEST(bitwise_equal(explicit_qkv.output, base.output));
      }
      Shape wide = query.shape();
      wide.back() += 3;
      Tensor storage = Tensor::zeros(wide, query.dtype());
      Tensor padded = storage.narrow(-1, 0, query.size(-1));
      padded.copy_from(query);
      BOOST_TEST(padded.stride(-2) == query.size(-1) + 3);
      const Tensor permuted = query.transpose(0, 1).contiguous().transpose(0, 1);
      for (const Tensor& q : {padded, permuted}) {
        const MultiheadAttentionOutput r =
            self ? m.forward(q, q, q, f.get("key_padding_mask"), true, f.get("attn_mask"),
                             f.average(), f.is_causal())
                 : run_fixture(m, f, true, q);
        BOOST_TEST(torch_error(r.output, base.output) <= 1e-6);
        if (base.weights.defined()) BOOST_TEST(torch_error(r.weights, base.weights) <= 1e-6);
      }
    }
  }
}

// ------------------------------------------------------------------- float64 reference

BOOST_AUTO_TEST_CASE(random_configs_match_float64_reference) {
  Worst out_err, w_err;
  int dead_rows = 0, cases_with_extra = 0;
  for (uint64_t seed = 1; seed <= kRandomCases; ++seed) {
    const RandomCase c = random_case(seed);
    BOOST_TEST_CONTEXT(c.label) {
      const MultiheadAttention m = module_for(c);
      const MultiheadAttentionOutput r = run_case(m, c);
      const f64::MhaReference ref =
          reference_forward(m, c.query, c.key, c.value, c.kpm, c.attn_mask, c.is_causal);
      const double eo = rel_frobenius(r.output.to_double_vector(), ref.out);
      const double ew =
          rel_frobenius(r.weights.to_double_vector(), ref.returned_weights(c.average));
      BOOST_TEST(eo <= kFloat64Tolerance, "output rel. Frobenius " << eo);
      BOOST_TEST(ew <= kFloat64Tolerance, "weights rel. Frobenius " << ew);
      out_err.update(eo, c.label);
      w_err.update(ew, c.label);
      cases_with_extra += (c.opt.add_bias_kv || c.opt.add_zero_attn) ? 1 : 0;

      // Rows of the per-head weights: sum to 1, or all exactly zero where the reference says
      // every key is masked.
      const MultiheadAttentionOutput per_head =
          m.forward(c.query, c.key, c.value, c.kpm, true, c.attn_mask, false, c.is_causal);
      const std::vector<double> w = per_head.weights.to_double_vector();
      const int64_t Sp = ref.Sp;
      bool rows_ok = true;
      for (int64_t row = 0; Sp > 0 && row < ref.N * ref.H * ref.L; ++row) {
        double sum = 0.0;
        bool ref_dead = true, all_zero = true;
        for (int64_t s = 0; s < Sp; ++s) {
          sum += w[row * Sp + s];
          all_zero = all_zero && w[row * Sp + s] == 0.0;
          ref_dead = ref_dead && ref.weights[row * Sp + s] == 0.0;
        }
        dead_rows += ref_dead ? 1 : 0;
        rows_ok = rows_ok && (ref_dead ? all_zero : std::abs(sum - 1.0) <= 1e-5);
      }
      BOOST_TEST(rows_ok, "a weights row neither sums to 1 nor is all zero as it should be");
    }
  }
  // The random masks must actually produce fully masked rows and appended positions.
  BOOST_TEST(dead_rows > 0);
  BOOST_TEST(cases_with_extra > 0);
  BOOST_TEST_MESSAGE("MHA vs float64 reference ("
                     << kRandomCases << " random configs, " << dead_rows
                     << " fully masked rows): output rel. Frobenius " << out_err.value << " ["
                     << out_err.where << "], weights " << w_err.value << " [" << w_err.where
                     << "]");
}

// need_weights=false may take a fused kernel that never forms the [L, S'] matrix: it must agree
// with the explicit path and meet the float64 tolerance on its own.
BOOST_AUTO_TEST_CASE(property_need_weights_false_matches_true) {
  Worst vs_true, vs_f64;
  for (uint64_t seed = 1000; seed < 1000 + kRandomCases; ++seed) {
    const RandomCase c = random_case(seed);
    BOOST_TEST_CONTEXT(c.label) {
      const MultiheadAttention m = module_for(c);
      const MultiheadAttentionOutput a = run_case(m, c, true), b = run_case(m, c, false);
      BOOST_TEST(!b.weights.defined());
      const double e = torch_error(b.output, a.output);
      BOOST_TEST(e <= 1e-6);
      vs_true.update(e, c.label);
      const f64::MhaReference ref =
          reference_forward(m, c.query, c.key, c.value, c.kpm, c.attn_mask, c.is_causal);
      const double ef = rel_frobenius(b.output.to_double_vector(), ref.out);
      BOOST_TEST(ef <= kFloat64Tolerance, "need_weights=false rel. Frobenius " << ef);
      vs_f64.update(ef, c.label);
    }
  }
  BOOST_TEST_MESSAGE("MHA need_weights=false ("
                     << kRandomCases << " random configs): vs true " << vs_true.value << " ["
                     << vs_true.where << "], vs float64 rel. Frobenius " << vs_f64.value << " ["
                     << vs_f64.where << "]");
}

BOOST_AUTO_TEST_CASE(property_per_head_weights_average_to_averaged) {
  for (uint64_t seed = 2000; seed < 2000 + kRandomCases / 4; ++seed) {
    const RandomCase c = random_case(seed);
    BOOST_TEST_CONTEXT(c.label) {
      const MultiheadAttention m = module_for(c);
      const Tensor avg =
          m.forward(c.query, c.key, c.value, c.kpm, true, c.attn_mask, true, c.is_causal).weights;
      const Tensor per =
          m.forward(c.query, c.key, c.value, c.kpm, true, c.attn_mask, false, c.is_causal).weights;
      BOOST_TEST(per.dim() == avg.dim() + 1);
      const int64_t hd = c.batched ? 1 : 0;  // the heads dim of the per-head weights
      const int64_t H = c.opt.num_heads;
      BOOST_TEST(per.size(hd) == H);
      // Mean over heads from the per-head tensor, in double.
      Shape avg_shape = per.shape();
      avg_shape.erase(avg_shape.begin() + hd);
      BOOST_TEST(avg.shape() == avg_shape);
      const std::vector<double> p = per.to_double_vector();
      const int64_t inner = per.size(-2) * per.size(-1);  // L * S'
      const int64_t outer = c.batched ? per.size(0) : 1;
      std::vector<double> mean(static_cast<size_t>(outer * inner), 0.0);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < inner; ++i) mean[o * inner + i] += p[(o * H + h) * inner + i] / H;
      const std::vector<double> a = avg.to_double_vector();
      double e = 0.0;
      for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - mean[i]));
      BOOST_TEST(e <= 1e-6);
    }
  }
}

BOOST_AUTO_TEST_CASE(property_batch_first_is_a_transpose) {
  int checked = 0;
  for (uint64_t seed = 3000; seed < 3000 + kRandomCases / 2; ++seed) {
    const RandomCase c = random_case(seed);
    if (!c.batched) continue;
    ++checked;
    BOOST_TEST_CONTEXT(c.label) {
      const MultiheadAttention m = module_for(c);
      MultiheadAttentionOptions flipped_opt = c.opt;
      flipped_opt.batch_first = !c.opt.batch_first;
      MultiheadAttention flipped(flipped_opt);
      flipped.load_state_dict(c.state);
      auto t = [](const Tensor& x) { return x.transpose(0, 1).contiguous(); };
      const bool self = c.key.storage() == c.query.storage();
      const Tensor q = t(c.query);
      const Tensor k = self ? q : t(c.key);
      const Tensor v = self ? q : (c.value.storage() == c.key.storage() ? k : t(c.value));
      const MultiheadAttentionOutput a = run_case(m, c);
      const MultiheadAttentionOutput b =
          flipped.forward(q, k, v, c.kpm, true, c.attn_mask, c.average, c.is_causal);
      BOOST_TEST(torch_error(b.output, t(a.output)) <= 1e-6);
      // Weights are never transposed by batch_first.
      BOOST_TEST(b.weights.shape() == a.weights.shape());
      BOOST_TEST(torch_error(b.weights, a.weights) <= 1e-6);
    }
  }
  BOOST_TEST(checked > 50);
}

BOOST_AUTO_TEST_CASE(property_unbatched_equals_batch_of_one) {
  int checked = 0;
  for (uint64_t seed = 4000; seed < 4000 + kRandomCases / 2; ++seed) {
    const RandomCase c = random_case(seed);
    if (c.batched) continue;
    ++checked;
    BOOST_TEST_CONTEXT(c.label) {
      const MultiheadAttention m = module_for(c);
      const MultiheadAttentionOutput a = run_case(m, c);
      // batch_first is ignored for unbatched input; batched, the batch dim is 0 or 1.
      const int64_t bd = c.opt.batch_first ? 0 : 1;
      const Tensor q = c.query.unsqueeze(bd);
      const Tensor k = c.key.storage() == c.query.storage() ? q : c.key.unsqueeze(bd);
      const Tensor v = c.value.storage() == c.query.storage() ? q
                       : c.value.storage() == c.key.storage() ? k
                                                              : c.value.unsqueeze(bd);
      // A 3-D attn_mask is (H, L, S) unbatched and (1*H, L, S) batched: the same tensor.
      const Tensor kpm = c.kpm.defined() ? c.kpm.unsqueeze(0) : Tensor();
      const MultiheadAttentionOutput b =
          m.forward(q, k, v, kpm, true, c.attn_mask, c.average, c.is_causal);
      BOOST_TEST(torch_error(b.output.squeeze(bd), a.output) <= 1e-6);
      BOOST_TEST(b.output.shape_str() == q.shape_str());
      BOOST_TEST(torch_error(b.weights.squeeze(0), a.weights) <= 1e-6);
    }
  }
  BOOST_TEST(checked > 20);
}

BOOST_AUTO_TEST_CASE(property_bool_mask_equals_neg_inf_float_mask) {
  int checked = 0;
  auto as_float = [](const Tensor& m) {
    if (!m.defined() || m.dtype() != DType::Bool) return m;
    Tensor f = Tensor::empty(m.shape(), DType::F32);
    const auto* p = static_cast<const uint8_t*>(m.contiguous().raw_data());
    for (int64_t i = 0; i < m.numel(); ++i)
      f.data<float>()[i] = p[i] ? -std::numeric_limits<float>::infinity() : 0.0f;
    return f;
  };
  for (uint64_t seed = 5000; seed < 5000 + kRandomCases / 2; ++seed) {
    const RandomCase c = random_case(seed);
    const bool has_bool = (c.attn_mask.defined() && c.attn_mask.dtype() == DType::Bool) ||
                          (c.kpm.defined() && c.kpm.dtype() == DType::Bool);
    if (!has_bool) continue;
    ++checked;
    BOOST_TEST_CONTEXT(c.label) {
      const MultiheadAttention m = module_for(c);
      const MultiheadAttentionOutput a = run_case(m, c);
      const MultiheadAttentionOutput b = m.forward(c.query, c.key, c.value, as_float(c.kpm), true,
                                                   as_float(c.attn_mask), c.average, c.is_causal);
      // Both become the same float buffer before the core runs: bit-identical results.
      BOOST_TEST(bitwise_equal(a.output, b.output));
      BOOST_TEST(bitwise_equal(a.weights, b.weights));
    }
  }
  BOOST_TEST(checked > 30);
}

// ------------------------------------------------------------------------ construction

BOOST_AUTO_TEST_CASE(parameter_names_and_shapes_follow_pytorch) {
  using Names = std::map<std::string, Shape>;
  auto names_of = [](const MultiheadAttention& m) {
    Names n;
    for (const auto& [name, t] : m.state_dict()) n[name] = t.shape();
    return n;
  };
  MultiheadAttentionOptions o = small_options();
  BOOST_TEST((names_of(MultiheadAttention(o)) == Names{{"in_proj_weight", {24, 8}},
                                                       {"in_proj_bias", {24}},
                                                       {"out_proj.weight", {8, 8}},
                                                       {"out_proj.bias", {8}}}));
  BOOST_TEST(MultiheadAttention(o).packed_in_proj());
  o.bias = false;
  BOOST_TEST((names_of(MultiheadAttention(o)) ==
              Names{{"in_proj_weight", {24, 8}}, {"out_proj.weight", {8, 8}}}));
  o.add_bias_kv = true;  // bias_k / bias_v whatever `bias` is
  BOOST_TEST((names_of(MultiheadAttention(o)) == Names{{"in_proj_weight", {24, 8}},
                                                       {"out_proj.weight", {8, 8}},
                                                       {"bias_k", {1, 1, 8}},
                                                       {"bias_v", {1, 1, 8}}}));
  o = small_options();
  o.kdim = 5;
  o.vdim = 3;
  const MultiheadAttention sep(o);
  BOOST_TEST(!sep.packed_in_proj());
  BOOST_TEST((names_of(sep) == Names{{"q_proj_weight", {8, 8}},
                                     {"k_proj_weight", {8, 5}},
                                     {"v_proj_weight", {8, 3}},
                                     {"in_proj_bias", {24}},
                                     {"out_proj.weight", {8, 8}},
                                     {"out_proj.bias", {8}}}));
  BOOST_TEST(sep.parameters().count() == 64 + 40 + 24 + 24 + 64 + 8);
  o.kdim = 8;  // only vdim differs: still separate weights
  BOOST_TEST(!MultiheadAttention(o).packed_in_proj());
  o.vdim = 8;  // kdim == vdim == E given explicitly: packed
  BOOST_TEST(MultiheadAttention(o).packed_in_proj());
  BOOST_TEST(!MultiheadAttention(small_options()).training());  // modules start in eval mode
}

BOOST_AUTO_TEST_CASE(reset_parameters_follows_the_page) {
  MultiheadAttentionOptions o;
  o.embed_dim = 256;
  o.num_heads = 4;
  o.add_bias_kv = true;
  const MultiheadAttention a(o, 7), b(o, 7), c(o, 8);
  for (const auto& [name, t] : a.state_dict()) {
    BOOST_TEST(bitwise_equal(t, b.state_dict().at(name)), name << " differs for the same seed");
    if (name != "in_proj_bias" && name != "out_proj.bias")
      BOOST_TEST(!bitwise_equal(t, c.state_dict().at(name)), name << " same for another seed");
  }
  const auto s = a.state_dict();
  BOOST_TEST(max_abs(s.at("in_proj_bias")) == 0.0);
  BOOST_TEST(max_abs(s.at("out_proj.bias")) == 0.0);
  // Glorot-uniform over the packed [3E, E]: bound sqrt(6 / (E + 3E)) = 0.0765 at E = 256;
  // 196608 draws reach within 0.1% of it.
  const double glorot = std::sqrt(6.0 / (256 + 768));
  BOOST_TEST(max_abs(s.at("in_proj_weight")) <= glorot);
  BOOST_TEST(max_abs(s.at("in_proj_weight")) >= 0.999 * glorot);
  // Kaiming-uniform(a = sqrt(5)) = U(+-1/sqrt(E)) = 0.0625.
  BOOST_TEST(max_abs(s.at("out_proj.weight")) <= 1.0 / 16.0);
  BOOST_TEST(max_abs(s.at("out_proj.weight")) >= 0.99 / 16.0);
  // Glorot-normal on [1, 1, E]: std sqrt(2 / (E + E)) = 0.0625; 256 draws give the sample std
  // within 20% with probability > 0.999.
  for (const char* name : {"bias_k", "bias_v"}) {
    double ss = 0.0;
    for (double v : s.at(name).to_double_vector()) ss += v * v;
    const double std = std::sqrt(ss / 256.0);
    BOOST_TEST(std::abs(std - 0.0625) <= 0.2 * 0.0625, name << " std " << std);
  }
  // Separate projections: each its own Glorot bound, sqrt(6 / (kdim + E)) for k.
  o.kdim = 64;
  const auto sep = MultiheadAttention(o, 3).state_dict();
  BOOST_TEST(max_abs(sep.at("k_proj_weight")) <= std::sqrt(6.0 / (64 + 256)));
  BOOST_TEST(max_abs(sep.at("k_proj_weight")) >= 0.99 * std::sqrt(6.0 / (64 + 256)));
  BOOST_TEST(max_abs(sep.at("q_proj_weight")) <= std::sqrt(6.0 / 512));
  // reset_parameters after loading puts the zero biases back.
  MultiheadAttention m(small_options());
  Generator g(5);
  m.load_state_dict(random_state(m, g));
  BOOST_TEST(max_abs(m.state_dict().at("in_proj_bias")) > 0.0);
  m.reset_parameters(g);
  BOOST_TEST(max_abs(m.state_dict().at("in_proj_bias")) == 0.0);
  BOOST_TEST(max_abs(m.state_dict().at("out_proj.bias")) == 0.0);
}

BOOST_AUTO_TEST_CASE(repr_shows_geometry_and_non_defaults) {
  BOOST_TEST(MultiheadAttention(small_options()).repr() ==
             "MultiheadAttention(embed_dim=8, num_heads=2, bias=True, batch_first=False)");
  MultiheadAttentionOptions o = small_options();
  o.dropout = 0.1;
  o.bias = false;
  o.add_bias_kv = true;
  o.add_zero_attn = true;
  o.kdim = 5;
  o.vdim = 3;
  o.batch_first = true;
  BOOST_TEST(MultiheadAttention(o).repr() ==
             "MultiheadAttention(embed_dim=8, num_heads=2, dropout=0.1, bias=False, "
             "add_bias_kv=True, add_zero_attn=True, kdim=5, vdim=3, batch_first=True)");
  o = small_options();
  o.kdim = 8;  // equal to embed_dim: not a difference worth printing
  o.dropout = 1.0;
  o.dtype = DType::F16;
  BOOST_TEST(MultiheadAttention(o).repr() ==
             "MultiheadAttention(embed_dim=8, num_heads=2, dropout=1.0, bias=True, "
             "batch_first=False, dtype=float16)");
}

BOOST_AUTO_TEST_CASE(constructor_errors) {
  auto with = [](auto&& edit) {
    MultiheadAttentionOptions o = small_options();
    edit(o);
    return o;
  };
  using O = MultiheadAttentionOptions;
  expect_error(ErrorCode::Constraint,
               [&] { MultiheadAttention(with([](O& o) { o.embed_dim = 0; })); }, {"embed_dim=0"});
  expect_error(ErrorCode::Constraint,
               [&] { MultiheadAttention(with([](O& o) { o.embed_dim = -8; })); }, {"embed_dim=-8"});
  expect_error(ErrorCode::Constraint,
               [&] { MultiheadAttention(with([](O& o) { o.num_heads = 0; })); }, {"num_heads=0"});
  expect_error(ErrorCode::Constraint,
               [&] { MultiheadAttention(with([](O& o) { o.num_heads = 3; })); },
               {"num_heads=3 must divide embed_dim=8"});
  expect_error(ErrorCode::Constraint,
               [&] { MultiheadAttention(with([](O& o) { o.dropout = -0.1; })); }, {"dropout=-0.1"});
  expect_error(ErrorCode::Constraint,
               [&] { MultiheadAttention(with([](O& o) { o.dropout = 1.5; })); }, {"dropout=1.5"});
  expect_error(ErrorCode::Constraint,
               [&] { MultiheadAttention(with([](O& o) { o.dropout = std::nan(""); })); });
  expect_error(ErrorCode::Constraint, [&] { MultiheadAttention(with([](O& o) { o.kdim = 0; })); },
               {"kdim=0"});
  expect_error(ErrorCode::Constraint, [&] { MultiheadAttention(with([](O& o) { o.vdim = -2; })); },
               {"vdim=-2"});
  expect_error(ErrorCode::Unsupported,
               [&] { MultiheadAttention(with([](O& o) { o.device = "cuda"; })); }, {"cuda"});
  expect_error(ErrorCode::DType,
               [&] { MultiheadAttention(with([](O& o) { o.dtype = DType::I64; })); }, {"int64"});
  // The boundary values are legal.
  MultiheadAttention(with([](O& o) { o.dropout = 0.0; }));
  MultiheadAttention(with([](O& o) { o.dropout = 1.0; }));
  MultiheadAttention(with([](O& o) { o.num_heads = 8; }));
}

// ---------------------------------------------------------------------------- forward

BOOST_AUTO_TEST_CASE(training_mode_dropout_is_unsupported) {
  Generator g(11);
  const Tensor x = Tensor::randn({5, 2, 8}, g);
  MultiheadAttentionOptions o = small_options();
  o.dropout = 0.1;
  MultiheadAttention m(o);
  const Tensor eval_out = m.forward(x, {}, {}).output;  // eval mode: dropout not applied
  m.train();
  BOOST_TEST(m.training());
  expect_error(ErrorCode::Unsupported, [&] { m.forward(x, {}, {}); }, {"dropout=0.1", "training"});
  m.eval();
  BOOST_TEST(bitwise_equal(m.forward(x, {}, {}).output, eval_out));
  // Training with dropout = 0 has nothing to drop: served.
  MultiheadAttention z(small_options());
  const Tensor z_eval = z.forward(x, {}, {}).output;
  z.train(true);
  BOOST_TEST(bitwise_equal(z.forward(x, {}, {}).output, z_eval));
}

BOOST_AUTO_TEST_CASE(shape_errors_name_tensor_and_shapes) {
  Generator g(12);
  MultiheadAttentionOptions o = small_options();
  o.kdim = 6;
  o.vdim = 5;
  const MultiheadAttention m(o);
  const Tensor q = Tensor::randn({5, 2, 8}, g), k = Tensor::randn({7, 2, 6}, g),
               v = Tensor::randn({7, 2, 5}, g);
  auto fwd = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv, const Tensor& kpm = {},
                 const Tensor& am = {}) { m.forward(qq, kk, vv, kpm, true, am); };
  m.forward(q, k, v);  // the valid call the cases below break one way each
  expect_error(ErrorCode::Shape, [&] { fwd(Tensor::randn({8}, g), k, v); }, {"query [8]"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(Tensor::randn({1, 5, 2, 8}, g), k, v);
               },
               {"query [1, 5, 2, 8]"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(q, Tensor::randn({7, 6}, g), v);
               },
               {"key [7, 6]", "query [5, 2, 8]"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(q, k, Tensor::randn({7, 5}, g));
               },
               {"value [7, 5]", "query [5, 2, 8]"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(Tensor::randn({5, 2, 7}, g), k, v);
               },
               {"query [5, 2, 7]", "embed_dim=8"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(q, Tensor::randn({7, 2, 8}, g), v);
               },
               {"key [7, 2, 8]", "kdim=6"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(q, k, Tensor::randn({7, 2, 6}, g));
               },
               {"value [7, 2, 6]", "vdim=5"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(q, Tensor::randn({7, 3, 6}, g), Tensor::randn({7, 3, 5}, g));
               },
               {"key [7, 3, 6]", "query [5, 2, 8]"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(q, k, Tensor::randn({7, 3, 5}, g));
               },
               {"value [7, 3, 5]", "query [5, 2, 8]"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(q, k, Tensor::randn({6, 2, 5}, g));
               },
               {"value [6, 2, 5]", "key [7, 2, 6]"});
  // attn_mask: exact (L, S) or (N*H, L, S); broadcastable shapes are rejected, as PyTorch does.
  for (const Shape& bad : {Shape{1, 7}, Shape{5, 1}, Shape{5, 8}, Shape{7, 5}, Shape{2, 5, 7},
                           Shape{1, 5, 7}, Shape{4, 5, 8}, Shape{2, 2, 5, 7}, Shape{7}})
    expect_error(ErrorCode::Shape, [&] { fwd(q, k, v, {}, Tensor::zeros(bad, DType::Bool)); },
                 {"attn_mask " + shape_to_string(bad), "[5, 7]", "[4, 5, 7]"});
  for (const Shape& bad : {Shape{2, 8}, Shape{1, 7}, Shape{7}, Shape{2, 7, 1}, Shape{2, 6}})
    expect_error(ErrorCode::Shape, [&] { fwd(q, k, v, Tensor::zeros(bad, DType::Bool)); },
                 {"key_padding_mask " + shape_to_string(bad), "[2, 7]"});
  // Unbatched: kpm (S,), 3-D attn_mask (H, L, S).
  const Tensor uq = Tensor::randn({5, 8}, g), uk = Tensor::randn({7, 6}, g),
               uv = Tensor::randn({7, 5}, g);
  m.forward(uq, uk, uv, Tensor::zeros({7}, DType::Bool), true, Tensor::zeros({2, 5, 7}));
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(uq, uk, uv, Tensor::zeros({1, 7}, DType::Bool));
               },
               {"key_padding_mask [1, 7]", "[7]"});
  expect_error(ErrorCode::Shape,
               [&] {
                 fwd(uq, uk, uv, {}, Tensor::zeros({4, 5, 7}));
               },
               {"attn_mask [4, 5, 7]", "[2, 5, 7]"});
  expect_error(ErrorCode::Shape, [&] { fwd(uq, k, v); }, {"key [7, 2, 6]", "query [5, 8]"});
}

BOOST_AUTO_TEST_CASE(dtype_errors) {
  Generator g(13);
  const MultiheadAttention m(small_options());
  const Tensor q = Tensor::randn({5, 2, 8}, g);
  expect_error(ErrorCode::DType, [&] { m.forward(q.to(DType::I64), {}, {}); }, {"query", "int64"});
  expect_error(ErrorCode::DType, [&] { m.forward(q, q.to(DType::I32), q); }, {"key", "int32"});
  expect_error(ErrorCode::DType, [&] { m.forward(q, q, q.to(DType::Bool)); }, {"value", "bool"});
  for (DType bad : {DType::U8, DType::I64, DType::I32, DType::I8}) {
    expect_error(ErrorCode::DType,
                 [&] {
                   m.forward(q, {}, {}, {}, true, Tensor::zeros({5, 5}, bad));
                 },
                 {"attn_mask", dtype_name(bad)});
    expect_error(ErrorCode::DType,
                 [&] {
                   m.forward(q, {}, {}, Tensor::zeros({2, 5}, bad));
                 },
                 {"key_padding_mask", dtype_name(bad)});
  }
  expect_error(ErrorCode::Arg, [&] { m.forward(Tensor(), q, q); }, {"query"});
}

// F16/BF16/F64 inputs and masks are converted to float32 at entry: the result is that of the
// float32 tensor holding the converted values, bit for bit.
BOOST_AUTO_TEST_CASE(non_float32_inputs_and_masks_are_converted) {
  Generator g(14);
  MultiheadAttentionOptions o = small_options();
  o.kdim = 6;
  MultiheadAttention m(o);
  m.load_state_dict(random_state(m, g));
  const Tensor q = Tensor::randn({5, 2, 8}, g), k = Tensor::randn({7, 2, 6}, g),
               v = Tensor::randn({7, 2, 8}, g);
  const Tensor am = f64::random_mask({5, 7}, false, g), kpm = f64::random_mask({2, 7}, false, g);
  for (DType dt : {DType::F16, DType::BF16, DType::F64}) {
    BOOST_TEST_CONTEXT(dtype_name(dt)) {
      const Tensor q2 = q.to(dt), k2 = k.to(dt), v2 = v.to(dt);
      const Tensor am2 = am.to(dt), kpm2 = kpm.to(dt);
      const auto a = m.forward(q2, k2, v2, kpm2, true, am2);
      const auto b = m.forward(q2.to(DType::F32), k2.to(DType::F32), v2.to(DType::F32),
                               kpm2.to(DType::F32), true, am2.to(DType::F32));
      BOOST_TEST((a.output.dtype() == DType::F32));
      BOOST_TEST(bitwise_equal(a.output, b.output));
      BOOST_TEST(bitwise_equal(a.weights, b.weights));
    }
  }
}

BOOST_AUTO_TEST_CASE(is_causal_is_a_hint_when_attn_mask_is_given) {
  Generator g(15);
  MultiheadAttention m(small_options());
  m.load_state_dict(random_state(m, g));
  const Tensor x = Tensor::randn({5, 2, 8}, g);
  const Tensor am = f64::random_mask({5, 5}, false, g);
  const auto hinted = m.forward(x, {}, {}, {}, true, am, true, true);
  const auto plain = m.forward(x, {}, {}, {}, true, am, true, false);
  BOOST_TEST(bitwise_equal(hinted.output, plain.output));
  BOOST_TEST(bitwise_equal(hinted.weights, plain.weights));
  // Without a mask it is the causal mask: weights above the diagonal are exactly zero.
  const auto causal = m.forward(x, {}, {}, {}, true, {}, false, true);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t l = 0; l < 5; ++l)
        for (int64_t s = 0; s < 5; ++s)
          if (s > l) BOOST_TEST(causal.weights.item({n, h, l, s}) == 0.0);
}

// Masks are given for the S real keys (PyTorch); an S'-wide mask (the page's notation) is also
// accepted and then covers the appended positions too.
BOOST_AUTO_TEST_CASE(masks_for_appended_positions) {
  Generator g(16);
  MultiheadAttentionOptions o = small_options();
  o.add_bias_kv = true;
  o.add_zero_attn = true;
  MultiheadAttention m(o);
  m.load_state_dict(random_state(m, g));
  const Tensor q = Tensor::randn({4, 2, 8}, g), kv = Tensor::randn({5, 2, 8}, g);
  const Tensor narrow = f64::random_mask({4, 5}, false, g);
  Tensor wide = Tensor::zeros({4, 7});
  wide.narrow(1, 0, 5).copy_from(narrow);
  const auto a = m.forward(q, kv, kv, {}, true, narrow);
  const auto b = m.forward(q, kv, kv, {}, true, wide);
  BOOST_TEST(bitwise_equal(a.output, b.output));
  BOOST_TEST(a.weights.shape_str() == "[2, 4, 7]");
  // Masking the bias_k position (column 5) through a wide mask.
  for (int64_t l = 0; l < 4; ++l) wide.set_item({l, 5}, -kInf);
  const auto c = m.forward(q, kv, kv, {}, true, wide, false);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t l = 0; l < 4; ++l) BOOST_TEST(c.weights.item({n, 0, l, 5}) == 0.0);
  const f64::MhaReference ref = reference_forward(m, q, kv, kv, {}, wide, false);
  BOOST_TEST(rel_frobenius(c.output.to_double_vector(), ref.out) <= kFloat64Tolerance);
  BOOST_TEST(rel_frobenius(c.weights.to_double_vector(), ref.weights) <= kFloat64Tolerance);
  // The key_padding_mask is (N, S) only.
  expect_error(ErrorCode::Shape,
               [&] {
                 m.forward(q, kv, kv, Tensor::zeros({2, 7}, DType::Bool));
               },
               {"key_padding_mask [2, 7]", "[2, 5]"});
}

BOOST_AUTO_TEST_CASE(fully_masked_rows_give_out_proj_bias) {
  Generator g(17);
  MultiheadAttention m(small_options());
  m.load_state_dict(random_state(m, g));
  const Tensor x = Tensor::randn({5, 2, 8}, g);
  Tensor kpm = Tensor::zeros({2, 5}, DType::Bool);
  for (int64_t s = 0; s < 5; ++s) kpm.set_item({1, s}, 1.0);  // batch 1: every key padded
  const auto r = m.forward(x, {}, {}, kpm, true, {}, false);
  const Tensor bias = m.state_dict().at("out_proj.bias");
  for (int64_t l = 0; l < 5; ++l) {
    for (int64_t e = 0; e < 8; ++e) BOOST_TEST(r.output.item({l, 1, e}) == bias.item({e}));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t s = 0; s < 5; ++s) BOOST_TEST(r.weights.item({1, h, l, s}) == 0.0);
  }
  // S = 0 with nothing appended: every query attends to nothing.
  const auto empty = m.forward(x, Tensor::zeros({0, 2, 8}), Tensor::zeros({0, 2, 8}));
  BOOST_TEST(empty.weights.shape_str() == "[2, 5, 0]");
  for (int64_t e = 0; e < 8; ++e) BOOST_TEST(empty.output.item({3, 0, e}) == bias.item({e}));
  // L = 0 and N = 0 give empty outputs.
  BOOST_TEST(m.forward(Tensor::zeros({0, 2, 8}), x, x).output.shape_str() == "[0, 2, 8]");
  BOOST_TEST(m.forward(Tensor::zeros({5, 0, 8}), {}, {}).weights.shape_str() == "[0, 5, 5]");
}

// ---------------------------------------------------------------------------- weights

BOOST_AUTO_TEST_CASE(strict_loading_names_every_problem_at_once) {
  MultiheadAttention m(small_options(), 1);
  const auto before = m.state_dict();
  auto state = MultiheadAttention(small_options(), 2).state_dict();
  state.erase("in_proj_bias");
  state["extra.weight"] = Tensor::zeros({3});
  state["out_proj.weight"] = Tensor::zeros({8, 9});
  expect_error(ErrorCode::Weights, [&] { m.load_state_dict(state, true); },
               {"missing: in_proj_bias", "unexpected: extra.weight",
                "out_proj.weight (expected [8, 8], got [8, 9])"});
  for (const auto& [name, t] : m.state_dict())
    BOOST_TEST(bitwise_equal(t, before.at(name)), name << " changed by a failed load");
  // Non-strict: missing and unexpected are returned, mis-shaped is still an error.
  expect_error(ErrorCode::Weights, [&] { m.load_state_dict(state, false); },
               {"out_proj.weight (expected [8, 8], got [8, 9])"});
  state["out_proj.weight"] = Tensor::zeros({8, 8});
  const LoadResult r = m.load_state_dict(state, false);
  BOOST_TEST((r.missing == std::vector<std::string>{"in_proj_bias"}));
  BOOST_TEST((r.unexpected == std::vector<std::string>{"extra.weight"}));
  BOOST_TEST(max_abs(m.state_dict().at("out_proj.weight")) == 0.0);
  BOOST_TEST(bitwise_equal(m.state_dict().at("in_proj_bias"), before.at("in_proj_bias")));
  // A non-float stored weight is refused.
  auto ints = MultiheadAttention(small_options()).state_dict();
  ints["in_proj_bias"] = Tensor::zeros({24}, DType::I64);
  expect_error(ErrorCode::Weights, [&] { m.load_state_dict(ints); }, {"in_proj_bias"});
}

BOOST_AUTO_TEST_CASE(stored_and_parameter_dtypes_are_converted) {
  Generator g(18);
  MultiheadAttentionOptions o = small_options();
  o.add_bias_kv = true;
  o.vdim = 6;
  MultiheadAttention shape_only(o);
  const auto state = random_state(shape_only, g);
  const Tensor q = Tensor::randn({5, 2, 8}, g), k = Tensor::randn({6, 2, 8}, g),
               v = Tensor::randn({6, 2, 6}, g);
  for (DType dt : {DType::F16, DType::BF16, DType::F64}) {
    BOOST_TEST_CONTEXT(dtype_name(dt)) {
      std::map<std::string, Tensor> stored, rounded;
      for (const auto& [name, t] : state) {
        stored[name] = t.to(dt);
        rounded[name] = t.to(dt).to(DType::F32);
      }
      // Stored F16/BF16/F64 into a float32 module == the float32 values they round to.
      MultiheadAttention a(o), b(o);
      a.load_state_dict(stored);
      b.load_state_dict(rounded);
      for (const auto& [name, t] : a.state_dict()) BOOST_TEST((t.dtype() == DType::F32));
      const auto ra = a.forward(q, k, v), rb = b.forward(q, k, v);
      BOOST_TEST(bitwise_equal(ra.output, rb.output));
      BOOST_TEST(bitwise_equal(ra.weights, rb.weights));
      // A module whose parameters live in `dt` computes in float32 from the same values.
      MultiheadAttentionOptions od = o;
      od.dtype = dt;
      MultiheadAttention c(od);
      c.load_state_dict(stored);
      for (const auto& [name, t] : c.state_dict()) BOOST_TEST((t.dtype() == dt));
      const auto rc = c.forward(q, k, v);
      BOOST_TEST((rc.output.dtype() == DType::F32));
      BOOST_TEST(bitwise_equal(rc.output, rb.output));
    }
  }
}

// ------------------------------------------------------------------------- concurrency

BOOST_AUTO_TEST_CASE(concurrent_forward_is_identical) {
  Generator g(19);
  MultiheadAttentionOptions o;
  o.embed_dim = 64;
  o.num_heads = 4;
  o.add_bias_kv = true;
  MultiheadAttention m(o);
  m.load_state_dict(random_state(m, g));
  const Tensor x = Tensor::randn({48, 2, 64}, g);
  const Tensor kpm = f64::random_mask({2, 48}, true, g), am = f64::random_mask({48, 48}, false, g);
  const MultiheadAttentionOutput base = m.forward(x, {}, {}, kpm, true, am, false);
  std::atomic<int> mismatches{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      try {
        for (int i = 0; i < 8; ++i) {
          const MultiheadAttentionOutput r = m.forward(x, {}, {}, kpm, true, am, false);
          if (!bitwise_equal(r.output, base.output) || !bitwise_equal(r.weights, base.weights))
            ++mismatches;
        }
      } catch (...) {
        ++failures;
      }
    });
  for (auto& t : threads) t.join();
  BOOST_TEST(mismatches.load() == 0);
  BOOST_TEST(failures.load() == 0);
}

BOOST_AUTO_TEST_SUITE_END()
