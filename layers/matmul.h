// The matmul family: torch.matmul on Tensors and the network's `matmul` op, over the backend's
// GEMM (KernelTable::gemm_f32).
#pragma once

#include <string>

#include "core/tensor.h"

namespace tessera {

// torch.matmul's output shape: 1-D x 1-D is a dot product ([]); a 1-D a is [1, k] and a 1-D b
// [k, 1] for the product, the added dim removed after; otherwise the last two dims multiply
// ([.., m, k] x [.., k, n] -> [.., m, n]) and the dims before them broadcast. E_SHAPE for a 0-d
// input, inner dims that differ, or batch dims that do not broadcast (messages name both
// shapes).
Shape matmul_shape(const Shape& a, const Shape& b, const std::string& where);

// y = torch.matmul(a, b). y: matmul_shape(a, b), contiguous float32, not overlapping a or b.
// Float32 products through the backend's GEMM, split over batches and row blocks by shape
// only; allocates nothing when a and b are contiguous float32.
void matmul_into(const Tensor& a, const Tensor& b, Tensor& y, const std::string& where);

}  // namespace tessera
