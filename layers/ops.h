// The network's elementwise and structural ops (layer_norm, gelu, add, chunk, concat) on Tensors.
// Each validates once at entry (messages name `where`, the argument and the shapes), then splits
// rows over the worker threads and calls the backend kernels. Outputs are written into tensors
// the caller allocated (contiguous float32 of the documented shape), so a plan reuses its buffers
// and a repeated call allocates nothing. Inputs are float32 of any strides (a non-contiguous one
// is copied first).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "layers/parameters.h"

namespace tessera {

class Generator;

// PyTorch broadcasting: shapes aligned at the last dim; a dim of 1 stretches. E_SHAPE when two
// aligned dims differ and neither is 1.
Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where);

// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim (biased variance, as
// PyTorch); gamma and beta are [D] or undefined (no affine). y: like x.
void layer_norm_into(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                     Tensor& y, const std::string& where);

// y = gelu(x): x * Phi(x) with the exact erf form, or the tanh approximation. y: like x.
void gelu_into(const Tensor& x, bool tanh_approx, Tensor& y, const std::string& where);

// y = a + b with broadcasting. y: broadcast_shapes(a, b).
void add_into(const Tensor& a, const Tensor& b, Tensor& y, const std::string& where);

// torch.chunk with equal pieces: outs[i] = x.narrow(dim, i * n, n), n = size(dim) / outs.size()
// (size(dim) must be a multiple: E_CONSTRAINT). dim may be negative.
void chunk_into(const Tensor& x, int64_t dim, const std::vector<Tensor*>& outs,
                const std::string& where);

// torch.cat: y = xs joined along dim (negative counts from the end); every other dim equal.
void concat_into(const std::vector<const Tensor*>& xs, int64_t dim, Tensor& y,
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

 private:
  int64_t dim_;
  double eps_;
  bool affine_;
  ParameterSet params_;
};

}  // namespace tessera
