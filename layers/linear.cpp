#include "layers/linear.h"

#include <algorithm>

#include "core/parallel.h"
#include "core/random.h"

namespace tessera {

void linear_forward_f32(const Device& device, int64_t rows, int64_t in_features,
                        int64_t out_features, const float* x, int64_t x_stride, const float* w,
                        const float* bias, float* y, int64_t y_stride) {
  if (rows <= 0 || out_features <= 0) return;
  const KernelTable& k = device.kernels();
  // The split below depends on the shape only, never on the thread count, so results are
  // bitwise identical on 1, 2 or 8 threads (security suite, determinism): OpenBLAS's result for
  // one element can change with the N of the call (measured: a [2, 512] x [512, 1024] product
  // split into 2 and into 8 column slices differed in the last bit), while splitting rows keeps
  // every element's K loop and blocking unchanged.
  // Below ~2 MFLOP a second thread costs more (wake-up ~5-10 us) than it saves.
  const double flops = 2.0 * static_cast<double>(rows) * in_features * out_features;
  if (flops < 2e6) {
    k.gemm_f32(false, true, rows, out_features, in_features, 1.0f, x, x_stride, w, in_features,
               0.0f, y, y_stride);
    if (bias) k.add_bias_rows_f32(rows, out_features, y, y_stride, bias);
    return;
  }
  if (rows >= 32) {
    // Split rows: each worker runs one GEMM over a block of rows with the whole weight, so the
    // weight panel is packed once per block (one block per thread keeps packing at 1/threads).
    const int threads = num_threads();
    const int64_t grain = std::max<int64_t>(16, (rows + threads - 1) / threads);
    parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      k.gemm_f32(false, true, r1 - r0, out_features, in_features, 1.0f, x + r0 * x_stride,
                 x_stride, w, in_features, 0.0f, y + r0 * y_stride, y_stride);
      if (bias) k.add_bias_rows_f32(r1 - r0, out_features, y + r0 * y_stride, y_stride, bias);
    });
  } else {
    // Few rows (decode-like): split output features into fixed blocks of 128 (a whole number of
    // AVX-512 vectors; 8 blocks for 1024 features, enough to balance 2-8 threads).
    constexpr int64_t kColumnBlock = 128;
    const int64_t blocks = (out_features + kColumnBlock - 1) / kColumnBlock;
    parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n0 = b * kColumnBlock, n = std::min(kColumnBlock, out_features - n0);
        k.gemm_f32(false, true, rows, n, in_features, 1.0f, x, x_stride, w + n0 * in_features,
                   in_features, 0.0f, y + n0, y_stride);
        if (bias) k.add_bias_rows_f32(rows, n, y + n0, y_stride, bias + n0);
      }
    });
  }
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_(in_features), out_(out_features), has_bias_(bias) {
  if (in_features <= 0 || out_features <= 0)
    fail(ErrorCode::Constraint, "linear",
         "in_features=" + std::to_string(in_features) + " and out_features=" +
             std::to_string(out_features) + " must be positive");
  params_.add("weight", {out_features, in_features});
  if (bias) params_.add("bias", {out_features});
}

void Linear::reset_parameters(Generator& gen) {
  init_linear_weight(params_.mutable_tensor("weight"), gen, in_);
  if (has_bias_) init_linear_bias(params_.mutable_tensor("bias"), gen, in_);
}

Tensor Linear::forward(const Tensor& x) const {
  if (x.dim() < 1 || x.size(-1) != in_)
    fail(ErrorCode::Shape, "linear",
         "input " + x.shape_str() + " does not end in in_features=" + std::to_string(in_));
  if (!dtype_is_floating(x.dtype()))
    fail(ErrorCode::DType, "linear", std::string("input dtype ") + dtype_name(x.dtype()) + " is not a float type");
  const Tensor xc = x.to(DType::F32).contiguous();
  Shape out_shape = x.shape();
  out_shape.back() = out_;
  Tensor y = Tensor::empty(out_shape, DType::F32);
  const int64_t rows = in_ > 0 ? xc.numel() / in_ : 0;
  linear_forward_f32(x.device(), rows, in_, out_, xc.data<float>(), in_,
                     params_.tensor("weight").data<float>(),
                     has_bias_ ? params_.tensor("bias").data<float>() : nullptr, y.data<float>(),
                     out_);
  return y;
}

}  // namespace tessera
