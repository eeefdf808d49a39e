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

// Elementwise work per worker hand-off: 64K floats (256 KB) take ~10-40 us. Handing off less
// loses under KVM, where waking a worker costs tens of us: at 16K, nn.Transformer's 30 adds and
// 32 layer norms over [128, 512] took 1.5-1.6 and 1.7-2.0 ms per run on 2 threads against 1.0
// and 0.7 ms on one (Zen 4, tessera bench --profile); at 64K they run inline, 0.8-0.9 and
// 1.1-1.4 ms on 2 threads. (Layer norms, now fused with the add before them, take one block per
// thread instead: layers/norm.cpp.)
inline constexpr int64_t kElementGrain = 65536;

}  // namespace tessera
