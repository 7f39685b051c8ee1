// The actor's side of failover (actor.h): lost env workers' sessions restored
// elsewhere, the weight-sync group rebuilt without a lost member, a standby
// taking a lost actor's place.

#include <spdlog/spdlog.h>

#include "moerl/env/session_snapshot.h"
#include "moerl/rollout/actor.h"
#include "moerl/runtime/failover_messages.h"
#include "moerl/runtime/lost_ranks.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::rollout {

void Actor::take_rejoined_env_workers() {
  const std::vector<int> rejoined = runtime::lost_ranks().rejoined_since(rejoins_taken_);
  rejoined_unreached_.insert(rejoined.begin(), rejoined.end());
  rejoins_taken_ += rejoined.size();
  for (auto it = rejoined_unreached_.begin(); it != rejoined_unreached_.end();) {
    if (!mailbox_.has_route(*it) || runtime::lost_ranks().contains(*it)) {
      ++it;
      continue;
    }
    env_.mark_rejoined(*it);
    spdlog::warn("actor {}: env worker rank {} is back (a new process); new sessions go to it again",
                 world_.role_index(), *it);
    it = rejoined_unreached_.erase(it);
  }
}

void Actor::act_on_lost_ranks() {
  take_rejoined_env_workers();
  // A send that found an env worker dead: restore at once, before learner 0's notice.
  for (int worker : env_.take_newly_lost()) {
    const int moved = restore_sessions_of(worker);
    spdlog::warn("actor {}: env worker rank {} is dead (MPI); {} sessions moved", world_.role_index(), worker, moved);
  }
  const std::uint64_t epoch = runtime::lost_ranks().epoch();
  if (epoch == lost_epoch_) return;
  const std::vector<runtime::RankLost> lost = runtime::lost_ranks().all();
  for (size_t i = lost_epoch_; i < lost.size(); ++i) {
    const runtime::RankLost& notice = lost[i];
    runtime::FailoverReport report;
    report.lost_rank = notice.rank;
    if (world_.layout().assignment(notice.rank).role == runtime::Role::EnvWorker)
      report.sessions_migrated = restore_sessions_of(notice.rank);
    try {
      mailbox_.send(runtime::RankLayout::kCoordinatorRank, report);
    } catch (const runtime::PeerLostError&) {
      // Learner 0 gone: the heartbeats end this rank.
    }
  }
  lost_epoch_ = epoch;
  if (standby_ && promoted_by(lost)) {
    standby_ = false;
    spdlog::warn("actor (standby {}): takes the place of a lost actor; asking for work", world_.role_index());
    telemetry::metrics().add("actor.promotions");
  }
}

bool Actor::promoted_by(const std::vector<runtime::RankLost>& lost) const {
  // The i-th lost actor promotes standby i (learner 0 applies the same rule).
  int actors_lost = 0;
  for (const runtime::RankLost& notice : lost)
    if (world_.layout().assignment(notice.rank).role == runtime::Role::Actor) ++actors_lost;
  return actors_lost > world_.role_index();
}

int Actor::restore_sessions_of(int worker) {
  env_.mark_lost(worker);
  std::vector<std::uint64_t> ids;
  for (const auto& [id, episode] : episodes_)
    if (episode.env_worker == worker) ids.push_back(id);
  int moved = 0;
  for (std::uint64_t id : ids) {
    Episode& episode = episodes_.at(id);
    const int target = env_.pick_living(id);
    if (target < 0) {
      fail(episode, env::FailureReason::FailureNoReply,
           "session " + std::to_string(id) + ": env worker rank " + std::to_string(worker) +
               " was lost and no env worker is left",
           0);
      continue;
    }
    episode.env_worker = target;
    if (episode.waiting_env && episode.awaited_kind == env::RequestKind::Open) {
      // Never opened: open it there.
      episode.awaited_request = env_.open_on(id, episode.group.task, target);
    } else {
      // The new worker restores the latest archived snapshot and applies the
      // actions since, or replays every acknowledged action (environments are
      // deterministic): the session is where it was, the trajectory untouched.
      if (!episode.snapshot_path.empty()) {
        const std::vector<std::string> since(
            episode.env_actions.begin() + static_cast<std::ptrdiff_t>(episode.snapshot_turn),
            episode.env_actions.end());
        episode.awaited_request = env_.restore_from_archive_on(id, episode.snapshot_path, since, target);
      } else {
        const env::SessionSnapshot snapshot{id, episode.group.task, episode.env_actions, {}};
        episode.awaited_request = env_.restore_on(id, snapshot.encode(), target);
      }
      episode.awaited_kind = env::RequestKind::Restore;
      episode.restoring = true;
      expect_env_reply(episode);
    }
    ++moved;
  }
  telemetry::metrics().add("actor.sessions_migrated", moved);
  return moved;
}

void Actor::on_restored(Episode& episode) {
  episode.restoring = false;
  if (!episode.pending_action.empty()) {
    // The step that was in flight when its worker was lost, again.
    episode.awaited_request = env_.step(episode.id, episode.pending_action);
    episode.awaited_kind = env::RequestKind::Step;
    expect_env_reply(episode);
  } else {
    episode.waiting_env = false;  // it was generating: its next action goes to the new worker
    episode.last_progress_s = runtime::monotonic_seconds();
  }
}

void Actor::recover_sync_group() {
  auto* receiver = dynamic_cast<sync::WeightReceiver*>(receiver_.get());
  if (receiver == nullptr)
    throw Error("actor " + std::to_string(world_.role_index()) +
                ": the weight-sync group lost a member, and the sharded weight sync of expert-parallel learners "
                "([cluster] expert_parallel > 1) cannot go on without it");
  receiver->abandon();
  // Collective over the living members of the group: returns once learner 0 and
  // every other living actor have joined (learner 0 republishes its newest weights).
  const sync::SyncOptions& options = settings_.sync;
  const int publisher = sync_comm_->world_rank_of(options.root);
  std::unique_ptr<comm::Communicator> survivors = sync_comm_->survivors();
  if (survivors->world_rank_of(options.root) != publisher) {
    // The publisher itself is gone (learner 0): no group can go on without
    // it; this rank ends with the job, which the launcher restarts.
    throw runtime::PeerLostError(publisher, "actor " + std::to_string(world_.role_index()) +
                                                ": the weight-sync group lost its publisher (rank " +
                                                std::to_string(publisher) + ", learner 0)");
  }
  sync_survivors_ = std::move(survivors);
  sync_comm_ = sync_survivors_.get();
  auto rebuilt = make_receiver(*sync_comm_);
  static_cast<sync::WeightReceiver&>(*rebuilt).assume_version(engine_.policy_version());
  receiver_ = std::move(rebuilt);
  telemetry::metrics().add("actor.sync_recoveries");
  spdlog::warn("actor {}: weight-sync group rebuilt with {} members", world_.role_index(), sync_comm_->size());
}

}  // namespace moerl::rollout
