#include "moerl/runtime/world.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "moerl/core/usable_cores.h"
#include "moerl/core/check.h"
#include "moerl/runtime/compute_device.h"
#include "moerl/runtime/placement.h"

namespace moerl::runtime {

int choose_compute_threads(std::int64_t configured, const char* environment_value, int cores, int ranks_on_host) {
  if (environment_value != nullptr && *environment_value != '\0') {
    const int from_env = std::atoi(environment_value);
    if (from_env > 0) return from_env;
  }
  if (configured > 0) return static_cast<int>(configured);
  return std::max(1, cores / std::max(1, ranks_on_host));
}

World::World(const config::Config& config, MPI_Comm parent) : layout_(config.cluster) {
  int rank = 0, size = 0;
  MOERL_MPI_CHECK(MPI_Comm_rank(parent, &rank));
  MOERL_MPI_CHECK(MPI_Comm_size(parent, &size));
  MOERL_CHECK(size == layout_.world_size(), "World needs " + std::to_string(layout_.world_size()) +
                                                " ranks, the job has " + std::to_string(size) +
                                                " (check_world_size should have caught this)");
  self_ = layout_.assignment(rank);
  world_ = parent;
  MOERL_MPI_CHECK(MPI_Comm_dup(parent, &messages_));
  MOERL_MPI_CHECK(MPI_Comm_split(parent, static_cast<int>(self_.role), rank, &role_));
  const bool in_sync_group =
      rank == RankLayout::kCoordinatorRank || self_.role == Role::Actor || self_.role == Role::StandbyActor;
  MOERL_MPI_CHECK(MPI_Comm_split(parent, in_sync_group ? 0 : MPI_UNDEFINED, rank, &sync_));
  if (sync_ != MPI_COMM_NULL) MOERL_MPI_CHECK(MPI_Comm_dup(sync_, &join_));
  split_expert_groups(config.cluster.expert_parallel, config.rollout.expert_parallel);

  MPI_Comm host_comm = MPI_COMM_NULL;
  MOERL_MPI_CHECK(MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host_comm));
  MOERL_MPI_CHECK(MPI_Comm_size(host_comm, &ranks_on_host_));
  int rank_on_host = 0;
  MOERL_MPI_CHECK(MPI_Comm_rank(host_comm, &rank_on_host));
  MPI_Comm_free(&host_comm);
  local_rank_ = launcher_local_rank(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"), std::getenv("SLURM_LOCALID"))
                    .value_or(rank_on_host);

  hostname_ = machine_hostname();
  placement_host_ = placement_host_name();
  compute_threads_ = choose_compute_threads(config.cluster.threads_per_rank, std::getenv("MOERL_THREADS_PER_RANK"),
                                            usable_cores(), ranks_on_host_);
}

World::World(const config::Config& config, Joined joined) : layout_(config.cluster), joined_(true) {
  MOERL_CHECK(
      joined.rank > 0 && joined.rank < layout_.world_size() && layout_.assignment(joined.rank).role == Role::EnvWorker,
      "rank " + std::to_string(joined.rank) + " is not an env worker's rank in this job's layout");
  self_ = layout_.assignment(joined.rank);
  hostname_ = machine_hostname();
  placement_host_ = placement_host_name();
  compute_threads_ =
      choose_compute_threads(joined.threads, std::getenv("MOERL_THREADS_PER_RANK"), usable_cores(), ranks_on_host_);
}

void World::split_expert_groups(std::int64_t learner_expert_parallel, std::int64_t actor_expert_parallel) {
  learner_expert_parallel_ = static_cast<int>(std::max<std::int64_t>(1, learner_expert_parallel));
  actor_expert_parallel_ = static_cast<int>(std::max<std::int64_t>(1, actor_expert_parallel));
  if (!sharded_weight_sync()) return;
  // Weight sync from the first learner group's members
  // (sync/sharded_weight_sync.h): they come first (their ranks lead), then
  // the actors and standby actors. Collective over the whole job.
  const bool publishes = self_.role == Role::Learner && self_.index < learner_expert_parallel_;
  const bool receives = self_.role == Role::Actor || self_.role == Role::StandbyActor;
  MOERL_MPI_CHECK(MPI_Comm_split(world_, publishes || receives ? 0 : MPI_UNDEFINED, self_.rank, &expert_sync_));
  // The groups, collective over each role's ranks (role_ holds them alone).
  const int p = self_.role == Role::Learner ? learner_expert_parallel_
                : self_.role == Role::Actor ? actor_expert_parallel_
                                            : 1;
  if (p == 1) return;
  const int index = self_.index;
  MOERL_MPI_CHECK(MPI_Comm_split(role_, index / p, index, &expert_));
  MOERL_MPI_CHECK(MPI_Comm_split(role_, index % p, index, &expert_replicas_));
}

World::~World() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* comm : {&messages_, &role_, &sync_, &join_, &expert_, &expert_replicas_, &expert_sync_})
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
}

std::string World::role_label() const { return std::string(role_name(self_.role)) + " " + std::to_string(self_.index); }

}  // namespace moerl::runtime
