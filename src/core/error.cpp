#include "moerl/core/check.h"

#include <mpi.h>

#include <sstream>

namespace moerl {

namespace {
int g_reported_rank = -1;
}  // namespace

void set_reported_rank(int rank) { g_reported_rank = rank; }

int world_rank_or_unknown() {
  if (g_reported_rank >= 0) return g_reported_rank;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string located_message(const char* file, int line, const std::string& message) {
  std::ostringstream out;
  const int rank = world_rank_or_unknown();
  if (rank >= 0) out << "rank " << rank << ": ";
  out << message << " (at " << file << ":" << line << ")";
  return out.str();
}

BackendError::BackendError(const std::string& backend, const std::string& operation, const std::string& detail,
                           const char* file, int line, const std::string& hint)
    : Error(located_message(file, line,
                            backend + " call " + operation + " failed: " + detail + (hint.empty() ? "" : "; " + hint))),
      backend_(backend) {}

void throw_check_failure(const char* file, int line, const char* condition, const std::string& message) {
  throw Error(located_message(file, line, message + " [check: " + condition + "]"));
}

void throw_mpi_failure(const char* file, int line, const char* operation, int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw BackendError("MPI", operation, std::string(text, length), file, line);
}

void throw_backend_failure(const char* file, int line, const char* backend, const std::string& operation,
                           const std::string& detail, const std::string& hint) {
  throw BackendError(backend, operation, detail, file, line, hint);
}

}  // namespace moerl
