// The linear family: projections y = x W^T + b (the kernel driver every layer projects with),
// nn.Linear, and the network's `linear` op, which share one set of rules.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/tensor.h"
#include "layers/activation.h"
#include "layers/parameters.h"

namespace tessera {

// Floats of workspace linear_forward_f32 needs for these sizes: x packed in panels when the
// backend's own kernel runs, nothing otherwise. The one place that decides; forward follows it.
int64_t linear_workspace_floats(const Device& device, int64_t rows, int64_t in_features,
                                int64_t out_features);

// y[m, n] = sum_k x[m, k] * w[n, k] + bias[n] (bias may be null). Row strides in elements;
// columns contiguous. `workspace`: linear_workspace_floats(...) floats, 64-byte aligned (may be
// null when that is 0). Work is split over the threads; allocates nothing. With w.panels (the
// layer's packed weight, ParameterSet::pack_projections) the rows of w are never read.
// `act` is applied to every element after the bias (the elementwise op's kernel, same bits); on
// the packed-panel path each task's block right after the block is computed, still in L2.
void linear_forward_f32(const Device& device, int64_t rows, int64_t in_features,
                        int64_t out_features, const float* x, int64_t x_stride,
                        ProjectionWeight w, const float* bias, float* y, int64_t y_stride,
                        float* workspace, Activation act = Activation::none);

// The same product with x's rows and y's each strided or at one pointer per row (MatrixRows,
// core/kernels.h): a gather of x's rows and a scatter of y's folded into it (Swin's window
// partition reads the map's cells in place and writes its output's). No workspace, no
// activation. With w.panels the packed kernel runs exactly as for linear_forward_f32 (same
// bits); without, each row is a few-rows product against w's rows.
void linear_forward_rows_f32(const Device& device, int64_t rows, int64_t in_features,
                             int64_t out_features, RowsInF32 x, ProjectionWeight w,
                             const float* bias, RowsOutF32 y);

// nn.Linear(in_features, out_features, bias): parameters `weight` [out, in], `bias` [out].
class Linear {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias);
  void reset_parameters(Generator& gen);
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return has_bias_; }
  ParameterSet& parameters() { return params_; }
  const ParameterSet& parameters() const { return params_; }
  // x [..., in] (any float dtype, any strides) -> [..., out] float32, contiguous.
  Tensor forward(const Tensor& x) const;

 private:
  int64_t in_, out_;
  bool has_bias_;
  ParameterSet params_;
};

}  // namespace tessera
