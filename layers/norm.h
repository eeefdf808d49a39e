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

// layer_norm_into(x + residual): the sum formed row by row and normalized in the same pass
// (one read of each operand). `residual` has x's shape; `sum`, when not null, receives x + residual
// (the bits add_into gives). Allocates nothing when x and residual are contiguous float32.
void add_layer_norm_into(const Tensor& x, const Tensor& residual, const Tensor& gamma,
                         const Tensor& beta, double eps, Tensor* sum, Tensor& y,
                         const std::string& where);

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
  // forward_into(x + residual), the sum also written to `sum` when not null (add_layer_norm_into).
  void forward_summed_into(const Tensor& x, const Tensor& residual, Tensor* sum, Tensor& y,
                           const std::string& where = "layer_norm") const;

 private:
  // forward_into(x [+ residual]): the one check of x and the one lookup of the affine
  // parameters for both.
  void normalize(const Tensor& x, const Tensor* residual, Tensor* sum, Tensor& y,
                 const std::string& where) const;
  int64_t dim_;
  double eps_;
  bool affine_;
  ParameterSet params_;
};

}  // namespace tessera
