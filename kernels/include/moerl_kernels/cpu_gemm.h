#pragma once
// Row-major GEMM on raw pointers for the CPU kernels:
//   C[m,n] = alpha * op(A) op(B) + beta * C
// op(A) is [m,k] (A stored [m,k] with leading dimension lda, or [k,m] when
// trans_a), op(B) is [k,n] (B stored [k,n], or [n,k] when trans_b). Leading
// dimensions may exceed the row length, so a caller can write into column
// slices of a wider buffer. Float products go to the backend below (oneDNN's
// sgemm by default where built in); double ones to the Fortran BLAS the
// kernels were linked with (the one LibTorch itself calls, e.g. OpenBLAS),
// and to a plain loop without one.
// Single call, no threading policy of its own beyond what the BLAS does.

#include <cstdint>
#include <string>

namespace moerl::kernels {

// True when cpu_gemm goes through a BLAS library (false: the reference loop).
bool cpu_gemm_has_blas();

// The library that float cpu_gemm calls go to. oneDNN's sgemm (kernels
// generated for the CPU at run time) ran the expert and attention shapes of
// moerl's kernels 1.0-2.0x faster than OpenBLAS's (docs/performance.md), so
// it is the default where the build has it (Debian's libdnnl-dev). Double
// calls always go to BLAS (oneDNN has no dgemm).
enum class CpuGemmBackend { Loop, Blas, OneDnn };

// True when this build can call oneDNN's sgemm.
bool cpu_gemm_has_onednn();

// The float backend in use. Chosen on first use from the environment variable
// MOERL_CPU_GEMM ("onednn" or "blas"; unset or empty: oneDNN where built in,
// else BLAS, else the loop). Throws std::invalid_argument naming the variable
// for another value, or for one this build lacks.
CpuGemmBackend cpu_gemm_float_backend();

// Sets the float backend from here on (moerl's startup check, tests,
// benchmarks); throws std::invalid_argument for one this build lacks.
void set_cpu_gemm_float_backend(CpuGemmBackend backend);

// "oneDNN 2.6.3 sgemm", "BLAS sgemm" or "reference loop".
const char* cpu_gemm_backend_name(CpuGemmBackend backend);
std::string cpu_gemm_backend_description(CpuGemmBackend backend);

// Its check against a double-precision product: moerl_kernels/gemm_check.h.

template <typename Scalar>
void cpu_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, Scalar alpha, const Scalar* A,
              std::int64_t lda, const Scalar* B, std::int64_t ldb, Scalar beta, Scalar* C, std::int64_t ldc);

}  // namespace moerl::kernels
