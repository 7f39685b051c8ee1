#pragma once
// moerl's exception types and check macros. Every error says where it came
// from (file:line of the check, the rank when known, the operation) and what
// the library said, so that a failure in a 40-rank job points at its cause.

#include <stdexcept>
#include <string>

namespace moerl {

// Base of every moerl exception.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failed call into MPI, CUDA, NCCL or HDF5.
class BackendError : public Error {
 public:
  BackendError(const std::string& backend, const std::string& operation, const std::string& detail,
               const char* file, int line);
  const std::string& backend() const { return backend_; }

 private:
  std::string backend_;
};

// Formats "file:line: message" with the rank prefix when MPI is up.
std::string located_message(const char* file, int line, const std::string& message);

// The rank errors name: the job rank once [cluster] placement has decided it
// (set_reported_rank), else the rank in MPI_COMM_WORLD, or -1 before MPI_Init.
int world_rank_or_unknown();
void set_reported_rank(int rank);

[[noreturn]] void throw_check_failure(const char* file, int line, const char* condition,
                                      const std::string& message);
[[noreturn]] void throw_mpi_failure(const char* file, int line, const char* operation, int code);

}  // namespace moerl

// MOERL_CHECK(cond, message): throws moerl::Error naming the condition.
#define MOERL_CHECK(condition, message)                                        \
  do {                                                                         \
    if (!(condition)) {                                                        \
      ::moerl::throw_check_failure(__FILE__, __LINE__, #condition, (message)); \
    }                                                                          \
  } while (0)

// MOERL_MPI_CHECK(MPI_Send(...)): throws moerl::BackendError with MPI's error string.
#define MOERL_MPI_CHECK(call)                                                  \
  do {                                                                         \
    int moerl_mpi_code_ = (call);                                              \
    if (moerl_mpi_code_ != 0) {                                                \
      ::moerl::throw_mpi_failure(__FILE__, __LINE__, #call, moerl_mpi_code_);  \
    }                                                                          \
  } while (0)
