// The ops table: one line per op. An op lives in its family's file (layers/), which defines its
// factory; ARCHITECTURE.md has the recipe for adding one.
#include <algorithm>

#include "core/text.h"
#include "layers/op.h"

namespace tessera {

using OpFactory = std::unique_ptr<Op> (*)(const NetworkNode& node, const std::string& where);

// Defined in the family files.
std::unique_ptr<Op> make_attention_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_multihead_attention_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_linear_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_layer_norm_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_gelu_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_add_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_relu_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_chunk_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_concat_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_embedding_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_arange_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_parameter_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_reshape_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_flatten_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_permute_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_transpose_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_unsqueeze_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_squeeze_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_slice_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_select_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_roll_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_pad_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_expand_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_patch_merging_pad_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_conv2d_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_mean_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_adaptive_avg_pool2d_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_sub_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_mul_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_div_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_silu_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_tanh_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_sigmoid_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_softmax_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_dropout_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_matmul_op(const NetworkNode&, const std::string&);
std::unique_ptr<Op> make_shifted_window_attention_op(const NetworkNode&, const std::string&);

namespace {

struct OpEntry {
  const char* name;
  OpFactory make;
};

// In the order of interfaces.md §2.
constexpr OpEntry kOps[] = {
    {"attention", make_attention_op},                      // layers/attention.cpp
    {"multihead_attention", make_multihead_attention_op},  // layers/multihead_attention.cpp
    {"linear", make_linear_op},                            // layers/linear.cpp
    {"layer_norm", make_layer_norm_op},                    // layers/norm.cpp
    {"gelu", make_gelu_op},                                // layers/elementwise.cpp
    {"add", make_add_op},                                  // layers/elementwise.cpp
    {"chunk", make_chunk_op},                              // layers/shape_ops.cpp
    {"concat", make_concat_op},                            // layers/shape_ops.cpp
    {"relu", make_relu_op},                                // layers/elementwise.cpp
    {"embedding", make_embedding_op},                      // layers/embedding.cpp
    {"arange", make_arange_op},                            // layers/embedding.cpp
    {"parameter", make_parameter_op},                      // layers/embedding.cpp
    {"reshape", make_reshape_op},                          // layers/shape_ops.cpp
    {"flatten", make_flatten_op},                          // layers/shape_ops.cpp
    {"permute", make_permute_op},                          // layers/shape_ops.cpp
    {"transpose", make_transpose_op},                      // layers/shape_ops.cpp
    {"unsqueeze", make_unsqueeze_op},                      // layers/shape_ops.cpp
    {"squeeze", make_squeeze_op},                          // layers/shape_ops.cpp
    {"slice", make_slice_op},                              // layers/shape_ops.cpp
    {"select", make_select_op},                            // layers/shape_ops.cpp
    {"roll", make_roll_op},                                // layers/shape_ops.cpp
    {"pad", make_pad_op},                                  // layers/shape_ops.cpp
    {"expand", make_expand_op},                            // layers/shape_ops.cpp
    {"patch_merging_pad", make_patch_merging_pad_op},      // layers/shape_ops.cpp
    {"conv2d", make_conv2d_op},                            // layers/conv.cpp
    {"mean", make_mean_op},                                // layers/conv.cpp
    {"adaptive_avg_pool2d", make_adaptive_avg_pool2d_op},  // layers/conv.cpp
    {"sub", make_sub_op},                                  // layers/elementwise.cpp
    {"mul", make_mul_op},                                  // layers/elementwise.cpp
    {"div", make_div_op},                                  // layers/elementwise.cpp
    {"silu", make_silu_op},                                // layers/elementwise.cpp
    {"tanh", make_tanh_op},                                // layers/elementwise.cpp
    {"sigmoid", make_sigmoid_op},                          // layers/elementwise.cpp
    {"softmax", make_softmax_op},                          // layers/elementwise.cpp
    {"dropout", make_dropout_op},                          // layers/elementwise.cpp
    {"matmul", make_matmul_op},                            // layers/matmul.cpp
    {"shifted_window_attention", make_shifted_window_attention_op},  // layers/swin_attention.cpp
};

}  // namespace

void OpLayer::forward_activated(std::span<const Tensor* const>, std::span<Tensor* const>,
                                Workspace&, Activation) const {
  fail(ErrorCode::Internal, "plan", "a fused activation on a layer that does not apply one");
}

void OpLayer::forward_summed(const Tensor&, const Tensor&, Tensor*, std::span<Tensor* const>,
                             Workspace&) const {
  fail(ErrorCode::Internal, "plan", "a fused residual sum on a layer that does not form one");
}

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const OpEntry& entry : kOps) n.push_back(entry.name);
    return n;
  }();
  return names;
}

std::unique_ptr<Op> make_op(const NetworkNode& node) {
  const std::string where = node.name + " (" + node.op + ")";
  const auto it = std::find_if(std::begin(kOps), std::end(kOps),
                               [&](const OpEntry& entry) { return entry.name == node.op; });
  if (it == std::end(kOps))
    fail(ErrorCode::Arg, where, "unknown op '" + node.op + "' (ops: " + join(op_names()) + ")");
  std::unique_ptr<Op> op = it->make(node, where);
  const std::vector<PortSpec> ports = op->input_ports();
  std::vector<std::string> names;
  for (const PortSpec& p : ports) names.push_back(p.name);
  const std::string list = join(names);
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
