#pragma once
// Which BLAS kernels this process runs, and choosing the right ones.
//
// Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels by the CPU's
// model number when it loads; on a CPU it does not know (Intel Sapphire
// Rapids, for one) it falls back to "Prescott", SSE3 kernels that run fp32
// GEMM at a third of the speed the CPU's AVX-512 allows. OpenBLAS reads
// OPENBLAS_CORETYPE only while the library initialises, before main(), so
// moerl chooses by the CPU's features instead and, when OpenBLAS chose
// worse, re-executes itself with OPENBLAS_CORETYPE set. A core the user set
// is always respected. The chosen kernels are checked against a
// double-precision GEMM; if they disagree, moerl goes back to OpenBLAS's own
// choice and says so.
//
// No library fits here: the choice needs OpenBLAS's own entry points
// (looked up at run time, so builds against other BLAS libraries, such as
// PyPI torch's MKL, need nothing of this) and the compiler's CPU feature
// tests (__builtin_cpu_supports, which also checks the OS saves the
// registers).

#include <optional>
#include <string>
#include <vector>

namespace moerl::blas {

// The widest vector instructions that the CPU and the OS both allow, as far
// as fp32 GEMM kernels tell them apart (AVX-512 BF16 adds only bf16 kernels).
enum class VectorLevel { Sse, Avx, Avx2, Avx512 };

const char* vector_level_name(VectorLevel level);
VectorLevel detect_vector_level();

// The OpenBLAS core to force on a CPU of `cpu` level when OpenBLAS chose
// `chosen_core` (its openblas_get_corename() spelling, any case): the CPU's
// best when OpenBLAS chose SSE or AVX kernels on a CPU with wider ones.
// Nothing when the chosen core is as good, is an AVX2 one, or is one this
// table does not know (leaving an unknown choice alone is the safe default).
std::optional<std::string> better_core(const std::string& chosen_core, VectorLevel cpu);

// The cores OPENBLAS_CORETYPE can force on a CPU of `cpu` level, oldest
// first: one per vector level up to the CPU's (for `moerl bench blas`).
std::vector<std::string> forcible_cores(VectorLevel cpu);

// What this process runs.
struct BlasInfo {
  std::string library;  // "OpenBLAS 0.3.21 ..." (openblas_get_config), or "unknown (not OpenBLAS)"
  std::string core;     // openblas_get_corename(), empty when not OpenBLAS
  int threads = 0;      // openblas_get_num_threads(), 0 when unknown
  std::string choice;   // how the core was chosen, in words (see select_kernels)
  std::string warning;  // non-empty when the kernels moerl chose failed the check
  // The float GEMM library of moerl's own kernels (moerl_kernels/cpu_gemm.h),
  // e.g. "oneDNN 2.6.3 sgemm", and a warning when its check failed.
  std::string cpu_gemm;
  std::string cpu_gemm_warning;
};

// Call first thing in main(), before MPI or any thread starts: may replace
// the process image (execv of /proc/self/exe with the same argv) once, or
// twice when the chosen core fails the GEMM check. Never throws; when the
// re-execution itself fails the process goes on with OpenBLAS's choice.
void select_kernels(char** argv);

// Call after select_kernels: settles the float GEMM library of moerl's own
// kernels (MOERL_CPU_GEMM, or oneDNN where built in) and checks it against a
// double-precision product; one that fails goes back to BLAS, with a
// warning in blas_info(). Throws std::invalid_argument, naming the variable,
// for a MOERL_CPU_GEMM this build cannot honour.
void select_cpu_gemm();

// The result of select_kernels in this process.
BlasInfo blas_info();

// "OpenBLAS 0.3.21 (core SkylakeX, 2 threads; selected by moerl, OpenBLAS chose Prescott)"
std::string blas_summary();

// "oneDNN 2.6.3 sgemm (MOERL_CPU_GEMM unset; checked)", for logs and --version.
std::string cpu_gemm_summary();

// c = a b through the process's cblas_sgemm (row-major, a: m x k, b: k x n,
// c: m x n); false, touching nothing, when the process has no cblas_sgemm.
bool sgemm(int m, int n, int k, const float* a, const float* b, float* c);

// Largest relative error of the BLAS's sgemm against a double-precision
// product at odd sizes (row-major, with transposes); nullopt when there is
// no cblas_sgemm in the process. Errors above gemm_tolerance() fail.
std::optional<double> gemm_relative_error();
double gemm_tolerance();

}  // namespace moerl::blas
