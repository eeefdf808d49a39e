// torch.nn.MultiheadAttention, inference, on the shared attention core.
//
// One call, sequence-first [L, N, E] shown (batch-first swaps the two outer dims; unbatched
// input is N = 1 sequence-first):
//   1. query/key/value -> float32 row matrices, views when already float32 with unit column
//      stride and a uniform row stride, copies otherwise.
//   2. In-projection. Self-attention (query, key, value one tensor, kdim == vdim == E): ONE GEMM
//      [L*N, E] x [3E, E]^T into a packed [rows, 3E] buffer, q/k/v at column offsets 0/E/2E.
//      Otherwise three GEMMs (row slices of in_proj_weight, or q/k/v_proj_weight) into
//      q [L*N, E], k [S'*N, E], v [S'*N, E].
//   3. bias_k/bias_v, then the zero position, are written as extra key/value positions of those
//      buffers, so the core reads S' = S + [add_bias_kv] + [add_zero_attn] keys through the
//      same strides: no concatenation copy.
//   4. Masks (bool -> -inf, attn_mask + key_padding_mask, causal, "keep" for the appended
//      positions) are materialised once into one float buffer [N|1, H|1, L|1, S'] that the core
//      broadcasts with zero strides: a key_padding_mask alone costs N*S' floats, not N*H*L*S'.
//   5. attention_forward_f32 reads q/k/v in place (head h = columns [h*D, (h+1)*D)) and writes
//      the merged heads straight into the out-projection's input rows.
//   6. Out-projection: one GEMM over L*N rows into the output tensor.
// Per call: one projection buffer, one attention-output buffer, at most one mask buffer and one
// weights buffer; nothing is allocated per head or per query tile here.
//
// Parameter dtype: parameters are stored in options.dtype (float32, float64, float16 or
// bfloat16); compute is always float32. A non-float32 parameter set is converted to float32 at
// the start of each forward (E*(4E + 2) floats for the packed layout, e.g. 16 KB at E = 64):
// memory is saved at rest, a little time is paid per call. A non-float dtype is E_DTYPE.
#include "layers/multihead_attention.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/parallel.h"
#include "core/random.h"
#include "layers/attention_core.h"
#include "layers/linear.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "multihead_attention";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

[[noreturn]] void shape_error(const std::string& what) { fail(ErrorCode::Shape, kWhere, what); }

std::string named(const char* name, const Tensor& t) {
  return std::string(name) + " " + t.shape_str();
}

// Python's repr of a float: shortest round-trip digits, always with a '.' or an exponent.
std::string python_float(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

const char* python_bool(bool b) { return b ? "True" : "False"; }

// Same storage, offset, shape, strides and dtype: the same values, read the same way. This is
// PyTorch's `query is key` test made robust to views that were created separately.
bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.offset() == b.offset() && a.dtype() == b.dtype() &&
         a.shape() == b.shape() && a.strides() == b.strides();
}

void check_float_input(const char* name, const Tensor& t) {
  if (!dtype_is_floating(t.dtype()))
    fail(ErrorCode::DType, kWhere,
         std::string(name) + " dtype " + dtype_name(t.dtype()) +
             " is not a float type (float32, float64, float16 or bfloat16)");
}

// A float32 matrix: the input's rows in logical (row-major) order, row r at data + r * stride,
// columns contiguous.
struct RowMatrix {
  Tensor holder;  // the converted copy, when one was needed
  const float* data = nullptr;
  int64_t stride = 0;
};

RowMatrix as_rows(const Tensor& t) {
  Tensor f = t.to(DType::F32);
  const int64_t width = f.size(-1);
  int64_t stride = -1;
  if (f.is_contiguous()) {
    stride = width;
  } else if (f.stride(-1) == 1) {
    // Padded rows (a slice of a wider tensor) are read in place; the GEMM needs ld >= width.
    if (f.dim() == 2 && f.stride(0) >= width) stride = f.stride(0);
    if (f.dim() == 3 && f.stride(1) >= width && f.stride(0) == f.size(1) * f.stride(1))
      stride = f.stride(1);
  }
  if (stride < 0) {
    f = f.contiguous();
    stride = width;
  }
  RowMatrix m;
  m.holder = f;
  m.data = f.numel() > 0 ? f.data<float>() : nullptr;
  m.stride = std::max<int64_t>(stride, 1);
  return m;
}

// Where position (b, s) of a projection buffer lives: `len` positions per sequence, `ld` floats
// per row. Sequence-first rows are s*N + b (the input's own row order, so the appended
// positions are whole rows at the end); batch-first rows are b*len + s.
struct Layout {
  bool batch_first;
  int64_t batch, len, ld;
  int64_t batch_stride() const { return batch_first ? len * ld : ld; }
  int64_t row_stride() const { return batch_first ? ld : batch * ld; }
};

// y (positions [0, len_in) of every sequence, laid out by `out`) = x W^T + b. The input rows are
// in the same order as the buffer's, except that a batch-first buffer with appended positions
// has a gap after each sequence: then one GEMM per sequence.
void project(const Device& device, const RowMatrix& x, int64_t len_in, int64_t in_features,
             int64_t out_features, const float* w, const float* bias, float* y, const Layout& out) {
  if (!out.batch_first || out.len == len_in) {
    linear_forward_f32(device, len_in * out.batch, in_features, out_features, x.data, x.stride, w,
                       bias, y, out.ld);
    return;
  }
  for (int64_t b = 0; b < out.batch; ++b)
    linear_forward_f32(device, len_in, in_features, out_features, x.data + b * len_in * x.stride,
                       x.stride, w, bias, y + b * out.batch_stride(), out.ld);
}

// Writes position `pos` of every sequence: `row` (E floats), or zeros when row is null.
void fill_position(float* base, const Layout& layout, int64_t pos, int64_t width,
                   const float* row) {
  for (int64_t b = 0; b < layout.batch; ++b) {
    float* dst = base + b * layout.batch_stride() + pos * layout.row_stride();
    if (row)
      std::memcpy(dst, row, static_cast<size_t>(width) * sizeof(float));
    else
      std::memset(dst, 0, static_cast<size_t>(width) * sizeof(float));
  }
}

// Reads a bool or float mask element by element through its strides, as an additive float:
// bool true -> -inf, false -> 0; float values as they are. Float16/bfloat16/float64 masks are
// converted to float32 first (rare; float32 and bool masks are read in place).
class MaskReader {
 public:
  explicit MaskReader(const Tensor& m) {
    if (m.dtype() == DType::Bool) {
      t_ = m;
      bytes_ = static_cast<const uint8_t*>(m.raw_data());
    } else {
      t_ = m.to(DType::F32);
      floats_ = t_.numel() > 0 ? t_.data<float>() : nullptr;
    }
  }
  int64_t stride(int64_t d) const { return t_.stride(d); }
  float at(int64_t off) const {
    if (bytes_) return bytes_[off] != 0 ? kNegInf : 0.0f;
    return floats_[off];
  }

 private:
  Tensor t_;
  const uint8_t* bytes_ = nullptr;
  const float* floats_ = nullptr;
};

void check_mask_dtype(const char* name, const Tensor& m) {
  if (m.dtype() != DType::Bool && !dtype_is_floating(m.dtype()))
    fail(ErrorCode::DType, kWhere,
         std::string(name) + " dtype " + dtype_name(m.dtype()) +
             " is not supported: use bool (true = masked) or a float type (added to the scores)");
}

// A float32, contiguous copy of a parameter (the stored tensor itself when already so).
Tensor param_f32(const ParameterSet& params, const std::string& name) {
  return params.tensor(name).to(DType::F32).contiguous();
}

}  // namespace

// ------------------------------------------------------------------------------- construction

MultiheadAttention::MultiheadAttention(const MultiheadAttentionOptions& options,
                                       std::optional<uint64_t> seed)
    : opt_(options) {
  const int64_t E = opt_.embed_dim, H = opt_.num_heads;
  if (opt_.device != "cpu")
    fail(ErrorCode::Unsupported, kWhere,
         "device '" + opt_.device + "' is not supported (only 'cpu')");
  if (E <= 0)
    fail(ErrorCode::Constraint, kWhere, "embed_dim=" + std::to_string(E) + " must be > 0");
  if (H <= 0)
    fail(ErrorCode::Constraint, kWhere, "num_heads=" + std::to_string(H) + " must be > 0");
  if (E % H != 0)
    fail(ErrorCode::Constraint, kWhere,
         "num_heads=" + std::to_string(H) + " must divide embed_dim=" + std::to_string(E));
  if (!(opt_.dropout >= 0.0 && opt_.dropout <= 1.0))  // also rejects NaN
    fail(ErrorCode::Constraint, kWhere,
         "dropout=" + python_float(opt_.dropout) + " must be in [0, 1]");
  if (opt_.kdim && *opt_.kdim <= 0)
    fail(ErrorCode::Constraint, kWhere, "kdim=" + std::to_string(*opt_.kdim) + " must be > 0");
  if (opt_.vdim && *opt_.vdim <= 0)
    fail(ErrorCode::Constraint, kWhere, "vdim=" + std::to_string(*opt_.vdim) + " must be > 0");
  if (!dtype_is_floating(opt_.dtype))
    fail(ErrorCode::DType, kWhere,
         std::string("parameter dtype ") + dtype_name(opt_.dtype) +
             " is not a float type (float32, float64, float16 or bfloat16)");

  const DType dt = opt_.dtype;
  if (packed_in_proj()) {
    params_.add("in_proj_weight", {3 * E, E}, dt);
  } else {
    params_.add("q_proj_weight", {E, E}, dt);
    params_.add("k_proj_weight", {E, kdim()}, dt);
    params_.add("v_proj_weight", {E, vdim()}, dt);
  }
  if (opt_.bias) params_.add("in_proj_bias", {3 * E}, dt);
  if (opt_.add_bias_kv) {
    params_.add("bias_k", {1, 1, E}, dt);
    params_.add("bias_v", {1, 1, E}, dt);
  }
  params_.add("out_proj.weight", {E, E}, dt);
  if (opt_.bias) params_.add("out_proj.bias", {E}, dt);

  if (!seed) return;
  Generator gen(*seed);
  reset_parameters(gen);
}

int64_t MultiheadAttention::kdim() const { return opt_.kdim.value_or(opt_.embed_dim); }
int64_t MultiheadAttention::vdim() const { return opt_.vdim.value_or(opt_.embed_dim); }
bool MultiheadAttention::packed_in_proj() const {
  return kdim() == opt_.embed_dim && vdim() == opt_.embed_dim;
}

void MultiheadAttention::reset_parameters(Generator& gen) {
  const int64_t E = opt_.embed_dim;
  auto zero = [](Tensor& t) { t.copy_from(Tensor::zeros(t.shape(), DType::F32)); };
  // xavier_uniform_ takes fan_in = size(1), fan_out = size(0) of each 2-D weight: the packed
  // [3E, E] weight is one draw with bound sqrt(6 / (E + 3E)), as PyTorch does it.
  if (packed_in_proj()) {
    init_xavier_uniform(params_.mutable_tensor("in_proj_weight"), gen, E, 3 * E);
  } else {
    init_xavier_uniform(params_.mutable_tensor("q_proj_weight"), gen, E, E);
    init_xavier_uniform(params_.mutable_tensor("k_proj_weight"), gen, kdim(), E);
    init_xavier_uniform(params_.mutable_tensor("v_proj_weight"), gen, vdim(), E);
  }
  if (opt_.bias) zero(params_.mutable_tensor("in_proj_bias"));
  init_linear_weight(params_.mutable_tensor("out_proj.weight"), gen, E);
  if (opt_.bias) zero(params_.mutable_tensor("out_proj.bias"));
  // [1, 1, E]: fan_in = size(1) * E = E and fan_out = size(0) * E = E, std = sqrt(1 / E).
  if (opt_.add_bias_kv) {
    init_xavier_normal(params_.mutable_tensor("bias_k"), gen, E, E);
    init_xavier_normal(params_.mutable_tensor("bias_v"), gen, E, E);
  }
}

LoadResult MultiheadAttention::load_state_dict(const std::map<std::string, Tensor>& state,
                                               bool strict) {
  return params_.load(state, strict, kWhere);
}

std::map<std::string, Tensor> MultiheadAttention::state_dict() const {
  return params_.state_dict();
}

// PyTorch prints no geometry for this module (only its out_proj child); we print the constructor
// arguments in constructor order: embed_dim, num_heads, bias and batch_first always, the others
// only when they differ from their defaults.
std::string MultiheadAttention::repr() const {
  std::string s = "MultiheadAttention(embed_dim=" + std::to_string(opt_.embed_dim) +
                  ", num_heads=" + std::to_string(opt_.num_heads);
  if (opt_.dropout != 0.0) s += ", dropout=" + python_float(opt_.dropout);
  s += std::string(", bias=") + python_bool(opt_.bias);
  if (opt_.add_bias_kv) s += ", add_bias_kv=True";
  if (opt_.add_zero_attn) s += ", add_zero_attn=True";
  if (kdim() != opt_.embed_dim) s += ", kdim=" + std::to_string(kdim());
  if (vdim() != opt_.embed_dim) s += ", vdim=" + std::to_string(vdim());
  s += std::string(", batch_first=") + python_bool(opt_.batch_first);
  if (opt_.dtype != DType::F32) s += std::string(", dtype=") + dtype_name(opt_.dtype);
  return s + ")";
}

// ------------------------------------------------------------------------------------ forward

MultiheadAttentionOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key_in,
                                                     const Tensor& value_in,
                                                     const Tensor& key_padding_mask,
                                                     bool need_weights, const Tensor& attn_mask,
                                                     bool average_attn_weights,
                                                     bool is_causal) const {
  if (training_ && opt_.dropout > 0.0)
    fail(ErrorCode::Unsupported, kWhere,
         "dropout=" + python_float(opt_.dropout) +
             " in training mode is not supported (this runtime serves inference; call eval())");
  if (!query.defined()) fail(ErrorCode::Arg, kWhere, "query is required");
  const Tensor& key = key_in.defined() ? key_in : query;
  const Tensor& value = value_in.defined() ? value_in : key;
  check_float_input("query", query);
  check_float_input("key", key);
  check_float_input("value", value);

  // ---- shapes
  const int64_t E = opt_.embed_dim, H = opt_.num_heads, D = E / H;
  if (query.dim() != 2 && query.dim() != 3)
    shape_error(named("query", query) + " must be 2-D (unbatched [L, E]) or 3-D (batched)");
  const bool batched = query.dim() == 3;
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"key", &key},
                                std::pair<const char*, const Tensor*>{"value", &value}})
    if (t->dim() != query.dim())
      shape_error(named(name, *t) + " must be " + std::to_string(query.dim()) + "-D like " +
                  named("query", query));
  // batch_first only applies to batched input (PyTorch ignores it for unbatched).
  const bool bf = batched && opt_.batch_first;
  const int64_t seq_dim = bf ? 1 : 0, batch_dim = bf ? 0 : 1;
  const int64_t L = query.size(seq_dim), S = key.size(seq_dim);
  const int64_t N = batched ? query.size(batch_dim) : 1;
  if (query.size(-1) != E)
    shape_error(named("query", query) + " must end in embed_dim=" + std::to_string(E));
  if (key.size(-1) != kdim())
    shape_error(named("key", key) + " must end in kdim=" + std::to_string(kdim()));
  if (value.size(-1) != vdim())
    shape_error(named("value", value) + " must end in vdim=" + std::to_string(vdim()));
  if (batched) {
    if (key.size(batch_dim) != N)
      shape_error(named("key", key) + " and " + named("query", query) +
                  " must have the same batch size (dim " + std::to_string(batch_dim) + ")");
    if (value.size(batch_dim) != N)
      shape_error(named("value", value) + " and " + named("query", query) +
                  " must have the same batch size (dim " + std::to_string(batch_dim) + ")");
  }
  if (value.size(seq_dim) != S)
    shape_error(named("value", value) + " and " + named("key", key) +
                " must have the same source length (dim " + std::to_string(seq_dim) + ")");

  const int64_t extra = (opt_.add_bias_kv ? 1 : 0) + (opt_.add_zero_attn ? 1 : 0);
  const int64_t Sp = S + extra;  // S'

  // Masks are given for the S real keys, as PyTorch takes them (it pads them with zeros after
  // appending bias_k and again after the zero position); the appended positions are "keep".
  // A mask already S' wide (mha_semantics.md writes (L, S')) is accepted too and applied as
  // given; the two widths differ only when positions are appended.
  if (attn_mask.defined()) {
    check_mask_dtype("attn_mask", attn_mask);
    const int64_t rows3 = batched ? N * H : H;
    const Shape m = attn_mask.shape();
    const bool width_ok = attn_mask.dim() >= 2 && (m.back() == S || m.back() == Sp);
    const bool ok = width_ok && ((attn_mask.dim() == 2 && m[0] == L) ||
                                 (attn_mask.dim() == 3 && m[0] == rows3 && m[1] == L));
    if (!ok)
      shape_error(named("attn_mask", attn_mask) + " must be " + shape_to_string({L, S}) +
                  " (L, S) or " + shape_to_string({rows3, L, S}) +
                  (batched ? " (N*num_heads, L, S)" : " (num_heads, L, S)") + " for " +
                  named("query", query) + " and " + named("key", key));
  }
  if (key_padding_mask.defined()) {
    check_mask_dtype("key_padding_mask", key_padding_mask);
    const Shape want = batched ? Shape{N, S} : Shape{S};
    if (key_padding_mask.shape() != want)
      shape_error(named("key_padding_mask", key_padding_mask) + " must be " +
                  shape_to_string(want) + (batched ? " (N, S)" : " (S)") + " for " +
                  named("query", query) + " and " + named("key", key));
  }

  // ---- outputs
  MultiheadAttentionOutput result;
  result.output = Tensor::empty(query.shape(), DType::F32);
  if (need_weights) {
    // The core writes [N, H, L, S'], or their mean over heads straight into [N, L, S'].
    const Shape per_head = batched ? Shape{N, H, L, Sp} : Shape{H, L, Sp};
    const Shape averaged = batched ? Shape{N, L, Sp} : Shape{L, Sp};
    result.weights = Tensor::empty(average_attn_weights ? averaged : per_head, DType::F32);
  }
  if (N == 0 || L == 0) return result;

  const Device& device = cpu_device();

  // ---- parameters as float32 (views unless stored in another dtype)
  const bool packed = packed_in_proj();
  Tensor w_in, w_q, w_k, w_v, b_in, bias_k, bias_v;
  if (packed) {
    w_in = param_f32(params_, "in_proj_weight");
  } else {
    w_q = param_f32(params_, "q_proj_weight");
    w_k = param_f32(params_, "k_proj_weight");
    w_v = param_f32(params_, "v_proj_weight");
  }
  if (opt_.bias) b_in = param_f32(params_, "in_proj_bias");
  if (opt_.add_bias_kv) {
    bias_k = param_f32(params_, "bias_k");
    bias_v = param_f32(params_, "bias_v");
  }
  const Tensor w_out = param_f32(params_, "out_proj.weight");
  const Tensor b_out = opt_.bias ? param_f32(params_, "out_proj.bias") : Tensor();
  const float* bq = opt_.bias ? b_in.data<float>() : nullptr;
  const float* bk = bq ? bq + E : nullptr;
  const float* bv = bq ? bq + 2 * E : nullptr;

  // ---- in-projection (step 2) and appended positions (step 3)
  const bool self_attention = packed && same_tensor(query, key) && same_tensor(key, value);
  Tensor proj;  // every projection output of this call
  const float *q, *k, *v;
  Layout q_layout, kv_layout;
  if (self_attention) {
    // L == S here. One [rows, 3E] buffer with S' positions per sequence: the q columns of the
    // appended rows are never read.
    const RowMatrix x = as_rows(query);
    q_layout = kv_layout = Layout{bf, N, Sp, 3 * E};
    proj = Tensor::empty({N * Sp * 3 * E}, DType::F32);
    float* base = proj.data<float>();
    project(device, x, L, E, 3 * E, w_in.data<float>(), bq, base, q_layout);
    q = base;
    k = base + E;
    v = base + 2 * E;
  } else {
    q_layout = Layout{bf, N, L, E};
    kv_layout = Layout{bf, N, Sp, E};
    proj = Tensor::empty({(N * L + 2 * N * Sp) * E}, DType::F32);
    float* qb = proj.data<float>();
    float* kb = qb + N * L * E;
    float* vb = kb + N * Sp * E;
    const float* wq = packed ? w_in.data<float>() : w_q.data<float>();
    const float* wk = packed ? wq + E * E : w_k.data<float>();
    const float* wv = packed ? wq + 2 * E * E : w_v.data<float>();
    const RowMatrix xq = as_rows(query);
    const RowMatrix xk = same_tensor(key, query) ? xq : as_rows(key);
    const RowMatrix xv = same_tensor(value, key) ? xk : as_rows(value);
    project(device, xq, L, E, E, wq, bq, qb, q_layout);
    if (S > 0) {
      project(device, xk, S, kdim(), E, wk, bk, kb, kv_layout);
      project(device, xv, S, vdim(), E, wv, bv, vb, kv_layout);
    }
    q = qb;
    k = kb;
    v = vb;
  }
  {
    float* kw = const_cast<float*>(k);  // the buffer is ours; k/v are const for the core
    float* vw = const_cast<float*>(v);
    int64_t pos = S;
    if (opt_.add_bias_kv) {
      fill_position(kw, kv_layout, pos, E, bias_k.data<float>());
      fill_position(vw, kv_layout, pos, E, bias_v.data<float>());
      ++pos;
    }
    if (opt_.add_zero_attn) {
      fill_position(kw, kv_layout, pos, E, nullptr);
      fill_position(vw, kv_layout, pos, E, nullptr);
    }
  }

  // ---- masks (step 4)
  // The core applies an upper-left causal mask to all of its keys; with appended positions
  // (which are never masked) the causal part is materialised instead.
  const bool causal = is_causal && !attn_mask.defined();
  const bool causal_in_core = causal && extra == 0;
  const bool causal_in_buffer = causal && extra > 0;
  Tensor mask_buf;
  AttentionArgs args;
  if (attn_mask.defined() || key_padding_mask.defined() || causal_in_buffer) {
    const bool per_batch =
        key_padding_mask.defined() || (attn_mask.defined() && attn_mask.dim() == 3);
    const bool per_head = attn_mask.defined() && attn_mask.dim() == 3;
    const bool per_row = attn_mask.defined() || causal_in_buffer;
    const int64_t Nb = per_batch ? N : 1, Hb = per_head ? H : 1, Lb = per_row ? L : 1;
    mask_buf = Tensor::zeros({Nb, Hb, Lb, Sp}, DType::F32);
    float* mb = mask_buf.data<float>();
    const int64_t row_stride = Sp, head_stride = Lb * Sp, batch_stride = Hb * Lb * Sp;
    if (attn_mask.defined()) {
      const MaskReader m(attn_mask);
      const int64_t cols = attn_mask.size(-1);
      const int64_t sr = m.stride(-2), sc = m.stride(-1);
      for (int64_t n = 0; n < Nb; ++n)
        for (int64_t h = 0; h < Hb; ++h) {
          const int64_t base = attn_mask.dim() == 3 ? (n * H + h) * m.stride(0) : 0;
          for (int64_t l = 0; l < L; ++l) {
            float* dst = mb + n * batch_stride + h * head_stride + l * row_stride;
            for (int64_t s = 0; s < cols; ++s) dst[s] += m.at(base + l * sr + s * sc);
          }
        }
    }
    if (key_padding_mask.defined()) {
      const MaskReader m(key_padding_mask);
      const int64_t sn = batched ? m.stride(0) : 0, ss = m.stride(-1);
      for (int64_t n = 0; n < Nb; ++n)
        for (int64_t hl = 0; hl < Hb * Lb; ++hl) {
          float* dst = mb + n * batch_stride + hl * row_stride;
          for (int64_t s = 0; s < S; ++s) dst[s] += m.at(n * sn + s * ss);
        }
    }
    if (causal_in_buffer)
      for (int64_t nh = 0; nh < Nb * Hb; ++nh)
        for (int64_t l = 0; l < L; ++l) {
          float* dst = mb + nh * head_stride + l * row_stride;
          for (int64_t s = l + 1; s < S; ++s) dst[s] = kNegInf;
        }
    args.mask = mb;
    args.mask_batch_stride = per_batch ? batch_stride : 0;
    args.mask_head_stride = per_head ? head_stride : 0;
    args.mask_row_stride = per_row ? row_stride : 0;
  }

  // ---- attention (step 5) and out-projection (step 6)
  const Layout out_layout{bf, N, L, E};
  Tensor attn_out = Tensor::empty({N * L * E}, DType::F32);
  args.batch = N;
  args.heads = H;
  args.q_len = L;
  args.kv_len = Sp;
  args.head_dim = D;
  args.v_head_dim = D;
  args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  args.q = q;
  args.q_batch_stride = q_layout.batch_stride();
  args.q_row_stride = q_layout.row_stride();
  args.q_head_stride = D;
  args.k = k;
  args.k_batch_stride = kv_layout.batch_stride();
  args.k_row_stride = kv_layout.row_stride();
  args.k_head_stride = D;
  args.v = v;
  args.v_batch_stride = kv_layout.batch_stride();
  args.v_row_stride = kv_layout.row_stride();
  args.v_head_stride = D;
  args.out = attn_out.data<float>();
  args.out_batch_stride = out_layout.batch_stride();
  args.out_row_stride = out_layout.row_stride();
  args.out_head_stride = D;
  args.causal = causal_in_core;
  args.weights = need_weights ? result.weights.data<float>() : nullptr;
  args.average_weights = average_attn_weights;
  attention_forward_f32(device, args);

  // The attention output rows are in the output's own row order (l*N + n or n*L + l).
  linear_forward_f32(device, N * L, E, E, attn_out.data<float>(), E, w_out.data<float>(),
                     opt_.bias ? b_out.data<float>() : nullptr, result.output.data<float>(), E);

  return result;
}

}  // namespace tessera
