// Float64 references of the ops, and the random parameters and masks they are checked on, shared
// by the suites that check ops (ops, network, mha): naive loops written from the documents
// (shared/docs/mha_semantics.md, shared/reference/attention_op_spec.txt, PyTorch's definitions),
// never from the code under test. Inputs are the float values the op sees, converted to double;
// every sum runs in double. Tensors are row-major; a parameter map is a layer's state_dict (names
// without a node prefix).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "layers/attention.h"
#include "layers/multihead_attention.h"

namespace tessera::f64 {

// Row-major strides of a shape, and the index of a flat position.
std::vector<int64_t> strides_of(const Shape& s);
std::vector<int64_t> unravel(int64_t flat, const Shape& s);

// A parameter's values; empty when `params` has none of that name.
std::vector<double> param(const std::map<std::string, Tensor>& params, const std::string& name);

// Random values for every parameter, drawn in the order given: U(+-sqrt(3/in)) for a matrix
// (unit-variance projections), N(0, 0.5) otherwise. Non-zero biases and norm scales other than
// one, which layers' own resets would leave at 0 and 1, hiding a dropped bias.
std::map<std::string, Tensor> random_parameters(
    const std::vector<std::pair<std::string, Shape>>& shapes, Generator& gen);

// A random mask: bool (30% true = masked) or float (20% -inf, the rest N(0, 1)).
Tensor random_mask(const Shape& shape, bool is_bool, Generator& gen);

// y[r][o] = b[o] + sum_c x[r][c] w[o][c]: x [rows, in], w [out, in], b [out] or empty (none).
std::vector<double> linear(const std::vector<double>& x, int64_t rows, int64_t in,
                           const std::vector<double>& w, int64_t out, const std::vector<double>& b);

// Each row of x [rows, D] normalised with its biased variance, then * gamma + beta (both [D];
// empty: no affine).
std::vector<double> layer_norm(const std::vector<double>& x, int64_t rows, int64_t D,
                               const std::vector<double>& gamma, const std::vector<double>& beta,
                               double eps);

// x * Phi(x) (erf form), or PyTorch's tanh approximation.
double gelu(double x, bool tanh_form);

// PyTorch broadcasting: aligned at the last dim, a dim of 1 stretches (BOOST_REQUIRE otherwise).
Shape broadcast_shape(const Shape& a, const Shape& b);
// a + b broadcast to broadcast_shape(sa, sb).
std::vector<double> add(const std::vector<double>& a, const Shape& sa, const std::vector<double>& b,
                        const Shape& sb);
// op(a, b) elementwise, broadcast to broadcast_shape(sa, sb).
std::vector<double> binary(const std::vector<double>& a, const Shape& sa,
                           const std::vector<double>& b, const Shape& sb,
                           double (*op)(double, double));

// torch.softmax(x, dim) of x of shape s (dim may be negative; a 0-d x is one element): exp(x -
// max) / sum along dim; a slice of all -inf gives NaN, as PyTorch.
std::vector<double> softmax(const std::vector<double>& x, const Shape& s, int64_t dim);

// torch.matmul(a, b), the documented rules: 1-D x 1-D is a dot product (shape []); a 1-D a is
// [1, k] and a 1-D b [k, 1], the added dim removed after; the dims before the last two
// broadcast. Returns the output shape and values (BOOST_REQUIRE on shapes that do not fit).
std::pair<Shape, std::vector<double>> matmul(const std::vector<double>& a, const Shape& sa,
                                             const std::vector<double>& b, const Shape& sb);

// The layout ops (permute ... expand), each on x row-major of shape s, from PyTorch's definition
// of which input element each output element is. Dims are given non-negative.
struct Layout {
  Shape shape;
  std::vector<double> values;
};
// out[i] = x[j] with j[dims[k]] = i[k].
Layout permute(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& dims);
// x[..., start:stop:step, ...] along each of dims (distinct) with Python's slice.indices():
// negative bounds count from the end, then clamp to [0, n]; a stop of kNoStop (None) is the
// end.
inline constexpr int64_t kNoStop = INT64_MIN;
Layout slice(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& dims,
             const std::vector<int64_t>& starts, const std::vector<int64_t>& stops,
             const std::vector<int64_t>& steps);
// x.select(dim, index), index counted from the end when negative.
Layout select(const std::vector<double>& x, const Shape& s, int64_t dim, int64_t index);
// torch.roll: element j moves to (j + shift) mod n along each dim of dims (repeats add up);
// dims empty: the flattened x by shifts[0].
std::vector<double> roll(const std::vector<double>& x, const Shape& s,
                         const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims);
// F.pad(x, pads, value=value): pads = (lo, hi) pairs from the last dim backwards; a negative pad
// crops. out[i] = x[i - lo] along each dim, value where that is outside x.
Layout pad(const std::vector<double>& x, const Shape& s, const std::vector<int64_t>& pads,
           double value);
// x.expand(out): x aligned with the last dims of out, its size-1 dims read at index 0.
std::vector<double> expand(const std::vector<double>& x, const Shape& s, const Shape& out);
// nn.Conv2d's geometry for conv2d below: zero padding per side (top/bottom, left/right).
struct Conv2dGeometry {
  int64_t batch = 1, channels = 1, height = 1, width = 1;  // x [batch, channels, height, width]
  int64_t out_channels = 1, kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t groups = 1;
  // floor((in + pads - dilation * (kernel - 1) - 1) / stride) + 1
  int64_t out_h() const;
  int64_t out_w() const;
};
// The direct seven-loop convolution: y[n][o][oy][ox] = b[o] + sum over the group's channels c and
// i < kh, j < kw of x[n][c][oy*sh - pad_top + i*dh][ox*sw - pad_left + j*dw] * w[o][c'][i][j]
// (zero outside x). w [out, channels/groups, kh, kw]; b [out] or empty (none).
// Returns [batch, out, out_h, out_w].
std::vector<double> conv2d(const Conv2dGeometry& g, const std::vector<double>& x,
                           const std::vector<double>& w, const std::vector<double>& b);

// torch.mean of x (shape s) over the dims flagged in `reduced` (one flag per dim), row-major
// over the kept dims; NaN for an empty reduction.
std::vector<double> mean(const std::vector<double>& x, const Shape& s,
                         const std::vector<bool>& reduced);

// F.adaptive_avg_pool2d over the last two dims of x (shape s): output cell (i, j) of each plane
// averages rows floor(i*H/oh) .. ceil((i+1)*H/oh)-1 and columns likewise.
std::vector<double> adaptive_avg_pool2d(const std::vector<double>& x, const Shape& s, int64_t oh,
                                        int64_t ow);

// One head of scaled dot-product attention: weights = softmax(scale * q k^T + mask) over the S
// keys, out = weights v. Row l of q is at q + l * ldq (D values), key s at k + s * ldk (D) and
// v + s * ldv (Dv), output row l at out + l * ldo (Dv). mask: additive [L][S] (-inf masks; null:
// none). A row whose scores are all -inf (or S == 0) attends to nothing: zero weights, zero
// output (mha_semantics.md 7). weights: [L][S], or null.
void attention_head(int64_t L, int64_t S, int64_t D, int64_t Dv, double scale, const double* q,
                    int64_t ldq, const double* k, int64_t ldk, const double* v, int64_t ldv,
                    const double* mask, double* weights, double* out, int64_t ldo);

// The `attention` op (attention_op_spec.txt) on x [B, T, D]: q/k/v projections, rope
// (rotate-half, theta_i = 10000^(-2i/head_dim)), the relative-position bias
// table[(dy) * (2W-1) + dx, head] over the spatial_shape grid, the causal mask, o_proj.
// Returns [B, T, D]. A bias is read when `params` has it; BOOST_TESTs that exactly the biases
// the spec's bias/qkv_bias/out_bias rules call for are there.
std::vector<double> attention(const AttentionOptions& o,
                              const std::map<std::string, Tensor>& params, const Tensor& x);

// torch.nn.MultiheadAttention as mha_semantics.md defines it. Weights are [N, H, L, S'] whatever
// the input layout; the output is laid out like the query.
struct MhaReference {
  std::vector<double> out;
  std::vector<double> weights;
  int64_t N = 0, H = 0, L = 0, Sp = 0;
  // Averaged over heads ([N, L, S']) or per head, as the module returns them.
  std::vector<double> returned_weights(bool average) const;
};
// `key`/`value` undefined default to query/key; masks undefined when absent.
MhaReference multihead_attention(const MultiheadAttentionOptions& o,
                                 const std::map<std::string, Tensor>& params, const Tensor& query,
                                 const Tensor& key, const Tensor& value,
                                 const Tensor& key_padding_mask, const Tensor& attn_mask,
                                 bool is_causal);

// torchvision 0.14's shifted_window_attention() (Swin V1, eval mode) on x [B, H, W, C], written
// from its code in float64: zero padding to window multiples, the shift dropped where the window
// covers the padded map, torch.roll, window partition, q * head_dim^-0.5, the bias gathered
// through relative_position_index built from coordinates as define_relative_position_index
// does, the -100 region mask labelled with Python slices, softmax, proj, reverse, roll back,
// crop. Parameters by their state_dict names (qkv.bias / proj.bias may be absent). Returns
// [B, H, W, C].
struct SwinOptionsRef {
  int64_t heads = 1, window_h = 1, window_w = 1, shift_h = 0, shift_w = 0;
};
std::vector<double> shifted_window_attention(const SwinOptionsRef& o,
                                             const std::map<std::string, Tensor>& params,
                                             const Tensor& x);
// torchvision's relative_position_index for a Wh x Ww window, flattened ([N*N]).
std::vector<int64_t> swin_relative_position_index(int64_t window_h, int64_t window_w);

}  // namespace tessera::f64
