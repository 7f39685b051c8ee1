#include "moerl/runtime/rank_layout.h"

#include "moerl/core/check.h"

namespace moerl::runtime {

const char* role_name(Role role) {
  switch (role) {
    case Role::Learner: return "learner";
    case Role::Actor: return "actor";
    case Role::EnvWorker: return "env_worker";
    case Role::StandbyActor: return "standby_actor";
  }
  return "unknown";
}

RankLayout::RankLayout(const config::ClusterSection& cluster) {
  const std::int64_t counts[kRoleCount] = {cluster.learners, cluster.actors, cluster.env_workers,
                                           cluster.standby_actors};
  for (int r = 0; r < kRoleCount; ++r) {
    MOERL_CHECK(counts[r] >= 0 && counts[r] < (1 << 20), "rank count out of range");
    firsts_[r] = total_;
    counts_[r] = static_cast<int>(counts[r]);
    total_ += counts_[r];
  }
}

RankAssignment RankLayout::assignment(int rank) const {
  for (int r = 0; r < kRoleCount; ++r) {
    if (rank >= firsts_[r] && rank < firsts_[r] + counts_[r])
      return RankAssignment{rank, static_cast<Role>(r), rank - firsts_[r]};
  }
  throw Error("rank " + std::to_string(rank) + " is outside the rank layout of " + std::to_string(total_) + " ranks");
}

std::vector<int> RankLayout::ranks_of(Role role) const {
  std::vector<int> ranks;
  for (int i = 0; i < count(role); ++i) ranks.push_back(first_rank(role) + i);
  return ranks;
}

}  // namespace moerl::runtime
