#pragma once
// Row-major GEMM on raw pointers for the CPU kernels:
//   C[m,n] = alpha * op(A) op(B) + beta * C
// op(A) is [m,k] (A stored [m,k] with leading dimension lda, or [k,m] when
// trans_a), op(B) is [k,n] (B stored [k,n], or [n,k] when trans_b). Leading
// dimensions may exceed the row length, so a caller can write into column
// slices of a wider buffer. Uses the Fortran BLAS the kernels were linked with
// (the one LibTorch itself calls, e.g. OpenBLAS) and a plain loop otherwise.
// Single call, no threading policy of its own beyond what the BLAS does.

#include <cstdint>

namespace moerl::kernels {

// True when cpu_gemm goes through a BLAS library (false: the reference loop).
bool cpu_gemm_has_blas();

template <typename Scalar>
void cpu_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha, const Scalar* A,
              std::int64_t lda, const Scalar* B, std::int64_t ldb, Scalar beta, Scalar* C, std::int64_t ldc);

}  // namespace moerl::kernels
