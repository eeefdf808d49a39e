// The convolution family: nn.Conv2d (the `conv2d` op) as im2col into the workspace and one GEMM
// per block of patches, and the reductions a vision model ends with, torch.mean (`mean`) and
// F.adaptive_avg_pool2d (`adaptive_avg_pool2d`). Each function takes contiguous float32 data of
// shapes its op has validated (the ops check every argument and shape once, in infer), splits the
// work over the threads by shape only, and allocates nothing.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/device.h"
#include "core/tensor.h"
#include "core/workspace.h"

namespace tessera {

// nn.Conv2d's arguments, with the padding resolved per side: "same" puts the odd zero of an even
// effective kernel after (bottom, right), as PyTorch does.
struct Conv2dOptions {
  int64_t in_channels = 1, out_channels = 1;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t groups = 1;
  bool bias = true;
};

// One forward's sizes: the input [N, C, H, W] (N = 1 for an unbatched [C, H, W]) and its output
// [N, out_channels, out_h, out_w].
struct Conv2dShape {
  int64_t batch = 0, height = 0, width = 0;
  int64_t out_h = 0, out_w = 0;
};

// The largest kernel_size, stride, padding or dilation accepted (E_CONSTRAINT above): with every
// one below 2^31, no index the convolution computes from input dims below 2^62 overflows.
inline constexpr int64_t kConvArgMax = (int64_t{1} << 31) - 1;

// PyTorch's output size, floor((in + pad - dilation * (kernel - 1) - 1) / stride) + 1 for
// in >= 0 and options as validated. E_SHAPE (naming `what`) when it is below 1: the dilated
// kernel is larger than the padded input.
int64_t conv2d_output_size(int64_t in, int64_t pad, int64_t kernel, int64_t stride,
                           int64_t dilation, const char* what, const std::string& where);

// Bytes of workspace conv2d_forward_f32 takes for these sizes (the same layout function).
size_t conv2d_workspace_bytes(const Device& device, const Conv2dOptions& o, const Conv2dShape& s);

// y [N, out, out_h, out_w] = conv2d(x [N, C, H, W], weight [out, C/groups, kh, kw], bias [out] or
// null); all contiguous float32. Scratch from `ws` (conv2d_workspace_bytes); results do not
// depend on the thread count.
void conv2d_forward_f32(const Device& device, const Conv2dOptions& o, const Conv2dShape& s,
                        const float* x, const float* weight, const float* bias, float* y,
                        Workspace& ws);

// y = x.mean(dims, keepdim) as torch.mean: `dims` in [-rank, rank) (a rank-0 x takes 0 and -1),
// each at most once (E_CONSTRAINT otherwise); empty = every dim. y: contiguous float32 of the
// reduced shape (E_SHAPE otherwise). Sums run in double; an empty reduction gives NaN, as 0/0.
void mean_into(const Tensor& x, std::span<const int64_t> dims, bool keepdim, Tensor& y,
               const std::string& where);

// y = F.adaptive_avg_pool2d(x) for x [N, C, H, W] or [C, H, W] (H, W >= 1) and y [..., oh, ow] of
// the same rank, the output size taken from y: output row i averages input rows
// floor(i * H / oh) .. ceil((i + 1) * H / oh) - 1, and likewise along W.
void adaptive_avg_pool2d_into(const Tensor& x, Tensor& y, const std::string& where);

}  // namespace tessera
