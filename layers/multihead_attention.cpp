// torch.nn.MultiheadAttention, inference, on the shared attention core: the C++ layer and the
// network's `multihead_attention` op, one set of rules for both (validate_mha_options,
// infer_mha, mha_scratch, mha_forward_f32 below).
//
// One call, sequence-first [L, N, E] shown (batch-first swaps the two outer dims; unbatched
// input is N = 1 sequence-first):
//   1. query/key/value are float32 row matrices (the plan's values are; the C++ layer converts
//      others first).
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
// Scratch (one workspace, laid out by mha_scratch): the projection buffer, the attention output,
// at most one mask buffer, the projections' packed input and the core's tiles.
//
// Parameter dtype: the C++ layer stores parameters in options.dtype (float32, float64, float16
// or bfloat16); compute is always float32. A non-float32 parameter set is converted to float32
// at the start of each forward of the layer (E*(4E + 2) floats for the packed layout, 16 KB at
// E = 64). Networks hold float32 parameters.
#include "layers/multihead_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/text.h"
#include "layers/attention_core.h"
#include "layers/linear.h"
#include "layers/op_args.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "multihead_attention";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Same storage, offset, shape, strides and dtype: the same values, read the same way. This is
// PyTorch's `query is key` test made robust to views that were created separately.
bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.offset() == b.offset() && a.dtype() == b.dtype() &&
         a.shape() == b.shape() && a.strides() == b.strides();
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

// y (positions [0, len_in) of every sequence, laid out by `out`) = x W^T + b, x contiguous rows
// of in_features. The input rows are in the same order as the buffer's, except that a
// batch-first buffer with appended positions has a gap after each sequence: then one GEMM per
// sequence.
void project(const Device& device, const float* x, int64_t len_in, int64_t in_features,
             int64_t out_features, ProjectionWeight w, const float* bias, float* y,
             const Layout& out, float* linear_ws) {
  if (!out.batch_first || out.len == len_in) {
    linear_forward_f32(device, len_in * out.batch, in_features, out_features, x, in_features, w,
                       bias, y, out.ld, linear_ws);
    return;
  }
  for (int64_t b = 0; b < out.batch; ++b)
    linear_forward_f32(device, len_in, in_features, out_features, x + b * len_in * in_features,
                       in_features, w, bias, y + b * out.batch_stride(), out.ld, linear_ws);
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

// Reads a bool or float32 mask element by element through its strides, as an additive float:
// bool true -> -inf, false -> 0; float values as they are. Holds no copy of the tensor.
class MaskReader {
 public:
  explicit MaskReader(const Tensor& m) : t_(m) {
    if (m.dtype() == DType::Bool)
      bytes_ = static_cast<const uint8_t*>(m.raw_data());
    else
      floats_ = m.numel() > 0 ? m.data<float>() : nullptr;
  }
  int64_t stride(int64_t d) const { return t_.stride(d); }
  float at(int64_t off) const {
    if (bytes_) return bytes_[off] != 0 ? kNegInf : 0.0f;
    return floats_[off];
  }

 private:
  const Tensor& t_;
  const uint8_t* bytes_ = nullptr;
  const float* floats_ = nullptr;
};

// The dims one call works on, from the input shapes (already checked by infer_mha).
struct MhaDims {
  int64_t N, L, S, Sp, E, H, D, kdim, vdim;
  bool batched, batch_first;
};

MhaDims mha_dims(const MultiheadAttentionOptions& o, const Shape& q, const Shape& k) {
  MhaDims d{};
  d.batched = q.size() == 3;
  d.batch_first = d.batched && o.batch_first;  // PyTorch ignores batch_first when unbatched
  const size_t seq = d.batch_first ? 1 : 0, batch = d.batch_first ? 0 : 1;
  d.L = q[seq];
  d.S = k[seq];
  d.N = d.batched ? q[batch] : 1;
  d.E = o.embed_dim;
  d.H = o.num_heads;
  d.D = d.E / d.H;
  d.kdim = o.kdim.value_or(d.E);
  d.vdim = o.vdim.value_or(d.E);
  d.Sp = d.S + (o.add_bias_kv ? 1 : 0) + (o.add_zero_attn ? 1 : 0);
  return d;
}

// What the masks of one call make of the mask buffer (step 4): which of its dims are real.
struct MaskPlan {
  bool any = false, per_batch = false, per_head = false, per_row = false;
  bool causal_in_core = false;
  int64_t Nb = 1, Hb = 1, Lb = 1;
  int64_t floats() const { return any ? Nb * Hb * Lb : 0; }
};

MaskPlan mask_plan(const MhaDims& d, const MhaCall& call, bool has_kpm, bool has_attn_mask,
                   int64_t attn_mask_rank) {
  // The core applies an upper-left causal mask to all of its keys; with appended positions
  // (which are never masked) the causal part is materialised instead.
  const bool causal = call.is_causal && !has_attn_mask;
  const bool causal_in_buffer = causal && d.Sp > d.S;
  MaskPlan m;
  m.causal_in_core = causal && d.Sp == d.S;
  m.any = has_attn_mask || has_kpm || causal_in_buffer;
  m.per_batch = has_kpm || (has_attn_mask && attn_mask_rank == 3);
  m.per_head = has_attn_mask && attn_mask_rank == 3;
  m.per_row = has_attn_mask || causal_in_buffer;
  m.Nb = m.per_batch ? d.N : 1;
  m.Hb = m.per_head ? d.H : 1;
  m.Lb = m.per_row ? d.L : 1;
  return m;
}

// The attention core's arguments for this call; pointers filled by the caller (null while
// sizing the scratch).
AttentionArgs core_args(const MhaDims& d, const MhaCall& call, const MaskPlan& m, bool self) {
  const Layout q_layout =
      self ? Layout{d.batch_first, d.N, d.Sp, 3 * d.E} : Layout{d.batch_first, d.N, d.L, d.E};
  const Layout kv_layout = Layout{d.batch_first, d.N, d.Sp, self ? 3 * d.E : d.E};
  const Layout out_layout{d.batch_first, d.N, d.L, d.E};
  AttentionArgs a;
  a.batch = d.N;
  a.heads = d.H;
  a.q_len = d.L;
  a.kv_len = d.Sp;
  a.head_dim = d.D;
  a.v_head_dim = d.D;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.D)));
  a.q_batch_stride = q_layout.batch_stride();
  a.q_row_stride = q_layout.row_stride();
  a.q_head_stride = d.D;
  a.k_batch_stride = kv_layout.batch_stride();
  a.k_row_stride = kv_layout.row_stride();
  a.k_head_stride = d.D;
  a.v_batch_stride = kv_layout.batch_stride();
  a.v_row_stride = kv_layout.row_stride();
  a.v_head_stride = d.D;
  a.out_batch_stride = out_layout.batch_stride();
  a.out_row_stride = out_layout.row_stride();
  a.out_head_stride = d.D;
  a.causal = m.causal_in_core;
  a.need_weights = call.need_weights;
  a.average_weights = call.average_attn_weights;
  if (m.any) {
    const int64_t row_stride = d.Sp, head_stride = m.Lb * d.Sp, batch_stride = m.Hb * head_stride;
    a.mask_batch_stride = m.per_batch ? batch_stride : 0;
    a.mask_head_stride = m.per_head ? head_stride : 0;
    a.mask_row_stride = m.per_row ? row_stride : 0;
  }
  return a;
}

// The scratch of one call, laid out in `ws` (mha_scratch sizes it through the same function).
struct MhaScratch {
  float* proj = nullptr;      // every projection output of this call
  float* attn_out = nullptr;  // [N*L, E], the out-projection's input
  float* mask = nullptr;      // MaskPlan::floats() * S'
  float* linear = nullptr;    // the projections' packed input, one at a time
  AttentionScratch core;
};

MhaScratch layout_scratch(const Device& device, const MhaDims& d, const MaskPlan& m,
                          const AttentionArgs& args, bool self, Workspace& ws) {
  MhaScratch s;
  if (d.N == 0 || d.L == 0) return s;
  s.proj = ws.take<float>(self ? d.N * d.Sp * 3 * d.E : (d.N * d.L + 2 * d.N * d.Sp) * d.E);
  s.attn_out = ws.take<float>(d.N * d.L * d.E);
  s.mask = ws.take<float>(m.floats() * d.Sp);
  // Projections run one after another: one packed-input region sized for the largest.
  const int64_t linear =
      std::max({linear_workspace_floats(device, d.N * d.L, d.E, self ? 3 * d.E : d.E),
                self ? 0 : linear_workspace_floats(device, d.N * d.S, d.kdim, d.E),
                self ? 0 : linear_workspace_floats(device, d.N * d.S, d.vdim, d.E),
                linear_workspace_floats(device, d.N * d.L, d.E, d.E)});
  s.linear = ws.take<float>(linear);
  s.core = attention_scratch(device, args, ws);
  return s;
}

// ------------------------------------------------------------- incremental (cached) forward
// Causal self-attention one step at a time (generation): the packed in-projection of the new
// positions only, the cached attention core (keys and values of every earlier position kept in
// the node's cache), the out-projection. The prompt (past == 0) takes the same GEMMs and the same
// fused causal kernel as mha_forward_f32, so its outputs are the full forward's.
CachedAttentionArgs cached_core_args(const MhaDims& d, int64_t past, int64_t capacity) {
  return {core_args(d, MhaCall{false, false, true}, MaskPlan{}, true), past, capacity, nullptr};
}

struct MhaCachedScratch {
  float* qkv = nullptr;       // [rows, 3E]
  float* attn_out = nullptr;  // [rows, E]
  float* linear = nullptr;
  CachedAttentionScratch core;
};

MhaCachedScratch layout_cached_scratch(const Device& device, const MhaDims& d,
                                       const CachedAttentionArgs& c, Workspace& ws) {
  MhaCachedScratch s;
  if (d.N == 0 || d.L == 0) return s;
  s.qkv = ws.take<float>(d.N * d.L * 3 * d.E);
  s.attn_out = ws.take<float>(d.N * d.L * d.E);
  s.linear = ws.take<float>(std::max(linear_workspace_floats(device, d.N * d.L, d.E, 3 * d.E),
                                     linear_workspace_floats(device, d.N * d.L, d.E, d.E)));
  s.core = cached_attention_scratch(device, c, ws);
  return s;
}

}  // namespace

size_t mha_cached_workspace_bytes(const MultiheadAttentionOptions& options, const Shape& query,
                                  int64_t capacity) {
  const MhaDims d = mha_dims(options, query, query);
  Workspace counting;
  layout_cached_scratch(cpu_device(), d, cached_core_args(d, 0, capacity), counting);
  return counting.peak();
}

int64_t mha_cache_floats(const MultiheadAttentionOptions& options, int64_t batch,
                         int64_t capacity) {
  const int64_t D = options.embed_dim / options.num_heads;
  return cached_attention_cache_floats(batch, options.num_heads, D, D, capacity);
}

void mha_forward_cached_f32(const MultiheadAttentionOptions& opt, const MhaWeights& w,
                            const Tensor& query, Tensor& output, const StepState& step,
                            Workspace& ws) {
  const MhaDims d = mha_dims(opt, query.shape(), query.shape());
  if (d.N == 0 || d.L == 0) return;
  const Device& device = cpu_device();
  CachedAttentionArgs c = cached_core_args(d, step.past, step.capacity);
  const MhaCachedScratch s = layout_cached_scratch(device, d, c, ws);
  // The new positions' q | k | v: one GEMM over their rows, in the input's own row order.
  linear_forward_f32(device, d.N * d.L, d.E, 3 * d.E, query.data<float>(), d.E, w.in_proj_weight,
                     w.in_proj_bias, s.qkv, 3 * d.E, s.linear);
  c.step.q = s.qkv;
  c.step.k = s.qkv + d.E;
  c.step.v = s.qkv + 2 * d.E;
  c.step.out = s.attn_out;
  c.cache = step.cache;
  cached_attention_f32(device, c, s.core);
  linear_forward_f32(device, d.N * d.L, d.E, d.E, s.attn_out, d.E, w.out_proj_weight,
                     w.out_proj_bias, output.data<float>(), d.E, s.linear);
}

// ------------------------------------------------------------------------------- the rules

void validate_mha_options(const MultiheadAttentionOptions& o, const std::string& where) {
  if (o.device != "cpu")
    fail(ErrorCode::Unsupported, where, "device '" + o.device + "' is not supported (only 'cpu')");
  if (o.embed_dim <= 0)
    fail(ErrorCode::Constraint, where, "embed_dim=" + str(o.embed_dim) + " must be > 0");
  if (o.num_heads <= 0)
    fail(ErrorCode::Constraint, where, "num_heads=" + str(o.num_heads) + " must be > 0");
  if (o.embed_dim % o.num_heads != 0)
    fail(ErrorCode::Constraint, where,
         "num_heads=" + str(o.num_heads) + " must divide embed_dim=" + str(o.embed_dim));
  if (!(o.dropout >= 0.0 && o.dropout <= 1.0))  // also rejects NaN
    fail(ErrorCode::Constraint, where, "dropout=" + py_float(o.dropout) + " must be in [0, 1]");
  if (o.kdim && *o.kdim <= 0)
    fail(ErrorCode::Constraint, where, "kdim=" + str(*o.kdim) + " must be > 0");
  if (o.vdim && *o.vdim <= 0)
    fail(ErrorCode::Constraint, where, "vdim=" + str(*o.vdim) + " must be > 0");
  if (!dtype_is_floating(o.dtype))
    fail(ErrorCode::DType, where,
         std::string("parameter dtype ") + dtype_name(o.dtype) +
             " is not a float type (float32, float64, float16 or bfloat16)");
}

std::vector<std::pair<std::string, Shape>> mha_parameter_shapes(
    const MultiheadAttentionOptions& o) {
  const int64_t E = o.embed_dim;
  const int64_t kdim = o.kdim.value_or(E), vdim = o.vdim.value_or(E);
  std::vector<std::pair<std::string, Shape>> p;
  if (kdim == E && vdim == E) {
    p.emplace_back("in_proj_weight", Shape{3 * E, E});
  } else {
    p.emplace_back("q_proj_weight", Shape{E, E});
    p.emplace_back("k_proj_weight", Shape{E, kdim});
    p.emplace_back("v_proj_weight", Shape{E, vdim});
  }
  if (o.bias) p.emplace_back("in_proj_bias", Shape{3 * E});
  if (o.add_bias_kv) {
    p.emplace_back("bias_k", Shape{1, 1, E});
    p.emplace_back("bias_v", Shape{1, 1, E});
  }
  p.emplace_back("out_proj.weight", Shape{E, E});
  if (o.bias) p.emplace_back("out_proj.bias", Shape{E});
  return p;
}

InferResult infer_mha(const MultiheadAttentionOptions& opt, const MhaCall& call,
                      const InputTypes& in, const std::string& where) {
  const int64_t E = opt.embed_dim, H = opt.num_heads;
  const int64_t kdim = opt.kdim.value_or(E), vdim = opt.vdim.value_or(E);
  const ValueType& q = *in[0];
  const ValueType& k = in[1] ? *in[1] : q;
  const ValueType& v = in[2] ? *in[2] : k;
  require_float("query", q, "multihead_attention", where);
  require_float("key", k, "multihead_attention", where);
  require_float("value", v, "multihead_attention", where);
  const size_t rank = q.shape.size();
  if (rank != 2 && rank != 3)
    fail(ErrorCode::Shape, where,
         named("query", q) + " must be 2-D (unbatched [L, E]) or 3-D (batched)");
  for (const auto& [port, t] : {std::pair<const char*, const ValueType*>{"key", &k},
                                std::pair<const char*, const ValueType*>{"value", &v}})
    if (t->shape.size() != rank)
      fail(ErrorCode::Shape, where,
           named(port, *t) + " must be " + str(static_cast<int64_t>(rank)) + "-D like " +
               named("query", q));
  const bool batched = rank == 3;
  const bool bf = batched && opt.batch_first;  // batch_first is ignored for unbatched input
  const size_t seq = bf ? 1 : 0, batch = bf ? 0 : 1;
  const Dim L = q.shape[seq], S = k.shape[seq];
  const Dim N = batched ? q.shape[batch] : Dim::fixed(1);
  auto check = [&](const Dim& got, const Dim& want, const std::string& what) {
    if (differ(got, want)) fail(ErrorCode::Shape, where, what);
  };
  check(q.shape.back(), Dim::fixed(E), named("query", q) + " must end in embed_dim=" + str(E));
  check(k.shape.back(), Dim::fixed(kdim), named("key", k) + " must end in kdim=" + str(kdim));
  check(v.shape.back(), Dim::fixed(vdim), named("value", v) + " must end in vdim=" + str(vdim));
  if (batched) {
    check(k.shape[batch], N,
          named("key", k) + " and " + named("query", q) + " must have the same batch size");
    check(v.shape[batch], N,
          named("value", v) + " and " + named("query", q) + " must have the same batch size");
  }
  check(v.shape[seq], S,
        named("value", v) + " and " + named("key", k) + " must have the same source length");
  const int64_t extra = (opt.add_bias_kv ? 1 : 0) + (opt.add_zero_attn ? 1 : 0);
  const Dim Sp = dim_sum({S, Dim::fixed(extra)}, where);

  // Masks are given for the S real keys, as PyTorch takes them (it pads them with zeros after
  // appending bias_k and again after the zero position); the appended positions are "keep".
  // A mask already S' wide (mha_semantics.md writes (L, S')) is accepted too and applied as
  // given; the two widths differ only when positions are appended.
  if (const ValueType* m = in[3]) {  // key_padding_mask: (N, S), unbatched (S)
    require_mask("key_padding_mask", *m, where);
    const SymShape want = batched ? SymShape{N, S} : SymShape{S};
    bool ok = m->shape.size() == want.size();
    for (size_t i = 0; ok && i < want.size(); ++i) ok = !differ(m->shape[i], want[i]);
    if (!ok)
      fail(ErrorCode::Shape, where,
           named("key_padding_mask", *m) + " must be " + sym_shape_to_string(want));
  }
  if (const ValueType* m = in[4]) {  // attn_mask: (L, S) or (N*H, L, S); S' wide accepted
    require_mask("attn_mask", *m, where);
    const Dim rows3 = batched ? dim_mul(N, Dim::fixed(H), where) : Dim::fixed(H);
    const SymShape& s = m->shape;
    bool ok = (s.size() == 2 && !differ(s[0], L)) ||
              (s.size() == 3 && !differ(s[0], rows3) && !differ(s[1], L));
    ok = ok && !(differ(s.back(), S) && differ(s.back(), Sp));
    if (!ok)
      fail(ErrorCode::Shape, where,
           named("attn_mask", *m) + " must be " + sym_shape_to_string({L, S}) + " or " +
               sym_shape_to_string({rows3, L, S}));
  }

  InferResult r;
  SymShape out = q.shape;
  out.back() = Dim::fixed(E);
  r.outputs.push_back({out, DType::F32});
  if (call.need_weights) {
    SymShape w;
    if (batched) w.push_back(N);
    if (!call.average_attn_weights) w.push_back(Dim::fixed(H));
    w.push_back(L);
    w.push_back(Sp);
    r.outputs.push_back({w, DType::F32});
  }
  r.parameters = mha_parameter_shapes(opt);
  return r;
}

double mha_flops(const MultiheadAttentionOptions& opt, const Shape& query, const Shape& key) {
  const MhaDims d = mha_dims(opt, query, key);
  const auto f = [](int64_t v) { return static_cast<double>(v); };
  // q, k, v and out projections; q k^T and p v over all heads (2*L*S'*E each).
  return 2.0 * f(d.N) *
             (f(d.L) * f(d.E) * f(d.E) + f(d.S) * f(d.kdim) * f(d.E) + f(d.S) * f(d.vdim) * f(d.E) +
              f(d.L) * f(d.E) * f(d.E)) +
         4.0 * f(d.N) * f(d.L) * f(d.Sp) * f(d.E);
}

size_t mha_workspace_bytes(const MultiheadAttentionOptions& opt, const MhaCall& call,
                           const Shape& query, const Shape& key, bool has_kpm,
                           const Shape* attn_mask) {
  const MhaDims d = mha_dims(opt, query, key);
  const MaskPlan m = mask_plan(d, call, has_kpm, attn_mask != nullptr,
                               attn_mask ? static_cast<int64_t>(attn_mask->size()) : 0);
  // Whether the call is self-attention is decided by the tensors' identity at run time (one
  // tensor passed as query, key and value); the workspace covers both layouts.
  size_t bytes = 0;
  for (const bool self : {false, true}) {
    if (self && !(d.kdim == d.E && d.vdim == d.E && d.L == d.S)) continue;
    Workspace counter;
    layout_scratch(cpu_device(), d, m, core_args(d, call, m, self), self, counter);
    bytes = std::max(bytes, counter.peak());
  }
  return bytes;
}

namespace {

// Steps 2 and 3: the in-projections into s.proj, then the appended key/value positions. Returns
// where q, k and v start (strides: core_args).
struct ProjectedQkv {
  const float *q, *k, *v;
};

ProjectedQkv project_qkv(const MultiheadAttentionOptions& opt, const MhaWeights& w,
                         const MhaDims& d, bool self, const Tensor& query, const Tensor& key,
                         const Tensor& value, const MhaScratch& s) {
  const Device& device = cpu_device();
  const int64_t N = d.N, L = d.L, S = d.S, E = d.E;
  const bool packed = d.kdim == E && d.vdim == E;
  const float* bq = w.in_proj_bias;
  const float* bk = bq ? bq + E : nullptr;
  const float* bv = bq ? bq + 2 * E : nullptr;
  const Layout kv_layout{d.batch_first, N, d.Sp, self ? 3 * E : E};
  float *q, *k, *v;
  if (self) {
    // L == S here. One [rows, 3E] buffer with S' positions per sequence: the q columns of the
    // appended rows are never read.
    project(device, query.data<float>(), L, E, 3 * E, w.in_proj_weight, bq, s.proj, kv_layout,
            s.linear);
    q = s.proj;
    k = s.proj + E;
    v = s.proj + 2 * E;
  } else {
    const Layout q_layout{d.batch_first, N, L, E};
    q = s.proj;
    k = q + N * L * E;
    v = k + N * d.Sp * E;
    // Rows E.. and 2E.. of a packed in_proj: its panels start there when E is a whole number of
    // panels (LinearKernels::weight_panel), else those rows are read in place.
    const LinearKernels* lk = device.kernels().linear(DType::F32);
    auto rows_from = [&](const ProjectionWeight& pw, int64_t row) {
      const bool whole = pw.panels != nullptr && lk != nullptr && E % lk->weight_panel == 0;
      return ProjectionWeight(pw.rows + row * E, whole ? pw.panels + row * E : nullptr);
    };
    const ProjectionWeight wq = packed ? rows_from(w.in_proj_weight, 0) : w.q_proj_weight;
    const ProjectionWeight wk = packed ? rows_from(w.in_proj_weight, E) : w.k_proj_weight;
    const ProjectionWeight wv = packed ? rows_from(w.in_proj_weight, 2 * E) : w.v_proj_weight;
    project(device, query.data<float>(), L, E, E, wq, bq, q, q_layout, s.linear);
    if (S > 0) {
      project(device, key.data<float>(), S, d.kdim, E, wk, bk, k, kv_layout, s.linear);
      project(device, value.data<float>(), S, d.vdim, E, wv, bv, v, kv_layout, s.linear);
    }
  }
  int64_t pos = S;
  if (opt.add_bias_kv) {
    fill_position(k, kv_layout, pos, E, w.bias_k);
    fill_position(v, kv_layout, pos, E, w.bias_v);
    ++pos;
  }
  if (opt.add_zero_attn) {
    fill_position(k, kv_layout, pos, E, nullptr);
    fill_position(v, kv_layout, pos, E, nullptr);
  }
  return {q, k, v};
}

// Step 4: the one additive float mask [Nb, Hb, Lb, S'] (MaskPlan) in `mb`.
void fill_mask(const MhaDims& d, const MaskPlan& m, const Tensor* key_padding_mask,
               const Tensor* attn_mask, float* mb) {
  const int64_t L = d.L, S = d.S, H = d.H;
  std::fill(mb, mb + m.floats() * d.Sp, 0.0f);
  const int64_t row_stride = d.Sp, head_stride = m.Lb * d.Sp, batch_stride = m.Hb * head_stride;
  if (attn_mask) {
    const MaskReader mr(*attn_mask);
    const int64_t cols = attn_mask->size(-1);
    const int64_t sr = mr.stride(-2), sc = mr.stride(-1);
    for (int64_t n = 0; n < m.Nb; ++n)
      for (int64_t h = 0; h < m.Hb; ++h) {
        const int64_t base = attn_mask->dim() == 3 ? (n * H + h) * mr.stride(0) : 0;
        for (int64_t l = 0; l < L; ++l) {
          float* dst = mb + n * batch_stride + h * head_stride + l * row_stride;
          for (int64_t c = 0; c < cols; ++c) dst[c] += mr.at(base + l * sr + c * sc);
        }
      }
  }
  if (key_padding_mask) {
    const MaskReader mr(*key_padding_mask);
    const int64_t sn = d.batched ? mr.stride(0) : 0, ss = mr.stride(-1);
    for (int64_t n = 0; n < m.Nb; ++n)
      for (int64_t hl = 0; hl < m.Hb * m.Lb; ++hl) {
        float* dst = mb + n * batch_stride + hl * row_stride;
        for (int64_t c = 0; c < S; ++c) dst[c] += mr.at(n * sn + c * ss);
      }
  }
  if (m.per_row && !attn_mask)  // the causal part, materialised (appended positions)
    for (int64_t nh = 0; nh < m.Nb * m.Hb; ++nh)
      for (int64_t l = 0; l < L; ++l) {
        float* dst = mb + nh * head_stride + l * row_stride;
        for (int64_t c = l + 1; c < S; ++c) dst[c] = kNegInf;
      }
}

}  // namespace

void mha_forward_f32(const MultiheadAttentionOptions& opt, const MhaWeights& w,
                     const MhaCall& call, const Tensor& query, const Tensor& key,
                     const Tensor& value, const Tensor* key_padding_mask,
                     const Tensor* attn_mask, Tensor& output, Tensor* weights, Workspace& ws) {
  const MhaDims d = mha_dims(opt, query.shape(), key.shape());
  if (d.N == 0 || d.L == 0) return;
  const Device& device = cpu_device();
  const bool packed = d.kdim == d.E && d.vdim == d.E;
  const bool self = packed && same_tensor(query, key) && same_tensor(key, value);
  const MaskPlan m = mask_plan(d, call, key_padding_mask != nullptr, attn_mask != nullptr,
                               attn_mask ? attn_mask->dim() : 0);
  AttentionArgs args = core_args(d, call, m, self);
  const MhaScratch s = layout_scratch(device, d, m, args, self, ws);

  const ProjectedQkv qkv = project_qkv(opt, w, d, self, query, key, value, s);
  if (m.any) {
    fill_mask(d, m, key_padding_mask, attn_mask, s.mask);
    args.mask = s.mask;
  }

  // Step 5: attention, straight into the out-projection's input rows (in the output's own row
  // order, l*N + n or n*L + l); step 6: the out-projection.
  args.q = qkv.q;
  args.k = qkv.k;
  args.v = qkv.v;
  args.out = s.attn_out;
  args.weights = call.need_weights ? weights->data<float>() : nullptr;
  attention_forward_f32(device, args, s.core);
  linear_forward_f32(device, d.N * d.L, d.E, d.E, s.attn_out, d.E, w.out_proj_weight,
                     w.out_proj_bias, output.data<float>(), d.E, s.linear);
}

// ------------------------------------------------------------------------------- the layer

MultiheadAttention::MultiheadAttention(const MultiheadAttentionOptions& options,
                                       std::optional<uint64_t> seed)
    : opt_(options) {
  validate_mha_options(opt_, kWhere);
  for (const auto& [name, shape] : mha_parameter_shapes(opt_))
    params_.add(name, shape, opt_.dtype).projection =
        opt_.dtype == DType::F32 && shape.size() == 2 && name.ends_with("weight");
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
  if (opt_.dropout != 0.0) s += ", dropout=" + py_float(opt_.dropout);
  s += std::string(", bias=") + py_bool(opt_.bias);
  if (opt_.add_bias_kv) s += ", add_bias_kv=True";
  if (opt_.add_zero_attn) s += ", add_zero_attn=True";
  if (kdim() != opt_.embed_dim) s += ", kdim=" + std::to_string(kdim());
  if (vdim() != opt_.embed_dim) s += ", vdim=" + std::to_string(vdim());
  s += std::string(", batch_first=") + py_bool(opt_.batch_first);
  if (opt_.dtype != DType::F32) s += std::string(", dtype=") + dtype_name(opt_.dtype);
  return s + ")";
}

MhaWeights mha_weights(const ParameterSet& p, const MultiheadAttentionOptions& o) {
  auto get = [&](std::string_view name) {
    const Parameter* param = p.find(name);
    return param ? param->value.data<float>() : nullptr;
  };
  auto projection = [&](std::string_view name) {
    return p.contains(name) ? p.projection(name) : ProjectionWeight();
  };
  MhaWeights w;
  w.in_proj_weight = projection("in_proj_weight");
  w.q_proj_weight = projection("q_proj_weight");
  w.k_proj_weight = projection("k_proj_weight");
  w.v_proj_weight = projection("v_proj_weight");
  w.in_proj_bias = o.bias ? get("in_proj_bias") : nullptr;
  w.bias_k = get("bias_k");
  w.bias_v = get("bias_v");
  w.out_proj_weight = projection("out_proj.weight");
  w.out_proj_bias = o.bias ? get("out_proj.bias") : nullptr;
  return w;
}

MultiheadAttentionOutput MultiheadAttention::forward(const Tensor& query, const Tensor& key_in,
                                                     const Tensor& value_in,
                                                     const Tensor& key_padding_mask,
                                                     bool need_weights, const Tensor& attn_mask,
                                                     bool average_attn_weights,
                                                     bool is_causal) const {
  if (training_ && opt_.dropout > 0.0)
    fail(ErrorCode::Unsupported, kWhere,
         "dropout=" + py_float(opt_.dropout) +
             " in training mode is not supported (this runtime serves inference; call eval())");
  if (!query.defined()) fail(ErrorCode::Arg, kWhere, "query is required");
  const Tensor& key = key_in.defined() ? key_in : query;
  const Tensor& value = value_in.defined() ? value_in : key;
  const MhaCall call{need_weights, average_attn_weights, is_causal};

  // The op's rules, on these shapes.
  auto type = [](const Tensor& t) { return ValueType{fixed_shape(t.shape()), t.dtype()}; };
  const ValueType tq = type(query), tk = type(key), tv = type(value);
  const ValueType tkpm = key_padding_mask.defined() ? type(key_padding_mask) : ValueType{};
  const ValueType tam = attn_mask.defined() ? type(attn_mask) : ValueType{};
  const InferResult r = infer_mha(opt_, call,
                                  {&tq, &tk, &tv, key_padding_mask.defined() ? &tkpm : nullptr,
                                   attn_mask.defined() ? &tam : nullptr},
                                  kWhere);

  MultiheadAttentionOutput result;
  result.output = Tensor::empty(query.shape(), DType::F32);
  if (need_weights) result.weights = Tensor::empty(concrete_shape(r.outputs[1].shape), DType::F32);

  // float32 row matrices (the inputs themselves when already so); one tensor passed as several
  // stays one, so self-attention is still recognised.
  const Tensor q = query.to(DType::F32).contiguous();
  const Tensor k = same_tensor(key, query) ? q : key.to(DType::F32).contiguous();
  const Tensor v = same_tensor(value, key) ? k : value.to(DType::F32).contiguous();
  auto mask = [](const Tensor& m) { return m.dtype() == DType::Bool ? m : m.to(DType::F32); };
  const Tensor kpm = key_padding_mask.defined() ? mask(key_padding_mask) : Tensor();
  const Tensor am = attn_mask.defined() ? mask(attn_mask) : Tensor();

  // float32 parameters (views unless stored in another dtype).
  ParameterSet f32;
  for (const Parameter& p : params_.all())
    f32.add(p.name, p.shape).value = p.value.to(DType::F32).contiguous();

  const size_t bytes = mha_workspace_bytes(opt_, call, q.shape(), k.shape(), kpm.defined(),
                                           am.defined() ? &am.shape() : nullptr);
  const Tensor scratch = Tensor::empty({static_cast<int64_t>(bytes / sizeof(float)) + 1});
  Workspace ws(scratch.raw_data(), scratch.nbytes());
  mha_forward_f32(opt_, mha_weights(f32, opt_), call, q, k, v, kpm.defined() ? &kpm : nullptr,
                  am.defined() ? &am : nullptr, result.output,
                  need_weights ? &result.weights : nullptr, ws);
  return result;
}

// ------------------------------------------------------------------------------- the op

namespace {

class MultiheadAttentionLayer : public OpLayer {
 public:
  MultiheadAttentionLayer(const MultiheadAttentionOptions& options, std::optional<uint64_t> seed,
                          const MhaCall& call)
      : mha_(options, seed), call_(call) {}
  ParameterSet* parameters() override { return &mha_.parameters(); }
  void load(const std::map<std::string, Tensor>& state) override {
    mha_.load_state_dict(state, false);
  }
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace& ws) const override {
    const Tensor& q = *in[0];
    const Tensor& k = in[1] ? *in[1] : q;
    const Tensor& v = in[2] ? *in[2] : k;
    mha_forward_f32(mha_.options(), mha_weights(mha_.parameters(), mha_.options()), call_, q, k, v,
                    in[3], in[4], *out[0], call_.need_weights ? out[1] : nullptr, ws);
  }
  void forward_step(std::span<const Tensor* const> in, std::span<Tensor* const> out,
                    Workspace& ws, const StepState& step) const override {
    mha_forward_cached_f32(mha_.options(), mha_weights(mha_.parameters(), mha_.options()), *in[0],
                           *out[0], step, ws);
  }

 private:
  MultiheadAttention mha_;
  MhaCall call_;
};

class MultiheadAttentionOp : public Op {
 public:
  MultiheadAttentionOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "multihead_attention");
    opt_.embed_dim = a.integer("embed_dim");
    opt_.num_heads = a.integer("num_heads");
    opt_.dropout = a.number("dropout", 0.0);
    opt_.bias = a.boolean("bias", true);
    opt_.add_bias_kv = a.boolean("add_bias_kv", false);
    opt_.add_zero_attn = a.boolean("add_zero_attn", false);
    opt_.kdim = a.optional_integer("kdim");
    opt_.vdim = a.optional_integer("vdim");
    opt_.batch_first = a.boolean("batch_first", false);
    call_.need_weights = a.boolean("need_weights", true);
    call_.average_attn_weights = a.boolean("average_attn_weights", true);
    call_.is_causal = a.boolean("is_causal", false);
    a.finish();
    validate_mha_options(opt_, where);
  }
  const char* name() const override { return "multihead_attention"; }
  std::vector<PortSpec> input_ports() const override {
    return {
        {"query"}, {"key", true}, {"value", true}, {"key_padding_mask", true}, {"attn_mask", true}};
  }
  std::vector<std::string> output_ports() const override {
    if (call_.need_weights) return {"out", "weights"};
    return {"out"};
  }
  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    return infer_mha(opt_, call_, in, where());
  }
  OpCost cost(const InputTypes& in) const override {
    const Shape q = concrete_shape(in[0]->shape);
    const Shape k = in[1] ? concrete_shape(in[1]->shape) : q;
    const Shape am = in[4] ? concrete_shape(in[4]->shape) : Shape{};
    OpCost c;
    c.flops = mha_flops(opt_, q, k);
    c.workspace_bytes = static_cast<double>(
        mha_workspace_bytes(opt_, call_, q, k, in[3] != nullptr, in[4] ? &am : nullptr));
    return c;
  }
  // Cached: batched causal self-attention (query only) over the sequence dim, nothing else that
  // looks across positions or grows with them (masks, weights, appended key positions).
  StepRole step_role(const InputTypes& in, const std::string& seq,
                     std::string& why) const override {
    const SymShape& q = in[0]->shape;
    const int64_t seq_dim = opt_.batch_first ? 1 : 0;
    if (!call_.is_causal)
      why = "multihead attention without is_causal looks at later positions";
    else if (in[1] || in[2])
      why = "key/value are given: only self-attention (query alone) is cached";
    else if (in[3] || in[4])
      why = "a mask is given (only is_causal is supported incrementally)";
    else if (call_.need_weights)
      why = "need_weights=true (the weights span every position)";
    else if (opt_.add_bias_kv || opt_.add_zero_attn)
      why = "add_bias_kv/add_zero_attn append key positions";
    else if (q.size() != 3 || seq_axis(q, seq) != seq_dim)
      why = "query " + sym_shape_to_string(q) + " does not have the sequence dim " + seq +
            " at dim " + str(seq_dim) + " of a batched input";
    else
      return StepRole::cached;
    return StepRole::none;
  }
  int64_t cache_floats(const InputTypes&, int64_t batch, int64_t capacity) const override {
    return mha_cache_floats(opt_, batch, capacity);
  }
  double step_workspace_bytes(const InputTypes& in, int64_t capacity) const override {
    return static_cast<double>(
        mha_cached_workspace_bytes(opt_, concrete_shape(in[0]->shape), capacity));
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<MultiheadAttentionLayer>(opt_, seed, call_);
  }

 private:
  MultiheadAttentionOptions opt_;
  MhaCall call_;
};

}  // namespace

std::unique_ptr<Op> make_multihead_attention_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<MultiheadAttentionOp>(node, where);
}

}  // namespace tessera
