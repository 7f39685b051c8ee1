#pragma once
// Stopping a job: cleanly on SIGINT/SIGTERM, at once on a fatal error.
//
// Clean stop: a signal only sets a flag (nothing else is async-signal-safe).
// Role loops call StopCoordinator::should_stop() between units of work; a
// rank that saw the signal tells learner 0, learner 0 tells every rank, and
// each role finishes its current step and returns. Under mpirun every rank
// receives the signal itself too; the messages cover a signal sent to one
// rank (e.g. `kill` of a single process, or Slurm's --signal to one task).
//
// Fatal error: abort_job() prints the error once, flushes logs and calls
// MPI_Abort, which ends every rank promptly with a non-zero status — a job
// never hangs waiting for a dead peer.

#include <mpi.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "moerl/runtime/mailbox.h"

namespace moerl::runtime {

void install_stop_signal_handlers();
// The signal number that asked for a stop, or 0.
int stop_signal_received();
// For tests: forget a received signal.
void reset_stop_signal();

class StopCoordinator {
 public:
  StopCoordinator(Mailbox& mailbox, int coordinator_rank = 0);

  // Non-blocking. True once this rank must stop; reason() says why.
  bool should_stop();
  // Asks the whole job to stop (any rank may call it).
  void request_stop(const std::string& reason);
  // For a rank that answers a signal of its own otherwise (an env worker
  // asks to be released): the signal number, once, and should_stop() does
  // not forward it; 0 when none came or it was taken already.
  int take_stop_signal();
  const std::string& reason() const { return reason_; }

 private:
  void broadcast_stop(const std::string& reason);

  Mailbox& mailbox_;
  int coordinator_;
  bool stopping_ = false;
  bool forwarded_signal_ = false;
  std::string reason_;
};

// Exit status used when a fatal error aborts the job.
constexpr int kFatalErrorExitStatus = 1;
// Exit status of a job that stopped cleanly (checkpoint saved, every rank
// out) on a failure it could not work around: no progress, every task
// family paused, repeated malformed messages from one rank.
constexpr int kJobFailedExitStatus = 3;
// Exit status of a job that lost a rank it could not do without (learner 0,
// or any rank without a fault-tolerant MPI): scripts/launch.sh restarts it.
constexpr int kLostRankExitStatus = 4;

// Which attempt of the job this is: scripts/launch.sh counts its restarts in
// MOERL_RESTARTS and says why it made the last one in MOERL_RESTART_CAUSE
// (0 and "" for a job started without it).
int launcher_restarts();
std::string launcher_restart_cause();

// Where abort_job() tells the other ranks under a fault-tolerant MPI (whose
// MPI_Abort ends only the caller): a duplicate of the world that MpiSession
// keeps until MPI_Finalize. poll_job_abort() is how a rank hears of it (the
// heartbeat thread asks): the status and reason, if another rank aborted.
void set_abort_channel(MPI_Comm channel);
// The job rank of each of the channel's ranks, when [cluster] placement
// reordered the ranks (the channel keeps the launcher's order).
void set_abort_channel_job_ranks(std::vector<int> job_rank_of_channel_rank);
struct JobAbortNotice {
  int rank = -1;
  int status = 1;
  std::string reason;
};
std::optional<JobAbortNotice> poll_job_abort();
// Ends this process now with `status`: the abort cleanups, then MPI_Abort
// (which under ULFM ends this rank only; without it, the whole job).
[[noreturn]] void end_this_rank(int status);
// A process that joined a running job (runtime/env_join.h): MPI_Abort there
// ends every process the job's launcher started, spawned ones included, so
// such a process only ends itself; learner 0 sees it lost.
void end_without_mpi_abort();

// The end of a job: every living rank tells learner 0 it is done and learner
// 0 answers each, within timeout_s. MPI_Finalize waits for every rank, so
// without this a frozen or lost rank would hold the job forever after the
// others stopped cleanly. Ranks that learner 0 declared lost are not waited
// for: a handshake of messages rather than a collective, so that no two ranks
// need to agree on who is lost. A rank that does not arrive is fenced: learner
// 0 SIGKILLs it when it runs on learner 0's host, and its answer names it to
// the others so that the ranks on its host do (`whereabouts` says where a
// rank runs, from its heartbeats).
struct EndOfJobResult {
  bool complete = true;      // everyone arrived (a member: learner 0 answered)
  std::vector<int> missing;  // the ranks that did not arrive, fenced (a member: as learner 0 answered)
};
using RankWhereabouts = std::function<std::optional<EndOfJob::Fence>(int rank)>;
EndOfJobResult every_rank_arrives(Mailbox& mailbox, double timeout_s, const std::string& this_host,
                                  const RankWhereabouts& whereabouts = {});

// A function abort paths run before the process goes (abort_job, a second
// stop signal): it must be async-signal-safe (e.g. kill(2) of child process
// groups). At most 8; registering the same function twice keeps one.
void add_abort_cleanup(void (*cleanup)());

// Prints "moerl: fatal error on rank R (role): WHAT", flushes logs, runs the
// abort cleanups, aborts every rank.
[[noreturn]] void abort_job(const std::string& role_label, const std::string& what, int status = kFatalErrorExitStatus);

}  // namespace moerl::runtime
