#include "moerl/runtime/job_control.h"

#include <mpi.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <thread>

#include "moerl/runtime/logging.h"

namespace moerl::runtime {
namespace {

std::atomic<int> g_stop_signal{0};

constexpr int kMaxAbortCleanups = 8;
std::atomic<void (*)()> g_abort_cleanups[kMaxAbortCleanups] = {};

void run_abort_cleanups() {
  for (auto& slot : g_abort_cleanups)
    if (void (*cleanup)() = slot.load()) cleanup();
}

extern "C" void on_stop_signal(int signal_number) {
  // A second signal while stopping means "now": leave without the clean stop
  // (only the async-signal-safe cleanups run).
  if (g_stop_signal.exchange(signal_number) != 0) {
    run_abort_cleanups();
    std::_Exit(128 + signal_number);
  }
}

}  // namespace

bool every_rank_arrives(MPI_Comm comm, double timeout_s) {
  MPI_Request request;
  MOERL_MPI_CHECK(MPI_Ibarrier(comm, &request));
  const double deadline = monotonic_seconds() + timeout_s;
  for (;;) {
    int done = 0;
    MOERL_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return true;
    // The request stays pending: the caller aborts the job.
    if (monotonic_seconds() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void add_abort_cleanup(void (*cleanup)()) {
  for (auto& slot : g_abort_cleanups) {
    void (*current)() = slot.load();
    if (current == cleanup) return;
    if (current == nullptr && slot.compare_exchange_strong(current, cleanup)) return;
    if (current == cleanup) return;
  }
}

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int stop_signal_received() { return g_stop_signal.load(); }
void reset_stop_signal() { g_stop_signal.store(0); }

StopCoordinator::StopCoordinator(Mailbox& mailbox, int coordinator_rank)
    : mailbox_(mailbox), coordinator_(coordinator_rank) {}

void StopCoordinator::broadcast_stop(const std::string& reason) {
  for (int rank = 0; rank < mailbox_.size(); ++rank)
    if (rank != mailbox_.rank()) mailbox_.send(rank, Stop{reason});
}

void StopCoordinator::request_stop(const std::string& reason) {
  if (stopping_) return;
  if (mailbox_.rank() == coordinator_) {
    stopping_ = true;
    reason_ = reason;
    broadcast_stop(reason);
  } else {
    mailbox_.send(coordinator_, StopRequest{reason});
  }
}

bool StopCoordinator::should_stop() {
  if (stopping_) return true;
  if (const int signal_number = stop_signal_received(); signal_number != 0 && !forwarded_signal_) {
    forwarded_signal_ = true;
    request_stop("signal " + std::to_string(signal_number) + " on rank " +
                 std::to_string(mailbox_.rank()));
    if (stopping_) return true;
  }
  if (mailbox_.rank() == coordinator_) {
    if (auto request = mailbox_.try_receive<StopRequest>()) {
      stopping_ = true;
      reason_ = request->second.reason;
      broadcast_stop(reason_);
    }
  } else if (auto stop = mailbox_.try_receive<Stop>(coordinator_)) {
    stopping_ = true;
    reason_ = stop->second.reason;
  }
  return stopping_;
}

void abort_job(const std::string& role_label, const std::string& what, int status) {
  int rank = -1, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "moerl: fatal error on rank %d (%s): %s\nmoerl: stopping the whole job\n",
               rank, role_label.empty() ? "no role yet" : role_label.c_str(), what.c_str());
  std::fflush(stderr);
  flush_logs();
  run_abort_cleanups();
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);
}

}  // namespace moerl::runtime
