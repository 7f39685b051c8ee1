// Row-major GEMM over the Fortran BLAS interface (see moerl_kernels/cpu_gemm.h).

#include "moerl_kernels/cpu_gemm.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#ifdef MOERL_KERNELS_BLAS
// The Fortran interface is the one every BLAS exports (OpenBLAS, MKL, the
// reference BLAS), and the one LibTorch calls; LP64 (32-bit int) sizes.
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
}
#endif

namespace moerl::kernels {
namespace {

#ifdef MOERL_KERNELS_BLAS
int to_int(std::int64_t v, const char* what) {
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    throw std::out_of_range(std::string("cpu_gemm: ") + what + " = " + std::to_string(v) +
                            " does not fit the BLAS int");
  }
  return static_cast<int>(v);
}

void fortran_gemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                  const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                  const int* ldc) {
  sgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void fortran_gemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
                  const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
                  const int* ldc) {
  dgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

// The reference loop: C = alpha*op(A)op(B) + beta*C, i-p-j order so that the
// inner loop runs along rows of B and C when B is not transposed.
template <typename Scalar>
void loop_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha,
               const Scalar* A, std::int64_t lda, const Scalar* B, std::int64_t ldb, Scalar beta, Scalar* C,
               std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i) {
    Scalar* c = C + i * ldc;
    for (std::int64_t j = 0; j < n; ++j) c[j] = beta == Scalar(0) ? Scalar(0) : beta * c[j];
    for (std::int64_t p = 0; p < k; ++p) {
      const Scalar a = alpha * (trans_a ? A[p * lda + i] : A[i * lda + p]);
      if (trans_b) {
        for (std::int64_t j = 0; j < n; ++j) c[j] += a * B[j * ldb + p];
      } else {
        const Scalar* b = B + p * ldb;
        for (std::int64_t j = 0; j < n; ++j) c[j] += a * b[j];
      }
    }
  }
}

}  // namespace

bool cpu_gemm_has_blas() {
#ifdef MOERL_KERNELS_BLAS
  return true;
#else
  return false;
#endif
}

template <typename Scalar>
void cpu_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha, const Scalar* A,
              std::int64_t lda, const Scalar* B, std::int64_t ldb, Scalar beta, Scalar* C, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
#ifdef MOERL_KERNELS_BLAS
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the
  // operands and the sizes m, n; the transpose flags carry over unchanged.
  // k == 0 is passed through: BLAS then scales C by beta.
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int M = to_int(n, "n"), N = to_int(m, "m"), K = to_int(k, "k");
  const int la = to_int(std::max<std::int64_t>(lda, 1), "lda");
  const int lb = to_int(std::max<std::int64_t>(ldb, 1), "ldb");
  const int lc = to_int(std::max<std::int64_t>(ldc, 1), "ldc");
  fortran_gemm(&tb, &ta, &M, &N, &K, &alpha, B, &lb, A, &la, &beta, C, &lc);
#else
  loop_gemm(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

template void cpu_gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                              const float*, std::int64_t, float, float*, std::int64_t);
template void cpu_gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                               std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace moerl::kernels
