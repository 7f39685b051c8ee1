#pragma once
// How far a float GEMM is from a double-precision product: the check that
// moerl runs on the BLAS kernels it selects (core/blas_kernels.h) and on the
// float GEMM library of its own kernels (cpu_gemm.h) before trusting them.

#include <cstdint>
#include <functional>
#include <vector>

namespace moerl::kernels {

// One product to check: op(A) [m, k] times op(B) [k, n], row-major, with
// leading dimensions `pad` elements wider than the rows.
struct GemmCheckCase {
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  std::int64_t pad = 0;
};

// A row-major float GEMM with cpu_gemm's arguments:
// C = alpha op(A) op(B) + beta C.
using RowMajorSgemm = std::function<void(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                                         float alpha, const float* A, std::int64_t lda, const float* B,
                                         std::int64_t ldb, float beta, float* C, std::int64_t ldc)>;

// The largest relative error, |C - exact| / (sum of |terms|), of `gemm` over
// the cases, on inputs drawn uniformly from [-1, 1]; infinity when a result
// is not a number. Columns past n (the padding) must stay untouched, or the
// error is infinity too.
double sgemm_relative_error(const RowMajorSgemm& gemm, const std::vector<GemmCheckCase>& cases);

// The same for float cpu_gemm through its current backend: odd sizes (edges
// of register blocks, a row vector, k past one panel), every transpose form,
// leading dimensions wider than the rows, beta 0 and 1. Small enough to run
// at every start.
double cpu_gemm_float_relative_error();

}  // namespace moerl::kernels
