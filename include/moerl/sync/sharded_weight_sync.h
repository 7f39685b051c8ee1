#pragma once
// Weight sync when learners and actors split the routed experts, each side
// with its own expert-parallel size (P_L learner members, actors in groups of
// P_A): each actor receives the experts it holds from the learner members
// that own them, plus the replicated parameters from learner member 0.
//
// A version travels as the channels of an ExpertSyncPlan
// (sync/expert_sync_plan.h), each an ordinary WeightPublisher/WeightReceiver
// pair (sync/weight_sync.h) on its own communicator
// (sync/expert_sync_channels.h): the bucketing, the pipelining, the CRC-32C
// checksums and the per-channel layout fingerprint are those of the
// unsharded path, unchanged. What this layer adds is the version fence:
//
//   - a version is ready on an actor only when every one of its channels
//     holds that same verified version, and apply() applies all of them
//     together between two decode steps, so an actor never generates with
//     the experts of one version and the attention of another;
//   - a checksum failure in any channel refuses the version as a whole
//     (CorruptVersionError, once per version): the channels that did verify
//     it drop it unapplied (WeightReceiver::discard_ready), and every channel
//     still takes all of the version's collectives, so the channels stay
//     matched with their publishers and the next version lands as usual.
//
// Every channel sees every version in order (a WeightReceiver never skips a
// header), so the channels of an actor can only differ by a version one of
// them refused; a channel holding a version older than another channel's
// ready one drops it too.
//
// Memory: the actor's views are its own parameters (its share of the
// experts), and each channel stages only its pieces, so an actor stages and
// receives replicated + E/P_A experts' bytes, never the whole model.
// Receivers copy staging into the parameters (no swap mode: a channel holds
// slices of tensors, which cannot be re-pointed one slice at a time). A
// module on a device or in another dtype goes through HostWeights views
// (sync/module_weights.h), pull() before publish(), push() after apply();
// sync/policy_sync_views.h marks a Policy's split tensors.
//
// Order and collectives: every rank of the sync communicator constructs its
// ShardedWeightPublisher (learner members) or ShardedWeightReceiver (actors)
// at the same point (collective, expert_sync_channels.h). Afterwards no
// call is collective across sides: each learner member publishes the same
// versions in the same order (a version is published when every learner
// member has published it), and actors poll. Every learner member must
// close() before the communicators go, as with WeightPublisher.

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moerl/sync/expert_sync_channels.h"
#include "moerl/sync/weight_sync.h"

namespace moerl::sync {

class ShardedWeightPublisher {
 public:
  // Learner member `member` (its rank in comm). Collective over comm.
  // options.root is ignored: the learner is its channels' root.
  ShardedWeightPublisher(MPI_Comm comm, ExpertSyncLayout layout, int member, std::vector<ShardedWeightView> views,
                         SyncOptions options = {});
  ~ShardedWeightPublisher();

  // As WeightPublisher, over every channel this member publishes.
  void publish(std::int64_t version);
  bool progress();
  void finish();
  bool in_flight() const;
  void close();
  // Fault injection: the next publication flips a byte of `bucket` of the
  // channel plan().channels()[channel], which this member must publish.
  void corrupt_next_publication(size_t channel, int bucket);

  const ExpertSyncPlan& plan() const { return channels_->plan(); }
  // Indices into plan().channels() this member publishes.
  const std::vector<size_t>& channels() const { return channels_->mine(); }
  // The last publication, over every channel: bytes and buckets summed,
  // seconds and blocking_s of the slowest channel.
  SyncStats last() const;

 private:
  std::unique_ptr<ExpertSyncChannels> channels_;
  std::vector<std::unique_ptr<WeightPublisher>> publishers_;  // one per channels()
};

class ShardedWeightReceiver : public VersionReceiver {
 public:
  // An actor holding actor member `member`'s share (a standby actor's share
  // is the caller's choice). Collective over comm. apply() copies into the
  // views' memory.
  ShardedWeightReceiver(MPI_Comm comm, ExpertSyncLayout layout, int member, std::vector<ShardedWeightView> views,
                        SyncOptions options = {});
  ~ShardedWeightReceiver();

  // Drives every channel; true when all of them hold the same verified
  // version, newer than the current one. Throws CorruptVersionError once for
  // a version some channel refused (the next version is received as usual),
  // SyncError on a layout mismatch and CommTimeout as WeightReceiver does.
  bool poll() override;
  std::int64_t ready_version() const override;
  // Applies every channel's bytes of the ready version; returns it (or the
  // current version when none is ready).
  std::int64_t apply() override;
  std::int64_t current_version() const override { return current_version_; }
  // True once every channel's publisher closed and nothing is left to apply.
  bool closed() const override;
  // Blocks until a version is ready or the publishers closed (with the timeout).
  bool wait_ready(double timeout_s) override;

  const ExpertSyncPlan& plan() const { return channels_->plan(); }
  // Indices into plan().channels() this actor receives.
  const std::vector<size_t>& channels() const { return channels_->mine(); }
  // What this actor receives and stages per version: its parameters' bytes.
  size_t bytes_per_version() const;
  // The last version over every channel: bytes summed, seconds of the slowest channel.
  SyncStats last() const override;

 private:
  // Drops, channel by channel, a verified version that cannot become ready:
  // refused elsewhere, or older than another channel's.
  void discard_stale();

  std::unique_ptr<ExpertSyncChannels> channels_;
  std::vector<std::unique_ptr<WeightReceiver>> receivers_;  // one per channels()
  std::int64_t refused_version_ = -1;                       // the newest version some channel refused
  std::int64_t current_version_ = -1;
};

}  // namespace moerl::sync
