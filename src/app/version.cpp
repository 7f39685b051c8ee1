// Version text and thread control: the app's only contact with ATen headers,
// kept to this small translation unit.

#include <ATen/Parallel.h>
#include <cstdlib>
#include <mpi.h>
#include <torch/csrc/api/include/torch/version.h>

#include "commands.h"
#include "moerl/core/blas_kernels.h"
#include "moerl/core/usable_cores.h"

namespace moerl::app {

namespace {

std::string blas_warning() {
  const std::string warning = blas::blas_info().warning;
  return warning.empty() ? "" : "\nBLAS warning: " + warning;
}

std::string cpu_gemm_warning() {
  const std::string warning = blas::blas_info().cpu_gemm_warning;
  return warning.empty() ? "" : "\nGEMM warning: " + warning;
}

}  // namespace

std::string version_text() {
  char mpi_version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(mpi_version, &length);
  std::string mpi(mpi_version, static_cast<size_t>(length));
  if (const auto comma = mpi.find(','); comma != std::string::npos) mpi = mpi.substr(0, comma);
#ifdef MOERL_WITH_CUDA
  const char* cuda = "built";
#else
  const char* cuda = "not built";
#endif
#ifdef MOERL_HAVE_ULFM
  const char* ulfm = " with ULFM";
#else
  const char* ulfm = " without ULFM";
#endif
  return std::string("moerl ") + MOERL_VERSION + " (LibTorch " + TORCH_VERSION + ", " + mpi + ulfm +
         ", CUDA kernels: " + cuda + ")\nBLAS: " + blas::blas_summary() + blas_warning() +
         "\nGEMM (moerl's kernels): " + blas::cpu_gemm_summary() + cpu_gemm_warning();
}

std::string mpiexec_path() {
#ifdef MOERL_MPIEXEC
  return MOERL_MPIEXEC;
#else
  return "mpiexec";
#endif
}

void set_compute_threads(int threads) {
  if (threads > 0) at::set_num_threads(threads);
}

int single_process_threads(int requested) {
  if (requested > 0) return requested;
  for (const char* name : {"MOERL_THREADS_PER_RANK", "OMP_NUM_THREADS"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::atoi(value) > 0) return std::atoi(value);
  }
  return usable_cores();
}

}  // namespace moerl::app
