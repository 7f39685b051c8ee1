// Row-major GEMM over oneDNN's sgemm or the Fortran BLAS interface (see
// moerl_kernels/cpu_gemm.h).

#include "moerl_kernels/cpu_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#ifdef MOERL_KERNELS_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

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

#ifdef MOERL_KERNELS_ONEDNN
// oneDNN's sgemm is row-major with cpu_gemm's own meaning of every argument.
// It refuses k == 0, where cpu_gemm (like BLAS) only scales C by beta.
void onednn_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                 std::int64_t ldc) {
  if (k == 0) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  if (status != dnnl_success) {
    throw std::invalid_argument("cpu_gemm: oneDNN's sgemm refused m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                " k=" + std::to_string(k) + " lda=" + std::to_string(lda) +
                                " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) + " (status " +
                                std::to_string(static_cast<int>(status)) + ")");
  }
}
#endif

bool backend_built_in(CpuGemmBackend backend) {
  switch (backend) {
    case CpuGemmBackend::Loop: return true;
    case CpuGemmBackend::Blas: return cpu_gemm_has_blas();
    case CpuGemmBackend::OneDnn: return cpu_gemm_has_onednn();
  }
  return false;
}

CpuGemmBackend backend_from_environment() {
  const char* value = std::getenv("MOERL_CPU_GEMM");
  const std::string wanted = value == nullptr ? "" : value;
  if (wanted.empty()) {
    if (cpu_gemm_has_onednn()) return CpuGemmBackend::OneDnn;
    return cpu_gemm_has_blas() ? CpuGemmBackend::Blas : CpuGemmBackend::Loop;
  }
  CpuGemmBackend backend;
  if (wanted == "onednn") {
    backend = CpuGemmBackend::OneDnn;
  } else if (wanted == "blas") {
    backend = CpuGemmBackend::Blas;
  } else {
    throw std::invalid_argument("MOERL_CPU_GEMM='" + wanted + "': expected 'onednn' or 'blas' (or unset)");
  }
  if (!backend_built_in(backend))
    throw std::invalid_argument("MOERL_CPU_GEMM='" + wanted + "': this build has no " + wanted +
                                " (oneDNN needs Debian's libdnnl-dev at build time)");
  return backend;
}

std::atomic<int>& backend_slot() {
  static std::atomic<int> slot{static_cast<int>(backend_from_environment())};
  return slot;
}

}  // namespace

bool cpu_gemm_has_onednn() {
#ifdef MOERL_KERNELS_ONEDNN
  return true;
#else
  return false;
#endif
}

CpuGemmBackend cpu_gemm_float_backend() { return static_cast<CpuGemmBackend>(backend_slot().load()); }

void set_cpu_gemm_float_backend(CpuGemmBackend backend) {
  if (!backend_built_in(backend))
    throw std::invalid_argument(std::string("cpu_gemm: this build has no ") + cpu_gemm_backend_name(backend));
  backend_slot().store(static_cast<int>(backend));
}

const char* cpu_gemm_backend_name(CpuGemmBackend backend) {
  switch (backend) {
    case CpuGemmBackend::Loop: return "reference loop";
    case CpuGemmBackend::Blas: return "BLAS sgemm";
    case CpuGemmBackend::OneDnn: return "oneDNN sgemm";
  }
  return "?";
}

std::string cpu_gemm_backend_description(CpuGemmBackend backend) {
#ifdef MOERL_KERNELS_ONEDNN
  if (backend == CpuGemmBackend::OneDnn) {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
           " sgemm";
  }
#endif
  return cpu_gemm_backend_name(backend);
}

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
  if constexpr (std::is_same_v<Scalar, float>) {
    const CpuGemmBackend backend = cpu_gemm_float_backend();
#ifdef MOERL_KERNELS_ONEDNN
    if (backend == CpuGemmBackend::OneDnn) {
      onednn_gemm(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
#endif
    if (backend == CpuGemmBackend::Loop) {
      loop_gemm(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
  }
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
