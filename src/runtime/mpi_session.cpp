#include "moerl/runtime/mpi_session.h"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "moerl/core/check.h"
#include "moerl/runtime/exit_record.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/logging.h"

namespace moerl::runtime {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "unknown thread level";
}

MpiSession::MpiSession(int* argc, char*** argv) {
  MOERL_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_));
  // Errors come back as codes so that MOERL_MPI_CHECK can name the call.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MOERL_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MOERL_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  // The channel abort_job() tells the other ranks on: it must outlive every
  // other communicator (an error unwinds them before abort_job runs).
  MOERL_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &abort_channel_));
  MPI_Comm_set_errhandler(abort_channel_, MPI_ERRORS_RETURN);
  set_abort_channel(abort_channel_);
  if (provided_ < MPI_THREAD_MULTIPLE) {
    const std::string message = std::string("the MPI library provides ") + thread_level_name(provided_) +
                                " but moerl needs MPI_THREAD_MULTIPLE (use an MPI built with "
                                "thread support, e.g. Open MPI 4 or later)";
    MPI_Finalize();
    throw Error(message);
  }
}

namespace {

std::mutex g_intercomms_mutex;
std::vector<MPI_Comm> g_intercomms;

// Collective with the processes on the other side, who do the same at their end of the job.
void disconnect_intercomms() {
  std::vector<MPI_Comm> comms;
  {
    std::lock_guard<std::mutex> lock(g_intercomms_mutex);
    comms.swap(g_intercomms);
  }
  for (MPI_Comm& comm : comms) MPI_Comm_disconnect(&comm);
}

}  // namespace

void remember_intercomm(MPI_Comm intercomm) {
  std::lock_guard<std::mutex> lock(g_intercomms_mutex);
  if (std::find(g_intercomms.begin(), g_intercomms.end(), intercomm) == g_intercomms.end())
    g_intercomms.push_back(intercomm);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  set_abort_channel(MPI_COMM_NULL);
  MPI_Comm_free(&abort_channel_);
  disconnect_intercomms();
  MPI_Finalize();
}

void MpiSession::finalize_within(double deadline_s, int status) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  const int rank = rank_;
  std::thread([deadline_s, status, rank] {
    std::this_thread::sleep_for(std::chrono::duration<double>(deadline_s));
    spdlog::error(
        "rank {}: MPI_Finalize did not return within {:.0f} s ([cluster] shutdown_timeout_s); ending with "
        "status {} without it",
        rank, deadline_s, status);
    flush_logs();
    exit_with_record(status);
  }).detach();
  set_abort_channel(MPI_COMM_NULL);
  MPI_Comm_free(&abort_channel_);
  disconnect_intercomms();
  MPI_Finalize();
}

std::unique_ptr<MpiSession> start_mpi_unless_running() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized ? nullptr : std::make_unique<MpiSession>(nullptr, nullptr);
}

}  // namespace moerl::runtime
