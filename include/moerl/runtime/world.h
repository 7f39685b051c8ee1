#pragma once
// This process's place in the job: its rank and role, and the communicators
// each role group uses. Constructing a World is collective over the parent
// communicator (every rank must construct one, after the config is valid).

#include <mpi.h>

#include <string>

#include "moerl/config/config.h"
#include "moerl/runtime/rank_layout.h"

namespace moerl::runtime {

class World {
 public:
  World(const config::Config& config, MPI_Comm parent);
  // A process that joined the running job as env worker `rank`
  // (runtime/env_join.h): it shares no communicator with the job; its
  // messages go through the Mailbox's routes. `threads`: learner 0's choice,
  // unless MOERL_THREADS_PER_RANK says otherwise.
  struct Joined {
    int rank = -1;
    int threads = 1;
  };
  World(const config::Config& config, Joined joined);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return self_.rank; }
  int size() const { return layout_.world_size(); }
  Role role() const { return self_.role; }
  int role_index() const { return self_.index; }
  const RankLayout& layout() const { return layout_; }
  bool is_coordinator() const { return self_.rank == RankLayout::kCoordinatorRank; }
  bool joined() const { return joined_; }  // a process that joined the running job
  // "learner 0", "actor 3": how logs and errors name this rank's role.
  std::string role_label() const;

  MPI_Comm world_comm() const { return world_; }
  // Point-to-point messages only (a duplicate, so tags never meet collectives).
  MPI_Comm message_comm() const { return messages_; }
  // The ranks sharing this rank's role (learners all-reduce gradients here).
  MPI_Comm role_comm() const { return role_; }
  // Learner 0, the actors and standby actors: weight publication. MPI_COMM_NULL elsewhere.
  MPI_Comm sync_comm() const { return sync_; }
  // Learner 0, the actors and standby actors, for spawning env workers that
  // join the running job together (runtime/env_join.h); a duplicate, used for
  // nothing else. MPI_COMM_NULL elsewhere.
  MPI_Comm join_comm() const { return join_; }
  // Expert parallelism: [cluster] expert_parallel = P learners and
  // [rollout] expert_parallel = P actors per expert group. For a learner or
  // actor whose role's P > 1: the P consecutive ranks of its role whose MoE
  // layers split their routed experts (index i is member i mod P), and the
  // ranks of its role holding the same share (one from each group; learners
  // average expert gradients over them). MPI_COMM_NULL elsewhere.
  MPI_Comm expert_comm() const { return expert_; }
  MPI_Comm expert_replica_comm() const { return expert_replicas_; }
  int learner_expert_parallel() const { return learner_expert_parallel_; }
  int actor_expert_parallel() const { return actor_expert_parallel_; }
  // Either side splits its experts: weight sync goes by shares (sync/sharded_weight_sync.h).
  bool sharded_weight_sync() const { return learner_expert_parallel_ > 1 || actor_expert_parallel_ > 1; }
  // Then: the first learner group's members (ranks 0..P-1 here), then every
  // actor and standby actor: the sharded weight sync's communicator.
  MPI_Comm expert_sync_comm() const { return expert_sync_; }

  // The machine's hostname: fencing a lost rank by pid is only safe on it.
  const std::string& hostname() const { return hostname_; }
  // The name [cluster] placement matched (placement.h: $MOERL_HOST_NAME, $SLURMD_NODENAME or the hostname).
  const std::string& placement_host() const { return placement_host_; }
  int ranks_on_host() const { return ranks_on_host_; }
  // This process's index among the job's processes on its host: the
  // launcher's (runtime/compute_device.h), else its place among the ranks
  // that share the host. Picks the CUDA device with [run] device = "cuda".
  int local_rank() const { return local_rank_; }
  // Compute threads for this rank: [cluster] threads_per_rank, or the
  // MOERL_THREADS_PER_RANK environment variable, or cores / ranks on host.
  int compute_threads() const { return compute_threads_; }

 private:
  void split_expert_groups(std::int64_t learner_expert_parallel, std::int64_t actor_expert_parallel);

  RankLayout layout_;
  RankAssignment self_;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm messages_ = MPI_COMM_NULL;
  MPI_Comm role_ = MPI_COMM_NULL;
  MPI_Comm sync_ = MPI_COMM_NULL;
  MPI_Comm join_ = MPI_COMM_NULL;
  bool joined_ = false;
  MPI_Comm expert_ = MPI_COMM_NULL;
  MPI_Comm expert_replicas_ = MPI_COMM_NULL;
  MPI_Comm expert_sync_ = MPI_COMM_NULL;
  int learner_expert_parallel_ = 1;
  int actor_expert_parallel_ = 1;
  std::string hostname_;
  std::string placement_host_;
  int ranks_on_host_ = 1;
  int local_rank_ = 0;
  int compute_threads_ = 1;
};

// The threads rule of World::compute_threads(), separated for tests.
int choose_compute_threads(std::int64_t configured, const char* environment_value, int cores, int ranks_on_host);

}  // namespace moerl::runtime
