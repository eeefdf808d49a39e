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

}  // namespace tessera::f64
