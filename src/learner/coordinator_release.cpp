// The Coordinator's releases of env workers (coordinator.h): scaling the
// environment tier down while the job runs.
//
// An env worker that gets SIGTERM of its own (a scheduler taking its node
// back, `moerl ctl release-env`) asks learner 0 to let it go instead of
// stopping the job. Learner 0 waits kReleaseGraceS first: a job-wide stop
// (Slurm's scancel, mpirun forwarding a SIGTERM to every rank) reaches learner
// 0 within that time too, and then the job stops as on any signal, with its
// checkpoint. Otherwise it grants the release when another env worker lives
// and the MPI is fault tolerant (the worker's exit must not end the job), and
// the worker leaves at once. Its loss is then handled as any env worker's
// (the actors restore its sessions elsewhere), but counted as a release:
// summary.json's failure entry says "released", and nothing is fenced.

#include <spdlog/spdlog.h>

#include "moerl/learner/coordinator.h"
#include "moerl/runtime/failover_messages.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/lost_ranks.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

// mpirun and Slurm deliver a job-wide SIGTERM to every rank within
// milliseconds; one second tells a job-wide stop from one worker's release
// with a wide margin, and delays a release by no more.
constexpr double kReleaseGraceS = 1.0;

}  // namespace

void Coordinator::take_release_requests(double now) {
  while (auto request = mailbox_.try_receive<runtime::EnvReleaseRequest>()) {
    const int rank = request->first;
    if (world_.layout().assignment(rank).role != runtime::Role::EnvWorker) {
      drop_malformed(runtime::MessageError(
                         "a release request from rank " + std::to_string(rank) + ", which is not an env worker", rank),
                     false);
      continue;
    }
    if (releases_pending_.count(rank) || released_.count(rank)) continue;
    releases_pending_[rank] = PendingRelease{now + kReleaseGraceS, request->second.reason};
  }
}

std::string Coordinator::release_refusal(int rank) const {
  if (!runtime::fault_tolerant_mpi()) return "this MPI is not fault tolerant, so a rank that leaves ends the job";
  for (int other : world_.layout().ranks_of(runtime::Role::EnvWorker))
    if (other != rank && !runtime::lost_ranks().contains(other) && !released_.count(other)) return "";
  return "it is the last env worker";
}

void Coordinator::decide_releases(double now) {
  for (auto it = releases_pending_.begin(); it != releases_pending_.end();) {
    const int rank = it->first;
    if (now < it->second.decide_at) {
      ++it;
      continue;
    }
    const std::string reason = it->second.reason;
    it = releases_pending_.erase(it);
    // A stop of the whole job is under way (learner 0 got the signal too, or a failure): it wins.
    if (runtime::stop_signal_received() != 0 || failure_ || runtime::lost_ranks().contains(rank)) continue;
    const int index = world_.layout().assignment(rank).index;
    runtime::EnvReleaseReply reply;
    reply.refusal = release_refusal(rank);
    reply.granted = reply.refusal.empty();
    if (reply.granted) {
      released_[rank] = reason;
      spdlog::warn("releasing env worker {} (rank {}) on its {}: its sessions move to the other env workers", index,
                   rank, reason);
    } else {
      spdlog::warn("env worker {} (rank {}) asked to leave on its {}; refused: {}; it stops the job instead", index,
                   rank, reason, reply.refusal);
    }
    try {
      mailbox_.send(rank, reply);
    } catch (const runtime::PeerLostError&) {
      // Gone already: its loss is declared as any other.
    }
  }
}

}  // namespace moerl::learner
