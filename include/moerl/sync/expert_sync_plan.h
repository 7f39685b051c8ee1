#pragma once
// Which bytes of a policy travel from which learner to which actors when both
// sides split the routed experts (moe/expert_parallel.h), each with its own
// expert-parallel size: P_L learner members publish, actors hold the share of
// their member index under P_A. Pure arithmetic: no communication, no
// LibTorch; sync/sharded_weight_sync.h moves the bytes it names.
//
// A version is cut into channels, each one publisher (a learner member) and
// the actors of one actor member (or every actor):
//
//   "replicated"   learner 0 -> every actor: every parameter that is not split
//   (m, a)         learner m -> the actors of member a, for every pair whose
//                  expert ranges [m E/P_L, (m+1) E/P_L) and [a E/P_A, (a+1) E/P_A)
//                  overlap: for every split tensor the overlapping experts
//
// A split tensor is [E/P, ...] with dim 0 the expert and contiguous, so a
// range of experts is one contiguous byte range on both sides (at different
// offsets). The channels of an actor member tile its parameters exactly, and
// no channel carries a byte its actors do not hold: an actor receives (and
// stages) only its share, which is what expert parallelism saves on the
// actors. The channels of a learner member tile its experts exactly too.
//
// Why channels rather than one stream per actor: each channel's receivers all
// want the same bytes, so a channel is one broadcast (the existing bucketed,
// checksummed WeightPublisher) on its own communicator, and its bytes leave
// the learner once however many actor groups there are. There are at most
// P_L + P_A channels (the overlapping pairs of two partitions of [0, E)).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moerl::sync {

// The expert-parallel sizes of both sides; each must divide `experts`.
struct ExpertSyncLayout {
  std::int64_t experts = 1;
  int learner_members = 1;  // P_L
  int actor_members = 1;    // P_A
};

// "E = 8, P_L = 2, P_A = 4": how errors name a layout.
std::string describe(const ExpertSyncLayout& layout);

// Experts [first, first + count).
struct ExpertRange {
  std::int64_t first = 0;
  std::int64_t count = 0;
};

// Member `member` of `members` holds experts [member E/members, (member+1) E/members)
// (as moe::expert_shard, which this library cannot reach: it lives beside LibTorch).
ExpertRange expert_range(std::int64_t experts, int member, int members);

// One parameter of the whole policy, as both sides name it.
struct SyncedParameter {
  std::string name;
  bool split = false;  // a routed expert tensor: dim 0 is the expert, each side holds its share
  size_t bytes = 0;    // not split: the parameter's bytes; split: one expert's (a dim-0 slice)
};

// A byte range of one parameter that a channel carries, at its offset in the
// learner member's tensor and in the actor member's tensor.
struct ChannelPiece {
  size_t parameter = 0;  // index into the plan's parameters
  size_t learner_offset = 0;
  size_t actor_offset = 0;
  size_t bytes = 0;
};

struct SyncChannel {
  static constexpr int kEveryActor = -1;

  std::string name;                  // "replicated" or "experts 2..3: learner 1 -> actor member 0"
  int learner = 0;                   // the publishing learner member
  int actor_member = kEveryActor;    // the actor member whose actors receive, or every actor
  ExpertRange experts;               // the experts it carries (count 0: the replicated channel)
  std::vector<ChannelPiece> pieces;  // in parameter order

  bool reaches(int member) const { return actor_member == kEveryActor || actor_member == member; }
  size_t bytes() const;
};

class ExpertSyncPlan {
 public:
  // Throws (naming the layout) unless P_L and P_A are positive and divide E.
  ExpertSyncPlan(ExpertSyncLayout layout, std::vector<SyncedParameter> parameters);

  const ExpertSyncLayout& layout() const { return layout_; }
  const std::vector<SyncedParameter>& parameters() const { return parameters_; }
  // The replicated channel first (when anything is replicated), then the
  // expert channels by expert range.
  const std::vector<SyncChannel>& channels() const { return channels_; }
  // Indices into channels(): those learner member m publishes, those actor member a receives.
  std::vector<size_t> learner_channels(int member) const;
  std::vector<size_t> actor_channels(int member) const;

  // The bytes of parameter p as a member of either side holds it.
  size_t learner_bytes(size_t parameter) const;
  size_t actor_bytes(size_t parameter) const;
  // Everything an actor holds (any member: the shares are equal), and so receives per version.
  size_t actor_total_bytes() const;

  // FNV-1a over E and the parameters (names, split, bytes): the whole model,
  // the same whatever P_L and P_A are. Both sides must agree on it.
  std::uint64_t model_fingerprint() const;

 private:
  void add_expert_channels();

  ExpertSyncLayout layout_;
  std::vector<SyncedParameter> parameters_;
  std::vector<SyncChannel> channels_;
};

}  // namespace moerl::sync
