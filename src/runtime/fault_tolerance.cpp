#include "moerl/runtime/fault_tolerance.h"

#if defined(MOERL_HAVE_ULFM)
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "moerl/core/check.h"

namespace moerl::runtime {
namespace {

bool environment_says(const char* name, const char* value) {
  const char* set = std::getenv(name);
  return set != nullptr && std::strcmp(set, value) == 0;
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  if (const auto comma = version.find(','); comma != std::string::npos) version = version.substr(0, comma);
  while (!version.empty() && (version.back() == '\n' || version.back() == ' ')) version.pop_back();
  return version;
}

}  // namespace

bool fault_tolerant_mpi() {
#if defined(MOERL_HAVE_ULFM)
  if (environment_says("MOERL_FAULT_TOLERANCE", "off")) return false;
  return environment_says("OMPI_MCA_mpi_ft_enable", "1") || environment_says("OMPI_MCA_mpi_ft_enable", "true");
#else
  return false;
#endif
}

std::string mpi_description() {
  const std::string version = library_version();
#if defined(MOERL_HAVE_ULFM)
  if (fault_tolerant_mpi()) return version + ", fault tolerant (ULFM): a lost actor or env worker fails over";
  return version + ", ULFM built but off for this job (" +
         (environment_says("MOERL_FAULT_TOLERANCE", "off") ? std::string("MOERL_FAULT_TOLERANCE=off")
                                                           : std::string("not launched with --with-ft ulfm")) +
         "): a lost rank stops the job for a restart";
#else
  return version + ", without ULFM: a lost rank stops the job for a restart (scripts/launch.sh restarts it)";
#endif
}

bool is_process_failure(int code) {
#if defined(MOERL_HAVE_ULFM)
  int error_class = code;
  MPI_Error_class(code, &error_class);
  return error_class == MPIX_ERR_PROC_FAILED || error_class == MPIX_ERR_PROC_FAILED_PENDING ||
         error_class == MPIX_ERR_REVOKED;
#else
  (void)code;
  return false;
#endif
}

std::vector<int> failed_ranks(MPI_Comm comm) {
  std::vector<int> ranks;
#if defined(MOERL_HAVE_ULFM)
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return ranks;
  int count = 0;
  MPI_Group_size(failed, &count);
  if (count > 0) {
    MPI_Comm_group(comm, &all);
    std::vector<int> in_failed(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) in_failed[static_cast<size_t>(i)] = i;
    ranks.resize(static_cast<size_t>(count));
    MPI_Group_translate_ranks(failed, count, in_failed.data(), all, ranks.data());
    MPI_Group_free(&all);
  }
  MPI_Group_free(&failed);
#else
  (void)comm;
#endif
  return ranks;
}

bool wait_until_known_failed(MPI_Comm comm, const std::vector<int>& ranks, double timeout_s) {
#if defined(MOERL_HAVE_ULFM)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int self = 0;
  MPI_Comm_rank(comm, &self);
  for (;;) {
    const std::vector<int> failed = failed_ranks(comm);
    if (std::all_of(ranks.begin(), ranks.end(),
                    [&](int rank) { return std::find(failed.begin(), failed.end(), rank) != failed.end(); }))
      return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    int flag = 0;  // any call into MPI progresses its failure detection; a probe of ourselves touches no peer
    MPI_Iprobe(self, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
#else
  (void)comm, (void)ranks, (void)timeout_s;
  return true;
#endif
}

void acknowledge_failures(MPI_Comm comm) {
#if defined(MOERL_HAVE_ULFM)
  int size = 0, acknowledged = 0;
  MPI_Comm_size(comm, &size);
  MPIX_Comm_ack_failed(comm, size, &acknowledged);
#else
  (void)comm;
#endif
}

void revoke(MPI_Comm comm) {
#if defined(MOERL_HAVE_ULFM)
  MPIX_Comm_revoke(comm);
#else
  (void)comm;
#endif
}

bool is_revoked(MPI_Comm comm) {
#if defined(MOERL_HAVE_ULFM)
  int flag = 0;
  MPIX_Comm_is_revoked(comm, &flag);
  return flag != 0;
#else
  (void)comm;
  return false;
#endif
}

MPI_Comm shrink(MPI_Comm comm) {
#if defined(MOERL_HAVE_ULFM)
  MPI_Comm survivors = MPI_COMM_NULL;
  MOERL_MPI_CHECK(MPIX_Comm_shrink(comm, &survivors));
  MPI_Comm_set_errhandler(survivors, MPI_ERRORS_RETURN);
  return survivors;
#else
  (void)comm;
  throw Error("MPIX_Comm_shrink needs an MPI with ULFM (this build has none)");
#endif
}

}  // namespace moerl::runtime
