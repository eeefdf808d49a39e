#include "layers/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/attention_tile.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/text.h"
#include "layers/attention_core.h"
#include "layers/linear.h"
#include "layers/op_args.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

constexpr const char* kProj[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
constexpr const char* kTable = "relative_position_bias_table";

bool has_qkv_bias(const AttentionOptions& o) { return o.bias && o.qkv_bias; }
bool has_out_bias(const AttentionOptions& o) { return o.bias && o.out_bias; }

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
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.first);
  return join(names);
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

// `value` is the float32 contiguous view of elements [offset, offset + count) of `packed`.
bool views_rows(const Tensor& value, const Tensor& packed, int64_t offset, int64_t count) {
  return value.defined() && value.storage() == packed.storage() && value.dtype() == DType::F32 &&
         value.is_contiguous() && value.numel() == count &&
         static_cast<const float*>(value.raw_data()) ==
             static_cast<const float*>(packed.raw_data()) + offset;
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
  // Parameter order is q_proj.weight, [q_proj.bias,] k_proj.weight, ... (declaration order);
  // read by position so the check builds no strings or views (forward allocates nothing).
  const std::vector<Parameter>& all = params_.all();
  const size_t per_proj = qkv_bias_.defined() ? 2 : 1;
  for (size_t i = 0; i < 3; ++i) {
    if (!views_rows(all[i * per_proj].value, qkv_weight_, static_cast<int64_t>(i) * dim_ * dim_,
                    dim_ * dim_))
      return false;
    if (qkv_bias_.defined() &&
        !views_rows(all[i * per_proj + 1].value, qkv_bias_, static_cast<int64_t>(i) * dim_, dim_))
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

namespace {

// The attention core's arguments for x [B, T, D] read from the packed q|k|v buffer in place
// and written into the o_proj input [B*T, D]; pointers filled by the caller (null while sizing).
AttentionArgs core_args(const AttentionOptions& o, int64_t B, int64_t T, int64_t D,
                        bool dropout) {
  const int64_t hd = D / o.heads, D3 = 3 * D;
  AttentionArgs a;
  a.batch = B;
  a.heads = o.heads;
  a.q_len = a.kv_len = T;
  a.head_dim = a.v_head_dim = hd;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  a.q_batch_stride = a.k_batch_stride = a.v_batch_stride = T * D3;
  a.q_row_stride = a.k_row_stride = a.v_row_stride = D3;
  a.q_head_stride = a.k_head_stride = a.v_head_stride = hd;
  a.out_batch_stride = T * D;
  a.out_row_stride = D;
  a.out_head_stride = hd;
  if (o.relative_position_bias) {
    a.rel_head_stride = (2 * o.spatial_h - 1) * (2 * o.spatial_w - 1);
    a.grid_h = o.spatial_h;
    a.grid_w = o.spatial_w;
  }
  a.causal = o.causal;
  if (dropout) {
    // dropout < 1 in double can still round to 1.0f (p > 1 - 2^-25); keep 1/(1-p) finite.
    a.dropout_p = std::min(static_cast<float>(o.dropout), std::nextafter(1.0f, 0.0f));
  }
  return a;
}

// The scratch of one forward, laid out in `ws` (Attention::workspace_bytes sizes it through the
// same function).
struct AttentionLayerScratch {
  float* qkv = nullptr;        // q | k | v [rows, 3D]
  float* ctx = nullptr;        // the o_proj input [rows, D]
  float* rope_cos = nullptr;   // [T, hd/2]
  float* rope_sin = nullptr;   // [T, hd/2]
  float* rel_table = nullptr;  // the bias table transposed, one row per head
  float* linear = nullptr;     // the projections' packed input, one at a time
  AttentionScratch core;
  CachedAttentionScratch cached;  // incremental runs instead of `core`
};

// `cached` (incremental runs): the cached core's scratch instead of the full core's.
AttentionLayerScratch layout_scratch(const AttentionOptions& o, int64_t B, int64_t T, int64_t D,
                                     const AttentionArgs& args, Workspace& ws,
                                     const CachedAttentionArgs* cached = nullptr) {
  AttentionLayerScratch s;
  if (B == 0 || T == 0) return s;
  const Device& device = cpu_device();
  const int64_t rows = B * T, hd = D / o.heads;
  s.qkv = ws.take<float>(rows * 3 * D);
  s.ctx = ws.take<float>(rows * D);
  if (o.rope) {
    s.rope_cos = ws.take<float>(T * (hd / 2));
    s.rope_sin = ws.take<float>(T * (hd / 2));
  }
  if (o.relative_position_bias) s.rel_table = ws.take<float>(args.rel_head_stride * o.heads);
  s.linear = ws.take<float>(std::max(linear_workspace_floats(device, rows, D, 3 * D),
                                     linear_workspace_floats(device, rows, D, D)));
  if (cached)
    s.cached = cached_attention_scratch(device, *cached, ws);
  else
    s.core = attention_scratch(device, args, ws);
  return s;
}


}  // namespace

size_t attention_cached_workspace_bytes(const AttentionOptions& options, int64_t dim,
                                        int64_t batch, int64_t seq_len, int64_t capacity) {
  Workspace counter;
  const AttentionArgs a = core_args(options, batch, seq_len, dim, false);
  const CachedAttentionArgs c{a, 0, capacity, nullptr};
  layout_scratch(options, batch, seq_len, dim, a, counter, &c);
  return counter.peak();
}

int64_t attention_cache_floats(const AttentionOptions& options, int64_t dim, int64_t batch,
                               int64_t capacity) {
  const int64_t hd = dim / options.heads;
  return cached_attention_cache_floats(batch, options.heads, hd, hd, capacity);
}

size_t attention_workspace_bytes(const AttentionOptions& options, int64_t dim, int64_t batch,
                                 int64_t seq_len, bool dropout) {
  Workspace counter;
  layout_scratch(options, batch, seq_len, dim, core_args(options, batch, seq_len, dim, dropout),
                 counter);
  return counter.peak();
}

size_t Attention::workspace_bytes(int64_t batch, int64_t seq_len) const {
  return attention_workspace_bytes(opt_, dim_, batch, seq_len, training_ && opt_.dropout > 0.0);
}

void Attention::check_input(const Tensor& x) const {
  if (x.dim() != 3 || x.size(2) != dim_)
    fail(ErrorCode::Shape, where_, "x " + x.shape_str() + " is not [B, T, D] with D=" + str(dim_));
  if (!dtype_is_floating(x.dtype()))
    fail(ErrorCode::DType, where_,
         std::string("x has dtype ") + dtype_name(x.dtype()) + ", not a float type");
  check_seq_len(opt_, x.size(1), where_);
}

Tensor Attention::forward(const Tensor& x, uint64_t dropout_seed) const {
  check_input(x);
  const int64_t B = x.size(0), T = x.size(1);
  Tensor out = Tensor::empty({B, T, dim_}, DType::F32);
  const Tensor xf = x.to(DType::F32).contiguous();
  const Tensor scratch =
      Tensor::empty({static_cast<int64_t>(workspace_bytes(B, T) / sizeof(float)) + 1});
  Workspace ws(scratch.raw_data(), scratch.nbytes());
  forward_into(xf, out, ws, dropout_seed);
  return out;
}

void Attention::forward_into(const Tensor& x, Tensor& out, Workspace& ws,
                             uint64_t dropout_seed) const {
  forward_impl(x, out, ws, dropout_seed, nullptr);
}

void Attention::forward_cached_into(const Tensor& x, Tensor& out, Workspace& ws,
                                    const StepState& step) const {
  forward_impl(x, out, ws, 0, &step);
}

void Attention::forward_impl(const Tensor& x, Tensor& out, Workspace& ws, uint64_t dropout_seed,
                             const StepState* step) const {
  const int64_t B = x.size(0), T = x.size(1), D = dim_;
  if (B == 0 || T == 0) return;
  const Device& device = cpu_device();
  const KernelTable& kern = device.kernels();
  const int64_t heads = opt_.heads, hd = D / heads, rows = B * T, D3 = 3 * D;
  AttentionArgs a = core_args(opt_, B, T, D, !step && training_ && opt_.dropout > 0.0);
  const CachedAttentionArgs sizing{a, step ? step->past : 0, step ? step->capacity : 0, nullptr};
  const AttentionLayerScratch s = layout_scratch(opt_, B, T, D, a, ws, step ? &sizing : nullptr);
  // Positions of this call: 0.. for a full forward, past.. for an incremental one.
  const int64_t first = step ? step->past : 0;

  // Packed q/k/v weights. They are bound to the parameters unless someone replaced a parameter
  // tensor outside load_state_dict/reset_parameters; then pack a private copy for this call
  // (forward is const and may run on several threads, so it must not rebind; this is the one
  // case in which a forward allocates).
  // (Pointers, not Tensor copies: copying a Tensor copies its shape, a heap allocation.)
  const Tensor* wqkv = &qkv_weight_;
  const Tensor* bqkv = &qkv_bias_;
  Tensor private_w, private_b;
  if (!packed_qkv_bound()) {
    private_w = Tensor::empty({D3, D}, DType::F32);
    if (qkv_bias_.defined()) private_b = Tensor::empty({D3}, DType::F32);
    copy_qkv_into(params_, D, private_w, private_b);
    wqkv = &private_w;
    bqkv = &private_b;
  }

  // 1. q | k | v = x [Wq; Wk; Wv]^T + [bq; bk; bv]: one [rows, D] x [D, 3D] GEMM.
  float* qkv_p = s.qkv;
  linear_forward_f32(device, rows, D, D3, x.data<float>(), D, wqkv->data<float>(),
                     bqkv->defined() ? bqkv->data<float>() : nullptr, qkv_p, D3, s.linear);

  // 2. RoPE on the q and k column blocks, in place. Tables [T, hd/2], rebuilt for this T:
  //    theta_i = 10000^(-2i/hd) rounded once to float32 (computed in double: in float32 the
  //    power would lose bits, in float16 it underflows), angle = float32(t) * theta_i in float32
  //    arithmetic as the spec prescribes, cos/sin rounded to float32 (the compute dtype).
  if (opt_.rope) {
    const int64_t half = hd / 2;
    float* cos_t = s.rope_cos;
    float* sin_t = s.rope_sin;
    for (int64_t i = 0; i < half; ++i) {
      const float theta = static_cast<float>(
          std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(hd)));
      for (int64_t t = 0; t < T; ++t) {
        const float angle = static_cast<float>(first + t) * theta;
        cos_t[t * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_t[t * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
    }
    // Work item (b, 0 for q / 1 for k) rotates T*D floats; ~16K floats (~10 us) per chunk is
    // enough to pay for a worker hand-off.
    const int64_t grain = std::max<int64_t>(1, 16384 / (T * D));
    parallel_for(0, 2 * B, grain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        kern.rope_rotate_half_f32(T, heads, hd, qkv_p + (i / 2) * T * D3 + (i % 2) * D, D3, cos_t,
                                  sin_t);
    });
  }

  // 3. The relative-position bias table [(2H-1)(2W-1), heads] transposed to one contiguous row
  //    per head, which the kernel indexes per tile (16129 x 8 floats at T = 4096, against the
  //    512 MB [heads, T, T] a gathered bias would take).
  if (opt_.relative_position_bias) {
    const Tensor& table = params_.tensor(kTable);
    const float* tab = table.data<float>();
    const int64_t entries = a.rel_head_stride;
    for (int64_t i = 0; i < entries; ++i)
      for (int64_t h = 0; h < heads; ++h) s.rel_table[h * entries + i] = tab[i * heads + h];
    a.rel_table = s.rel_table;
  }

  // 4. softmax(q k^T / sqrt(hd) + bias [+ causal -inf]) v, read from the packed buffer in place
  //    and written straight into the o_proj input [rows, D] (head h at columns h*hd).
  a.q = qkv_p;
  a.k = qkv_p + D;
  a.v = qkv_p + 2 * D;
  a.out = s.ctx;
  a.dropout_seed = dropout_seed;
  if (step) {
    cached_attention_f32(device, {a, step->past, step->capacity, step->cache}, s.cached);
  } else {
    attention_forward_f32(device, a, s.core);
  }

  // 5. out = ctx Wo^T + bo.
  linear_forward_f32(device, rows, D, D, s.ctx, D, params_.tensor("o_proj.weight").data<float>(),
                     has_out_bias(opt_) ? params_.tensor("o_proj.bias").data<float>() : nullptr,
                     out.data<float>(), D, s.linear);
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

// ---------------------------------------------------------------- the `attention` op

namespace {

using ojson = nlohmann::ordered_json;

class AttentionLayer : public OpLayer {
 public:
  AttentionLayer(int64_t dim, const AttentionOptions& options, std::optional<uint64_t> seed,
                 const std::string& where)
      : attention_(dim, options, seed, where) {}
  ParameterSet* parameters() override { return &attention_.parameters(); }
  void load(const std::map<std::string, Tensor>& state) override {
    attention_.load_state_dict(state, false);
  }
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace& ws) const override {
    attention_.check_input(*in[0]);
    attention_.forward_into(*in[0], *out[0], ws);
  }
  void forward_step(std::span<const Tensor* const> in, std::span<Tensor* const> out,
                    Workspace& ws, const StepState& step) const override {
    attention_.forward_cached_into(*in[0], *out[0], ws, step);
  }

 private:
  Attention attention_;
};

class AttentionOp : public Op {
 public:
  AttentionOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "attention");
    opt_.heads = a.integer("heads");
    opt_.causal = a.boolean("causal", false);
    opt_.dropout = a.number("dropout", 0.0);
    opt_.bias = a.boolean("bias", true);
    opt_.qkv_bias = a.boolean("qkv_bias", true);
    opt_.out_bias = a.boolean("out_bias", true);
    opt_.rope = a.boolean("rope", false);
    opt_.relative_position_bias = a.boolean("relative_position_bias", false);
    if (const ojson* s = a.raw("spatial_shape")) {
      auto side = [&](const ojson& v) -> int64_t {
        if (!v.is_number_integer()) a.type_error("spatial_shape", "an int or a pair of ints", *s);
        if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
          fail(ErrorCode::Constraint, where, "spatial_shape=" + s->dump() + " does not fit int64");
        return v.get<int64_t>();
      };
      if (s->is_array()) {
        if (s->size() != 2) a.type_error("spatial_shape", "an int or a pair of ints", *s);
        opt_.spatial_h = side((*s)[0]);
        opt_.spatial_w = side((*s)[1]);
      } else {
        opt_.spatial_h = opt_.spatial_w = side(*s);
      }
    }
    if (const ojson* init = a.raw("init")) {
      if (!init->is_object()) a.type_error("init", "an object (parameter -> std)", *init);
      for (const auto& [name, v] : init->items()) {
        if (!v.is_number()) a.type_error("init['" + name + "']", "a number", v);
        opt_.init[name] = v.get<double>();
      }
    }
    if (const ojson* tr = a.raw("trainable")) {
      if (!tr->is_object()) a.type_error("trainable", "an object (parameter -> bool)", *tr);
      for (const auto& [name, v] : tr->items()) {
        if (!v.is_boolean()) a.type_error("trainable['" + name + "']", "a boolean", v);
        opt_.trainable[name] = v.get<bool>();
      }
    }
    a.finish();
  }
  const char* name() const override { return "attention"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes& in, SymbolBindings& bound) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "attention", where());
    if (x.shape.size() != 3) fail(ErrorCode::Shape, where(), named("x", x) + " is not [B, T, D]");
    const int64_t D = require_fixed(x.shape[2], "the model width D", x, "x", where());
    const Dim& T = x.shape[1];
    validate_attention_options(opt_, D, T.is_fixed() ? T.value : -1, where());
    SymShape out = x.shape;
    if (opt_.relative_position_bias && !T.is_fixed()) {
      // The grid fixes the sequence length: H*W == T binds the symbol everywhere.
      const int64_t tokens = opt_.spatial_h * opt_.spatial_w;
      if (T.is_symbol()) {
        const auto [it, inserted] = bound.emplace(T.text, tokens);
        if (!inserted && it->second != tokens)
          fail(ErrorCode::Constraint, where(),
               "spatial_shape=(" + str(opt_.spatial_h) + ", " + str(opt_.spatial_w) +
                   ") fixes T=" + T.text + " to " + str(tokens) +
                   ", but another node fixed it to " + str(it->second));
      }
      out[1] = Dim::fixed(tokens);
    }
    InferResult r;
    r.outputs.push_back({out, DType::F32});
    r.parameters = attention_parameter_shapes(opt_, D);
    return r;
  }
  OpCost cost(const InputTypes& in) const override {
    const SymShape& s = in[0]->shape;
    const int64_t B = s[0].value, T = s[1].value, D = s[2].value;
    const double b = static_cast<double>(B), t = static_cast<double>(T), d = static_cast<double>(D);
    OpCost c;
    // Four [B*T, D] x [D, D] projections, then q k^T and p v: 2*T*T*D each per batch element.
    c.flops = 8.0 * b * t * d * d + 4.0 * b * t * t * d;
    c.workspace_bytes = static_cast<double>(attention_workspace_bytes(opt_, D, B, T, false));
    return c;
  }
  double resident_bytes(const InputTypes& in) const override {
    const double d = static_cast<double>(in[0]->shape[2].value);
    // Attention::Attention: q/k/v weights packed as one [3D, D] matrix and a [3D] bias beside
    // the parameters.
    return sizeof(float) * (3.0 * d * d + 3.0 * d);
  }
  // Cached: causal, without a relative-position bias (its grid fixes the sequence), over x's
  // sequence dim. Dropout does not apply (inference).
  StepRole step_role(const InputTypes& in, const std::string& seq,
                     std::string& why) const override {
    if (!opt_.causal)
      why = "attention without causal looks at later positions";
    else if (opt_.relative_position_bias)
      why = "relative_position_bias ties the sequence to a fixed grid";
    else if (seq_axis(in[0]->shape, seq) != 1)
      why = "x " + sym_shape_to_string(in[0]->shape) + " does not have the sequence dim " + seq +
            " at dim 1";
    else
      return StepRole::cached;
    return StepRole::none;
  }
  int64_t cache_floats(const InputTypes& in, int64_t batch, int64_t capacity) const override {
    return attention_cache_floats(opt_, in[0]->shape[2].value, batch, capacity);
  }
  double step_workspace_bytes(const InputTypes& in, int64_t capacity) const override {
    const SymShape& s = in[0]->shape;
    return static_cast<double>(attention_cached_workspace_bytes(opt_, s[2].value, s[0].value,
                                                                s[1].value, capacity));
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes& in,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<AttentionLayer>(in[0]->shape[2].value, opt_, seed, where());
  }

 private:
  AttentionOptions opt_;
};

}  // namespace

std::unique_ptr<Op> make_attention_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<AttentionOp>(node, where);
}

}  // namespace tessera
