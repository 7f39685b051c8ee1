#include "moerl/runtime/job_control.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <set>
#include <vector>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "moerl/runtime/exit_record.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/heartbeat_messages.h"
#include "moerl/runtime/logging.h"
#include "moerl/runtime/lost_ranks.h"
#include "moerl/runtime/rank_layout.h"

namespace moerl::runtime {
namespace {

std::atomic<int> g_stop_signal{0};

MPI_Comm g_abort_channel = MPI_COMM_NULL;
std::atomic<bool> g_no_mpi_abort{false};      // end_without_mpi_abort()
std::vector<int> g_job_rank_of_channel_rank;  // empty: the channel's ranks are the job's

// Under ULFM MPI_Abort ends the caller only: every other rank gets a
// JobAbort (small, eager: the sends complete without the receivers) and ends
// itself. Best effort, a short bounded wait: a dead peer cannot hold us.
void tell_every_rank(int rank, int status, const std::string& what) {
  if (g_abort_channel == MPI_COMM_NULL) return;
  int size = 0, me = -1;
  MPI_Comm_size(g_abort_channel, &size);
  MPI_Comm_rank(g_abort_channel, &me);  // the launcher's order, which the channel keeps
  ByteWriter w;
  JobAbort{status, what}.encode(w);
  const std::vector<std::uint8_t> frame = frame_message(MessageType::JobAbort, rank, w.bytes());
  std::vector<MPI_Request> requests;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == me) continue;
    MPI_Request request;
    if (MPI_Isend(frame.data(), static_cast<int>(frame.size()), MPI_BYTE, peer, static_cast<int>(MessageType::JobAbort),
                  g_abort_channel, &request) == MPI_SUCCESS)
      requests.push_back(request);
  }
  const double deadline = monotonic_seconds() + 1.0;
  for (MPI_Request& request : requests) {
    int done = 0;
    while (!done && monotonic_seconds() < deadline) {
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

constexpr int kMaxAbortCleanups = 8;
constexpr int kAbortDeadlineSeconds = 5;  // MPI_Abort's time to end this rank before it ends itself
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
    exit_with_record(128 + signal_number);
  }
}

}  // namespace

namespace {

EndOfJobResult member_arrives(Mailbox& mailbox, double deadline, const std::string& this_host) {
  try {
    mailbox.send(RankLayout::kCoordinatorRank, EndOfJob{});
  } catch (const Error&) {
    return {false, {}};  // learner 0 is gone
  }
  while (monotonic_seconds() < deadline) {
    if (auto answer = mailbox.try_receive<EndOfJob>(RankLayout::kCoordinatorRank)) {
      EndOfJobResult result;
      for (const EndOfJob::Fence& fence : answer->second.fence) {
        runtime::fence(fence.host, fence.pid, this_host);
        result.missing.push_back(fence.rank);
      }
      return result;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return {false, {}};
}

}  // namespace

EndOfJobResult every_rank_arrives(Mailbox& mailbox, double timeout_s, const std::string& this_host,
                                  const RankWhereabouts& whereabouts) {
  const double deadline = monotonic_seconds() + timeout_s;
  if (mailbox.rank() != RankLayout::kCoordinatorRank) return member_arrives(mailbox, deadline, this_host);
  std::set<int> waiting;
  for (int rank = 0; rank < mailbox.size(); ++rank)
    if (rank != mailbox.rank()) waiting.insert(rank);
  std::set<int> arrived;
  while (monotonic_seconds() < deadline) {
    while (auto message = mailbox.try_receive<EndOfJob>()) arrived.insert(message->first);
    for (int rank : lost_ranks().ranks()) waiting.erase(rank);
    if (std::all_of(waiting.begin(), waiting.end(), [&](int rank) { return arrived.count(rank) > 0; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EndOfJobResult result;
  EndOfJob answer;
  for (int rank : waiting) {
    if (arrived.count(rank)) continue;
    result.missing.push_back(rank);
    if (!whereabouts) continue;
    if (const std::optional<EndOfJob::Fence> fence = whereabouts(rank)) {
      runtime::fence(fence->host, fence->pid, this_host);
      answer.fence.push_back(*fence);
    }
  }
  result.complete = result.missing.empty();
  for (int rank : arrived) {
    if (!waiting.count(rank)) continue;
    try {
      mailbox.send(rank, answer);
    } catch (const Error&) {
      result.complete = false;
    }
  }
  return result;
}

int launcher_restarts() {
  const char* restarts = std::getenv("MOERL_RESTARTS");
  return restarts ? std::max(0, std::atoi(restarts)) : 0;
}

std::string launcher_restart_cause() {
  const char* cause = std::getenv("MOERL_RESTART_CAUSE");
  return cause ? cause : "";
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
  Stop stop{reason, {}};
  for (int rank : lost_ranks().ranks()) stop.lost.push_back(rank);
  for (int rank = 0; rank < mailbox_.size(); ++rank) {
    if (rank == mailbox_.rank() || lost_ranks().contains(rank)) continue;
    try {
      mailbox_.send(rank, stop);
    } catch (const PeerLostError&) {
      // A lost rank has nothing to stop.
    }
  }
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

int StopCoordinator::take_stop_signal() {
  const int signal_number = stop_signal_received();
  if (signal_number == 0 || forwarded_signal_) return 0;
  forwarded_signal_ = true;
  return signal_number;
}

bool StopCoordinator::should_stop() {
  if (stopping_) return true;
  if (const int signal_number = stop_signal_received(); signal_number != 0 && !forwarded_signal_) {
    forwarded_signal_ = true;
    request_stop("signal " + std::to_string(signal_number) + " on rank " + std::to_string(mailbox_.rank()));
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
    // Learner 0's word on who was lost is final: the end of the job waits for the others.
    for (std::int32_t rank : stop->second.lost) {
      RankLost notice;
      notice.rank = rank;
      notice.why = "declared lost by learner 0 (in its Stop)";
      lost_ranks().add(notice);
    }
  }
  return stopping_;
}

void set_abort_channel(MPI_Comm channel) { g_abort_channel = channel; }

void set_abort_channel_job_ranks(std::vector<int> job_rank_of_channel_rank) {
  g_job_rank_of_channel_rank = std::move(job_rank_of_channel_rank);
}

std::optional<JobAbortNotice> poll_job_abort() {
  if (g_abort_channel == MPI_COMM_NULL) return std::nullopt;
  int arrived = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  // A matched probe, as in Mailbox::poll_envelope: the notice is taken even
  // when its sender (which exits right after aborting) is gone before its bytes are read.
  if (MPI_Improbe(MPI_ANY_SOURCE, static_cast<int>(MessageType::JobAbort), g_abort_channel, &arrived, &message,
                  &status) != MPI_SUCCESS) {
    acknowledge_failures(g_abort_channel);  // a dead peer (ULFM): look again next time
    return std::nullopt;
  }
  if (!arrived) return std::nullopt;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  std::vector<std::uint8_t> frame(static_cast<size_t>(count));
  const int received = MPI_Mrecv(frame.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
  JobAbortNotice notice;
  notice.rank = status.MPI_SOURCE;
  if (static_cast<size_t>(status.MPI_SOURCE) < g_job_rank_of_channel_rank.size())
    notice.rank = g_job_rank_of_channel_rank[static_cast<size_t>(status.MPI_SOURCE)];
  if (received != MPI_SUCCESS) {
    notice.status = kLostRankExitStatus;
    notice.reason = "(its reason was lost: it ended before the message was read)";
    return notice;
  }
  try {
    const Envelope envelope = unframe_message(frame, MessageType::JobAbort, status.MPI_SOURCE);
    ByteReader r(envelope.payload);
    const JobAbort abort = JobAbort::decode(r);
    notice.status = abort.status;
    notice.reason = abort.reason;
  } catch (const Error& error) {
    notice.reason = std::string("(its message was malformed: ") + error.what() + ")";
  }
  return notice;
}

void end_without_mpi_abort() { g_no_mpi_abort = true; }

void end_this_rank(int status) {
  flush_logs();
  run_abort_cleanups();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized && !g_no_mpi_abort) {
    // MPI_Abort has no deadline of its own: when every rank of a job aborts
    // at once under ULFM, Open MPI 5.0.11 could leave them inside it with
    // mpirun waiting for ever ("Abort is in progress"; seen in cli.train and
    // cli.restarts). This rank ends itself if MPI has not ended it by then,
    // and mpirun, which tolerates dead ranks under ULFM, then exits.
    std::thread([status] {
      std::this_thread::sleep_for(std::chrono::seconds(kAbortDeadlineSeconds));
      std::_Exit(status);
    }).detach();
    record_exit_status(status);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  exit_with_record(status);
}

void abort_job(const std::string& role_label, const std::string& what, int status) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const int rank = world_rank_or_unknown();  // the job rank once placement decided it
  const char* role = role_label.empty() ? "no role yet" : role_label.c_str();
  if (status == kLostRankExitStatus)
    std::fprintf(stderr,
                 "moerl: rank %d (%s) lost a rank the job cannot go on without: %s\n"
                 "moerl: stopping the whole job (status %d: scripts/launch.sh restarts it)\n",
                 rank, role, what.c_str(), status);
  else
    std::fprintf(stderr, "moerl: fatal error on rank %d (%s): %s\nmoerl: stopping the whole job\n", rank, role,
                 what.c_str());
  std::fflush(stderr);
  if (initialized && !finalized && fault_tolerant_mpi()) tell_every_rank(rank, status, what);
  end_this_rank(status);
}

}  // namespace moerl::runtime
