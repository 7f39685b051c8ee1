#pragma once
// The communicators of an ExpertSyncPlan's channels (sync/expert_sync_plan.h),
// made from one MPI communicator that holds learner members 0..P_L-1 at ranks
// 0..P_L-1 and then every actor (standby actors included), in any order.
//
// Construction is collective over that communicator: every rank constructs
// its ExpertSyncChannels (through ShardedWeightPublisher or
// ShardedWeightReceiver, sync/sharded_weight_sync.h) at the same point. It
//
//   1. checks the layout: one all-reduce (with the timeout) gathers every
//      rank's side, member, E, P_L, P_A and model fingerprint; every rank
//      then runs the same checks on the same records, so a mismatch (an actor
//      configured for another P_L, a learner at the wrong rank, another
//      model) ends every rank with the same error naming both sides' layout,
//      before anything could wait on a split that some rank never makes. A
//      rank whose own views are wrong (a split tensor that cannot hold E/P
//      experts) still joins the check, so that the others fail with it
//      instead of waiting;
//   2. splits one communicator per channel that has receivers (MPI_Comm_split,
//      in the plan's channel order, each rank passing MPI_UNDEFINED for the
//      channels it has no part in): the learner member first (rank 0, the
//      root), then its actors in rank order. A channel no actor reaches is
//      not made: nobody holds its bytes.
//
// MPI_Comm_split has no timeout; step 1 is what makes sure every rank is
// there before it.

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moerl/comm/communicator.h"
#include "moerl/sync/expert_sync_plan.h"
#include "moerl/sync/weight_sync.h"

namespace moerl::sync {

// One parameter of a member, in the same order on every rank.
struct ShardedWeightView {
  WeightView view;     // the member's bytes: the whole parameter, or its share of the experts
  bool split = false;  // a routed expert tensor [E/P, ...]: dim 0 is the expert
};

enum class ExpertSyncSide { ExpertSyncLearner, ExpertSyncActor };

class ExpertSyncChannels {
 public:
  // member: a learner's member index (its rank in comm), or an actor's
  // member index under P_A (a standby actor's is the caller's choice).
  // views: this member's parameters; a split one must hold E/P experts.
  ExpertSyncChannels(MPI_Comm comm, ExpertSyncLayout layout, ExpertSyncSide side, int member,
                     std::vector<ShardedWeightView> views, double timeout_s);
  ~ExpertSyncChannels();

  const ExpertSyncPlan& plan() const { return *plan_; }
  // Indices into plan().channels() of the channels this rank publishes
  // (learner) or receives (actor), in plan order; each has a communicator.
  const std::vector<size_t>& mine() const { return mine_; }
  comm::Communicator& communicator(size_t channel) const;
  // This side's views of a channel's pieces: one per piece, into this
  // member's parameters, named alike on both sides.
  std::vector<WeightView> channel_views(size_t channel) const;

 private:
  void check_layout(comm::Communicator& all, const ExpertSyncLayout& layout, const std::string& local_error,
                    double timeout_s);
  void split_channels(comm::Communicator& all, MPI_Comm parent);

  ExpertSyncSide side_;
  int member_;
  std::vector<ShardedWeightView> views_;
  std::optional<ExpertSyncPlan> plan_;  // always set once constructed
  std::vector<int> actor_members_;      // of every actor in the communicator, gathered by check_layout
  std::vector<size_t> mine_;
  std::vector<std::unique_ptr<comm::Communicator>> communicators_;  // per plan channel; null where not a member
};

}  // namespace moerl::sync
