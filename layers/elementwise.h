// The elementwise family: maps (gelu, relu, ...) and broadcasting binary ops (add) on Tensors,
// and the network ops built on them. Each function validates once at entry (messages name
// `where`, the argument and the shapes), then splits the elements over the worker threads and
// calls the backend kernels. Outputs are written into tensors the caller allocated (contiguous
// float32 of the documented shape), so a plan reuses its buffers; nothing is allocated when the
// inputs are contiguous float32 (the plan's always are; a strided one is copied first).
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

// y = a + b with broadcasting. y: broadcast_shapes(a, b).
void add_into(const Tensor& a, const Tensor& b, Tensor& y, const std::string& where);

}  // namespace tessera
