#pragma once
// moerl's exception types. Every error says where it came from (file:line of
// the check, the rank when known, the operation) and what the library said,
// so that a failure in a 40-rank job points at its cause. The macros that
// raise them are in core/check.h.

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
  // "rank 3: NCCL call ncclAllReduce(...) failed: unhandled system error; HINT (at file:line)"
  BackendError(const std::string& backend, const std::string& operation, const std::string& detail, const char* file,
               int line, const std::string& hint = "");
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

[[noreturn]] void throw_check_failure(const char* file, int line, const char* condition, const std::string& message);
[[noreturn]] void throw_mpi_failure(const char* file, int line, const char* operation, int code);
[[noreturn]] void throw_backend_failure(const char* file, int line, const char* backend, const std::string& operation,
                                        const std::string& detail, const std::string& hint = "");

}  // namespace moerl
