// Ops that bring tensors into the graph rather than transform one: `embedding` (a table row per
// int64 id, torch.nn.Embedding), `arange` (the positions 0..n-1 of a dim, torch.arange) and
// `parameter` (a learned tensor used directly as a value: ViT's class_token and pos_embedding,
// named as its node, interfaces.md §1).
#include <algorithm>
#include <cstring>
#include <string>

#include "core/limits.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/text.h"
#include "layers/op.h"
#include "layers/op_args.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

// Rows copied per parallel_for task: 64 rows of GPT-2's 768 floats are 192 KB, enough to
// amortise a task; a [1, 1] lookup stays on the calling thread.
constexpr int64_t kRowGrain = 64;

// Copies a float32 row table into `out` row by row: out[i] = table[ids[i]], ids checked before.
void gather_rows(const float* table, int64_t dim, const int64_t* ids, int64_t n, float* out) {
  parallel_for(0, n, kRowGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(out + i * dim, table + ids[i] * dim, sizeof(float) * static_cast<size_t>(dim));
  });
}

// ---------------------------------------------------------------- embedding

class EmbeddingLayer : public OpLayer {
 public:
  EmbeddingLayer(int64_t num, int64_t dim, std::optional<int64_t> padding_idx,
                 std::optional<uint64_t> seed, std::string where)
      : num_(num), dim_(dim), where_(std::move(where)) {
    params_.add("weight", {num, dim});
    if (!seed) return;
    // nn.Embedding.reset_parameters: N(0, 1), the padding row zeroed.
    Generator gen(*seed);
    Tensor& w = params_.mutable_tensor("weight");
    float* p = w.data<float>();
    for (int64_t i = 0; i < num * dim; ++i) p[i] = static_cast<float>(gen.normal());
    if (padding_idx) std::fill(p + *padding_idx * dim, p + (*padding_idx + 1) * dim, 0.0f);
  }
  ParameterSet* parameters() override { return &params_; }
  void load(const std::map<std::string, Tensor>& state) override {
    params_.load(state, false, where_);
  }
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace&) const override {
    const Tensor& x = *in[0];
    const int64_t n = x.numel();
    const int64_t* ids = n ? x.data<int64_t>() : nullptr;
    // Every id checked before any row is read: an id outside the table is the caller's error.
    for (int64_t i = 0; i < n; ++i)
      if (ids[i] < 0 || ids[i] >= num_)
        fail(ErrorCode::Shape, where_,
             "id " + str(ids[i]) + " at flat index " + str(i) + " of x " + x.shape_str() +
                 " is outside [0, " + str(num_) + ") (num_embeddings)");
    if (n) gather_rows(params_.tensor("weight").data<float>(), dim_, ids, n, out[0]->data<float>());
  }

 private:
  int64_t num_, dim_;
  std::string where_;
  ParameterSet params_;
};

class EmbeddingOp : public Op {
 public:
  EmbeddingOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "embedding");
    num_ = a.integer("num_embeddings");
    dim_ = a.integer("embedding_dim");
    padding_idx_ = a.optional_integer("padding_idx");
    const nlohmann::ordered_json* max_norm = a.raw("max_norm");
    a.number("norm_type", 2.0);              // used only with max_norm
    a.boolean("scale_grad_by_freq", false);  // training only
    a.boolean("sparse", false);              // training only
    a.finish();
    require_at_least(num_, 1, "num_embeddings", where);
    require_at_least(dim_, 1, "embedding_dim", where);
    if (max_norm && !max_norm->is_null())
      fail(ErrorCode::Unsupported, where,
           "max_norm is not supported (PyTorch renormalises the table in place at each forward)");
    if (padding_idx_) {
      // nn.Embedding: padding_idx in [-num, num), a negative one counting from the end.
      if (*padding_idx_ < -num_ || *padding_idx_ >= num_)
        fail(ErrorCode::Constraint, where,
             "padding_idx=" + str(*padding_idx_) + " must be within num_embeddings=" + str(num_));
      if (*padding_idx_ < 0) *padding_idx_ += num_;
    }
  }
  const char* name() const override { return "embedding"; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& x = *in[0];
    if (x.dtype != DType::I64)
      fail(ErrorCode::DType, where(),
           named("x", x) + " is " + dtype_name(x.dtype) + "; embedding takes int64 ids");
    // Positions (arange) known to reach past the table: a sequence longer than the context.
    if (x.index_limit.is_fixed() && x.index_limit.value > num_)
      fail(ErrorCode::Shape, where(),
           "positions 0.." + str(x.index_limit.value - 1) + " need " + str(x.index_limit.value) +
               " rows, num_embeddings=" + str(num_) + " (a sequence longer than the table)");
    InferResult r;
    SymShape out = x.shape;
    out.push_back(Dim::fixed(dim_));
    r.outputs.push_back({out, DType::F32});
    r.parameters.emplace_back("weight", Shape{num_, dim_});
    return r;
  }
  OpCost cost(const InputTypes&) const override { return {}; }  // data movement only
  StepRole step_role(const InputTypes&, const std::string&, std::string&) const override {
    return StepRole::per_position;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<EmbeddingLayer>(num_, dim_, padding_idx_, seed, where());
  }

 private:
  int64_t num_, dim_;
  std::optional<int64_t> padding_idx_;
};

// ---------------------------------------------------------------- arange

class ArangeLayer : public OpLayer {
 public:
  void forward(std::span<const Tensor* const>, std::span<Tensor* const> out,
               Workspace&) const override {
    fill(*out[0], 0);
  }
  void forward_step(std::span<const Tensor* const>, std::span<Tensor* const> out, Workspace&,
                    const StepState& step) const override {
    fill(*out[0], step.past);
  }

 private:
  static void fill(Tensor& out, int64_t first) {
    const int64_t n = out.numel();
    int64_t* p = n ? out.data<int64_t>() : nullptr;
    for (int64_t i = 0; i < n; ++i) p[i] = first + i;
  }
};

class ArangeOp : public Op {
 public:
  ArangeOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "arange");
    dim_ = a.integer("dim");
    a.finish();
  }
  const char* name() const override { return "arange"; }
  std::vector<PortSpec> input_ports() const override { return {{"like"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
    const ValueType& like = *in[0];
    const int64_t d = wrap_dim(dim_, static_cast<int64_t>(like.shape.size()), where(), "like");
    const Dim n = like.shape[static_cast<size_t>(d)];
    InferResult r;
    r.outputs.push_back({SymShape{n}, DType::I64, n});
    return r;
  }
  OpCost cost(const InputTypes&) const override { return {}; }
  // Over the sequence dim: the positions of this run, past .. past + T - 1. Over any other dim
  // the values do not depend on the sequence.
  StepRole step_role(const InputTypes& in, const std::string& seq, std::string&) const override {
    const int64_t rank = static_cast<int64_t>(in[0]->shape.size());
    const int64_t d = dim_ < 0 ? dim_ + rank : dim_;
    return d == seq_axis(in[0]->shape, seq) ? StepRole::positions : StepRole::per_position;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&,
                                       std::optional<uint64_t>) const override {
    return std::make_unique<ArangeLayer>();
  }

 private:
  int64_t dim_;
};

// ---------------------------------------------------------------- parameter

class ParameterLayer : public OpLayer {
 public:
  ParameterLayer(const Shape& shape, double std, std::optional<uint64_t> seed, std::string where)
      : where_(std::move(where)) {
    params_.add("", shape);
    if (!seed || std == 0.0) return;
    Generator gen(*seed);
    init_trunc_normal(params_.mutable_tensor(""), gen, std);
  }
  ParameterSet* parameters() override { return &params_; }
  void load(const std::map<std::string, Tensor>& state) override {
    params_.load(state, false, where_);
  }
  void forward(std::span<const Tensor* const>, std::span<Tensor* const> out,
               Workspace&) const override {
    // A copy into the plan's buffer (ViT-B's pos_embedding: 600 KB, ~0.05 ms, against ~90 ms of
    // the model) keeps "every output in a plan buffer" true for the ops after it.
    const Tensor& value = params_.tensor("");
    if (value.numel())
      std::memcpy(out[0]->raw_data(), value.raw_data(), value.nbytes());
  }

 private:
  std::string where_;
  ParameterSet params_;
};

class ParameterOp : public Op {
 public:
  ParameterOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "parameter");
    const nlohmann::ordered_json* shape = a.raw("shape");
    std_ = a.number("std", 0.0);
    a.finish();
    if (!shape) fail(ErrorCode::Arg, where, "missing argument shape");
    if (!shape->is_array()) a.type_error("shape", "an array of integers", *shape);
    if (shape->size() > static_cast<size_t>(kMaxRank))
      fail(ErrorCode::Shape, where,
           "shape has rank " + str(static_cast<int64_t>(shape->size())) + ", over the limit of " +
               str(kMaxRank));
    for (const auto& d : *shape) {
      if (!d.is_number_integer()) a.type_error("shape", "an array of integers", *shape);
      const int64_t v = d.get<int64_t>();
      if (v < 0) fail(ErrorCode::Shape, where, "shape " + shape->dump() + " has a negative dim");
      shape_.push_back(v);
    }
    shape_numel(shape_);  // E_SHAPE when the count overflows
    if (!(std_ >= 0.0))
      fail(ErrorCode::Constraint, where, "std=" + py_float(std_) + " must be >= 0");
  }
  const char* name() const override { return "parameter"; }
  std::vector<PortSpec> input_ports() const override { return {}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes&, SymbolBindings&) const override {
    InferResult r;
    r.outputs.push_back({fixed_shape(shape_), DType::F32});
    r.parameters.emplace_back("", shape_);
    return r;
  }
  OpCost cost(const InputTypes&) const override { return {}; }
  std::unique_ptr<OpLayer> instantiate(const InputTypes&,
                                       std::optional<uint64_t> seed) const override {
    return std::make_unique<ParameterLayer>(shape_, std_, seed, where());
  }

 private:
  Shape shape_;
  double std_ = 0.0;
};

}  // namespace

std::unique_ptr<Op> make_embedding_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<EmbeddingOp>(node, where);
}
std::unique_ptr<Op> make_arange_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<ArangeOp>(node, where);
}
std::unique_ptr<Op> make_parameter_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<ParameterOp>(node, where);
}

}  // namespace tessera
