#pragma once
// Which rank plays which role. The layout is contiguous and in this order:
//
//   ranks [0, L)              learners      (rank 0 = learner 0, the coordinator)
//   ranks [L, L+A)            actors
//   ranks [L+A, L+A+E)        env workers
//   ranks [L+A+E, L+A+E+S)    standby actors
//
// Contiguous blocks keep each role on as few nodes as possible when Slurm or
// mpirun fill nodes in rank order (learners share NVLink, env workers the CPUs).

#include <string>
#include <vector>

#include "moerl/config/sections.h"

namespace moerl::runtime {

enum class Role { Learner, Actor, EnvWorker, StandbyActor };
constexpr int kRoleCount = 4;

const char* role_name(Role role);

struct RankAssignment {
  int rank = -1;
  Role role = Role::Learner;
  int index = -1;  // position within the role: actor 0, actor 1, ...
};

class RankLayout {
 public:
  explicit RankLayout(const config::ClusterSection& cluster);

  int world_size() const { return total_; }
  int count(Role role) const { return counts_[static_cast<int>(role)]; }
  int first_rank(Role role) const { return firsts_[static_cast<int>(role)]; }
  RankAssignment assignment(int rank) const;  // throws for a rank outside the layout
  std::vector<int> ranks_of(Role role) const;

  static constexpr int kCoordinatorRank = 0;  // learner 0

 private:
  int counts_[kRoleCount] = {};
  int firsts_[kRoleCount] = {};
  int total_ = 0;
};

}  // namespace moerl::runtime
