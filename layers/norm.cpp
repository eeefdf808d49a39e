#include "backends/cpu/cpu_device.h"
#include "layers/norm.h"

#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "core/text.h"
#include "layers/op_args.h"
#include "layers/tensor_checks.h"

namespace tessera {

namespace {

// layer_norm_into, add_layer_norm_into and LayerNorm: `residual` (with `sum`, or y as its scratch)
// only for a summed norm.
void layer_norm_rows(const Tensor& x, const Tensor* residual, Tensor* sum, const Tensor& gamma,
                     const Tensor& beta, double eps, Tensor& y, const std::string& where) {
  Tensor xs, rs, gs, bs;
  const Tensor& xc = f32_contiguous(x, xs, "x", where);
  if (xc.dim() < 1) fail(ErrorCode::Shape, where, "x " + xc.shape_str() + " has no last dim");
  const int64_t D = xc.size(-1);
  const float* r = nullptr;
  if (residual) {
    const Tensor& rc = f32_contiguous(*residual, rs, "residual", where);
    if (rc.shape() != xc.shape())
      fail(ErrorCode::Shape, where,
           "residual " + rc.shape_str() + " is not the shape of x " + xc.shape_str());
    r = rc.data<float>();
  }
  const float* g = nullptr;
  const float* b = nullptr;
  if (gamma.defined()) {
    if (gamma.dim() != 1 || gamma.size(0) != D)
      fail(ErrorCode::Shape, where,
           "weight " + gamma.shape_str() + " is not [" + std::to_string(D) + "]");
    g = f32_contiguous(gamma, gs, "weight", where).data<float>();
  }
  if (beta.defined()) {
    if (beta.dim() != 1 || beta.size(0) != D)
      fail(ErrorCode::Shape, where,
           "bias " + beta.shape_str() + " is not [" + std::to_string(D) + "]");
    b = f32_contiguous(beta, bs, "bias", where).data<float>();
  }
  check_output(y, xc.shape(), "y", where);
  if (sum) check_output(*sum, xc.shape(), "sum", where);
  if (D == 0 || xc.numel() == 0) return;
  const int64_t rows = xc.numel() / D;
  const float* xp = xc.data<float>();
  float* yp = y.data<float>();
  float* sp = sum ? sum->data<float>() : yp;
  const KernelTable& k = cpu_device().kernels();
  const float e = static_cast<float>(eps);
  // One block of rows per thread, none under 16K floats. The rows arrive from a projection
  // whose threads each wrote a share of every row's columns, so whichever core runs a block
  // reads part of it from the other core's cache; split, each core pulls half of that (inline,
  // one pulls all of it). Two threads, AVX-512, Zen 5, 5 alternating rounds: nn.Transformer
  // 34.1 ms per run against 34.8 with kElementGrain's inline [128, 512] norms, swin_t 30.1
  // against 30.8; vit_b_16 and the gpt level. (More blocks than threads lost on Zen 4:
  // tensor_checks.h.)
  const int64_t threads = num_threads();
  const int64_t grain = std::max((rows + threads - 1) / threads, (int64_t{16384} + D - 1) / D);
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    if (r)
      k.add_layer_norm_rows_f32(r1 - r0, D, xp + r0 * D, D, r + r0 * D, D, sp + r0 * D, D,
                                yp + r0 * D, D, g, b, e);
    else
      k.layer_norm_rows_f32(r1 - r0, D, xp + r0 * D, D, yp + r0 * D, D, g, b, e);
  });
}

}  // namespace

void layer_norm_into(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                     Tensor& y, const std::string& where) {
  layer_norm_rows(x, nullptr, nullptr, gamma, beta, eps, y, where);
}

void add_layer_norm_into(const Tensor& x, const Tensor& residual, const Tensor& gamma,
                         const Tensor& beta, double eps, Tensor* sum, Tensor& y,
                         const std::string& where) {
  layer_norm_rows(x, &residual, sum, gamma, beta, eps, y, where);
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool elementwise_affine)
    : dim_(dim), eps_(eps), affine_(elementwise_affine) {
  if (dim < 1)
    fail(ErrorCode::Constraint, "layer_norm",
         "normalized dim D=" + std::to_string(dim) + " must be >= 1");
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
  normalize(x, nullptr, nullptr, y, where);
}

void LayerNorm::forward_summed_into(const Tensor& x, const Tensor& residual, Tensor* sum,
                                    Tensor& y, const std::string& where) const {
  normalize(x, &residual, sum, y, where);
}

void LayerNorm::normalize(const Tensor& x, const Tensor* residual, Tensor* sum, Tensor& y,
                          const std::string& where) const {
  if (x.dim() < 1 || x.size(-1) != dim_)
    fail(ErrorCode::Shape, where,
         "x " + x.shape_str() + " does not end in the normalized dim D=" + std::to_string(dim_));
  // References, not copies: copying a Tensor copies its shape (a heap allocation per run).
  static const Tensor kNone;
  const Tensor& gamma = affine_ ? params_.tensor("weight") : kNone;
  const Tensor& beta = affine_ ? params_.tensor("bias") : kNone;
  layer_norm_rows(x, residual, sum, gamma, beta, eps_, y, where);
}

Tensor LayerNorm::forward(const Tensor& x) const {
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  forward_into(x, y);
  return y;
}

// ---------------------------------------------------------------- the `layer_norm` op

namespace {

class LayerNormLayer : public OpLayer {
 public:
  LayerNormLayer(int64_t dim, double eps, bool affine, std::string where)
      : norm_(dim, eps, affine), where_(std::move(where)) {}
  ParameterSet* parameters() override { return &norm_.parameters(); }
  void load(const std::map<std::string, Tensor>& state) override {
    norm_.parameters().load(state, false, where_);
  }
  void forward(std::span<const Tensor* const> in, std::span<Tensor* const> out,
               Workspace&) const override {
    norm_.forward_into(*in[0], *out[0], where_);
  }
  void forward_summed(const Tensor& x, const Tensor& residual, Tensor* sum,
                      std::span<Tensor* const> out, Workspace&) const override {
    norm_.forward_summed_into(x, residual, sum, *out[0], where_);
  }

 private:
  LayerNorm norm_;
  std::string where_;
};

class LayerNormOp : public Op {
 public:
  LayerNormOp(const NetworkNode& node, const std::string& where) : Op(where) {
    Args a(node.args, where, "layer_norm");
    eps_ = a.number("eps", 1e-5);
    affine_ = a.boolean("elementwise_affine", true);
    a.finish();
    if (!(eps_ >= 0.0) || std::isinf(eps_))
      fail(ErrorCode::Constraint, where,
           "eps=" + nlohmann::ordered_json(eps_).dump() + " must be finite and >= 0");
  }
  const char* name() const override { return "layer_norm"; }
  bool normalizes_sum() const override { return true; }
  std::vector<PortSpec> input_ports() const override { return {{"x"}}; }
  std::vector<std::string> output_ports() const override { return {"out"}; }

  InferResult infer(const InputTypes& in, SymbolBindings&) const override {
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
  OpCost cost(const InputTypes& in) const override {
    // fvcore's count: subtract the mean, square, sum, scale (4), plus the affine (5).
    return {(affine_ ? 5.0 : 4.0) * elements(in[0]->shape), 0.0};
  }
  // The normalized (last) dim is fixed (infer), so never the sequence dim.
  StepRole step_role(const InputTypes&, const std::string&, std::string&) const override {
    return StepRole::per_position;
  }
  std::unique_ptr<OpLayer> instantiate(const InputTypes& in,
                                       std::optional<uint64_t>) const override {
    return std::make_unique<LayerNormLayer>(in[0]->shape.back().value, eps_, affine_, where());
  }

 private:
  double eps_;
  bool affine_;
};

}  // namespace

std::unique_ptr<Op> make_layer_norm_op(const NetworkNode& node, const std::string& where) {
  return std::make_unique<LayerNormOp>(node, where);
}

}  // namespace tessera
