// The attention family: the `attention` op of shared/reference/attention_op_spec.txt
// (attention@1), multi-head self-attention over [B, T, D] with q/k/v/o projections, causal
// masking, rotary embeddings and a learned 2-D relative-position bias, as a C++ layer and as
// the network op (one validator, one forward). Shares the attention core with
// MultiheadAttention.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/workspace.h"
#include "layers/op.h"
#include "layers/parameters.h"

namespace tessera {

class Generator;

struct AttentionOptions {
  int64_t heads = 0;
  bool causal = false;
  double dropout = 0.0;
  bool bias = true;
  bool qkv_bias = true;
  bool out_bias = true;
  bool rope = false;
  bool relative_position_bias = false;
  int64_t spatial_h = 0, spatial_w = 0;   // spatial_shape (H, W); an int n means (n, n)
  std::map<std::string, double> init;     // parameter name -> std of a 2-sigma truncated normal
  std::map<std::string, bool> trainable;  // parameter name -> flag (metadata)
};

class Attention {
 public:
  // `dim` is D, the model width. Validates every constraint that does not need T
  // (E_CONSTRAINT / E_ARG), declares parameters, initialises them from `seed`
  // (projections as nn.Linear, table zeros, then the `init` overrides; without a seed they stay
  // zero, for a load of every one). `where` prefixes every error message ("n0 (attention)").
  Attention(int64_t dim, const AttentionOptions& options, std::optional<uint64_t> seed = 0,
            std::string where = "attention");
  // A copy owns its parameters (deep copy): loading into it never touches the original, which
  // a shallow copy would, through the shared packed q/k/v buffer.
  Attention(const Attention& other);
  Attention& operator=(const Attention& other);
  Attention(Attention&&) = default;
  Attention& operator=(Attention&&) = default;

  // Every parameter in declaration order: nn.Linear's reset for the projections, zeros for the
  // table, unless `init` names the parameter. Trainable flags are left as they are.
  void reset_parameters(Generator& gen);
  // ParameterSet::load with this layer's `where`; relative_position_index in `state` is an
  // unexpected key, as for PyTorch's non-persistent buffer.
  LoadResult load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  std::map<std::string, Tensor> state_dict() const;  // never includes relative_position_index
  const ParameterSet& parameters() const { return params_; }
  ParameterSet& parameters() { return params_; }
  // PyTorch's non-persistent [T, T] int64 gather index, built on request (empty without
  // relative_position_bias). forward never builds it: the kernel computes each index.
  Tensor relative_position_index() const;

  // x [B, T, D] -> [B, T, D] float32. Checks T against spatial_shape (E_CONSTRAINT).
  // Thread-safe (const). In training mode with dropout > 0, `dropout_seed` seeds the mask.
  Tensor forward(const Tensor& x, uint64_t dropout_seed = 0) const;
  // E_SHAPE / E_DTYPE / E_CONSTRAINT unless x is a [B, T, D] float tensor this layer accepts.
  void check_input(const Tensor& x) const;
  // forward's work on a checked, contiguous float32 x into `out` (contiguous float32
  // [B, T, D]), scratch from `ws` (workspace_bytes(B, T)). Allocates nothing.
  void forward_into(const Tensor& x, Tensor& out, Workspace& ws, uint64_t dropout_seed = 0) const;
  // Incremental causal forward (generation): x [B, T, D] holds positions step.past .. past+T-1 of
  // each sequence (rope rotates them at those positions); keys and values of the earlier ones
  // are in step.cache (attention_cache_floats), which this call extends. Causal, no relative
  // position bias, no dropout (the op checks). Scratch: attention_cached_workspace_bytes.
  void forward_cached_into(const Tensor& x, Tensor& out, Workspace& ws,
                           const StepState& step) const;
  // The scratch forward_into takes for x [batch, seq_len, D], from the same layout it uses.
  size_t workspace_bytes(int64_t batch, int64_t seq_len) const;

  void train(bool mode = true) { training_ = mode; }
  void eval() { training_ = false; }
  bool training() const { return training_; }
  std::string repr() const;
  int64_t dim() const { return dim_; }
  const AttentionOptions& options() const { return opt_; }

 private:
  void forward_impl(const Tensor& x, Tensor& out, Workspace& ws, uint64_t dropout_seed,
                    const StepState* step) const;
  // Points q/k/v_proj.weight (and .bias) at row blocks of the packed qkv_weight_ [3D, D] and
  // qkv_bias_ [3D], copying in any value that was replaced (ParameterSet::load assigns fresh
  // tensors). In-place writes through parameters() then reach the packed copy by themselves.
  void bind_packed_qkv();
  // True when every q/k/v parameter still views the packed buffers.
  bool packed_qkv_bound() const;

  int64_t dim_;
  AttentionOptions opt_;
  std::string where_;
  ParameterSet params_;
  Tensor qkv_weight_;  // [3D, D] float32: q, k, v weights stacked for one GEMM
  Tensor qkv_bias_;    // [3D] float32, undefined when q/k/v carry no bias
  bool training_ = false;
};

// The parameters an `attention` layer of width `dim` declares, in declaration order, with their
// shapes (for counting without building the layer, and for checking `init`/`trainable` names).
std::vector<std::pair<std::string, Shape>> attention_parameter_shapes(
    const AttentionOptions& options, int64_t dim);

// The scratch Attention::forward_into takes for x [batch, seq_len, dim] (`dropout`: training
// mode with dropout > 0), from the same layout function it runs.
size_t attention_cached_workspace_bytes(const AttentionOptions& options, int64_t dim,
                                        int64_t batch, int64_t seq_len, int64_t capacity);
int64_t attention_cache_floats(const AttentionOptions& options, int64_t dim, int64_t batch,
                               int64_t capacity);
size_t attention_workspace_bytes(const AttentionOptions& options, int64_t dim, int64_t batch,
                                 int64_t seq_len, bool dropout);

// Validates the options against D (and T when known, T < 0 meaning open): the shared checks of
// the layer and the network resolver. `where` prefixes messages ("n0 (attention)").
void validate_attention_options(const AttentionOptions& options, int64_t dim, int64_t seq_len,
                                const std::string& where);

}  // namespace tessera
