// The shape family: ops that move data without arithmetic (chunk, concat), on Tensors, and the
// network ops built on them. Outputs go into tensors the caller allocated (contiguous float32
// of the documented shape); nothing is allocated when the inputs are contiguous float32.
// The layout ops (reshape, flatten, permute, transpose, unsqueeze, squeeze, slice, select, roll,
// pad, expand) are network ops only: a C++ caller has them as Tensor views (core/tensor.h) and
// contiguous().
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/tensor.h"

namespace tessera {

// torch.chunk with equal pieces: outs[i] = x.narrow(dim, i * n, n), n = size(dim) / outs.size()
// (size(dim) must be a multiple: E_CONSTRAINT). dim may be negative.
void chunk_into(const Tensor& x, int64_t dim, std::span<Tensor* const> outs,
                const std::string& where);

// torch.cat: y = xs joined along dim (negative counts from the end); every other dim equal.
void concat_into(std::span<const Tensor* const> xs, int64_t dim, Tensor& y,
                 const std::string& where);
inline void concat_into(std::initializer_list<const Tensor*> xs, int64_t dim, Tensor& y,
                        const std::string& where) {
  concat_into(std::span<const Tensor* const>(xs.begin(), xs.size()), dim, y, where);
}

}  // namespace tessera
