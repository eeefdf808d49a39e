#include "layers/attention.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/attention_tile.h"
#include "core/parallel.h"
#include "core/random.h"
#include "layers/attention_core.h"
#include "layers/linear.h"

namespace tessera {

namespace {

constexpr const char* kProj[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
constexpr const char* kTable = "relative_position_bias_table";

bool has_qkv_bias(const AttentionOptions& o) { return o.bias && o.qkv_bias; }
bool has_out_bias(const AttentionOptions& o) { return o.bias && o.out_bias; }

std::string str(int64_t v) { return std::to_string(v); }

// Shortest round-trip decimal, with ".0" on integral values as Python prints floats ("0.0",
// "0.1", "1e-05"), so messages and repr read like the network file.
std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

const char* py_bool(bool b) { return b ? "True" : "False"; }

// Built by appending: GCC 12 -O3 reports a false -Wrestrict on `"(" + std::string` (PR105329).
std::string spatial_str(const AttentionOptions& o) {
  std::string s = "(";
  s += str(o.spatial_h);
  s += ", ";
  s += str(o.spatial_w);
  s += ")";
  return s;
}

std::string join_names(const std::vector<std::pair<std::string, Shape>>& params) {
  std::string s;
  for (size_t i = 0; i < params.size(); ++i) s += (i ? ", " : "") + params[i].first;
  return s;
}

// H*W == T for the relative-position grid; T < 0 means open (the grid then fixes it).
void check_seq_len(const AttentionOptions& o, int64_t seq_len, const std::string& where) {
  if (!o.relative_position_bias || seq_len < 0) return;
  if (o.spatial_h * o.spatial_w != seq_len)
    fail(ErrorCode::Constraint, where,
         "relative_position_bias needs spatial_shape H*W == T; spatial_shape=" + spatial_str(o) +
             " gives " + str(o.spatial_h * o.spatial_w) + " tokens but T=" + str(seq_len));
}

// Copies the q/k/v weights (and biases) of `params` into the packed [3D, D] / [3D] buffers.
// Rows [i*D, (i+1)*D) of the packed weight are projection i (q, k, v), so one GEMM x W^T gives
// a [rows, 3D] buffer whose columns are q | k | v.
void copy_qkv_into(const ParameterSet& params, int64_t dim, Tensor& w, Tensor& b) {
  for (int i = 0; i < 3; ++i) {
    w.narrow(0, i * dim, dim).copy_from(params.tensor(std::string(kProj[i]) + ".weight"));
    if (b.defined())
      b.narrow(0, i * dim, dim).copy_from(params.tensor(std::string(kProj[i]) + ".bias"));
  }
}

bool views(const Tensor& value, const Tensor& expected) {
  return value.defined() && value.storage() == expected.storage() &&
         value.raw_data() == expected.raw_data() && value.shape() == expected.shape() &&
         value.dtype() == expected.dtype() && value.is_contiguous();
}

}  // namespace

// ---------------------------------------------------------------- validation

std::vector<std::pair<std::string, Shape>> attention_parameter_shapes(
    const AttentionOptions& options, int64_t dim) {
  std::vector<std::pair<std::string, Shape>> out;
  for (int i = 0; i < 4; ++i) {
    const std::string p = kProj[i];
    out.emplace_back(p + ".weight", Shape{dim, dim});
    if (i < 3 ? has_qkv_bias(options) : has_out_bias(options))
      out.emplace_back(p + ".bias", Shape{dim});
  }
  if (options.relative_position_bias)
    out.emplace_back(
        kTable, Shape{(2 * options.spatial_h - 1) * (2 * options.spatial_w - 1), options.heads});
  return out;
}

void validate_attention_options(const AttentionOptions& o, int64_t dim, int64_t seq_len,
                                const std::string& where) {
  if (dim < 1) fail(ErrorCode::Shape, where, "the model width D=" + str(dim) + " must be >= 1");
  if (o.heads < 1) fail(ErrorCode::Constraint, where, "heads=" + str(o.heads) + " must be >= 1");
  if (dim % o.heads != 0)
    fail(ErrorCode::Constraint, where, "heads=" + str(o.heads) + " must divide D=" + str(dim));
  // Written so that NaN fails too.
  if (!(o.dropout >= 0.0 && o.dropout < 1.0))
    fail(ErrorCode::Constraint, where, "dropout=" + py_float(o.dropout) + " must be >= 0 and < 1");
  if (o.spatial_h < 0 || o.spatial_w < 0)
    fail(ErrorCode::Constraint, where, "spatial_shape=" + spatial_str(o) + " must be >= 0");
  const int64_t head_dim = dim / o.heads;
  if (o.rope && head_dim % 2 != 0)
    fail(ErrorCode::Constraint, where,
         "rope needs an even head_dim; head_dim=D/heads=" + str(dim) + "/" + str(o.heads) + "=" +
             str(head_dim));
  if (o.relative_position_bias) {
    if (o.spatial_h == 0 || o.spatial_w == 0)
      fail(ErrorCode::Constraint, where,
           "relative_position_bias needs spatial_shape (H, W) with H, W >= 1; spatial_shape=" +
               spatial_str(o));
    // The table has (2H-1)(2W-1)*heads elements and the index T*T = (HW)^2: both must fit
    // int64. H, W <= 2^31 keeps 2H-1 and 2W-1 themselves from overflowing.
    constexpr int64_t kMaxSide = int64_t{1} << 31;
    int64_t t = 0, t2 = 0, rows = 0, table = 0;
    if (o.spatial_h > kMaxSide || o.spatial_w > kMaxSide ||
        __builtin_mul_overflow(o.spatial_h, o.spatial_w, &t) || __builtin_mul_overflow(t, t, &t2) ||
        __builtin_mul_overflow(2 * o.spatial_h - 1, 2 * o.spatial_w - 1, &rows) ||
        __builtin_mul_overflow(rows, o.heads, &table))
      fail(ErrorCode::Constraint, where,
           "spatial_shape=" + spatial_str(o) + " is too large to index");
  }
  const auto params = attention_parameter_shapes(o, dim);
  auto declared = [&](const std::string& name) {
    for (const auto& p : params)
      if (p.first == name) return true;
    return false;
  };
  for (const auto& [name, std] : o.init) {
    if (!declared(name))
      fail(ErrorCode::Arg, where,
           "init names '" + name + "', which is not a parameter of this layer (parameters: " +
               join_names(params) + ")");
    if (!(std >= 0.0) || std::isinf(std))
      fail(ErrorCode::Constraint, where,
           "init['" + name + "']=" + py_float(std) + " must be a finite standard deviation >= 0");
  }
  for (const auto& entry : o.trainable)
    if (!declared(entry.first))
      fail(ErrorCode::Arg, where,
           "trainable names '" + entry.first +
               "', which is not a parameter of this layer (parameters: " + join_names(params) +
               ")");
  check_seq_len(o, seq_len, where);
}

// ---------------------------------------------------------------- construction

Attention::Attention(int64_t dim, const AttentionOptions& options, std::optional<uint64_t> seed,
                     std::string where)
    : dim_(dim), opt_(options), where_(std::move(where)) {
  validate_attention_options(opt_, dim_, -1, where_);
  for (const auto& [name, shape] : attention_parameter_shapes(opt_, dim_)) {
    Parameter& p = params_.add(name, shape, DType::F32);
    const auto it = opt_.trainable.find(name);
    if (it != opt_.trainable.end()) p.trainable = it->second;
  }
  qkv_weight_ = Tensor::zeros({3 * dim_, dim_}, DType::F32);
  if (has_qkv_bias(opt_)) qkv_bias_ = Tensor::zeros({3 * dim_}, DType::F32);
  bind_packed_qkv();

  if (!seed) return;
  Generator gen(*seed);
  reset_parameters(gen);
}

Attention::Attention(const Attention& other)
    : dim_(other.dim_),
      opt_(other.opt_),
      where_(other.where_),
      params_(other.params_),
      training_(other.training_) {
  for (Parameter& p : params_.all()) p.value = p.value.clone();
  qkv_weight_ = Tensor::zeros({3 * dim_, dim_}, DType::F32);
  if (other.qkv_bias_.defined()) qkv_bias_ = Tensor::zeros({3 * dim_}, DType::F32);
  bind_packed_qkv();
}

Attention& Attention::operator=(const Attention& other) {
  if (this != &other) *this = Attention(other);
  return *this;
}

void Attention::bind_packed_qkv() {
  for (int i = 0; i < 3; ++i) {
    const std::string proj = kProj[i];
    Parameter* w = params_.find(proj + ".weight");
    Tensor wv = qkv_weight_.narrow(0, i * dim_, dim_);
    if (!views(w->value, wv)) {
      wv.copy_from(w->value);
      w->value = wv;
    }
    if (!qkv_bias_.defined()) continue;
    Parameter* b = params_.find(proj + ".bias");
    Tensor bv = qkv_bias_.narrow(0, i * dim_, dim_);
    if (!views(b->value, bv)) {
      bv.copy_from(b->value);
      b->value = bv;
    }
  }
}

bool Attention::packed_qkv_bound() const {
  for (int i = 0; i < 3; ++i) {
    const std::string proj = kProj[i];
    if (!views(params_.tensor(proj + ".weight"), qkv_weight_.narrow(0, i * dim_, dim_)))
      return false;
    if (qkv_bias_.defined() &&
        !views(params_.tensor(proj + ".bias"), qkv_bias_.narrow(0, i * dim_, dim_)))
      return false;
  }
  return true;
}

void Attention::reset_parameters(Generator& gen) {
  bind_packed_qkv();  // the initialisers below write in place, into the packed buffers
  for (Parameter& p : params_.all()) {
    const auto it = opt_.init.find(p.name);
    if (it != opt_.init.end()) {
      init_trunc_normal(p.value, gen, it->second);
    } else if (p.name == kTable) {
      // Zero: the layer starts as ordinary attention and learns the bias from there.
      p.value.copy_from(Tensor::zeros(p.shape, p.value.dtype()));
    } else if (p.name.ends_with(".weight")) {
      init_linear_weight(p.value, gen, dim_);
    } else {
      init_linear_bias(p.value, gen, dim_);
    }
  }
}

LoadResult Attention::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  LoadResult result = params_.load(state, strict, where_);
  bind_packed_qkv();  // load assigns fresh tensors: copy them into the packed buffers
  return result;
}

std::map<std::string, Tensor> Attention::state_dict() const { return params_.state_dict(); }

Tensor Attention::relative_position_index() const {
  if (!opt_.relative_position_bias) return {};
  const int64_t H = opt_.spatial_h, W = opt_.spatial_w, T = H * W;
  Tensor index = Tensor::empty({T, T}, DType::I64);
  int64_t* idx = index.data<int64_t>();
  for (int64_t q = 0; q < T; ++q)
    for (int64_t k = 0; k < T; ++k) idx[q * T + k] = tessera::relative_position_index(q, k, H, W);
  return index;
}

// ---------------------------------------------------------------- forward

Tensor Attention::forward(const Tensor& x, uint64_t dropout_seed) const {
  if (x.dim() != 3 || x.size(2) != dim_)
    fail(ErrorCode::Shape, where_, "x " + x.shape_str() + " is not [B, T, D] with D=" + str(dim_));
  if (!dtype_is_floating(x.dtype()))
    fail(ErrorCode::DType, where_,
         std::string("x has dtype ") + dtype_name(x.dtype()) + ", not a float type");
  const int64_t B = x.size(0), T = x.size(1), D = dim_;
  check_seq_len(opt_, T, where_);
  Tensor out = Tensor::empty({B, T, D}, DType::F32);
  if (B == 0 || T == 0) return out;

  const Tensor xf = x.to(DType::F32).contiguous();
  const Device& device = cpu_device();
  const KernelTable& kern = device.kernels();
  const int64_t heads = opt_.heads, hd = D / heads, rows = B * T, D3 = 3 * D;

  // Packed q/k/v weights. They are bound to the parameters unless someone replaced a parameter
  // tensor outside load_state_dict/reset_parameters; then pack a private copy for this call
  // (forward is const and may run on several threads, so it must not rebind).
  Tensor wqkv = qkv_weight_, bqkv = qkv_bias_;
  if (!packed_qkv_bound()) {
    wqkv = Tensor::empty({D3, D}, DType::F32);
    if (bqkv.defined()) bqkv = Tensor::empty({D3}, DType::F32);
    copy_qkv_into(params_, D, wqkv, bqkv);
  }

  // 1. q | k | v = x [Wq; Wk; Wv]^T + [bq; bk; bv]: one [rows, D] x [D, 3D] GEMM.
  Tensor qkv = Tensor::empty({rows, D3}, DType::F32);
  float* qkv_p = qkv.data<float>();
  linear_forward_f32(device, rows, D, D3, xf.data<float>(), D, wqkv.data<float>(),
                     bqkv.defined() ? bqkv.data<float>() : nullptr, qkv_p, D3);

  // 2. RoPE on the q and k column blocks, in place. Tables [T, hd/2], rebuilt for this T:
  //    theta_i = 10000^(-2i/hd) rounded once to float32 (computed in double: in float32 the
  //    power would lose bits, in float16 it underflows), angle = float32(t) * theta_i in float32
  //    arithmetic as the spec prescribes, cos/sin rounded to float32 (the compute dtype).
  if (opt_.rope) {
    const int64_t half = hd / 2;
    std::vector<float> cos_t(static_cast<size_t>(T * half)), sin_t(cos_t.size());
    for (int64_t i = 0; i < half; ++i) {
      const float theta = static_cast<float>(
          std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(hd)));
      for (int64_t t = 0; t < T; ++t) {
        const float angle = static_cast<float>(t) * theta;
        cos_t[t * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_t[t * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
    }
    // Work item (b, 0 for q / 1 for k) rotates T*D floats; ~16K floats (~10 us) per chunk is
    // enough to pay for a worker hand-off.
    const int64_t grain = std::max<int64_t>(1, 16384 / (T * D));
    parallel_for(0, 2 * B, grain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        kern.rope_rotate_half_f32(T, heads, hd, qkv_p + (i / 2) * T * D3 + (i % 2) * D, D3,
                                  cos_t.data(), sin_t.data());
    });
  }

  // 3. The relative-position bias table [(2H-1)(2W-1), heads] transposed to one contiguous row
  //    per head, which the kernel indexes per tile (16129 x 8 floats at T = 4096, against the
  //    512 MB [heads, T, T] a gathered bias would take).
  std::vector<float> rel_table;
  if (opt_.relative_position_bias) {
    const Tensor table = params_.tensor(kTable).to(DType::F32).contiguous();
    const float* tab = table.data<float>();
    const int64_t entries = table.size(0);
    rel_table.resize(static_cast<size_t>(entries * heads));
    for (int64_t i = 0; i < entries; ++i)
      for (int64_t h = 0; h < heads; ++h) rel_table[h * entries + i] = tab[i * heads + h];
  }

  // 4. softmax(q k^T / sqrt(hd) + bias [+ causal -inf]) v, read from the packed buffer in place
  //    and written straight into the o_proj input [rows, D] (head h at columns h*hd).
  Tensor ctx = Tensor::empty({rows, D}, DType::F32);
  AttentionArgs a;
  a.batch = B;
  a.heads = heads;
  a.q_len = a.kv_len = T;
  a.head_dim = a.v_head_dim = hd;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  a.q = qkv_p;
  a.k = qkv_p + D;
  a.v = qkv_p + 2 * D;
  a.q_batch_stride = a.k_batch_stride = a.v_batch_stride = T * D3;
  a.q_row_stride = a.k_row_stride = a.v_row_stride = D3;
  a.q_head_stride = a.k_head_stride = a.v_head_stride = hd;
  a.out = ctx.data<float>();
  a.out_batch_stride = T * D;
  a.out_row_stride = D;
  a.out_head_stride = hd;
  if (opt_.relative_position_bias) {
    a.rel_table = rel_table.data();
    a.rel_head_stride = static_cast<int64_t>(rel_table.size()) / heads;
    a.grid_h = opt_.spatial_h;
    a.grid_w = opt_.spatial_w;
  }
  a.causal = opt_.causal;
  if (training_ && opt_.dropout > 0.0) {
    // dropout < 1 in double can still round to 1.0f (p > 1 - 2^-25); keep 1/(1-p) finite.
    a.dropout_p = std::min(static_cast<float>(opt_.dropout), std::nextafter(1.0f, 0.0f));
    a.dropout_seed = dropout_seed;
  }
  attention_forward_f32(device, a);

  // 5. out = ctx Wo^T + bo.
  const Tensor wo = params_.tensor("o_proj.weight").to(DType::F32).contiguous();
  Tensor bo;
  if (has_out_bias(opt_)) bo = params_.tensor("o_proj.bias").to(DType::F32).contiguous();
  linear_forward_f32(device, rows, D, D, ctx.data<float>(), D, wo.data<float>(),
                     bo.defined() ? bo.data<float>() : nullptr, out.data<float>(), D);
  return out;
}

// ---------------------------------------------------------------- repr

std::string Attention::repr() const {
  // PyTorch's module repr: the layer's own arguments, then one line per submodule.
  std::string s = "Attention(dim=" + str(dim_) + ", heads=" + str(opt_.heads) +
                  ", head_dim=" + str(dim_ / opt_.heads) + ", causal=" + py_bool(opt_.causal) +
                  ", dropout=" + py_float(opt_.dropout) + ", rope=" + py_bool(opt_.rope) +
                  ", relative_position_bias=" + py_bool(opt_.relative_position_bias);
  if (opt_.relative_position_bias) s += ", spatial_shape=" + spatial_str(opt_);
  s += "\n";
  for (int i = 0; i < 4; ++i)
    s += std::string("  (") + kProj[i] + "): Linear(in_features=" + str(dim_) +
         ", out_features=" + str(dim_) +
         ", bias=" + py_bool(i < 3 ? has_qkv_bias(opt_) : has_out_bias(opt_)) + ")\n";
  if (opt_.relative_position_bias) {
    const int64_t rows = (2 * opt_.spatial_h - 1) * (2 * opt_.spatial_w - 1);
    s += std::string("  ") + kTable + ": [" + str(rows) + ", " + str(opt_.heads) + "]\n";
  }
  std::string frozen;
  for (const Parameter& p : params_.all())
    if (!p.trainable) frozen += (frozen.empty() ? "" : ", ") + p.name;
  if (!frozen.empty()) s += "  frozen: " + frozen + "\n";
  s += ")";
  return s;
}

}  // namespace tessera
