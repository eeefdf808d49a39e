// torch.nn.MultiheadAttention, inference, with the behaviour fixed in
// shared/docs/mha_semantics.md (PyTorch 2.x mask rules, fully masked rows give zeros).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "core/tensor.h"
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
