// The `shifted_window_attention` op: torchvision 0.14's ShiftedWindowAttention (Swin V1's W-MSA
// and SW-MSA), x [B, H, W, C] -> out [B, H, W, C], in eval mode.
//
// torchvision's shifted_window_attention(): pad H, W at the bottom/right to window multiples with
// zeros; a dim whose window covers the padded map is not shifted; roll by -shift; partition into
// windows of Wh x Ww tokens; qkv linear (padded tokens get k = v = bias and take part, unmasked);
// softmax(q k^T * head_dim^-0.5 + relative position bias [+ -100 between tokens of different
// shift regions]) v; proj; reverse the windows, roll back, crop to H, W.
//
// Here: the windows, a group of them at a time (windows_per_group: all of them unless the L2
// holds a group and the weights), as [windows*N, C] rows in window order (pad + roll +
// partition) that the qkv projection reads in place, one pointer per row into x (a zero row
// for a padding cell: linear_forward_rows_f32), into [windows*N, 3C]; then the one attention
// core (layers/attention_core.h) over the group as a batch of windows - the bias looked up in
// the tile (relative_position_index, core/attention_tile.h, is torchvision's index for a Wh x Ww
// window), the shift mask from per-token region ids of each window (shifted_window_region),
// never a [windows, N, N] tensor - and proj, which writes each token's row straight into its
// cell of the output (roll back and crop). H and W must be fixed when the network is resolved
// (E_SHAPE if open); B may be open.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_device.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/attention_tile.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/text.h"
#include "layers/attention_core.h"
#include "layers/linear.h"
#include "layers/op_args.h"

namespace tessera {

namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kTable = "relative_position_bias_table";
constexpr const char* kIndex = "relative_position_index";
// The most tokens a window may hold: the index buffer is (Wh*Ww)^2 int64 (128 MiB here; Swin V1
// uses 7x7 = 49, V2 up to 24x24 = 576).
constexpr int64_t kMaxWindowTokens = 4096;

struct SwinOptions {
  int64_t dim = 0, heads = 0;
  int64_t window_h = 0, window_w = 0;
  int64_t shift_h = 0, shift_w = 0;
  bool qkv_bias = true, proj_bias = true;
  double attention_dropout = 0.0, dropout = 0.0;
};

// The sizes one forward computes with, from the input's (concrete) shape.
struct SwinGeometry {
  int64_t B = 0, H = 0, W = 0, C = 0;
  int64_t pad_h = 0, pad_w = 0;      // the padded map
  int64_t shift_h = 0, shift_w = 0;  // after the window >= padded size rule
  int64_t windows_h = 0, windows_w = 0, windows = 0;  // per image
  int64_t N = 0;                                      // tokens per window
  int64_t tokens = 0;                                 // B * pad_h * pad_w
  bool masked = false;                                // sum(shift) > 0
};

// torchvision's arithmetic; sizes as infer checked them (no overflow).
SwinGeometry geometry(const SwinOptions& o, int64_t B, int64_t H, int64_t W, int64_t C) {
  SwinGeometry g;
  g.B = B;
  g.H = H;
  g.W = W;
  g.C = C;
  g.pad_h = H + (o.window_h - H % o.window_h) % o.window_h;
  g.pad_w = W + (o.window_w - W % o.window_w) % o.window_w;
  g.shift_h = o.window_h >= g.pad_h ? 0 : o.shift_h;
  g.shift_w = o.window_w >= g.pad_w ? 0 : o.shift_w;
  g.masked = g.shift_h > 0 || g.shift_w > 0;  // both >= 0: sum(shift_size) > 0, no overflow
  g.windows_h = g.pad_h / o.window_h;
  g.windows_w = g.pad_w / o.window_w;
  g.windows = g.windows_h * g.windows_w;
  g.N = o.window_h * o.window_w;
  g.tokens = B * g.pad_h * g.pad_w;
  return g;
}

int64_t table_rows(const SwinOptions& o) { return (2 * o.window_h - 1) * (2 * o.window_w - 1); }

// The core's arguments for the windows as a batch: q | k | v read in place from the packed
// [tokens, 3C] buffer, the output written into the proj input [tokens, C]. Pointers are filled by
// the caller (null while sizing).
AttentionArgs core_args(const SwinOptions& o, const SwinGeometry& g) {
  const int64_t C = g.C, hd = C / o.heads, C3 = 3 * C;
  AttentionArgs a;
  a.batch = g.B * g.windows;
  a.heads = o.heads;
  a.q_len = a.kv_len = g.N;
  a.head_dim = a.v_head_dim = hd;
  // torchvision: q * (C // num_heads) ** -0.5 (a Python float).
  a.scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  a.q_batch_stride = a.k_batch_stride = a.v_batch_stride = g.N * C3;
  a.q_row_stride = a.k_row_stride = a.v_row_stride = C3;
  a.q_head_stride = a.k_head_stride = a.v_head_stride = hd;
  a.out_batch_stride = g.N * C;
  a.out_row_stride = C;
  a.out_head_stride = hd;
  a.rel_head_stride = table_rows(o);
  a.grid_h = o.window_h;
  a.grid_w = o.window_w;
  if (g.masked) {
    a.region_groups = g.windows;  // window b % windows of the batch of windows
    a.region_penalty = -100.0f;   // torchvision's masked_fill value (not -inf)
  }
  return a;
}

// Windows per group. The forward takes the windows a group at a time, qkv to proj, so
// that the core reads the group's q, k and v from L2 where its projection just wrote them: over
// all of stage 1's windows at once (3.6 MB of qkv at 56 x 56 x 96) the core found them in memory,
// its strided rows a few lines in flight at a time, and took 1.4-1.6 ms against 1.0 warm
// (swin_t, AVX2, one thread, Zen 4). A group is a divisor of an image's windows (groups never
// straddle images) whose rows of x, qkv and proj input fit half the L2. Every group reads
// the layer's weights again, so only where they (4 C^2 floats) also fit half the L2 (Swin-T's
// first stage: 147 KiB); otherwise one group of every window of every image.
int64_t windows_per_group(const SwinGeometry& g) {
  const int64_t all = g.B * g.windows;
  const int64_t half_l2 = static_cast<int64_t>(cpu::l2_cache_bytes() / 2);
  if (g.C > half_l2 || 4 * g.C * g.C * static_cast<int64_t>(sizeof(float)) > half_l2) return all;
  // Windows that fit (divided, not multiplied: B * windows * N * 5C * 4 may pass int64).
  const int64_t fit = half_l2 / (g.N * 5 * g.C * static_cast<int64_t>(sizeof(float)));
  if (all <= fit) return all;
  int64_t group = 1;
  for (int64_t d = 2; d <= std::min(fit, g.windows); ++d)
    if (g.windows % d == 0) group = d;
  return group;
}

// One group's buffers (SwinScratch::buffers, one slot per worker), as offsets in floats from
// the start of a slot, each on a 64-byte line; `floats` is the slot's size. rows =
// windows_per_group * N.
//   qkv [rows, 3C], ctx [rows, C] (the proj input);
//   x_rows, out_rows [rows] pointers: each row's cell in x and in the output;
//   spare [rows, C] where the map is padded: a padding row's zeros for qkv, then its proj output
//   (dropped, as the crop drops it).
struct GroupLayout {
  int64_t qkv = 0, ctx = 0, x_rows = 0, out_rows = 0, spare = 0, floats = 0;
};
GroupLayout group_layout(const SwinGeometry& g, int64_t rows) {
  const auto line = [](int64_t floats) { return (floats + 15) / 16 * 16; };
  constexpr int64_t kPointerFloats = int64_t{sizeof(void*)} / int64_t{sizeof(float)};
  const int64_t C = g.C;
  const bool padded = g.pad_h != g.H || g.pad_w != g.W;
  GroupLayout l;
  l.qkv = 0;
  l.ctx = l.qkv + line(rows * 3 * C);
  l.x_rows = l.ctx + line(rows * C);
  l.out_rows = l.x_rows + line(rows * kPointerFloats);
  l.spare = l.out_rows + line(rows * kPointerFloats);
  l.floats = l.spare + (padded ? line(rows * C) : 0);
  return l;
}

struct SwinScratch {
  float* table = nullptr;     // the bias table transposed, one row per head
  int32_t* region = nullptr;  // [windows, N] region ids when masked
  int64_t per_group = 0;      // windows_per_group
  int64_t groups = 0;         // B * windows / per_group
  GroupLayout group;          // of per_group * N rows
  WorkerScratch buffers;      // a `group` slot per worker
  AttentionScratch core;
};

// The one layout function: cost() sizes it over a counting Workspace, forward() takes it.
SwinScratch layout_scratch(const SwinOptions& o, const SwinGeometry& g, const AttentionArgs& args,
                           Workspace& ws) {
  SwinScratch s;
  if (g.tokens == 0) return s;
  const Device& device = cpu_device();
  s.table = ws.take<float>(table_rows(o) * o.heads);
  if (g.masked) s.region = ws.take<int32_t>(g.windows * g.N);
  s.per_group = windows_per_group(g);
  s.groups = g.B * g.windows / s.per_group;
  s.group = group_layout(g, s.per_group * g.N);
  s.buffers = WorkerScratch(ws, sizeof(float) * static_cast<size_t>(s.group.floats),
                            static_cast<int>(std::min<int64_t>(s.groups, num_threads())));
  s.core = attention_scratch(device, args, ws);
  return s;
}

size_t workspace_bytes(const SwinOptions& o, const SwinGeometry& g) {
  Workspace counter;
  layout_scratch(o, g, core_args(o, g), counter);
  return counter.peak();
}

// Token (window (wy, wx) of image b, position (i, j) in it) -> its row in the gathered order.
// Gathered row r holds padded-and-rolled map cell (Y, X) = (wy*Wh + i, wx*Ww + j), which is
// padded map cell ((Y + sh) % pad_h, (X + sw) % pad_w) (torch.roll by -shift): returns that
// cell's offset in x's [B, H, W] cells, or -1 for a padding cell (outside H x W).
int64_t token_cell(const SwinOptions& o, const SwinGeometry& g, int64_t r) {
  const int64_t rows_per_image = g.pad_h * g.pad_w;
  const int64_t b = r / rows_per_image, rest = r % rows_per_image;
  const int64_t w = rest / g.N, t = rest % g.N;
  const int64_t Y = (w / g.windows_w) * o.window_h + t / o.window_w;
  const int64_t X = (w % g.windows_w) * o.window_w + t % o.window_w;
  const int64_t y = (Y + g.shift_h % g.pad_h) % g.pad_h;
  const int64_t x = (X + g.shift_w % g.pad_w) % g.pad_w;
  return y < g.H && x < g.W ? (b * g.H + y) * g.W + x : -1;
}

// Rows r0 .. r0 + rows - 1 in the gathered order (pad + roll + partition): each row's cell in x
// and in out, or for a padding cell a row of `spare`, zeroed, for both.
void window_rows(const SwinOptions& o, const SwinGeometry& g, const float* x, float* out,
                 int64_t r0, int64_t rows, float* spare, const float** x_rows, float** out_rows) {
  const int64_t C = g.C;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t cell = token_cell(o, g, r0 + i);
    if (cell >= 0) {
      x_rows[i] = x + cell * C;
      out_rows[i] = out + cell * C;
    } else {
      float* zeros = spare + i * C;
      std::memset(zeros, 0, static_cast<size_t>(C) * sizeof(float));
      x_rows[i] = zeros;
      out_rows[i] = zeros;
    }
  }
}

class SwinAttentionLayer : public OpLayer {
 public:
  SwinAttentionLayer(const SwinOptions& o, std::optional<uint64_t> seed, std::string where)
      : o_(o), where_(std::move(where)) {
    // torchvision's state_dict order: the module's own table, then qkv, then proj.
    params_.add(kTable, {table_rows(o_), o_.heads});
    params_.add_projection("qkv.weight", 3 * o_.dim, o_.dim);
    if (o_.qkv_bias) params_.add("qkv.bias", {3 * o_.dim});
    params_.add_projection("proj.weight", o_.dim, o_.dim);
    if (o_.proj_bias) params_.add("proj.bias", {o_.dim});
    if (!seed) return;
    // ShiftedWindowAttention: trunc_normal_(table, std=0.02); nn.Linear's reset for qkv, proj.
    Generator gen(*seed);
    init_trunc_normal(params_.mutable_tensor(kTable), gen, 0.02);
    init_linear_weight(params_.mutable_tensor("qkv.weight"), gen, o_.dim);
    if (o_.qkv_bias) init_linear_bias(params_.mutable_tensor("qkv.bias"), gen, o_.dim);
    init_linear_weight(params_.mutable_tensor("proj.weight"), gen, o_.dim);
    if (o_.proj_bias) init_linear_bias(params_.mutable_tensor("proj.bias"), gen, o_.dim);
  }
  ParameterSet* parameters() override { return &params_; }
  void load(const std::map<std::string, Tensor>& state) override {
    params_.load(state, false, where_);
  }
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace& ws) const override {
    const Tensor& x = *in[0];
    const SwinGeometry g = geometry(o_, x.size(0), x.size(1), x.size(2), x.size(3));
    if (g.tokens == 0 || g.H == 0 || g.W == 0) return;
    const Device& device = cpu_device();
    const int64_t C = g.C, C3 = 3 * C, heads = o_.heads;
    AttentionArgs a = core_args(o_, g);
    const SwinScratch s = layout_scratch(o_, g, a, ws);

    // 1. The bias table [(2Wh-1)(2Ww-1), heads] transposed to one row per head, and the region
    //    id of every token of every window (on the padded map, before the roll back: the mask is
    //    labelled on the rolled map's coordinates). What the core builds from them, once.
    const float* tab = params_.tensor(kTable).data<float>();
    const int64_t entries = a.rel_head_stride;
    for (int64_t i = 0; i < entries; ++i)
      for (int64_t h = 0; h < heads; ++h) s.table[h * entries + i] = tab[i * heads + h];
    a.rel_table = s.table;
    if (g.masked) {
      for (int64_t w = 0; w < g.windows; ++w)
        for (int64_t t = 0; t < g.N; ++t) {
          const int64_t Y = (w / g.windows_w) * o_.window_h + t / o_.window_w;
          const int64_t X = (w % g.windows_w) * o_.window_w + t % o_.window_w;
          s.region[w * g.N + t] = static_cast<int32_t>(
              3 * shifted_window_region(Y, g.pad_h, o_.window_h, g.shift_h) +
              shifted_window_region(X, g.pad_w, o_.window_w, g.shift_w));
        }
      a.region = s.region;
    }
    attention_prepare_f32(device, a, s.core);
    a.prepared = true;

    // 2. Per group of windows (windows_per_group), in the gathered order (pad + roll +
    //    partition): q | k | v = x's rows qkv.weight^T + qkv.bias, one [rows, C] x [C, 3C]
    //    GEMM reading each row in its cell; attention per window, written straight into the
    //    proj input; proj, writing each row into its cell of the output (roll back, crop). The
    //    copies in and out this replaced were ~1% of swin_t (memcpy of 384-byte rows). A group
    //    runs on one thread and the groups over the threads; one group of every window runs
    //    each op over them.
    const int64_t per_group = s.per_group, rows = per_group * g.N;
    const GroupLayout& lay = s.group;
    const float* qkv_bias = o_.qkv_bias ? params_.tensor("qkv.bias").data<float>() : nullptr;
    const float* proj_bias = o_.proj_bias ? params_.tensor("proj.bias").data<float>() : nullptr;
    const auto run_group = [&](int64_t group) {
      const WorkerScratch::Lease lease = s.buffers.acquire();
      float* slot = lease.as<float>();
      float* qkv = slot + lay.qkv;
      float* ctx = slot + lay.ctx;
      const auto x_rows = reinterpret_cast<const float**>(slot + lay.x_rows);
      const auto out_rows = reinterpret_cast<float**>(slot + lay.out_rows);
      const int64_t w0 = group * per_group, r0 = w0 * g.N;
      window_rows(o_, g, x.data<float>(), out[0]->data<float>(), r0, rows, slot + lay.spare,
                  x_rows, out_rows);
      linear_forward_rows_f32(device, rows, C, C3, RowsInF32{nullptr, 0, x_rows},
                              params_.projection("qkv.weight"), qkv_bias, RowsOutF32{qkv, C3});
      AttentionArgs ga = a;
      ga.batch = per_group;
      ga.q = qkv;
      ga.k = qkv + C;
      ga.v = qkv + 2 * C;
      ga.out = ctx;
      if (g.masked) {
        // Window b of the group is window (w0 + b) % windows of its image, and a group of
        // fewer windows than an image holds divides it: its ids are one run.
        ga.region = s.region + (w0 % g.windows) * g.N;
        ga.region_groups = std::min(per_group, g.windows);
      }
      attention_forward_f32(device, ga, s.core);
      linear_forward_rows_f32(device, rows, C, C, RowsInF32{ctx, C},
                              params_.projection("proj.weight"), proj_bias,
                              RowsOutF32{nullptr, 0, out_rows});
    };
    if (s.groups == 1) {
      run_group(0);
      return;
    }
    parallel_for(0, s.groups, 1, [&](int64_t g0, int64_t g1) {
      const SerialScope serial;
      for (int64_t group = g0; group < g1; ++group) run_group(group);
    });
  }

 private:
  SwinOptions o_;
  std::string where_;
  ParameterSet params_;
};

// An int (both axes) or a list of ints; a list not of length 2 is E_CONSTRAINT (torchvision's
// ValueError "window_size and shift_size must be of length 2").
std::pair<int64_t, int64_t> int_or_list(Args& a, const char* name, const ojson* v,
                                        std::pair<int64_t, int64_t> def,
                                        const std::string& where) {
  constexpr const char* kWant = "an int or a list of 2 ints";
  if (!v) return def;
  auto one = [&](const ojson& e) -> int64_t {
    if (!e.is_number_integer()) a.type_error(name, kWant, *v);
    if (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(ErrorCode::Constraint, where,
           std::string(name) + "=" + shown_arg(*v) + " does not fit int64");
    return e.get<int64_t>();
  };
  if (v->is_array()) {
    for (const ojson& e : *v) one(e);
    if (v->size() != 2)
      fail(ErrorCode::Constraint, where,
           std::string(name) + "=" + shown_arg(*v) + " must have length 2 (window_size and " +
               "shift_size must be of length 2)");
    return {one((*v)[0]), one((*v)[1])};
  }
  const int64_t n = one(*v);
  return {n, n};
}

class SwinAttentionOp : public Op {
 public:
  SwinAttentionOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "shifted_window_attention");
    o_.dim = a.integer("dim");
    const ojson* window = a.raw("window_size");
    if (!window) fail(ErrorCode::Arg, where, "missing required argument window_size");
    const auto [wh, ww] = int_or_list(a, "window_size", window, {0, 0}, where);
    const ojson* shift = a.raw("shift_size");
    const auto [sh, sw] = int_or_list(a, "shift_size", shift, {0, 0}, where);
    o_.heads = a.integer("num_heads");
    o_.qkv_bias = a.boolean("qkv_bias", true);
    o_.proj_bias = a.boolean("proj_bias", true);
    o_.attention_dropout = a.number("attention_dropout", 0.0);
    o_.dropout = a.number("dropout", 0.0);
    a.finish();

    require_at_least(o_.dim, 1, "dim", where);
    require_at_least(o_.heads, 1, "num_heads", where);
    if (o_.dim % o_.heads != 0)
      fail(ErrorCode::Constraint, where,
           "num_heads=" + str(o_.heads) + " must divide dim=" + str(o_.dim));
    const std::string window_text = "window_size=" + shown_arg(*window);
    if (wh < 1 || ww < 1) fail(ErrorCode::Constraint, where, window_text + " must be >= 1");
    int64_t n = 0;
    if (wh > kMaxWindowTokens || ww > kMaxWindowTokens || __builtin_mul_overflow(wh, ww, &n) ||
        n > kMaxWindowTokens)
      fail(ErrorCode::Constraint, where,
           window_text + " must hold at most " + str(kMaxWindowTokens) + " tokens (Wh*Ww)");
    if (sh < 0 || sw < 0)
      fail(ErrorCode::Constraint, where, "shift_size=" + shown_arg(*shift) + " must be >= 0");
    // Written so that NaN fails too.
    if (!(o_.attention_dropout >= 0.0 && o_.attention_dropout <= 1.0))
      fail(ErrorCode::Constraint, where,
           "attention_dropout=" + py_float(o_.attention_dropout) + " must be in [0, 1]");
    if (!(o_.dropout >= 0.0 && o_.dropout <= 1.0))
      fail(ErrorCode::Constraint, where, "dropout=" + py_float(o_.dropout) + " must be in [0, 1]");
    // 3C rows of qkv.weight and 3C*C elements fit (dim <= 2^31 keeps C*C in int64).
    if (o_.dim > (int64_t{1} << 30))
      fail(ErrorCode::Constraint, where, "dim=" + str(o_.dim) + " is too large");
    o_.window_h = wh;
    o_.window_w = ww;
    o_.shift_h = sh;
    o_.shift_w = sw;
  }
  const char* name() const override { return "shifted_window_attention"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "shifted_window_attention", where());
    if (x.shape.size() != 4)
      fail(ErrorCode::Shape, where(), named("x", x) + " is not [B, H, W, C]");
    const int64_t C = require_fixed(x.shape[3], "the channel dim C", x, "x", where());
    if (C != o_.dim)
      fail(ErrorCode::Shape, where(), named("x", x) + " has C=" + str(C) + ", dim=" + str(o_.dim));
    // H and W may stay open (a Swin recipe takes any image size): nothing the op declares
    // depends on them, and the size check below runs once they are bound.
    const bool open_map = !x.shape[1].is_fixed() || !x.shape[2].is_fixed();
    const int64_t H = open_map ? 0 : x.shape[1].value;
    const int64_t W = open_map ? 0 : x.shape[2].value;
    // The padded map and every buffer the forward sizes from it fit int64 (B once it is bound).
    // (4 * B * pH * pW * 3C: the bytes of the qkv buffer.)
    const Dim& B = x.shape[0];
    int64_t ph = 0, pw = 0, cells = 0, floats = 0;
    const bool huge =
        !open_map &&
        ((B.is_fixed() && B.value > (int64_t{1} << 40)) ||
         __builtin_add_overflow(H, o_.window_h, &ph) ||
         __builtin_add_overflow(W, o_.window_w, &pw) || __builtin_mul_overflow(ph, pw, &cells) ||
         __builtin_mul_overflow(cells, 3 * C, &floats) ||
         (B.is_fixed() && __builtin_mul_overflow(floats, B.value * 4, &floats)));
    if (huge)
      fail(ErrorCode::Shape, where(), named("x", x) + " is too large to partition into windows");
    InferResult r;
    r.outputs.push_back({x.shape, DType::F32});
    r.parameters.emplace_back(kTable, Shape{table_rows(o_), o_.heads});
    r.parameters.emplace_back("qkv.weight", Shape{3 * o_.dim, o_.dim});
    if (o_.qkv_bias) r.parameters.emplace_back("qkv.bias", Shape{3 * o_.dim});
    r.parameters.emplace_back("proj.weight", Shape{o_.dim, o_.dim});
    if (o_.proj_bias) r.parameters.emplace_back("proj.bias", Shape{o_.dim});
    return r;
  }
  OpCost cost(const InputTypes& in) const override {
    const SymShape& s = in[0]->shape;
    const SwinGeometry g = geometry(o_, s[0].value, s[1].value, s[2].value, s[3].value);
    const double t = static_cast<double>(g.tokens), c = static_cast<double>(g.C),
                 n = static_cast<double>(g.N);
    OpCost cost;
    // qkv ([tokens, C] x [C, 3C]) and proj ([tokens, C] x [C, C]): 8 t C^2; q k^T and p v per
    // window: 2 * 2 N^2 C per window, t / N windows: 4 t N C. Padded tokens count.
    cost.flops = g.H == 0 || g.W == 0 ? 0.0 : 8.0 * t * c * c + 4.0 * t * n * c;
    cost.workspace_bytes =
        g.H == 0 || g.W == 0 ? 0.0 : static_cast<double>(workspace_bytes(o_, g));
    return cost;
  }
  std::vector<std::pair<std::string, Tensor>> persistent_buffers() const override {
    // torchvision's define_relative_position_index: [Wh*Ww*Wh*Ww] int64.
    const int64_t N = o_.window_h * o_.window_w;
    Tensor index = Tensor::empty({N * N}, DType::I64);
    int64_t* idx = index.data<int64_t>();
    for (int64_t q = 0; q < N; ++q)
      for (int64_t k = 0; k < N; ++k)
        idx[q * N + k] = relative_position_index(q, k, o_.window_h, o_.window_w);
    return {{kIndex, index}};
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<SwinAttentionLayer>(o_, seed, where());
  }

 private:
  SwinOptions o_;
};

}  // namespace

std::unique_ptr<Op> make_shifted_window_attention_op(const NetworkNode& node,
                                                     const std::string& where) {
  return std::make_unique<SwinAttentionOp>(node, where);
}

}  // namespace tessera
