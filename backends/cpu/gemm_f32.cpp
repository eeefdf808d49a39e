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

// C[:, 0:cols] = alpha * A B[:, 0:cols] + beta * C for cols <= 8 columns, A [m, k] and B [k, ...]
// not transposed. Rows of A are read once, the columns' sums stay in registers.
void gemm_nn_narrow(int64_t m, int64_t cols, int64_t k, float alpha, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float sum[8] = {};
    const float* a_row = a + i * lda;
    for (int64_t p = 0; p < k; ++p) {
      const float x = a_row[p];
      const float* b_row = b + p * ldb;
      for (int64_t j = 0; j < cols; ++j) sum[j] += x * b_row[j];
    }
    float* c_row = c + i * ldc;
    for (int64_t j = 0; j < cols; ++j)
      c_row[j] = beta == 0.0f ? alpha * sum[j] : alpha * sum[j] + beta * c_row[j];
  }
}

// How many of n's last columns OpenBLAS would hand to a kernel that allocates. Debian's OpenBLAS
// 0.3.21 on SkylakeX-class cores (AVX-512) sends row-major no-transpose products of at most
// 100^3 multiply-adds to a "small matrix" kernel, which mallocs a copy of A for the last
// n % 16 columns when there are 1 to 8 of them and k >= 32 (measured: 45% of such calls in a
// sweep of m <= 100, n <= 100, k <= 300 allocated; the transposed forms never did). Those
// columns are computed here instead, on every CPU, so a product's cost and its freedom from
// allocation do not depend on which kernels OpenBLAS picked.
int64_t columns_kept_from_openblas(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  if (trans_a || trans_b || k < 32) return 0;
  if (static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) > 1e6) return 0;
  const int64_t tail = n % 16;
  return tail >= 1 && tail <= 8 ? tail : 0;
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
  if (const int64_t tail = columns_kept_from_openblas(trans_a, trans_b, m, n, k); tail > 0) {
    gemm_nn_narrow(m, tail, k, alpha, a, lda, b + (n - tail), ldb, beta, c + (n - tail), ldc);
    n -= tail;
    if (n == 0) return;
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
