#include "layers/op_registry.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "backends/cpu/cpu_device.h"
#include "core/random.h"
#include "layers/attention.h"
#include "layers/attention_core.h"
#include "layers/linear.h"
#include "layers/multihead_attention.h"
#include "layers/ops.h"

namespace tessera {

using ojson = nlohmann::ordered_json;

SymShape fixed_shape(const Shape& shape) {
  SymShape s;
  for (int64_t d : shape) s.push_back(Dim::fixed(d));
  return s;
}

bool is_fixed(const SymShape& shape) {
  return std::all_of(shape.begin(), shape.end(), [](const Dim& d) { return d.is_fixed(); });
}

Shape concrete_shape(const SymShape& shape) {
  Shape s;
  for (const Dim& d : shape) {
    if (!d.is_fixed())
      fail(ErrorCode::Internal, "network", "shape " + sym_shape_to_string(shape) + " is open");
    s.push_back(d.value);
  }
  return s;
}

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// "x3", "out0": port names. (Built by appending: GCC 12 at -O3 warns falsely, -Wrestrict, on
// "literal" + std::to_string(i).)
std::string indexed(const char* prefix, int64_t i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

// ------------------------------------------------------------------ symbolic dimension algebra
//
// Fixed operands give fixed results (overflow is E_SHAPE); an open operand gives an expression
// that prints what the dimension will be ("T/2", "2*T+4") and is compared by its text.

std::string paren(const Dim& d) {
  return d.is_fixed() || is_symbol_name(d.text) ? d.str() : "(" + d.text + ")";
}

// Two dims that are certainly different: both fixed and unequal. An open one may still turn out
// equal, so its check waits until it is bound.
bool differ(const Dim& a, const Dim& b) {
  return a.is_fixed() && b.is_fixed() && a.value != b.value;
}

Dim dim_mul(const Dim& a, const Dim& b, const std::string& where) {
  if (a.is_fixed() && b.is_fixed()) {
    int64_t p;
    if (__builtin_mul_overflow(a.value, b.value, &p))
      fail(ErrorCode::Shape, where, str(a.value) + "*" + str(b.value) + " overflows int64");
    return Dim::fixed(p);
  }
  return Dim::open(paren(a) + "*" + paren(b));
}

Dim dim_div(const Dim& a, int64_t n) {
  return a.is_fixed() ? Dim::fixed(a.value / n) : Dim::open(paren(a) + "/" + str(n));
}

// Sum of dims: the fixed ones folded into one constant, repeated open terms counted ("T+T+4"
// prints "2*T+4").
Dim dim_sum(const std::vector<Dim>& dims, const std::string& where) {
  int64_t constant = 0;
  std::vector<std::pair<std::string, int64_t>> terms;
  for (const Dim& d : dims) {
    if (d.is_fixed()) {
      if (__builtin_add_overflow(constant, d.value, &constant))
        fail(ErrorCode::Shape, where, "a sum of dims overflows int64");
      continue;
    }
    const std::string t = paren(d);
    auto it = std::find_if(terms.begin(), terms.end(), [&](const auto& p) { return p.first == t; });
    if (it == terms.end())
      terms.emplace_back(t, 1);
    else
      ++it->second;
  }
  if (terms.empty()) return Dim::fixed(constant);
  std::string s;
  for (const auto& [t, n] : terms) {
    if (!s.empty()) s += '+';
    if (n > 1) s += str(n) + '*';
    s += t;
  }
  if (constant > 0) {
    s += '+';
    s += str(constant);
  }
  return Dim::open(s);
}

// PyTorch broadcasting of two dims: 1 stretches; open against fixed c != 1 gives c (the open
// one must be 1 or c); two different open dims give their max, the broadcast size when valid.
Dim dim_broadcast(const Dim& a, const Dim& b, const std::string& what, const std::string& where) {
  if (a == b) return a;
  if (a.is_fixed() && a.value == 1) return b;
  if (b.is_fixed() && b.value == 1) return a;
  if (a.is_fixed() && b.is_fixed())
    fail(ErrorCode::Shape, where, what + ": " + str(a.value) + " vs " + str(b.value));
  if (a.is_fixed()) return a;
  if (b.is_fixed()) return b;
  return Dim::open("max(" + a.text + ", " + b.text + ")");
}

std::string named(const char* port, const ValueType& v) {
  return std::string(port) + " " + sym_shape_to_string(v.shape);
}

void require_float(const char* port, const ValueType& v, const char* op, const std::string& where) {
  if (!dtype_is_floating(v.dtype))
    fail(ErrorCode::DType, where,
         std::string(port) + " has dtype " + dtype_name(v.dtype) + "; " + op +
             " needs a float input");
}

void require_mask(const char* port, const ValueType& v, const std::string& where) {
  if (v.dtype != DType::Bool && !dtype_is_floating(v.dtype))
    fail(ErrorCode::DType, where,
         std::string(port) + " has dtype " + dtype_name(v.dtype) +
             "; a mask is bool (true = masked) or float (added to the scores)");
}

// A dim the op's parameters depend on: it must be fixed.
int64_t require_fixed(const Dim& d, const std::string& what, const ValueType& v, const char* port,
                      const std::string& where) {
  if (!d.is_fixed())
    fail(ErrorCode::Shape, where,
         what + " of " + named(port, v) + " is open (" + d.text +
             "); it sets the parameter shapes and must be fixed");
  return d.value;
}

int64_t wrap_dim(int64_t dim, size_t rank, const std::string& where) {
  const auto r = static_cast<int64_t>(rank);
  if (dim < -r || dim >= r)
    fail(ErrorCode::Constraint, where,
         "dim=" + str(dim) + " is out of range for a rank-" + str(r) + " input (valid: " + str(-r) +
             " .. " + str(r - 1) + ")");
  return dim < 0 ? dim + r : dim;
}

double numel(const SymShape& s) {
  double n = 1;
  for (const Dim& d : s) n *= static_cast<double>(d.value);
  return n;
}

// ------------------------------------------------------------------ arguments

const char* json_type(const ojson& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number_float()) return "a number";
  return j.type_name();
}

// Reads a node's args by name with their types and defaults; finish() rejects every argument
// that no read asked for, listing those the op takes.
class Args {
 public:
  Args(const ojson& args, const std::string& where, const char* op)
      : args_(args), where_(where), op_(op) {}

  int64_t integer(const char* name) {
    const ojson* v = get(name);
    if (!v) fail(ErrorCode::Arg, where_, std::string("missing required argument ") + name);
    return to_integer(*v, name);
  }
  int64_t integer(const char* name, int64_t def) {
    const ojson* v = get(name);
    return v ? to_integer(*v, name) : def;
  }
  // null or absent: nullopt (Python's None).
  std::optional<int64_t> optional_integer(const char* name) {
    const ojson* v = get(name);
    if (!v || v->is_null()) return std::nullopt;
    return to_integer(*v, name);
  }
  bool boolean(const char* name, bool def) {
    const ojson* v = get(name);
    if (!v) return def;
    if (!v->is_boolean()) type_error(name, "a boolean", *v);
    return v->get<bool>();
  }
  double number(const char* name, double def) {
    const ojson* v = get(name);
    if (!v) return def;
    if (!v->is_number()) type_error(name, "a number", *v);
    return v->get<double>();
  }
  std::string string(const char* name, const std::string& def) {
    const ojson* v = get(name);
    if (!v) return def;
    if (!v->is_string()) type_error(name, "a string", *v);
    return v->get<std::string>();
  }
  // The raw value for arguments with their own structure; null when absent.
  const ojson* raw(const char* name) { return get(name); }

  void finish() const {
    for (const auto& [key, value] : args_.items()) {
      (void)value;
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      std::string list;
      for (const std::string& k : known_) list += (list.empty() ? "" : ", ") + k;
      fail(ErrorCode::Arg, where_,
           "unknown argument '" + key + "' (" + op_ + " takes " + list + ")");
    }
  }

  [[noreturn]] void type_error(const std::string& name, const char* want, const ojson& got) const {
    fail(ErrorCode::Arg, where_,
         "argument " + name + " must be " + want + ", got " + json_type(got) + " " + got.dump());
  }

 private:
  const ojson* get(const char* name) {
    known_.emplace_back(name);
    const auto it = args_.find(name);
    return it == args_.end() ? nullptr : &*it;
  }
  int64_t to_integer(const ojson& v, const char* name) const {
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        fail(ErrorCode::Constraint, where_,
             std::string("argument ") + name + "=" + v.dump() + " does not fit int64");
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (!v.is_number_integer()) type_error(name, "an integer", v);
    return v.get<int64_t>();
  }

  const ojson& args_;
  const std::string& where_;
  const char* op_;
  std::vector<std::string> known_;
};

void require_at_least(int64_t value, int64_t min, const char* name, const std::string& where) {
  if (value < min)
    fail(ErrorCode::Constraint, where,
         std::string(name) + "=" + str(value) + " must be >= " + str(min));
}

// ------------------------------------------------------------------ layers the ops run

// Ops that read their inputs as contiguous float32 get them so from the plan; any other caller
// gets a copy.
const Tensor& contiguous_f32(const Tensor& x, Tensor& scratch) {
  if (x.dtype() == DType::F32 && x.is_contiguous()) return x;
  scratch = x.to(DType::F32).contiguous();
  return scratch;
}

class LinearLayer : public OpLayer {
 public:
  LinearLayer(int64_t in, int64_t out, bool bias, std::optional<uint64_t> seed, std::string where)
      : linear_(in, out, bias), where_(std::move(where)) {
    if (!seed) return;
    Generator gen(*seed);
    linear_.reset_parameters(gen);
  }
  ParameterSet* parameters() override { return &linear_.parameters(); }
  void load(const std::map<std::string, Tensor>& state) override {
    linear_.parameters().load(state, false, where_);
  }
  void forward(const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) const override {
    Tensor scratch;
    const Tensor& x = contiguous_f32(*in[0], scratch);
    const int64_t K = linear_.in_features(), N = linear_.out_features();
    const ParameterSet& p = linear_.parameters();
    linear_forward_f32(
        cpu_device(), x.numel() / K, K, N, x.data<float>(), K, p.tensor("weight").data<float>(),
        linear_.has_bias() ? p.tensor("bias").data<float>() : nullptr, out[0]->data<float>(), N);
  }

 private:
  Linear linear_;
  std::string where_;
};

class LayerNormLayer : public OpLayer {
 public:
  LayerNormLayer(int64_t dim, double eps, bool affine, std::string where)
      : norm_(dim, eps, affine), where_(std::move(where)) {}
  ParameterSet* parameters() override { return &norm_.parameters(); }
  void load(const std::map<std::string, Tensor>& state) override {
    norm_.parameters().load(state, false, where_);
  }
  void forward(const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) const override {
    norm_.forward_into(*in[0], *out[0], where_);
  }

 private:
  LayerNorm norm_;
  std::string where_;
};

// Parameterless ops: forward is a function of the inputs and the op's arguments.
class FunctionLayer : public OpLayer {
 public:
  using Fn = std::function<void(const std::vector<const Tensor*>&, const std::vector<Tensor*>&)>;
  explicit FunctionLayer(Fn fn) : fn_(std::move(fn)) {}
  void forward(const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) const override {
    fn_(in, out);
  }

 private:
  Fn fn_;
};

class AttentionLayer : public OpLayer {
 public:
  AttentionLayer(int64_t dim, const AttentionOptions& options, std::optional<uint64_t> seed,
                 const std::string& where)
      : attention_(dim, options, seed, where) {}
  ParameterSet* parameters() override { return &attention_.parameters(); }
  void load(const std::map<std::string, Tensor>& state) override {
    attention_.load_state_dict(state, false);
  }
  bool allocates_outputs() const override { return true; }
  void forward(const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) const override {
    *out[0] = attention_.forward(*in[0]);
  }

 private:
  Attention attention_;
};

class MultiheadAttentionLayer : public OpLayer {
 public:
  MultiheadAttentionLayer(const MultiheadAttentionOptions& options, std::optional<uint64_t> seed,
                          bool need_weights, bool average, bool is_causal)
      : mha_(options, seed), need_weights_(need_weights), average_(average), causal_(is_causal) {}
  ParameterSet* parameters() override { return &mha_.parameters(); }
  void load(const std::map<std::string, Tensor>& state) override {
    mha_.load_state_dict(state, false);
  }
  bool allocates_outputs() const override { return true; }
  void forward(const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) const override {
    auto arg = [&](size_t i) { return in[i] ? *in[i] : Tensor(); };
    MultiheadAttentionOutput r =
        mha_.forward(*in[0], arg(1), arg(2), arg(3), need_weights_, arg(4), average_, causal_);
    *out[0] = std::move(r.output);
    if (need_weights_) *out[1] = std::move(r.weights);
  }

 private:
  MultiheadAttention mha_;
  bool need_weights_, average_, causal_;
};

// ------------------------------------------------------------------ the ops

class LinearOp : public Op {
 public:
  LinearOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "linear");
    out_ = a.integer("out_features");
    bias_ = a.boolean("bias", true);
    a.finish();
    require_at_least(out_, 1, "out_features", where);
  }
  const char* name() const override { return "linear"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const std::vector<const ValueType*>& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "linear", where());
    if (x.shape.empty()) fail(ErrorCode::Shape, where(), "x [] has no last dim to project");
    const int64_t K = require_fixed(x.shape.back(), "the last dim (in_features)", x, "x", where());
    if (K < 1) fail(ErrorCode::Shape, where(), named("x", x) + " has an empty last dim");
    InferResult r;
    SymShape out = x.shape;
    out.back() = Dim::fixed(out_);
    r.outputs.push_back({out, DType::F32});
    r.parameters.emplace_back("weight", Shape{out_, K});
    if (bias_) r.parameters.emplace_back("bias", Shape{out_});
    return r;
  }
  double flops(const std::vector<const ValueType*>& in) const override {
    return 2.0 * numel(in[0]->shape) * static_cast<double>(out_);
  }
  double scratch_bytes(const std::vector<const ValueType*>& in) const override {
    // LinearLayer::forward: x converted to float32 unless it is already, then x packed.
    const ValueType& x = *in[0];
    const int64_t K = x.shape.back().value;
    const double converted = x.dtype == DType::F32 ? 0.0 : sizeof(float) * numel(x.shape);
    return converted +
           linear_scratch_bytes(cpu_device(), static_cast<int64_t>(numel(x.shape)) / K, K, out_);
  }
  std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>& in,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<LinearLayer>(in[0]->shape.back().value, out_, bias_, seed, where());
  }

 private:
  int64_t out_;
  bool bias_;
};

class LayerNormOp : public Op {
 public:
  LayerNormOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "layer_norm");
    eps_ = a.number("eps", 1e-5);
    affine_ = a.boolean("elementwise_affine", true);
    a.finish();
    if (!(eps_ >= 0.0) || std::isinf(eps_))
      fail(ErrorCode::Constraint, where, "eps=" + ojson(eps_).dump() + " must be finite and >= 0");
  }
  const char* name() const override { return "layer_norm"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const std::vector<const ValueType*>& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "layer_norm", where());
    if (x.shape.empty()) fail(ErrorCode::Shape, where(), "x [] has no last dim to normalize");
    // nn.LayerNorm fixes normalized_shape at construction, affine or not.
    const int64_t D = require_fixed(x.shape.back(), "the normalized (last) dim", x, "x", where());
    if (D < 1) fail(ErrorCode::Shape, where(), named("x", x) + " has an empty last dim");
    InferResult r;
    r.outputs.push_back({x.shape, DType::F32});
    if (affine_) {
      r.parameters.emplace_back("weight", Shape{D});
      r.parameters.emplace_back("bias", Shape{D});
    }
    return r;
  }
  double flops(const std::vector<const ValueType*>& in) const override {
    // fvcore's count: subtract the mean, square, sum, scale (4), plus the affine (5).
    return (affine_ ? 5.0 : 4.0) * numel(in[0]->shape);
  }
  std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>& in,
                                       std::optional<uint64_t>) const override {
    return std::make_unique<LayerNormLayer>(in[0]->shape.back().value, eps_, affine_, where());
  }

 private:
  double eps_;
  bool affine_;
};

class GeluOp : public Op {
 public:
  GeluOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "gelu");
    const std::string approx = a.string("approximate", "none");
    a.finish();
    if (approx != "none" && approx != "tanh")
      fail(ErrorCode::Constraint, where, "approximate='" + approx + "' must be 'none' or 'tanh'");
    tanh_ = approx == "tanh";
  }
  const char* name() const override { return "gelu"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const std::vector<const ValueType*>& in, SymbolBindings&) const override {
    require_float("x", *in[0], "gelu", where());
    return {{{in[0]->shape, DType::F32}}, {}};
  }
  double flops(const std::vector<const ValueType*>& in) const override {
    return numel(in[0]->shape);
  }
  std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>&,
                                       std::optional<uint64_t>) const override {
    const bool tanh = tanh_;
    const std::string w = where();
    return std::make_unique<FunctionLayer>(
        [tanh, w](const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
          gelu_into(*in[0], tanh, *out[0], w);
        });
  }

 private:
  bool tanh_;
};

class AddOp : public Op {
 public:
  AddOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args(node.args, where, "add").finish();
  }
  const char* name() const override { return "add"; }
  std::vector<PortSpec> input_ports() const override { return {{"a"}, {"b"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const std::vector<const ValueType*>& in, SymbolBindings&) const override {
    const ValueType& a = *in[0];
    const ValueType& b = *in[1];
    require_float("a", a, "add", where());
    require_float("b", b, "add", where());
    const size_t rank = std::max(a.shape.size(), b.shape.size());
    SymShape out(rank);
    for (size_t i = 0; i < rank; ++i) {
      const Dim da =
          i < rank - a.shape.size() ? Dim::fixed(1) : a.shape[i - (rank - a.shape.size())];
      const Dim db =
          i < rank - b.shape.size() ? Dim::fixed(1) : b.shape[i - (rank - b.shape.size())];
      out[i] = dim_broadcast(da, db,
                             named("a", a) + " and " + named("b", b) + " do not broadcast (dim " +
                                 str(static_cast<int64_t>(i)) + ")",
                             where());
    }
    return {{{out, DType::F32}}, {}};
  }
  double flops(const std::vector<const ValueType*>& in) const override {
    SymbolBindings none;
    return numel(infer(in, none).outputs[0].shape);
  }
  std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>&,
                                       std::optional<uint64_t>) const override {
    const std::string w = where();
    return std::make_unique<FunctionLayer>(
        [w](const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
          add_into(*in[0], *in[1], *out[0], w);
        });
  }
};

class ChunkOp : public Op {
 public:
  ChunkOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "chunk");
    chunks_ = a.integer("chunks");
    dim_ = a.integer("dim", 0);  // torch.chunk's default
    a.finish();
    require_at_least(chunks_, 1, "chunks", where);
    // One output port per chunk: bound the count so a typo cannot ask for 10^12 ports.
    if (chunks_ > 65536)
      fail(ErrorCode::Constraint, where, "chunks=" + str(chunks_) + " must be <= 65536");
  }
  const char* name() const override { return "chunk"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override {
    std::vector<std::string> ports;
    for (int64_t i = 0; i < chunks_; ++i) ports.push_back(indexed("out", i));
    return ports;
  }

  InferResult infer(const std::vector<const ValueType*>& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    require_float("x", x, "chunk", where());
    if (x.shape.empty()) fail(ErrorCode::Shape, where(), "chunk needs at least one dim, x is []");
    const auto d = static_cast<size_t>(wrap_dim(dim_, x.shape.size(), where()));
    const Dim size = x.shape[d];
    if (size.is_fixed() && size.value % chunks_ != 0)
      fail(ErrorCode::Constraint, where(),
           "dim " + str(static_cast<int64_t>(d)) + " of " + named("x", x) + " has size " +
               str(size.value) + ", not a multiple of chunks=" + str(chunks_));
    SymShape piece = x.shape;
    piece[d] = dim_div(size, chunks_);
    InferResult r;
    r.outputs.assign(static_cast<size_t>(chunks_), ValueType{piece, DType::F32});
    return r;
  }
  double flops(const std::vector<const ValueType*>&) const override { return 0.0; }
  std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>&,
                                       std::optional<uint64_t>) const override {
    const int64_t dim = dim_;
    const std::string w = where();
    return std::make_unique<FunctionLayer>(
        [dim, w](const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
          chunk_into(*in[0], dim, out, w);
        });
  }

 private:
  int64_t chunks_, dim_;
};

class ConcatOp : public Op {
 public:
  ConcatOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "concat");
    dim_ = a.integer("dim", 0);  // torch.cat's default
    a.finish();
    // Ports x0 .. x{n-1}: n is however many the node connects, without gaps.
    std::vector<bool> seen;
    for (const auto& [port, source] : node.inputs) {
      (void)source;
      const bool digits =
          port.size() > 1 && port[0] == 'x' &&
          std::all_of(port.begin() + 1, port.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
          (port.size() == 2 || port[1] != '0') && port.size() <= 7;
      if (!digits)
        fail(ErrorCode::Arg, where, "unknown input port '" + port + "' (concat takes x0, x1, ...)");
      const auto i = static_cast<size_t>(std::stol(port.substr(1)));
      if (seen.size() <= i) seen.resize(i + 1, false);
      seen[i] = true;
    }
    if (seen.empty())
      fail(ErrorCode::Arg, where, "missing input port x0 (concat takes x0, x1, ...)");
    for (size_t i = 0; i < seen.size(); ++i)
      if (!seen[i])
        fail(ErrorCode::Arg, where,
             "missing input port x" + std::to_string(i) + " (ports run x0 .. x" +
                 std::to_string(seen.size() - 1) + " without gaps)");
    inputs_ = static_cast<int64_t>(seen.size());
  }
  const char* name() const override { return "concat"; }
  std::vector<PortSpec> input_ports() const override {
    std::vector<PortSpec> ports;
    for (int64_t i = 0; i < inputs_; ++i) ports.push_back({indexed("x", i)});
    return ports;
  }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const std::vector<const ValueType*>& in, SymbolBindings&) const override {
    const ValueType& x0 = *in[0];
    for (size_t i = 0; i < in.size(); ++i)
      require_float(indexed("x", static_cast<int64_t>(i)).c_str(), *in[i], "concat", where());
    if (x0.shape.empty())
      fail(ErrorCode::Shape, where(), "concat needs at least one dim, x0 is []");
    const auto d = static_cast<size_t>(wrap_dim(dim_, x0.shape.size(), where()));
    SymShape out = x0.shape;
    std::vector<Dim> sizes;
    for (size_t i = 0; i < in.size(); ++i) {
      const SymShape& s = in[i]->shape;
      const std::string xi = indexed("x", static_cast<int64_t>(i));
      if (s.size() != x0.shape.size())
        fail(ErrorCode::Shape, where(),
             named(xi.c_str(), *in[i]) + " has rank " + str(static_cast<int64_t>(s.size())) +
                 ", x0 " + sym_shape_to_string(x0.shape) + " has rank " +
                 str(static_cast<int64_t>(x0.shape.size())));
      for (size_t j = 0; j < s.size(); ++j) {
        if (j == d) continue;
        if (differ(s[j], out[j]))
          fail(ErrorCode::Shape, where(),
               named(xi.c_str(), *in[i]) + " does not match x0 " + sym_shape_to_string(x0.shape) +
                   " in dim " + str(static_cast<int64_t>(j)) + " (only dim " +
                   str(static_cast<int64_t>(d)) + " may differ)");
        if (!out[j].is_fixed() && s[j].is_fixed()) out[j] = s[j];
      }
      sizes.push_back(s[d]);
    }
    out[d] = dim_sum(sizes, where());
    return {{{out, DType::F32}}, {}};
  }
  double flops(const std::vector<const ValueType*>&) const override { return 0.0; }
  std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>&,
                                       std::optional<uint64_t>) const override {
    const int64_t dim = dim_;
    const std::string w = where();
    return std::make_unique<FunctionLayer>(
        [dim, w](const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
          concat_into(in, dim, *out[0], w);
        });
  }

 private:
  int64_t dim_;
  int64_t inputs_ = 0;
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

  InferResult infer(const std::vector<const ValueType*>& in, SymbolBindings& bound) const override {
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
  double flops(const std::vector<const ValueType*>& in) const override {
    const SymShape& s = in[0]->shape;
    const double B = static_cast<double>(s[0].value), T = static_cast<double>(s[1].value),
                 D = static_cast<double>(s[2].value);
    // Four [B*T, D] x [D, D] projections, then q k^T and p v: 2*T*T*D each per batch element.
    return 8.0 * B * T * D * D + 4.0 * B * T * T * D;
  }
  double resident_bytes(const std::vector<const ValueType*>& in) const override {
    const double D = static_cast<double>(in[0]->shape[2].value);
    // Attention::Attention: q/k/v weights packed as one [3D, D] matrix and a [3D] bias beside
    // the parameters.
    return sizeof(float) * (3.0 * D * D + 3.0 * D);
  }
  double scratch_bytes(const std::vector<const ValueType*>& in) const override {
    const SymShape& s = in[0]->shape;
    const int64_t B = s[0].value, T = s[1].value, D = s[2].value, hd = D / opt_.heads;
    if (B == 0 || T == 0) return 0.0;  // forward returns before allocating scratch
    const double b = static_cast<double>(B), t = static_cast<double>(T), d = static_cast<double>(D),
                 h = static_cast<double>(opt_.heads);
    // Attention::forward: q|k|v [B*T, 3D], the context [B*T, D], rope's cos and sin tables
    // [T, hd/2] each, the relative-position table transposed per head, then the core's.
    double floats = 4.0 * b * t * d;
    if (opt_.rope) floats += t * static_cast<double>(hd);
    if (opt_.relative_position_bias)
      floats += (2.0 * static_cast<double>(opt_.spatial_h) - 1.0) *
                (2.0 * static_cast<double>(opt_.spatial_w) - 1.0) * h;
    return sizeof(float) * floats + linear_scratch_bytes(cpu_device(), B * T, D, D) +
           attention_scratch_bytes(cpu_device(), B, opt_.heads, T, hd, hd);
  }
  std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>& in,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<AttentionLayer>(in[0]->shape[2].value, opt_, seed, where());
  }

 private:
  AttentionOptions opt_;
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
    need_weights_ = a.boolean("need_weights", true);
    average_ = a.boolean("average_attn_weights", true);
    causal_ = a.boolean("is_causal", false);
    a.finish();
    // The constructor's constraints (mha_semantics.md), checked here so the resolver reports
    // them without building the layer.
    require_at_least(opt_.embed_dim, 1, "embed_dim", where);
    require_at_least(opt_.num_heads, 1, "num_heads", where);
    if (opt_.embed_dim % opt_.num_heads != 0)
      fail(ErrorCode::Constraint, where,
           "num_heads=" + str(opt_.num_heads) + " must divide embed_dim=" + str(opt_.embed_dim));
    if (!(opt_.dropout >= 0.0 && opt_.dropout <= 1.0))
      fail(ErrorCode::Constraint, where,
           "dropout=" + ojson(opt_.dropout).dump() + " must be in [0, 1]");
    if (opt_.kdim) require_at_least(*opt_.kdim, 1, "kdim", where);
    if (opt_.vdim) require_at_least(*opt_.vdim, 1, "vdim", where);
  }
  const char* name() const override { return "multihead_attention"; }
  std::vector<PortSpec> input_ports() const override {
    return {
        {"query"}, {"key", true}, {"value", true}, {"key_padding_mask", true}, {"attn_mask", true}};
  }
  std::vector<std::string> output_ports() const override {
    if (need_weights_) return {"out", "weights"};
    return {"out"};
  }

  InferResult infer(const std::vector<const ValueType*>& in, SymbolBindings&) const override {
    const int64_t E = opt_.embed_dim, H = opt_.num_heads;
    const int64_t kdim = opt_.kdim.value_or(E), vdim = opt_.vdim.value_or(E);
    const ValueType& q = *in[0];
    const ValueType& k = in[1] ? *in[1] : q;
    const ValueType& v = in[2] ? *in[2] : k;
    require_float("query", q, "multihead_attention", where());
    require_float("key", k, "multihead_attention", where());
    require_float("value", v, "multihead_attention", where());
    const size_t rank = q.shape.size();
    if (rank != 2 && rank != 3)
      fail(ErrorCode::Shape, where(),
           named("query", q) + " must be 2-D (unbatched [L, E]) or 3-D (batched)");
    for (const auto& [port, t] : {std::pair<const char*, const ValueType*>{"key", &k},
                                  std::pair<const char*, const ValueType*>{"value", &v}})
      if (t->shape.size() != rank)
        fail(ErrorCode::Shape, where(),
             named(port, *t) + " must be " + str(static_cast<int64_t>(rank)) + "-D like " +
                 named("query", q));
    const bool batched = rank == 3;
    const bool bf = batched && opt_.batch_first;  // batch_first is ignored for unbatched input
    const size_t seq = bf ? 1 : 0, batch = bf ? 0 : 1;
    const Dim L = q.shape[seq], S = k.shape[seq];
    const Dim N = batched ? q.shape[batch] : Dim::fixed(1);
    auto check = [&](const Dim& got, const Dim& want, const std::string& what) {
      if (differ(got, want)) fail(ErrorCode::Shape, where(), what);
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
    const int64_t extra = (opt_.add_bias_kv ? 1 : 0) + (opt_.add_zero_attn ? 1 : 0);
    const Dim Sp = dim_sum({S, Dim::fixed(extra)}, where());

    if (const ValueType* m = in[3]) {  // key_padding_mask: (N, S), unbatched (S)
      require_mask("key_padding_mask", *m, where());
      const SymShape want = batched ? SymShape{N, S} : SymShape{S};
      bool ok = m->shape.size() == want.size();
      for (size_t i = 0; ok && i < want.size(); ++i) ok = !differ(m->shape[i], want[i]);
      if (!ok)
        fail(ErrorCode::Shape, where(),
             named("key_padding_mask", *m) + " must be " + sym_shape_to_string(want));
    }
    if (const ValueType* m = in[4]) {  // attn_mask: (L, S) or (N*H, L, S); S' wide accepted
      require_mask("attn_mask", *m, where());
      const Dim rows3 = batched ? dim_mul(N, Dim::fixed(H), where()) : Dim::fixed(H);
      const SymShape& s = m->shape;
      bool ok = (s.size() == 2 && !differ(s[0], L)) ||
                (s.size() == 3 && !differ(s[0], rows3) && !differ(s[1], L));
      ok = ok && !(differ(s.back(), S) && differ(s.back(), Sp));
      if (!ok)
        fail(ErrorCode::Shape, where(),
             named("attn_mask", *m) + " must be " + sym_shape_to_string({L, S}) + " or " +
                 sym_shape_to_string({rows3, L, S}));
    }

    InferResult r;
    SymShape out = q.shape;
    out.back() = Dim::fixed(E);
    r.outputs.push_back({out, DType::F32});
    if (need_weights_) {
      SymShape w;
      if (batched) w.push_back(N);
      if (!average_) w.push_back(Dim::fixed(H));
      w.push_back(L);
      w.push_back(Sp);
      r.outputs.push_back({w, DType::F32});
    }
    r.parameters = parameter_shapes();
    return r;
  }
  double flops(const std::vector<const ValueType*>& in) const override {
    const ValueType& q = *in[0];
    const ValueType& k = in[1] ? *in[1] : q;
    const bool batched = q.shape.size() == 3;
    const bool bf = batched && opt_.batch_first;
    const double L = static_cast<double>(q.shape[bf ? 1 : 0].value);
    const double S = static_cast<double>(k.shape[bf ? 1 : 0].value);
    const double N = batched ? static_cast<double>(q.shape[bf ? 0 : 1].value) : 1.0;
    const double E = static_cast<double>(opt_.embed_dim);
    const double kd = static_cast<double>(opt_.kdim.value_or(opt_.embed_dim));
    const double vd = static_cast<double>(opt_.vdim.value_or(opt_.embed_dim));
    const double Sp = S + (opt_.add_bias_kv ? 1 : 0) + (opt_.add_zero_attn ? 1 : 0);
    // q, k, v and out projections; q k^T and p v over all heads (2*L*S'*E each).
    return 2.0 * N * (L * E * E + S * kd * E + S * vd * E + L * E * E) + 4.0 * N * L * Sp * E;
  }
  double scratch_bytes(const std::vector<const ValueType*>& in) const override {
    const ValueType& q = *in[0];
    const ValueType& k = in[1] ? *in[1] : q;
    const bool batched = q.shape.size() == 3;
    const bool bf = batched && opt_.batch_first;
    const int64_t L = q.shape[bf ? 1 : 0].value, S = k.shape[bf ? 1 : 0].value;
    const int64_t N = batched ? q.shape[bf ? 0 : 1].value : 1;
    if (N == 0 || L == 0) return 0.0;  // forward returns before allocating scratch
    const int64_t extra = (opt_.add_bias_kv ? 1 : 0) + (opt_.add_zero_attn ? 1 : 0);
    const double n = static_cast<double>(N), l = static_cast<double>(L),
                 sp = static_cast<double>(S + extra), e = static_cast<double>(opt_.embed_dim),
                 h = static_cast<double>(opt_.num_heads);
    // MultiheadAttention::forward: the projections (one [N*S', 3E] buffer for self-attention,
    // else [N*L + 2*N*S', E]), the attention output [N*L, E], the combined mask (at most
    // [N, H, L, S']) when there is one, then the core's tiles. (Averaged weights are summed
    // tile by tile into the output: no per-head [N, H, L, S'] buffer.)
    double floats = std::max(3.0 * n * sp * e, (n * l + 2.0 * n * sp) * e) + n * l * e;
    if (in[3] || in[4] || (causal_ && extra > 0)) floats += n * h * l * sp;
    const int64_t head_dim = opt_.embed_dim / opt_.num_heads;
    // Each projection's packed input (one at a time; bounded by the widest and longest).
    const int64_t widest = std::max(
        {opt_.embed_dim, opt_.kdim.value_or(opt_.embed_dim), opt_.vdim.value_or(opt_.embed_dim)});
    return sizeof(float) * floats +
           linear_scratch_bytes(cpu_device(), N * std::max(L, S), widest, opt_.embed_dim) +
           attention_scratch_bytes(cpu_device(), N, opt_.num_heads, S + extra, head_dim, head_dim);
  }
  std::unique_ptr<OpLayer> instantiate(const std::vector<const ValueType*>&,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<MultiheadAttentionLayer>(opt_, seed, need_weights_, average_, causal_);
  }

 private:
  // interfaces.md §1 / mha_semantics.md: packed in_proj_weight when kdim == vdim == E.
  std::vector<std::pair<std::string, Shape>> parameter_shapes() const {
    const int64_t E = opt_.embed_dim;
    const int64_t kdim = opt_.kdim.value_or(E), vdim = opt_.vdim.value_or(E);
    std::vector<std::pair<std::string, Shape>> p;
    if (kdim == E && vdim == E) {
      p.emplace_back("in_proj_weight", Shape{3 * E, E});
    } else {
      p.emplace_back("q_proj_weight", Shape{E, E});
      p.emplace_back("k_proj_weight", Shape{E, kdim});
      p.emplace_back("v_proj_weight", Shape{E, vdim});
    }
    if (opt_.bias) p.emplace_back("in_proj_bias", Shape{3 * E});
    if (opt_.add_bias_kv) {
      p.emplace_back("bias_k", Shape{1, 1, E});
      p.emplace_back("bias_v", Shape{1, 1, E});
    }
    p.emplace_back("out_proj.weight", Shape{E, E});
    if (opt_.bias) p.emplace_back("out_proj.bias", Shape{E});
    return p;
  }

  MultiheadAttentionOptions opt_;
  bool need_weights_, average_, causal_;
};

// ------------------------------------------------------------------ the table

using Factory = std::unique_ptr<Op> (*)(const NetworkNode&, const std::string&);

template <class T>
std::unique_ptr<Op> make(const NetworkNode& node, const std::string& where) {
  return std::make_unique<T>(node, where);
}

// In the order of interfaces.md §2.
const std::vector<std::pair<std::string, Factory>>& table() {
  static const std::vector<std::pair<std::string, Factory>> ops = {
      {"attention", make<AttentionOp>}, {"multihead_attention", make<MultiheadAttentionOp>},
      {"linear", make<LinearOp>},       {"layer_norm", make<LayerNormOp>},
      {"gelu", make<GeluOp>},           {"add", make<AddOp>},
      {"chunk", make<ChunkOp>},         {"concat", make<ConcatOp>},
  };
  return ops;
}

}  // namespace

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& entry : table()) n.push_back(entry.first);
    return n;
  }();
  return names;
}

std::unique_ptr<Op> make_op(const NetworkNode& node) {
  const std::string where = node.name + " (" + node.op + ")";
  const auto& ops = table();
  const auto it = std::find_if(ops.begin(), ops.end(),
                               [&](const auto& entry) { return entry.first == node.op; });
  if (it == ops.end()) {
    std::string list;
    for (const std::string& n : op_names()) list += (list.empty() ? "" : ", ") + n;
    fail(ErrorCode::Arg, where, "unknown op '" + node.op + "' (ops: " + list + ")");
  }
  std::unique_ptr<Op> op = it->second(node, where);
  const std::vector<PortSpec> ports = op->input_ports();
  std::string list;
  for (const PortSpec& p : ports) list += (list.empty() ? "" : ", ") + p.name;
  for (const auto& input : node.inputs) {
    const std::string& port = input.first;  // not a structured binding: clang 14 cannot capture one
    if (std::none_of(ports.begin(), ports.end(), [&](const PortSpec& p) { return p.name == port; }))
      fail(ErrorCode::Arg, where,
           "unknown input port '" + port + "' (" + node.op + " takes " + list + ")");
  }
  for (const PortSpec& p : ports) {
    if (p.optional) continue;
    if (std::none_of(node.inputs.begin(), node.inputs.end(),
                     [&](const auto& in) { return in.first == p.name; }))
      fail(ErrorCode::Arg, where, "missing input port " + p.name);
  }
  return op;
}

}  // namespace tessera
