// GEMM through OpenBLAS cblas_sgemm (row-major), one thread per call: the layers split work
// across oneTBB workers and call these from inside them (see cpu_device.cpp).
#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "backends/cpu/cpu_kernels.h"

namespace tessera::cpu {
namespace {

// C = beta * C for the products with nothing to add (k == 0 or alpha == 0). beta == 0 writes
// zeros without reading C, as BLAS defines it (C may be uninitialised memory holding NaN).
void scale_matrix(int64_t m, int64_t n, float beta, float* c, int64_t ldc) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + n, 0.0f);
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

// The leading dimension handed to cblas for a stored rows x cols matrix. cblas rejects
// ld < max(1, cols) (xerbla prints and the call does nothing) even when the matrix has one row
// and its stride is never used, which a caller may legitimately pass as anything.
blasint blas_ld(int64_t rows, int64_t cols, int64_t ld) {
  return static_cast<blasint>(rows <= 1 ? std::max<int64_t>({ld, cols, 1}) : ld);
}

}  // namespace

// Sizes must fit blasint (32-bit in Debian's OpenBLAS): a 2^31-element dimension is far beyond
// anything a layer here issues, and the layers validate shapes before calling.
void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {
    scale_matrix(m, n, beta, c, ldc);
    return;
  }
  // Stored shapes: A is [m, k] or, transposed, [k, m]; B is [k, n] or [n, k].
  const blasint ld_a = trans_a ? blas_ld(k, m, lda) : blas_ld(m, k, lda);
  const blasint ld_b = trans_b ? blas_ld(n, k, ldb) : blas_ld(k, n, ldb);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, ld_a, b, ld_b, beta, c, blas_ld(m, n, ldc));
}

// OpenBLAS 0.3.21 has no batched sgemm entry point, so this loops.
void gemm_batched_f32(int64_t batch, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, int64_t lda, int64_t stride_a, const float* b,
                      int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                      int64_t stride_c) {
  for (int64_t i = 0; i < batch; ++i) {
    gemm_f32(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
             c + i * stride_c, ldc);
  }
}

}  // namespace tessera::cpu
