// The multihead attention family: torch.nn.MultiheadAttention, inference, with the behaviour
// fixed in shared/docs/mha_semantics.md (PyTorch 2.x mask rules, fully masked rows give zeros),
// as a C++ layer and as the network's `multihead_attention` op. Both go through the functions
// below: one validator, one shape inference, one scratch layout, one forward.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "core/tensor.h"
#include "layers/op.h"
#include "layers/parameters.h"

namespace tessera {

class Generator;

struct MultiheadAttentionOptions {
  int64_t embed_dim = 0;
  int64_t num_heads = 0;
  double dropout = 0.0;
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  std::optional<int64_t> kdim;  // nullopt: embed_dim
  std::optional<int64_t> vdim;
  bool batch_first = false;
  std::string device = "cpu";   // the only device today; anything else is E_UNSUPPORTED
  DType dtype = DType::F32;     // parameter dtype
};

// The call's arguments (forward's, or the op's args).
struct MhaCall {
  bool need_weights = true;
  bool average_attn_weights = true;
  bool is_causal = false;
};

// float32 parameters of one layer; null where the layout has none (packed in_proj_weight, or
// q/k/v_proj_weight; biases when bias=false; bias_k/v without add_bias_kv).
struct MhaWeights {
  ProjectionWeight in_proj_weight;
  ProjectionWeight q_proj_weight;
  ProjectionWeight k_proj_weight;
  ProjectionWeight v_proj_weight;
  const float* in_proj_bias = nullptr;
  const float* bias_k = nullptr;
  const float* bias_v = nullptr;
  ProjectionWeight out_proj_weight;
  const float* out_proj_bias = nullptr;
};

// The constructor's constraints (E_CONSTRAINT, E_UNSUPPORTED for a device, E_DTYPE).
void validate_mha_options(const MultiheadAttentionOptions& options, const std::string& where);
// interfaces.md §1 / mha_semantics.md: packed in_proj_weight when kdim == vdim == E.
std::vector<std::pair<std::string, Shape>> mha_parameter_shapes(
    const MultiheadAttentionOptions& options);
// Ports query, key?, value?, key_padding_mask?, attn_mask? (null: absent; key defaults to
// query, value to key) -> out, weights (when need_weights). E_SHAPE / E_DTYPE naming the port
// and shapes; a check on an open dim waits until it is bound.
InferResult infer_mha(const MultiheadAttentionOptions& options, const MhaCall& call,
                      const InputTypes& in, const std::string& where);
double mha_flops(const MultiheadAttentionOptions& options, const Shape& query, const Shape& key);
// The scratch mha_forward_f32 takes for these inputs (either layout: self-attention or not).
size_t mha_workspace_bytes(const MultiheadAttentionOptions& options, const MhaCall& call,
                           const Shape& query, const Shape& key, bool has_key_padding_mask,
                           const Shape* attn_mask);
// The forward on inputs infer_mha accepted: query/key/value contiguous float32 (one tensor
// passed as all three is self-attention: one packed projection); masks bool or float32 of any
// strides; output (and weights) contiguous float32 of the inferred shapes. Allocates nothing.
void mha_forward_f32(const MultiheadAttentionOptions& options, const MhaWeights& weights,
                     const MhaCall& call, const Tensor& query, const Tensor& key,
                     const Tensor& value, const Tensor* key_padding_mask, const Tensor* attn_mask,
                     Tensor& output, Tensor* attn_weights, Workspace& workspace);
// Incremental causal self-attention (generation; the op's StepRole::cached): `query` holds the
// new positions of every sequence, keys and values of the earlier ones are in step.cache
// (mha_cache_floats floats for the batch and capacity), which this call extends. Self-attention
// with the packed in-projection, no masks, no weights, no appended positions: the op checks.
void mha_forward_cached_f32(const MultiheadAttentionOptions& options, const MhaWeights& weights,
                            const Tensor& query, Tensor& output, const StepState& step,
                            Workspace& workspace);
size_t mha_cached_workspace_bytes(const MultiheadAttentionOptions& options, const Shape& query,
                                  int64_t capacity);
int64_t mha_cache_floats(const MultiheadAttentionOptions& options, int64_t batch,
                         int64_t capacity);
// The float32 parameters of `params` (which must be float32).
MhaWeights mha_weights(const ParameterSet& params, const MultiheadAttentionOptions& options);

struct MultiheadAttentionOutput {
  Tensor output;   // like query, last dim embed_dim
  Tensor weights;  // undefined when need_weights is false
};

class MultiheadAttention {
 public:
  // Validates (E_CONSTRAINT), declares the parameters and initialises them from `seed` (without
  // one they stay zero, for a load of every one).
  explicit MultiheadAttention(const MultiheadAttentionOptions& options,
                              std::optional<uint64_t> seed = 0);

  void reset_parameters(Generator& gen);
  LoadResult load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  std::map<std::string, Tensor> state_dict() const;
  const ParameterSet& parameters() const { return params_; }
  ParameterSet& parameters() { return params_; }

  // Thread-safe: const, no shared mutable state. Missing key/value (undefined tensors) default
  // to query / key as in the network file (`key` defaults to `query`, `value` to `key`).
  MultiheadAttentionOutput forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask = Tensor(),
                                   bool need_weights = true, const Tensor& attn_mask = Tensor(),
                                   bool average_attn_weights = true,
                                   bool is_causal = false) const;

  void train(bool mode = true) { training_ = mode; }
  void eval() { training_ = false; }
  bool training() const { return training_; }
  // "MultiheadAttention(embed_dim=8, num_heads=2, bias=True, batch_first=False)"
  std::string repr() const;
  const MultiheadAttentionOptions& options() const { return opt_; }
  int64_t kdim() const;
  int64_t vdim() const;
  // Whether the packed in_proj_weight is used (kdim == vdim == embed_dim).
  bool packed_in_proj() const;

 private:
  MultiheadAttentionOptions opt_;
  ParameterSet params_;
  bool training_ = false;
};

}  // namespace tessera
