#include "layers/ops.h"

#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_device.h"
#include "core/parallel.h"

namespace tessera {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// "x3", "out0": port names. (Built by appending: GCC 12 at -O3 warns falsely, -Wrestrict, on
// "literal" + std::to_string(i).)
std::string indexed(const char* prefix, int64_t i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

// x itself when it is float32 and contiguous, otherwise a float32 contiguous copy in `scratch`.
const Tensor& f32_contiguous(const Tensor& x, Tensor& scratch, const char* name,
                             const std::string& where) {
  if (!x.defined()) fail(ErrorCode::Arg, where, std::string(name) + " is undefined");
  if (!dtype_is_floating(x.dtype()))
    fail(ErrorCode::DType, where,
         std::string(name) + " has dtype " + dtype_name(x.dtype()) + ", not a float type");
  if (x.dtype() == DType::F32 && x.is_contiguous()) return x;
  scratch = x.to(DType::F32).contiguous();
  return scratch;
}

void check_output(const Tensor& y, const Shape& shape, const char* name, const std::string& where) {
  if (!y.defined() || y.dtype() != DType::F32 || !y.is_contiguous() || y.shape() != shape)
    fail(ErrorCode::Shape, where,
         std::string("output ") + name + " must be a contiguous float32 " + shape_to_string(shape) +
             (y.defined() ? std::string(", got ") + dtype_name(y.dtype()) + " " + y.shape_str()
                          : std::string(", got an undefined tensor")));
}

int64_t wrap_dim(int64_t dim, int64_t rank, const std::string& where) {
  if (dim < -rank || dim >= rank)
    fail(ErrorCode::Constraint, where,
         "dim=" + str(dim) + " is out of range for a rank-" + str(rank) +
             " tensor (valid: " + str(-rank) + " .. " + str(rank - 1) + ")");
  return dim < 0 ? dim + rank : dim;
}

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

// Elementwise work per worker hand-off: 16K floats (64 KB, a quarter of L2) take ~2-10 us,
// well above the ~1 us it costs to wake a worker.
constexpr int64_t kElementGrain = 16384;

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(ErrorCode::Shape, where,
           "shapes " + shape_to_string(a) + " and " + shape_to_string(b) +
               " do not broadcast (dim " + str(static_cast<int64_t>(i)) + ": " + str(da) + " vs " +
               str(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

void layer_norm_into(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                     Tensor& y, const std::string& where) {
  Tensor xs, gs, bs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  if (xc.dim() < 1) fail(ErrorCode::Shape, where, "x " + xc.shape_str() + " has no last dim");
  const int64_t D = xc.size(-1);
  const float* g = nullptr;
  const float* b = nullptr;
  if (gamma.defined()) {
    if (gamma.shape() != Shape{D})
      fail(ErrorCode::Shape, where, "weight " + gamma.shape_str() + " is not [" + str(D) + "]");
    g = f32_contiguous(gamma, gs, "weight", where).data<float>();
  }
  if (beta.defined()) {
    if (beta.shape() != Shape{D})
      fail(ErrorCode::Shape, where, "bias " + beta.shape_str() + " is not [" + str(D) + "]");
    b = f32_contiguous(beta, bs, "bias", where).data<float>();
  }
  check_output(y, xc.shape(), "y", where);
  if (D == 0 || xc.numel() == 0) return;
  const int64_t rows = xc.numel() / D;
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  const KernelTable& k = cpu_device().kernels();
  const float e = static_cast<float>(eps);
  parallel_for(0, rows, std::max<int64_t>(1, kElementGrain / D), [&](int64_t r0, int64_t r1) {
    k.layer_norm_rows_f32(r1 - r0, D, xp + r0 * D, D, yp + r0 * D, D, g, b, e);
  });
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

void add_into(const Tensor& a, const Tensor& b, Tensor& y, const std::string& where) {
  Tensor as, bs;
  const Tensor& ac = f32_contiguous(a, as, "a", where);
  const Tensor& bc = f32_contiguous(b, bs, "b", where);
  const Shape out = broadcast_shapes(ac.shape(), bc.shape(), where);
  check_output(y, out, "y", where);
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
  const size_t rank = out.size();
  Shape sa(rank, 0), sb(rank, 0);
  auto strides_for = [&](const Shape& s, Shape& st) {
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

void chunk_into(const Tensor& x, int64_t dim, const std::vector<Tensor*>& outs,
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
  Shape piece_shape = xc.shape();
  piece_shape[static_cast<size_t>(d)] = piece;
  for (int64_t i = 0; i < chunks; ++i)
    check_output(*outs[static_cast<size_t>(i)], piece_shape, indexed("out", i).c_str(), where);
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

void concat_into(const std::vector<const Tensor*>& xs, int64_t dim, Tensor& y,
                 const std::string& where) {
  if (xs.empty()) fail(ErrorCode::Arg, where, "concat needs at least one input");
  std::vector<Tensor> scratch(xs.size());
  std::vector<const Tensor*> xc(xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    xc[i] =
        &f32_contiguous(*xs[i], scratch[i], indexed("x", static_cast<int64_t>(i)).c_str(), where);
  const int64_t rank = xc[0]->dim();
  if (rank < 1) fail(ErrorCode::Shape, where, "concat needs at least one dim, x0 is []");
  const int64_t d = wrap_dim(dim, rank, where);
  Shape out = xc[0]->shape();
  out[static_cast<size_t>(d)] = 0;
  for (size_t i = 0; i < xc.size(); ++i) {
    const Shape& s = xc[i]->shape();
    bool fits = static_cast<int64_t>(s.size()) == rank;
    for (int64_t j = 0; fits && j < rank; ++j)
      fits = j == d || s[static_cast<size_t>(j)] == xc[0]->shape()[static_cast<size_t>(j)];
    if (!fits)
      fail(ErrorCode::Shape, where,
           indexed("x", static_cast<int64_t>(i)) + " " + shape_to_string(s) +
               " does not match x0 " + xc[0]->shape_str() + " outside dim " + str(d));
    out[static_cast<size_t>(d)] += s[static_cast<size_t>(d)];
  }
  check_output(y, out, "y", where);
  const int64_t outer = product(out, 0, static_cast<size_t>(d));
  const int64_t inner = product(out, static_cast<size_t>(d) + 1, out.size());
  const int64_t row = out[static_cast<size_t>(d)] * inner;  // floats per outer index in y
  if (row == 0) return;
  float* yp = y.data<float>();
  parallel_for(0, outer, std::max<int64_t>(1, kElementGrain / row), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      float* dst = yp + o * row;
      for (const Tensor* x : xc) {
        const int64_t block = x->size(d) * inner;
        std::memcpy(dst, x->data<float>() + o * block, static_cast<size_t>(block) * sizeof(float));
        dst += block;
      }
    }
  });
}

// ---------------------------------------------------------------- LayerNorm

LayerNorm::LayerNorm(int64_t dim, double eps, bool elementwise_affine)
    : dim_(dim), eps_(eps), affine_(elementwise_affine) {
  if (dim < 1)
    fail(ErrorCode::Constraint, "layer_norm", "normalized dim D=" + str(dim) + " must be >= 1");
  if (elementwise_affine) {
    params_.add("weight", {dim});
    params_.add("bias", {dim});
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (!affine_) return;
  params_.mutable_tensor("weight").copy_from(Tensor::full({dim_}, 1.0));
  params_.mutable_tensor("bias").copy_from(Tensor::zeros({dim_}));
}

void LayerNorm::forward_into(const Tensor& x, Tensor& y, const std::string& where) const {
  if (x.dim() < 1 || x.size(-1) != dim_)
    fail(ErrorCode::Shape, where,
         "x " + x.shape_str() + " does not end in the normalized dim D=" + str(dim_));
  layer_norm_into(x, affine_ ? params_.tensor("weight") : Tensor(),
                  affine_ ? params_.tensor("bias") : Tensor(), eps_, y, where);
}

Tensor LayerNorm::forward(const Tensor& x) const {
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  forward_into(x, y);
  return y;
}

}  // namespace tessera
