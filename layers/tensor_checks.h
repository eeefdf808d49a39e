// Entry checks the Tensor-level functions of layers/ share (layer_norm_into, add_into,
// chunk_into, ...): they take any float tensor from a C++ caller, and allocate nothing when the
// plan hands them contiguous float32, as it always does.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/shape.h"
#include "core/tensor.h"

namespace tessera {

// x itself when it is float32 and contiguous, otherwise a float32 contiguous copy in `scratch`.
// E_ARG for an undefined tensor, E_DTYPE for a non-float one.
const Tensor& f32_contiguous(const Tensor& x, Tensor& scratch, const char* name,
                             const std::string& where);

// E_SHAPE unless y is a contiguous float32 tensor of `shape`.
void check_output(const Tensor& y, std::span<const int64_t> shape, const char* name,
                  const std::string& where);

// Product of s[begin, end).
int64_t product(std::span<const int64_t> s, size_t begin, size_t end);

// Where the sequence symbol `seq` (generation's T) is in `shape`: its index, or -1 when the
// shape has no such dim.
int64_t seq_axis(const SymShape& shape, const std::string& seq);

// Elementwise work per worker hand-off: 16K floats (64 KB, a quarter of L2) take ~2-10 us,
// well above the ~1 us it costs to wake a worker.
inline constexpr int64_t kElementGrain = 16384;

}  // namespace tessera
