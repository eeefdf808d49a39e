#include "tests/reference.h"

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>

namespace tessera::f64 {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// x as [N][T][C] whatever its layout: a batched sequence-first input is (T, N, C).
std::vector<double> batch_major(const Tensor& x, bool sequence_first) {
  std::vector<double> v = x.to_double_vector();
  if (!sequence_first) return v;
  const int64_t T = x.size(0), N = x.size(1), C = x.size(2);
  std::vector<double> r(v.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) r[(n * T + t) * C + c] = v[(t * N + n) * C + c];
  return r;
}

// An entry of mask `m` as the additive value it stands for: bool true = -inf (masked), a float
// as given.
double mask_value(const Tensor& m, double x) {
  return m.dtype() == DType::Bool ? (x != 0 ? -kInf : 0.0) : x;
}

}  // namespace

std::vector<double> param(const std::map<std::string, Tensor>& params, const std::string& name) {
  const auto it = params.find(name);
  return it == params.end() ? std::vector<double>() : it->second.to_double_vector();
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t i = s.size(); i-- > 0;) {
    idx[i] = flat % s[i];
    flat /= s[i];
  }
  return idx;
}

std::map<std::string, Tensor> random_parameters(
    const std::vector<std::pair<std::string, Shape>>& shapes, Generator& gen) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, shape] : shapes) {
    if (shape.size() == 2) {
      const double bound = std::sqrt(3.0 / static_cast<double>(shape[1]));
      state[name] = Tensor::rand(shape, gen, -bound, bound);
    } else {
      state[name] = Tensor::randn(shape, gen, 0.0, 0.5);
    }
  }
  return state;
}

Tensor random_mask(const Shape& shape, bool is_bool, Generator& gen) {
  Tensor m = Tensor::empty(shape, is_bool ? DType::Bool : DType::F32);
  const int64_t n = m.numel();
  if (is_bool) {
    auto* p = static_cast<uint8_t*>(m.raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = gen.uniform() < 0.3 ? 1 : 0;
  } else {
    float* p = m.data<float>();
    for (int64_t i = 0; i < n; ++i)
      p[i] = gen.uniform() < 0.2 ? -std::numeric_limits<float>::infinity()
                                 : static_cast<float>(gen.normal());
  }
  return m;
}

std::vector<double> linear(const std::vector<double>& x, int64_t rows, int64_t in,
                           const std::vector<double>& w, int64_t out,
                           const std::vector<double>& b) {
  BOOST_REQUIRE_EQUAL(x.size(), static_cast<size_t>(rows * in));
  BOOST_REQUIRE_EQUAL(w.size(), static_cast<size_t>(out * in));
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t c = 0; c < in; ++c) s += x[r * in + c] * w[o * in + c];
      y[r * out + o] = s;
    }
  return y;
}

std::vector<double> layer_norm(const std::vector<double>& x, int64_t rows, int64_t D,
                               const std::vector<double>& gamma, const std::vector<double>& beta,
                               double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * D;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < D; ++j) mean += row[j];
    mean /= static_cast<double>(D);
    for (int64_t j = 0; j < D; ++j) var += (row[j] - mean) * (row[j] - mean);
    var /= static_cast<double>(D);
    for (int64_t j = 0; j < D; ++j) {
      const double n = (row[j] - mean) / std::sqrt(var + eps);
      y[r * D + j] = gamma.empty() ? n : n * gamma[j] + beta[j];
    }
  }
  return y;
}

int64_t Conv2dGeometry::out_h() const {
  return (height + pad_top + pad_bottom - dilation_h * (kernel_h - 1) - 1) / stride_h + 1;
}

int64_t Conv2dGeometry::out_w() const {
  return (width + pad_left + pad_right - dilation_w * (kernel_w - 1) - 1) / stride_w + 1;
}

std::vector<double> conv2d(const Conv2dGeometry& g, const std::vector<double>& x,
                           const std::vector<double>& w, const std::vector<double>& b) {
  const int64_t N = g.batch, C = g.channels, H = g.height, W = g.width, O = g.out_channels;
  const int64_t kh = g.kernel_h, kw = g.kernel_w, OH = g.out_h(), OW = g.out_w();
  const int64_t cg = C / g.groups, og = O / g.groups;
  BOOST_REQUIRE_EQUAL(x.size(), static_cast<size_t>(N * C * H * W));
  BOOST_REQUIRE_EQUAL(w.size(), static_cast<size_t>(O * cg * kh * kw));
  BOOST_REQUIRE(b.empty() || b.size() == static_cast<size_t>(O));
  std::vector<double> y(static_cast<size_t>(N * O * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox) {
          double s = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
          const int64_t c0 = o / og * cg;  // the group's first input channel
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = oy * g.stride_h - g.pad_top + i * g.dilation_h;
                const int64_t ix = ox * g.stride_w - g.pad_left + j * g.dilation_w;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                s += x[static_cast<size_t>(((n * C + c0 + c) * H + iy) * W + ix)] *
                     w[static_cast<size_t>(((o * cg + c) * kh + i) * kw + j)];
              }
          y[static_cast<size_t>(((n * O + o) * OH + oy) * OW + ox)] = s;
        }
  return y;
}

std::vector<double> mean(const std::vector<double>& x, const Shape& s,
                         const std::vector<bool>& reduced) {
  Shape kept;
  for (size_t i = 0; i < s.size(); ++i)
    if (!reduced[i]) kept.push_back(s[i]);
  std::vector<double> sum(static_cast<size_t>(shape_numel(kept)), 0.0);
  std::vector<double> count(sum.size(), 0.0);
  const std::vector<int64_t> kst = strides_of(kept);
  for (int64_t f = 0; f < shape_numel(s); ++f) {
    const std::vector<int64_t> idx = unravel(f, s);
    int64_t o = 0;
    for (size_t i = 0, k = 0; i < s.size(); ++i)
      if (!reduced[i]) o += idx[i] * kst[k++];
    sum[static_cast<size_t>(o)] += x[static_cast<size_t>(f)];
    count[static_cast<size_t>(o)] += 1.0;
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i] /= count[i];  // 0/0 = NaN when empty
  return sum;
}

std::vector<double> adaptive_avg_pool2d(const std::vector<double>& x, const Shape& s, int64_t oh,
                                        int64_t ow) {
  const int64_t H = s[s.size() - 2], W = s.back();
  const int64_t planes = H * W == 0 ? 0 : static_cast<int64_t>(x.size()) / (H * W);
  std::vector<double> y(static_cast<size_t>(planes * oh * ow));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t y0 = i * H / oh, y1 = ((i + 1) * H + oh - 1) / oh;
        const int64_t x0 = j * W / ow, x1 = ((j + 1) * W + ow - 1) / ow;
        double sum = 0.0;
        for (int64_t r = y0; r < y1; ++r)
          for (int64_t c = x0; c < x1; ++c) sum += x[static_cast<size_t>((p * H + r) * W + c)];
        y[static_cast<size_t>((p * oh + i) * ow + j)] =
            sum / static_cast<double>((y1 - y0) * (x1 - x0));
      }
  return y;
}

double gelu(double x, bool tanh_form) {
  if (tanh_form) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

Shape broadcast_shape(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    // Dim i counted from the end; a missing dim is 1.
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    BOOST_REQUIRE(x == y || x == 1 || y == 1);
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

std::vector<double> add(const std::vector<double>& a, const Shape& sa, const std::vector<double>& b,
                        const Shape& sb) {
  return binary(a, sa, b, sb, [](double x, double y) { return x + y; });
}

std::vector<double> binary(const std::vector<double>& a, const Shape& sa,
                           const std::vector<double>& b, const Shape& sb,
                           double (*op)(double, double)) {
  const Shape so = broadcast_shape(sa, sb);
  std::vector<double> y(static_cast<size_t>(shape_numel(so)));
  // Each output index read from a and b with their size-1 dims pinned to 0.
  auto read = [&](const std::vector<int64_t>& idx, const Shape& s, const std::vector<double>& v) {
    const std::vector<int64_t> st = strides_of(s);
    int64_t off = 0;
    for (size_t k = 0; k < s.size(); ++k)
      off += (s[k] == 1 ? 0 : idx[k + so.size() - s.size()]) * st[k];
    return v[static_cast<size_t>(off)];
  };
  for (int64_t f = 0; f < shape_numel(so); ++f) {
    const std::vector<int64_t> idx = unravel(f, so);
    y[static_cast<size_t>(f)] = op(read(idx, sa, a), read(idx, sb, b));
  }
  return y;
}

std::vector<double> softmax(const std::vector<double>& x, const Shape& s, int64_t dim) {
  if (s.empty()) {  // one element: weight 1 (NaN for -inf, +inf or NaN, as x - max is NaN)
    BOOST_REQUIRE(dim == 0 || dim == -1);
    return {std::isfinite(x[0]) ? 1.0 : std::nan("")};
  }
  const auto rank = static_cast<int64_t>(s.size());
  BOOST_REQUIRE(dim >= -rank && dim < rank);
  const auto d = static_cast<size_t>(dim < 0 ? dim + rank : dim);
  const int64_t step = strides_of(s)[d], len = s[d];
  std::vector<double> y(x.size());
  for (int64_t f = 0; f < static_cast<int64_t>(x.size()); ++f) {
    if (unravel(f, s)[d] != 0) continue;  // f starts a slice along d
    double mx = -kInf;
    for (int64_t i = 0; i < len; ++i) mx = std::max(mx, x[static_cast<size_t>(f + i * step)]);
    double sum = 0.0;
    for (int64_t i = 0; i < len; ++i) sum += std::exp(x[static_cast<size_t>(f + i * step)] - mx);
    for (int64_t i = 0; i < len; ++i) {
      const auto at = static_cast<size_t>(f + i * step);
      y[at] = mx == -kInf ? std::nan("") : std::exp(x[at] - mx) / sum;
    }
  }
  return y;
}

std::pair<Shape, std::vector<double>> matmul(const std::vector<double>& a, const Shape& sa,
                                             const std::vector<double>& b, const Shape& sb) {
  BOOST_REQUIRE(!sa.empty() && !sb.empty());
  // Promote to matrices, then remember which added dims to drop.
  const Shape ma = sa.size() == 1 ? Shape{1, sa[0]} : sa;
  const Shape mb = sb.size() == 1 ? Shape{sb[0], 1} : sb;
  const int64_t M = ma[ma.size() - 2], K = ma.back(), N = mb.back();
  BOOST_REQUIRE(mb[mb.size() - 2] == K);
  const Shape batch_a(ma.begin(), ma.end() - 2), batch_b(mb.begin(), mb.end() - 2);
  const Shape batch = broadcast_shape(batch_a, batch_b);
  Shape full = batch;
  full.push_back(M);
  full.push_back(N);
  std::vector<double> y(static_cast<size_t>(shape_numel(full)), 0.0);
  // Element (batch idx, i, j) = sum_p a[idx', i, p] b[idx'', p, j], idx' and idx'' the batch
  // index with each operand's size-1 (or missing) dims pinned to 0.
  auto offset = [&](const std::vector<int64_t>& idx, const Shape& s) {
    const std::vector<int64_t> st = strides_of(s);
    int64_t off = 0;
    const size_t skip = batch.size() + 2 - s.size();
    for (size_t k = 0; k + 2 < s.size(); ++k) off += (s[k] == 1 ? 0 : idx[k + skip]) * st[k];
    return off;
  };
  for (int64_t f = 0; f < static_cast<int64_t>(y.size()); ++f) {
    const std::vector<int64_t> idx = unravel(f, full);
    const int64_t i = idx[idx.size() - 2], j = idx.back();
    const int64_t oa = offset(idx, ma), ob = offset(idx, mb);
    double acc = 0.0;
    for (int64_t p = 0; p < K; ++p)
      acc += a[static_cast<size_t>(oa + i * K + p)] * b[static_cast<size_t>(ob + p * N + j)];
    y[static_cast<size_t>(f)] = acc;
  }
  Shape out = batch;
  if (sa.size() > 1) out.push_back(M);
  if (sb.size() > 1) out.push_back(N);
  return {out, y};
}


namespace {

// The element of row-major x (shape s) at idx.
double at(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& idx) {
  const std::vector<int64_t> st = strides_of(s);
  int64_t off = 0;
  for (size_t k = 0; k < s.size(); ++k) off += idx[k] * st[k];
  return x[static_cast<size_t>(off)];
}

// out of shape `out`, each element x at source(out index), or `fill` where source says so
// (returns false).
template <class Source>
std::vector<double> gather(const std::vector<double>& x, const Shape& s, const Shape& out,
                           double fill, Source source) {
  std::vector<double> y;
  for (int64_t f = 0; f < shape_numel(out); ++f) {
    std::vector<int64_t> j(s.size());
    y.push_back(source(unravel(f, out), j) ? at(x, s, j) : fill);
  }
  return y;
}

}  // namespace

Layout permute(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& dims) {
  Shape out;
  for (int64_t d : dims) out.push_back(s[static_cast<size_t>(d)]);
  return {out, gather(x, s, out, 0.0, [&](const std::vector<int64_t>& i, std::vector<int64_t>& j) {
            for (size_t k = 0; k < dims.size(); ++k) j[static_cast<size_t>(dims[k])] = i[k];
            return true;
          })};
}

Layout slice(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& dims,
             const std::vector<int64_t>& starts, const std::vector<int64_t>& stops,
             const std::vector<int64_t>& steps) {
  // Per dim, the source index of each output index: Python's range(*slice.indices(n)).
  std::vector<std::vector<int64_t>> picks(s.size());
  for (size_t k = 0; k < s.size(); ++k)
    for (int64_t i = 0; i < s[k]; ++i) picks[k].push_back(i);
  for (size_t d = 0; d < dims.size(); ++d) {
    const int64_t n = s[static_cast<size_t>(dims[d])];
    auto clamp = [n](int64_t v) {
      if (v < 0) v += n;
      return std::min(std::max<int64_t>(v, 0), n);
    };
    const int64_t lo = clamp(starts[d]);
    const int64_t hi = stops[d] == kNoStop ? n : clamp(stops[d]);
    std::vector<int64_t>& p = picks[static_cast<size_t>(dims[d])];
    p.clear();
    for (int64_t i = lo; i < hi; i += steps[d]) p.push_back(i);
  }
  Shape out;
  for (const auto& p : picks) out.push_back(static_cast<int64_t>(p.size()));
  return {out, gather(x, s, out, 0.0, [&](const std::vector<int64_t>& i, std::vector<int64_t>& j) {
            for (size_t k = 0; k < s.size(); ++k) j[k] = picks[k][static_cast<size_t>(i[k])];
            return true;
          })};
}

Layout select(const std::vector<double>& x, const Shape& s, int64_t dim, int64_t index) {
  const auto d = static_cast<size_t>(dim);
  if (index < 0) index += s[d];
  Shape out = s;
  out.erase(out.begin() + dim);
  return {out, gather(x, s, out, 0.0, [&](const std::vector<int64_t>& i, std::vector<int64_t>& j) {
            for (size_t k = 0, m = 0; k < s.size(); ++k) j[k] = k == d ? index : i[m++];
            return true;
          })};
}

std::vector<double> roll(const std::vector<double>& x, const Shape& s,
                         const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims) {
  // Scattered: each source element to its destination.
  std::vector<double> y(x.size());
  const auto n = static_cast<int64_t>(x.size());
  auto mod = [](int64_t a, int64_t m) { return ((a % m) + m) % m; };
  for (int64_t f = 0; f < n; ++f) {
    if (dims.empty()) {
      y[static_cast<size_t>(mod(f + mod(shifts[0], n), n))] = x[static_cast<size_t>(f)];
      continue;
    }
    std::vector<int64_t> i = unravel(f, s);
    for (size_t k = 0; k < dims.size(); ++k) {
      const int64_t m = s[static_cast<size_t>(dims[k])];
      int64_t& v = i[static_cast<size_t>(dims[k])];
      v = mod(v + mod(shifts[k], m), m);
    }
    const std::vector<int64_t> st = strides_of(s);
    int64_t off = 0;
    for (size_t k = 0; k < s.size(); ++k) off += i[k] * st[k];
    y[static_cast<size_t>(off)] = x[static_cast<size_t>(f)];
  }
  return y;
}

Layout pad(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& pads,
           double value) {
  std::vector<int64_t> lo(s.size(), 0);
  Shape out = s;
  for (size_t p = 0; p < pads.size() / 2; ++p) {
    const size_t k = s.size() - 1 - p;
    lo[k] = pads[2 * p];
    out[k] += pads[2 * p] + pads[2 * p + 1];
  }
  return {out,
          gather(x, s, out, value, [&](const std::vector<int64_t>& i, std::vector<int64_t>& j) {
            for (size_t k = 0; k < s.size(); ++k) {
              j[k] = i[k] - lo[k];
              if (j[k] < 0 || j[k] >= s[k]) return false;
            }
            return true;
          })};
}

std::vector<double> expand(const std::vector<double>& x, const Shape& s, const Shape& out) {
  const size_t lead = out.size() - s.size();
  return gather(x, s, out, 0.0, [&](const std::vector<int64_t>& i, std::vector<int64_t>& j) {
    for (size_t k = 0; k < s.size(); ++k) j[k] = s[k] == 1 ? 0 : i[k + lead];
    return true;
  });
}

void attention_head(int64_t L, int64_t S, int64_t D, int64_t Dv, double scale, const double* q,
                    int64_t ldq, const double* k, int64_t ldk, const double* v, int64_t ldv,
                    const double* mask, double* weights, double* out, int64_t ldo) {
  std::vector<double> p(static_cast<size_t>(S));
  for (int64_t l = 0; l < L; ++l) {
    double mx = -kInf;
    for (int64_t s = 0; s < S; ++s) {
      double dot = 0.0;
      for (int64_t d = 0; d < D; ++d) dot += q[l * ldq + d] * k[s * ldk + d];
      p[s] = dot * scale + (mask ? mask[l * S + s] : 0.0);
      mx = std::max(mx, p[s]);
    }
    if (mx == -kInf) {  // every key masked (or S == 0)
      std::fill(p.begin(), p.end(), 0.0);
    } else {
      double sum = 0.0;
      for (int64_t s = 0; s < S; ++s) sum += std::exp(p[s] - mx);
      for (int64_t s = 0; s < S; ++s) p[s] = std::exp(p[s] - mx) / sum;
    }
    if (weights) std::copy(p.begin(), p.end(), weights + l * S);
    for (int64_t d = 0; d < Dv; ++d) {
      double acc = 0.0;
      for (int64_t s = 0; s < S; ++s) acc += p[s] * v[s * ldv + d];
      out[l * ldo + d] = acc;
    }
  }
}

std::vector<double> attention(const AttentionOptions& o,
                              const std::map<std::string, Tensor>& params, const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2), H = o.heads, hd = D / H;
  auto weight = [&](const std::string& name) {
    BOOST_REQUIRE_MESSAGE(params.count(name), "attention has no parameter " << name);
    return param(params, name);
  };
  // The spec: q/k/v carry a bias when bias and qkv_bias, o_proj when bias and out_bias.
  auto bias = [&](const std::string& name, bool wanted) {
    BOOST_TEST(params.count(name) == (wanted ? 1u : 0u),
               name << (wanted ? " missing" : " unwanted"));
    return param(params, name);
  };
  const bool qkv_bias = o.bias && o.qkv_bias, out_bias = o.bias && o.out_bias;
  const std::vector<double> xv = x.to_double_vector();
  std::vector<double> q =
      linear(xv, B * T, D, weight("q_proj.weight"), D, bias("q_proj.bias", qkv_bias));
  std::vector<double> k =
      linear(xv, B * T, D, weight("k_proj.weight"), D, bias("k_proj.bias", qkv_bias));
  const std::vector<double> v =
      linear(xv, B * T, D, weight("v_proj.weight"), D, bias("v_proj.bias", qkv_bias));

  if (o.rope) {
    // Rotate-half over each head: [a, b] -> [a cos - b sin, b cos + a sin], angle = t * theta_i.
    // The angles are built in float32 (the spec, interfaces.md §2): theta_i rounded to float,
    // then one float multiply; cos and sin of that float angle in double.
    const int64_t half = hd / 2;
    for (std::vector<double>* m : {&q, &k})
      for (int64_t bt = 0; bt < B * T; ++bt)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const auto theta =
                static_cast<float>(std::pow(10000.0, -2.0 * i / static_cast<double>(hd)));
            const float angle = static_cast<float>(bt % T) * theta;
            double& a = (*m)[bt * D + h * hd + i];
            double& b = (*m)[bt * D + h * hd + i + half];
            const double c = std::cos(static_cast<double>(angle)),
                         s = std::sin(static_cast<double>(angle));
            const double a0 = a;
            a = a0 * c - b * s;
            b = b * c + a0 * s;
          }
  }

  // Additive [H][T][T]: the relative-position bias (the spec's row/col offsets on the row-major
  // grid), then the causal -inf.
  std::vector<double> mask(static_cast<size_t>(H * T * T), 0.0);
  if (o.relative_position_bias) {
    const int64_t gh = o.spatial_h, gw = o.spatial_w;
    const std::vector<double> table = weight("relative_position_bias_table");
    BOOST_REQUIRE_EQUAL(table.size(), static_cast<size_t>((2 * gh - 1) * (2 * gw - 1) * H));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) {
          const int64_t dy = i / gw - j / gw + (gh - 1), dx = i % gw - j % gw + (gw - 1);
          mask[(h * T + i) * T + j] += table[(dy * (2 * gw - 1) + dx) * H + h];
        }
  }
  if (o.causal)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = i + 1; j < T; ++j) mask[(h * T + i) * T + j] = -kInf;

  std::vector<double> attn(static_cast<size_t>(B * T * D));
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t at = b * T * D + h * hd;
      attention_head(T, T, hd, hd, scale, q.data() + at, D, k.data() + at, D, v.data() + at, D,
                     mask.data() + h * T * T, nullptr, attn.data() + at, D);
    }
  return linear(attn, B * T, D, weight("o_proj.weight"), D, bias("o_proj.bias", out_bias));
}

std::vector<double> MhaReference::returned_weights(bool average) const {
  if (!average) return weights;
  std::vector<double> avg(static_cast<size_t>(N * L * Sp), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L * Sp; ++i) avg[n * L * Sp + i] += weights[(n * H + h) * L * Sp + i];
  for (double& v : avg) v /= static_cast<double>(H);
  return avg;
}

MhaReference multihead_attention(const MultiheadAttentionOptions& o,
                                 const std::map<std::string, Tensor>& params, const Tensor& query,
                                 const Tensor& key_in, const Tensor& value_in, const Tensor& kpm,
                                 const Tensor& attn_mask, bool is_causal) {
  const Tensor& key = key_in.defined() ? key_in : query;
  const Tensor& value = value_in.defined() ? value_in : key;
  const int64_t E = o.embed_dim, H = o.num_heads, D = E / H;
  const bool batched = query.dim() == 3, bf = batched && o.batch_first;
  const int64_t L = query.size(bf ? 1 : 0), S = key.size(bf ? 1 : 0);
  const int64_t N = batched ? query.size(bf ? 0 : 1) : 1;
  const int64_t kd = key.size(-1), vd = value.size(-1);
  const int64_t Sp = S + (o.add_bias_kv ? 1 : 0) + (o.add_zero_attn ? 1 : 0);

  std::vector<double> wq, wk, wv;
  if (params.count("in_proj_weight")) {
    const std::vector<double> w = param(params, "in_proj_weight");
    wq.assign(w.begin(), w.begin() + E * E);
    wk.assign(w.begin() + E * E, w.begin() + 2 * E * E);
    wv.assign(w.begin() + 2 * E * E, w.end());
  } else {
    wq = param(params, "q_proj_weight");
    wk = param(params, "k_proj_weight");
    wv = param(params, "v_proj_weight");
  }
  const std::vector<double> b_in = param(params, "in_proj_bias");
  auto bias_part = [&](int64_t i) {
    return b_in.empty() ? b_in
                        : std::vector<double>(b_in.begin() + i * E, b_in.begin() + (i + 1) * E);
  };

  // Projections, [N][T][E]; appended key/value positions: bias then zero.
  const bool seq_first = batched && !bf;
  const std::vector<double> q =
      linear(batch_major(query, seq_first), N * L, E, wq, E, bias_part(0));
  const std::vector<double> k_real =
      linear(batch_major(key, seq_first), N * S, kd, wk, E, bias_part(1));
  const std::vector<double> v_real =
      linear(batch_major(value, seq_first), N * S, vd, wv, E, bias_part(2));
  std::vector<double> k(static_cast<size_t>(N * Sp * E), 0.0), v(k.size(), 0.0);
  const std::vector<double> bias_k = param(params, "bias_k"), bias_v = param(params, "bias_v");
  for (int64_t n = 0; n < N; ++n) {
    // Pointer arithmetic, not &v[i]: with S = 0 (or N = 0) the vectors are empty, and
    // operator[] on an empty vector is undefined (UBSan).
    std::copy_n(k_real.data() + n * S * E, S * E, k.data() + n * Sp * E);
    std::copy_n(v_real.data() + n * S * E, S * E, v.data() + n * Sp * E);
    if (o.add_bias_kv) {
      std::copy(bias_k.begin(), bias_k.end(), k.data() + (n * Sp + S) * E);
      std::copy(bias_v.begin(), bias_v.end(), v.data() + (n * Sp + S) * E);
    }
  }

  // Additive mask [N][H][L][S']; the user's masks cover their own width (S, or S').
  std::vector<double> mask(static_cast<size_t>(N * H * L * Sp), 0.0);
  if (attn_mask.defined()) {
    const std::vector<double> am = attn_mask.to_double_vector();
    const int64_t C = attn_mask.size(-1);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t s = 0; s < C; ++s) {
            const int64_t i = attn_mask.dim() == 2 ? l * C + s : ((n * H + h) * L + l) * C + s;
            mask[((n * H + h) * L + l) * Sp + s] += mask_value(attn_mask, am[i]);
          }
  }
  if (kpm.defined()) {
    const std::vector<double> km = kpm.to_double_vector();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t s = 0; s < S; ++s)
            mask[((n * H + h) * L + l) * Sp + s] += mask_value(kpm, km[n * S + s]);
  }
  if (is_causal && !attn_mask.defined())
    for (int64_t nhl = 0; nhl < N * H * L; ++nhl)
      for (int64_t s = nhl % L + 1; s < S; ++s) mask[nhl * Sp + s] = -kInf;

  MhaReference r;
  r.N = N;
  r.H = H;
  r.L = L;
  r.Sp = Sp;
  r.weights.assign(static_cast<size_t>(N * H * L * Sp), 0.0);
  std::vector<double> attn(static_cast<size_t>(N * L * E), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t nh = (n * H + h) * L * Sp;
      // With no keys (Sp = 0) k, v, mask and weights are empty: their data() may be null, and
      // null + offset is undefined even unread (clang's UBSan), so pass them only when not.
      const bool keys = Sp > 0;
      attention_head(L, Sp, D, D, scale, q.data() + n * L * E + h * D, E,
                     keys ? k.data() + n * Sp * E + h * D : nullptr, E,
                     keys ? v.data() + n * Sp * E + h * D : nullptr, E,
                     keys ? mask.data() + nh : nullptr, keys ? r.weights.data() + nh : nullptr,
                     attn.data() + n * L * E + h * D, E);
    }
  const std::vector<double> out =
      linear(attn, N * L, E, param(params, "out_proj.weight"), E, param(params, "out_proj.bias"));
  // Laid out like the query.
  r.out.assign(out.size(), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t e = 0; e < E; ++e)
        r.out[seq_first ? (l * N + n) * E + e : (n * L + l) * E + e] = out[(n * L + l) * E + e];
  return r;
}

std::vector<int64_t> swin_relative_position_index(int64_t Wh, int64_t Ww) {
  // coords = stack(meshgrid(arange(Wh), arange(Ww), indexing="ij")).flatten(1): [2, N];
  // rel = coords[:, :, None] - coords[:, None, :] -> [N, N, 2]; rel[..., 0] += Wh - 1,
  // rel[..., 1] += Ww - 1, rel[..., 0] *= 2 Ww - 1; index = rel.sum(-1).flatten().
  const int64_t N = Wh * Ww;
  std::vector<int64_t> cy(static_cast<size_t>(N)), cx(static_cast<size_t>(N));
  for (int64_t i = 0; i < Wh; ++i)
    for (int64_t j = 0; j < Ww; ++j) {
      cy[static_cast<size_t>(i * Ww + j)] = i;
      cx[static_cast<size_t>(i * Ww + j)] = j;
    }
  std::vector<int64_t> index(static_cast<size_t>(N * N));
  for (int64_t a = 0; a < N; ++a)
    for (int64_t b = 0; b < N; ++b) {
      const int64_t r0 = (cy[static_cast<size_t>(a)] - cy[static_cast<size_t>(b)] + Wh - 1) *
                         (2 * Ww - 1);
      const int64_t r1 = cx[static_cast<size_t>(a)] - cx[static_cast<size_t>(b)] + Ww - 1;
      index[static_cast<size_t>(a * N + b)] = r0 + r1;
    }
  return index;
}

namespace {

// Python's slice(start, stop) bounds on a length-n axis; has_stop false is None.
std::pair<int64_t, int64_t> py_slice(int64_t start, int64_t stop, bool has_stop, int64_t n) {
  auto norm = [n](int64_t v) { return v < 0 ? std::max<int64_t>(v + n, 0) : std::min(v, n); };
  return {norm(start), has_stop ? norm(stop) : n};
}

}  // namespace

std::vector<double> shifted_window_attention(const SwinOptionsRef& o,
                                             const std::map<std::string, Tensor>& params,
                                             const Tensor& x) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  const int64_t Wh = o.window_h, Ww = o.window_w, heads = o.heads, hd = C / heads;
  const std::vector<double> xv = x.to_double_vector();
  // pad_r, pad_b; F.pad with zeros.
  const int64_t pad_r = (Ww - W % Ww) % Ww, pad_b = (Wh - H % Wh) % Wh;
  const int64_t pH = H + pad_b, pW = W + pad_r;
  std::vector<double> xp(static_cast<size_t>(B * pH * pW * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < W; ++j)
        for (int64_t c = 0; c < C; ++c)
          xp[static_cast<size_t>(((b * pH + i) * pW + j) * C + c)] =
              xv[static_cast<size_t>(((b * H + i) * W + j) * C + c)];
  int64_t sh = o.shift_h, sw = o.shift_w;
  if (Wh >= pH) sh = 0;
  if (Ww >= pW) sw = 0;
  // torch.roll(x, shifts=(-sh, -sw), dims=(1, 2)): out[i] = in[(i + sh) mod pH].
  std::vector<double> xr = xp;
  if (sh + sw > 0)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < pH; ++i)
        for (int64_t j = 0; j < pW; ++j)
          for (int64_t c = 0; c < C; ++c)
            xr[static_cast<size_t>(((b * pH + i) * pW + j) * C + c)] =
                xp[static_cast<size_t>(((b * pH + (i + sh) % pH) * pW + (j + sw) % pW) * C + c)];
  // Partition: view(B, pH/Wh, Wh, pW/Ww, Ww, C).permute(0, 1, 3, 2, 4, 5) -> [B*nW, N, C].
  const int64_t nWh = pH / Wh, nWw = pW / Ww, nW = nWh * nWw, N = Wh * Ww, BW = B * nW;
  std::vector<double> xw(static_cast<size_t>(BW * N * C));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t a = 0; a < nWh; ++a)
      for (int64_t e = 0; e < nWw; ++e)
        for (int64_t i = 0; i < Wh; ++i)
          for (int64_t j = 0; j < Ww; ++j)
            for (int64_t c = 0; c < C; ++c)
              xw[static_cast<size_t>((((b * nW + a * nWw + e) * N) + i * Ww + j) * C + c)] =
                  xr[static_cast<size_t>(((b * pH + a * Wh + i) * pW + e * Ww + j) * C + c)];
  auto need = [&](const std::string& name) {
    BOOST_REQUIRE_MESSAGE(params.count(name), "shifted_window_attention has no " << name);
    return param(params, name);
  };
  const std::vector<double> qkv =
      linear(xw, BW * N, C, need("qkv.weight"), 3 * C, param(params, "qkv.bias"));
  const std::vector<double> table = need("relative_position_bias_table");
  const std::vector<int64_t> index = swin_relative_position_index(Wh, Ww);
  // The region mask, as torchvision labels it: count over (h, w) slice pairs, later ones win.
  std::vector<double> label(static_cast<size_t>(pH * pW), 0.0);
  const bool masked = sh + sw > 0;
  if (masked) {
    const std::pair<int64_t, int64_t> hs[3] = {py_slice(0, -Wh, true, pH),
                                               py_slice(-Wh, -sh, true, pH),
                                               py_slice(-sh, 0, false, pH)};
    const std::pair<int64_t, int64_t> ws[3] = {py_slice(0, -Ww, true, pW),
                                               py_slice(-Ww, -sw, true, pW),
                                               py_slice(-sw, 0, false, pW)};
    int count = 0;
    for (const auto& h : hs)
      for (const auto& w : ws) {
        for (int64_t i = h.first; i < h.second; ++i)
          for (int64_t j = w.first; j < w.second; ++j)
            label[static_cast<size_t>(i * pW + j)] = count;
        ++count;
      }
  }
  std::vector<double> ctx(static_cast<size_t>(BW * N * C));
  std::vector<double> q(static_cast<size_t>(N * hd)), bias(static_cast<size_t>(N * N));
  for (int64_t bw = 0; bw < BW; ++bw) {
    const int64_t w = bw % nW, a = w / nWw, e = w % nWw;
    for (int64_t h = 0; h < heads; ++h) {
      const double* base = qkv.data() + bw * N * 3 * C;
      for (int64_t t = 0; t < N; ++t)
        for (int64_t d = 0; d < hd; ++d)
          q[static_cast<size_t>(t * hd + d)] =
              base[t * 3 * C + h * hd + d] * std::pow(static_cast<double>(hd), -0.5);
      for (int64_t l = 0; l < N; ++l)
        for (int64_t s2 = 0; s2 < N; ++s2) {
          double m = table[static_cast<size_t>(index[static_cast<size_t>(l * N + s2)] * heads + h)];
          if (masked) {
            const double ll = label[static_cast<size_t>((a * Wh + l / Ww) * pW + e * Ww + l % Ww)];
            const double ls =
                label[static_cast<size_t>((a * Wh + s2 / Ww) * pW + e * Ww + s2 % Ww)];
            if (ls - ll != 0.0) m += -100.0;
          }
          bias[static_cast<size_t>(l * N + s2)] = m;
        }
      attention_head(N, N, hd, hd, 1.0, q.data(), hd, base + C + h * hd, 3 * C,
                     base + 2 * C + h * hd, 3 * C, bias.data(), nullptr,
                     ctx.data() + bw * N * C + h * hd, C);
    }
  }
  const std::vector<double> y =
      linear(ctx, BW * N, C, need("proj.weight"), C, param(params, "proj.bias"));
  // Reverse windows, roll by (+sh, +sw), crop.
  std::vector<double> out(static_cast<size_t>(B * H * W * C));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < W; ++j) {
        // roll by +sh: out[i] = in[(i - sh) mod pH].
        const int64_t ri = masked ? ((i - sh) % pH + pH) % pH : i;
        const int64_t rj = masked ? ((j - sw) % pW + pW) % pW : j;
        const int64_t win = (ri / Wh) * nWw + rj / Ww, t = (ri % Wh) * Ww + rj % Ww;
        for (int64_t c = 0; c < C; ++c)
          out[static_cast<size_t>(((b * H + i) * W + j) * C + c)] =
              y[static_cast<size_t>(((b * nW + win) * N + t) * C + c)];
      }
  return out;
}

}  // namespace tessera::f64
