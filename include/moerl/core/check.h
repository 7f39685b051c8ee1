#pragma once
// The check macros, one header for all of them. Each throws a moerl
// exception (core/error.h) that names the file:line of the check, the rank
// (once MPI is up), the operation or condition, and what the library said:
//
//   MOERL_CHECK(cond, message)    moerl::Error         "message [check: cond]"
//   MOERL_MPI_CHECK(call)         moerl::BackendError  MPI_Error_string of the code
//   MOERL_CUDA_CHECK(call)        moerl::BackendError  cudaGetErrorString
//   MOERL_NCCL_CHECK(call)        moerl::BackendError  ncclGetErrorString, and for
//                                                      system/remote errors a hint
//
// The CUDA and NCCL forms name CUDA and NCCL symbols only where they are
// used, so this header needs neither library: include cuda_runtime.h or
// nccl.h before using them. (The MoE operators in src/moe use LibTorch's
// TORCH_CHECK instead: they are built without moerl_core for the GPU check,
// and LibTorch's c10::Error is what a LibTorch operator raises.)

#include "moerl/core/error.h"

namespace moerl {

// The hint a NCCL system or remote error carries: NCCL's own log names the peer.
inline constexpr const char* kNcclDebugHint = "set NCCL_DEBUG=INFO to see which peer or link failed";

}  // namespace moerl

#define MOERL_CHECK(condition, message)                                        \
  do {                                                                         \
    if (!(condition)) {                                                        \
      ::moerl::throw_check_failure(__FILE__, __LINE__, #condition, (message)); \
    }                                                                          \
  } while (0)

#define MOERL_MPI_CHECK(call)                                                 \
  do {                                                                        \
    int moerl_mpi_code_ = (call);                                             \
    if (moerl_mpi_code_ != 0) {                                               \
      ::moerl::throw_mpi_failure(__FILE__, __LINE__, #call, moerl_mpi_code_); \
    }                                                                         \
  } while (0)

#define MOERL_CUDA_CHECK(call)                                                                                   \
  do {                                                                                                           \
    const cudaError_t moerl_cuda_status_ = (call);                                                               \
    if (moerl_cuda_status_ != cudaSuccess) {                                                                     \
      ::moerl::throw_backend_failure(__FILE__, __LINE__, "CUDA", #call, cudaGetErrorString(moerl_cuda_status_)); \
    }                                                                                                            \
  } while (0)

#define MOERL_NCCL_CHECK(call)                                                                                      \
  do {                                                                                                              \
    const ncclResult_t moerl_nccl_status_ = (call);                                                                 \
    if (moerl_nccl_status_ != ncclSuccess) {                                                                        \
      const bool moerl_nccl_peer_ = moerl_nccl_status_ == ncclSystemError || moerl_nccl_status_ == ncclRemoteError; \
      ::moerl::throw_backend_failure(__FILE__, __LINE__, "NCCL", #call, ncclGetErrorString(moerl_nccl_status_),     \
                                     moerl_nccl_peer_ ? ::moerl::kNcclDebugHint : "");                              \
    }                                                                                                               \
  } while (0)
