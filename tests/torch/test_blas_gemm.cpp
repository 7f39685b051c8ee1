// The GEMM check that guards moerl's choice of BLAS kernels
// (include/moerl/core/blas_kernels.h), on the kernels this process runs.
#include <catch2/catch.hpp>

#include "moerl/core/blas_kernels.h"

TEST_CASE("the BLAS's sgemm agrees with a double-precision product at odd sizes", "[blas]") {
  const moerl::blas::BlasInfo info = moerl::blas::blas_info();
  INFO("BLAS: " << moerl::blas::blas_summary());
  const std::optional<double> error = moerl::blas::gemm_relative_error();
  REQUIRE(error.has_value());  // LibTorch links a BLAS with cblas_sgemm here
  CHECK(*error <= moerl::blas::gemm_tolerance());
  // fp32 accumulation is far better than the tolerance on sound kernels.
  CHECK(*error < 1e-5);
  CHECK(info.warning.empty());
}
