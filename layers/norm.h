// The norm family: layer normalisation over the last dim (nn.LayerNorm, the `layer_norm` op).
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "layers/parameters.h"

namespace tessera {

// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim (biased variance, as
// PyTorch); gamma and beta are [D] or undefined (no affine). y: like x, contiguous float32.
// Allocates nothing when x is contiguous float32.
void layer_norm_into(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                     Tensor& y, const std::string& where);

// nn.LayerNorm(D, eps, elementwise_affine) over the last dim: parameters `weight` [D] (ones)
// and `bias` [D] (zeros) when elementwise_affine.
class LayerNorm {
 public:
  LayerNorm(int64_t dim, double eps, bool elementwise_affine);
  void reset_parameters();
  int64_t dim() const { return dim_; }
  double eps() const { return eps_; }
  ParameterSet& parameters() { return params_; }
  const ParameterSet& parameters() const { return params_; }
  // x [..., D] -> y [..., D] float32 (y allocated by the caller). Thread-safe (const).
  void forward_into(const Tensor& x, Tensor& y, const std::string& where = "layer_norm") const;
  Tensor forward(const Tensor& x) const;

 private:
  int64_t dim_;
  double eps_;
  bool affine_;
  ParameterSet params_;
};

}  // namespace tessera
