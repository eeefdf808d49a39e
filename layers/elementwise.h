// The elementwise family: maps (gelu, relu, silu, ...), broadcasting binary ops (add, sub, mul,
// div), softmax and dropout's eval-mode identity on Tensors, and the network ops built on them.
// Each function validates once at entry (messages name `where`, the argument and the shapes),
// then splits the elements over the worker threads and calls the backend kernels. Outputs are
// written into tensors the caller allocated (contiguous float32 of the documented shape), so a
// plan reuses its buffers; nothing is allocated when the inputs are contiguous float32 (the
// plan's always are; a strided one is copied first).
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace tessera {

// PyTorch broadcasting: shapes aligned at the last dim; a dim of 1 stretches. E_SHAPE when two
// aligned dims differ and neither is 1.
Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where);

// y = gelu(x): x * Phi(x) with the exact erf form, or the tanh approximation. y: like x.
void gelu_into(const Tensor& x, bool tanh_approx, Tensor& y, const std::string& where);

// y = f(x) for the backend's elementwise map named `map` (KernelTable::unary_map_f32: "relu",
// ...). y: like x; E_INTERNAL when the backend has no such map.
void unary_map_into(const char* map, const Tensor& x, Tensor& y, const std::string& where);

// y = a op b with broadcasting, for the backend's binary map named `op`
// (KernelTable::binary_map_f32: "add", "sub", "mul", "div"). y: broadcast_shapes(a, b);
// E_INTERNAL when the backend has no such map.
void binary_into(const char* op, const Tensor& a, const Tensor& b, Tensor& y,
                 const std::string& where);

// y = a + b with broadcasting (binary_into "add"). y: broadcast_shapes(a, b).
void add_into(const Tensor& a, const Tensor& b, Tensor& y, const std::string& where);

// y = torch.softmax(x, dim): exp(x - max) / sum along dim (negative counts from the end; a 0-d x
// takes -1 or 0, E_CONSTRAINT otherwise). y: like x. PyTorch's special values: a slice of all
// -inf, or holding a NaN or +inf, gives NaN.
void softmax_into(const Tensor& x, int64_t dim, Tensor& y, const std::string& where);

// y = x (dropout in eval mode). y: like x.
void copy_into(const Tensor& x, Tensor& y, const std::string& where);

}  // namespace tessera
