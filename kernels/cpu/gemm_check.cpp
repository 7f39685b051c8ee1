// The GEMM check against a double-precision product (moerl_kernels/gemm_check.h).

#include "moerl_kernels/gemm_check.h"

#include <array>
#include <cmath>
#include <limits>

#include "moerl_kernels/cpu_gemm.h"

namespace moerl::kernels {

double sgemm_relative_error(const RowMajorSgemm& gemm, const std::vector<GemmCheckCase>& cases) {
  std::uint32_t state = 12345;  // a fixed LCG: the same inputs on every run and machine
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  };
  double worst = 0.0;
  for (const GemmCheckCase& c : cases) {
    const std::int64_t lda = (c.trans_a ? c.m : c.k) + c.pad, ldb = (c.trans_b ? c.k : c.n) + c.pad, ldc = c.n + c.pad;
    std::vector<float> A(static_cast<std::size_t>((c.trans_a ? c.k : c.m) * lda));
    std::vector<float> B(static_cast<std::size_t>((c.trans_b ? c.n : c.k) * ldb));
    std::vector<float> C(static_cast<std::size_t>(c.m * ldc));
    for (auto* v : {&A, &B, &C})
      for (float& x : *v) x = next();
    const std::vector<float> C0 = C;
    gemm(c.trans_a, c.trans_b, c.m, c.n, c.k, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
    for (std::int64_t i = 0; i < c.m; ++i) {
      for (std::int64_t j = 0; j < c.n; ++j) {
        double exact = 0.0, scale = 0.0;
        for (std::int64_t p = 0; p < c.k; ++p) {
          const double x = c.trans_a ? A[p * lda + i] : A[i * lda + p];
          const double y = c.trans_b ? B[j * ldb + p] : B[p * ldb + j];
          exact += x * y;
          scale += std::fabs(x * y);
        }
        // beta 0 ignores C as BLAS does (it may hold anything, even NaN).
        const double before = c.beta == 0.0f ? 0.0 : static_cast<double>(c.beta) * C0[i * ldc + j];
        exact = c.alpha * exact + before;
        scale = std::fabs(c.alpha) * scale + std::fabs(before);
        const double error = std::fabs(C[i * ldc + j] - exact) / (scale + 1e-30);
        if (!(error <= worst)) worst = std::isnan(error) ? std::numeric_limits<double>::infinity() : error;
      }
      for (std::int64_t j = c.n; j < ldc; ++j)
        if (!(C[i * ldc + j] == C0[i * ldc + j])) return std::numeric_limits<double>::infinity();
    }
  }
  return worst;
}

double cpu_gemm_float_relative_error() {
  std::vector<GemmCheckCase> cases;
  for (const auto& [m, n, k] : {std::array<std::int64_t, 3>{1, 33, 17}, {37, 29, 41}, {3, 130, 257}, {65, 7, 300}})
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        for (float beta : {0.0f, 1.0f}) cases.push_back({m, n, k, trans_a, trans_b, 0.5f, beta, 3});
  return sgemm_relative_error(cpu_gemm<float>, cases);
}

}  // namespace moerl::kernels
