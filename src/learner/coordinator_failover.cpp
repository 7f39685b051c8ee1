// The Coordinator's failover (coordinator.h): what learner 0 does when the
// heartbeats declare a rank lost.
//
// Under a fault-tolerant MPI the job goes on without a lost actor, standby
// actor or env worker:
//   1. every living rank is told (RankLost; a rank on the lost one's host
//      fences it with SIGKILL, so that a frozen process counts as dead);
//   2. a lost actor's groups that it had not delivered are replaced: its
//      evaluation groups go back into the queue, its training groups are
//      cancelled by their learners (those not complete yet) and new groups
//      are handed out in their place; the i-th lost actor promotes standby
//      actor i;
//   3. learner 0's training thread rebuilds the weight-sync group without it
//      and republishes its newest weights; the actors do the same;
//   4. the actors restore their sessions of a lost env worker elsewhere.
// The failure counts as recovered once every learner answered, every living
// actor reported (FailoverReport) and the sync group was rebuilt; the
// failures list of summary.json says how long that took and what moved.
// Any other loss (a learner, the last env worker or actor, or any loss
// without ULFM) stops the job cleanly for a restart (status 4).

#include <spdlog/spdlog.h>

#include "moerl/learner/coordinator.h"
#include "moerl/runtime/failover_messages.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/lost_ranks.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

int living(const runtime::RankLayout& layout, runtime::Role role) {
  int count = 0;
  for (int rank : layout.ranks_of(role)) count += !runtime::lost_ranks().contains(rank);
  return count;
}

int actors_lost(const runtime::RankLayout& layout) {
  int count = 0;
  for (int rank : layout.ranks_of(runtime::Role::Actor)) count += runtime::lost_ranks().contains(rank);
  return count;
}

}  // namespace

std::string Coordinator::failover_impossible(const runtime::LostRank& lost) const {
  if (!runtime::fault_tolerant_mpi()) return "this MPI is not fault tolerant";
  const runtime::RankLayout& layout = world_.layout();
  switch (lost.role) {
    case runtime::Role::Learner: return "a learner cannot be replaced while the job runs";
    case runtime::Role::EnvWorker: return living(layout, runtime::Role::EnvWorker) == 0 ? "no env worker is left" : "";
    case runtime::Role::Actor:
    case runtime::Role::StandbyActor:
      // A living standby is either promoted already (working as an actor) or
      // promoted by this loss: either way it generates.
      return living(layout, runtime::Role::Actor) + living(layout, runtime::Role::StandbyActor) == 0
                 ? "no actor is left"
                 : "";
  }
  return "";
}

void Coordinator::tell_living_ranks(const runtime::RankLost& notice) {
  for (int rank = 1; rank < world_.size(); ++rank) {
    if (runtime::lost_ranks().contains(rank)) continue;
    try {
      mailbox_.send(rank, notice);
    } catch (const runtime::PeerLostError&) {
      // Dead too: its own loss is declared next.
    }
  }
}

void Coordinator::on_rank_lost(const runtime::LostRank& lost, double now) {
  // An env worker released on its request (coordinator_release.cpp) leaves as a lost one does, on purpose.
  const auto release = released_.find(lost.rank);
  const bool released = release != released_.end();
  if (released) {
    spdlog::warn("rank {} (env_worker {} on host {}, pid {}) left the job, released on its {}", lost.rank,
                 lost.role_index, lost.host, lost.pid, release->second);
    telemetry::metrics().add("coordinator.released_ranks");
  } else {
    spdlog::error("{}", lost.describe());
    telemetry::metrics().add("coordinator.lost_ranks");
  }
  runtime::RankLost notice{lost.rank,       runtime::role_name(lost.role),
                           lost.role_index, lost.host,
                           lost.pid,        released ? "released on its " + release->second : lost.why};
  runtime::lost_ranks().add(notice);
  // Without a fault-tolerant MPI a killed rank takes the whole job down at
  // once, before the clean stop below saved its checkpoint: the end of the
  // job fences then (cmd_train.cpp). A released rank has ended itself.
  if (runtime::fault_tolerant_mpi() && !released) runtime::fence(notice, world_.hostname());
  tell_living_ranks(notice);
  for (Recovery& recovery : recoveries_) recovery.actors.erase(lost.rank);  // no report comes from it now

  RankFailure failure;
  failure.rank = lost.rank;
  failure.role = runtime::role_name(lost.role);
  failure.role_index = lost.role_index;
  failure.host = lost.host;
  failure.kind = released ? "released: " + release->second : "lost: " + lost.why;
  failure.detected_after_s = lost.silent_s;
  failure.step = step_;
  tasks_.record_rank_failure(failure);

  if (released) {
    released_.erase(release);
    gone_by_release_.insert(lost.rank);
  }
  const std::string impossible = failover_impossible(lost);
  if (!impossible.empty()) {
    fail(lost.describe() + "; " + impossible + ": the job stops so that it can be restarted from its checkpoint",
         runtime::kLostRankExitStatus);
    return;
  }
  Recovery recovery;
  recovery.rank = lost.rank;
  recovery.failure = tasks_.rank_failures().size() - 1;
  recovery.declared_at = now;
  for (int rank : world_.layout().ranks_of(runtime::Role::Actor))
    if (!runtime::lost_ranks().contains(rank)) recovery.actors.insert(rank);
  for (int rank : world_.layout().ranks_of(runtime::Role::StandbyActor))
    if (!runtime::lost_ranks().contains(rank)) recovery.actors.insert(rank);
  if (lost.role == runtime::Role::Actor || lost.role == runtime::Role::StandbyActor) fail_over_actor(lost, recovery);
  spdlog::warn("failing over from the loss of rank {} ({} {})", lost.rank, runtime::role_name(lost.role),
               lost.role_index);
  recoveries_.push_back(std::move(recovery));
}

void Coordinator::fail_over_actor(const runtime::LostRank& lost, Recovery& recovery) {
  recovery.sync = true;
  sync_broken_ = true;
  if (lost.role == runtime::Role::Actor) {
    // The i-th lost actor promotes standby actor i (the standbys apply the same rule).
    const int promoted = actors_lost(world_.layout()) - 1;
    if (promoted < world_.layout().count(runtime::Role::StandbyActor)) {
      const int standby = world_.layout().first_rank(runtime::Role::StandbyActor) + promoted;
      if (!runtime::lost_ranks().contains(standby)) {
        tasks_.add_actor(standby);
        spdlog::warn("standby actor {} (rank {}) takes the place of actor {}", promoted, standby, lost.role_index);
      }
    }
  }
  RankFailure& failure = tasks_.rank_failure(recovery.failure);
  std::map<int, std::vector<std::uint64_t>> by_learner;
  for (const rollout::TaskGroup& group : tasks_.take_undelivered(lost.rank)) {
    if (group.evaluation) {
      failure.episodes_restarted += group.size;  // queued again as it was
      continue;
    }
    const int learner = static_cast<int>(group.group_id % static_cast<std::uint64_t>(learners_));
    cancelling_[group.group_id] = group;
    by_learner[learner].push_back(group.group_id);
  }
  for (auto& [learner, ids] : by_learner) {
    if (learner == 0) {
      for (std::uint64_t id : own_inbox_.cancel_incomplete(ids)) {
        tasks_.cancelled_training_group(cancelling_[id]);
        failure.episodes_restarted += cancelling_[id].size;
      }
      for (std::uint64_t id : ids) cancelling_.erase(id);
      continue;
    }
    recovery.learners.insert(learner);
    mailbox_.send(learner, runtime::GroupsCancelled{lost.rank, ids});
  }
}

void Coordinator::take_failover_messages(double now) {
  while (auto reply = mailbox_.try_receive<runtime::GroupsCancelledReply>()) {
    for (Recovery& recovery : recoveries_) {
      if (recovery.rank != reply->second.lost_rank) continue;
      RankFailure& failure = tasks_.rank_failure(recovery.failure);
      for (std::uint64_t id : reply->second.cancelled) {
        const auto it = cancelling_.find(id);
        if (it == cancelling_.end()) continue;
        tasks_.cancelled_training_group(it->second);
        failure.episodes_restarted += it->second.size;
      }
      recovery.learners.erase(reply->first);
    }
    // The rest of the groups asked about were complete: trained on as they are.
    for (auto it = cancelling_.begin(); it != cancelling_.end();)
      it = it->first % static_cast<std::uint64_t>(learners_) == static_cast<std::uint64_t>(reply->first)
               ? cancelling_.erase(it)
               : std::next(it);
  }
  while (auto report = mailbox_.try_receive<runtime::FailoverReport>()) {
    for (Recovery& recovery : recoveries_) {
      if (recovery.rank != report->second.lost_rank) continue;
      tasks_.rank_failure(recovery.failure).sessions_migrated += report->second.sessions_migrated;
      recovery.actors.erase(report->first);
    }
  }
  (void)now;
}

void Coordinator::finish_recoveries(double now) {
  for (auto it = recoveries_.begin(); it != recoveries_.end();) {
    const Recovery& r = *it;
    if (!r.learners.empty() || !r.actors.empty() || (r.sync && sync_broken_)) {
      ++it;
      continue;
    }
    RankFailure& failure = tasks_.rank_failure(r.failure);
    failure.recovered_after_s = now - r.declared_at;
    spdlog::warn("recovered from the loss of rank {} in {:.2f} s: {} sessions moved, {} episodes restarted", r.rank,
                 failure.recovered_after_s, failure.sessions_migrated, failure.episodes_restarted);
    telemetry::metrics().record("coordinator.recovery_s", failure.recovered_after_s);
    it = recoveries_.erase(it);
  }
}

void Coordinator::sync_group_rebuilt() { sync_broken_ = false; }

}  // namespace moerl::learner
