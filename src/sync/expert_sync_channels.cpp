#include "moerl/sync/expert_sync_channels.h"

#include <cstring>

#include "moerl/comm/mpi_communicator.h"
#include "moerl/core/check.h"

namespace moerl::sync {
namespace {

using Side = ExpertSyncSide;

const char* side_name(Side side) { return side == Side::ExpertSyncLearner ? "learner" : "actor"; }

int members_of(const ExpertSyncLayout& layout, Side side) {
  return side == Side::ExpertSyncLearner ? layout.learner_members : layout.actor_members;
}

// The whole model's parameters from one member's views: a split view holds
// E/P experts, so one expert is bytes / (E/P).
std::vector<SyncedParameter> synced_parameters(const std::vector<ShardedWeightView>& views,
                                               const ExpertSyncLayout& layout, Side side) {
  const int members = members_of(layout, side);
  MOERL_CHECK(members >= 1 && layout.experts % members == 0,
              "expert sync: P_L and P_A must divide the number of experts (" + describe(layout) + ")");
  const auto local_experts = static_cast<size_t>(layout.experts / members);
  std::vector<SyncedParameter> parameters;
  for (const ShardedWeightView& v : views) {
    SyncedParameter p{v.view.name, v.split, v.view.bytes};
    if (v.split) {
      MOERL_CHECK(v.view.bytes % local_experts == 0,
                  "expert sync: the " + std::string(side_name(side)) + "'s split parameter " + v.view.name + " (" +
                      std::to_string(v.view.bytes) + " bytes) cannot hold " + std::to_string(local_experts) +
                      " experts (" + describe(layout) + ")");
      p.bytes = v.view.bytes / local_experts;
    }
    parameters.push_back(std::move(p));
  }
  return parameters;
}

// One rank's layout, as check_layout gathers it.
struct LayoutRecord {
  std::int64_t side = 0;  // 0 learner, 1 actor
  std::int64_t member = 0;
  std::int64_t experts = 0;
  std::int64_t learner_members = 0;
  std::int64_t actor_members = 0;
  std::int64_t model_fingerprint = 0;  // the bits of the uint64
  std::int64_t failed = 0;             // 1: the rank's own views were refused

  static constexpr size_t kFields = 7;
  ExpertSyncLayout layout() const {
    return {experts, static_cast<int>(learner_members), static_cast<int>(actor_members)};
  }
  bool learner() const { return side == 0; }
};

// "learner member 0 (rank 0, E = 8, P_L = 2, P_A = 2)"
std::string describe(const LayoutRecord& r, int rank) {
  return std::string(r.learner() ? "learner" : "actor") + " member " + std::to_string(r.member) + " (rank " +
         std::to_string(rank) + ", " + describe(r.layout()) + ")";
}

// Throws, on every rank alike, unless the records describe one layout:
// learner members 0..P_L-1 at ranks 0..P_L-1, actors after them, every rank
// with rank 0's E, P_L, P_A and model.
void check_records(const std::vector<LayoutRecord>& records) {
  const LayoutRecord& first = records[0];
  const std::string prefix = "expert weight sync: ";
  MOERL_CHECK(first.learner() && first.member == 0,
              prefix + "rank 0 of the sync communicator must be learner member 0, not " + describe(first, 0));
  for (size_t r = 1; r < records.size(); ++r) {
    const LayoutRecord& other = records[r];
    const int rank = static_cast<int>(r);
    if (other.experts != first.experts || other.learner_members != first.learner_members ||
        other.actor_members != first.actor_members)
      throw SyncError(prefix + "layout mismatch: " + describe(first, 0) + " but " + describe(other, rank) +
                      "; every learner and actor must be configured with the same expert-parallel sizes");
    const bool learner_rank = rank < first.learner_members;
    if (other.learner() != learner_rank || (learner_rank && other.member != rank))
      throw SyncError(prefix + describe(other, rank) + " is at the wrong rank: learner members 0.." +
                      std::to_string(first.learner_members - 1) + " must be ranks 0.." +
                      std::to_string(first.learner_members - 1) + " and every actor after them");
    if (!other.learner() && (other.member < 0 || other.member >= other.actor_members))
      throw SyncError(prefix + describe(other, rank) + " has no such actor member");
    if (other.model_fingerprint != first.model_fingerprint)
      throw SyncError(prefix + describe(other, rank) + " holds another model than " + describe(first, 0) +
                      " (parameter names, order or sizes differ): different [model]/[moe] settings?");
  }
}

}  // namespace

ExpertSyncChannels::ExpertSyncChannels(MPI_Comm comm, ExpertSyncLayout layout, ExpertSyncSide side, int member,
                                       std::vector<ShardedWeightView> views, double timeout_s)
    : side_(side), member_(member), views_(std::move(views)) {
  std::string local_error;
  try {
    plan_.emplace(layout, synced_parameters(views_, layout, side));
  } catch (const Error& e) {
    local_error = e.what();  // raised after the check, which the other ranks are waiting in
  }
  // A duplicate: the check's collective and the splits never match the caller's own.
  comm::MpiCommunicator all(comm, "expert weight sync (" + describe(layout) + ")");
  check_layout(all, layout, local_error, timeout_s);
  split_channels(all, all.comm());
}

ExpertSyncChannels::~ExpertSyncChannels() = default;

void ExpertSyncChannels::check_layout(comm::Communicator& all, const ExpertSyncLayout& layout,
                                      const std::string& local_error, double timeout_s) {
  const size_t n = static_cast<size_t>(all.size());
  std::vector<std::int64_t> gathered(n * LayoutRecord::kFields, 0);  // an all-gather as a sum of disjoint slots
  const std::uint64_t fingerprint = plan_ ? plan_->model_fingerprint() : 0;
  std::int64_t fingerprint_bits = 0;
  std::memcpy(&fingerprint_bits, &fingerprint, sizeof fingerprint);
  const std::int64_t mine[LayoutRecord::kFields] = {side_ == Side::ExpertSyncLearner ? 0 : 1,
                                                    member_,
                                                    layout.experts,
                                                    layout.learner_members,
                                                    layout.actor_members,
                                                    fingerprint_bits,
                                                    local_error.empty() ? 0 : 1};
  std::memcpy(gathered.data() + static_cast<size_t>(all.rank()) * LayoutRecord::kFields, mine, sizeof mine);
  all.allreduce_sum(gathered.data(), gathered.size(), comm::DataType::Int64, timeout_s);
  std::vector<LayoutRecord> records(n);
  for (size_t r = 0; r < n; ++r) {
    const std::int64_t* f = gathered.data() + r * LayoutRecord::kFields;
    records[r] = {f[0], f[1], f[2], f[3], f[4], f[5], f[6]};
  }
  if (!local_error.empty()) throw SyncError(local_error);
  for (size_t r = 0; r < n; ++r)
    if (records[r].failed)
      throw SyncError("expert weight sync: " + describe(records[r], static_cast<int>(r)) +
                      " could not set up its side of the sync (its own error says why)");
  check_records(records);
  for (size_t r = static_cast<size_t>(layout.learner_members); r < n; ++r)
    actor_members_.push_back(static_cast<int>(records[r].member));
}

void ExpertSyncChannels::split_channels(comm::Communicator& all, MPI_Comm parent) {
  const auto& channels = plan_->channels();
  communicators_.resize(channels.size());
  const int rank = all.rank();
  for (size_t c = 0; c < channels.size(); ++c) {
    const SyncChannel& channel = channels[c];
    bool reached = false;
    for (int a : actor_members_) reached = reached || channel.reaches(a);
    if (!reached) continue;  // the same on every rank: actor_members is everyone's
    const bool member = side_ == Side::ExpertSyncLearner ? channel.learner == member_ : channel.reaches(member_);
    MPI_Comm split = MPI_COMM_NULL;
    // key = rank: the learner member (rank m < every actor's) is the channel's rank 0, its root.
    MOERL_MPI_CHECK(MPI_Comm_split(parent, member ? 0 : MPI_UNDEFINED, rank, &split));
    if (!member) continue;
    communicators_[c] = comm::MpiCommunicator::adopt(split, "expert sync channel '" + channel.name + "'");
    mine_.push_back(c);
  }
}

comm::Communicator& ExpertSyncChannels::communicator(size_t channel) const {
  MOERL_CHECK(channel < communicators_.size() && communicators_[channel],
              "expert sync: this rank has no part in channel " + std::to_string(channel));
  return *communicators_[channel];
}

std::vector<WeightView> ExpertSyncChannels::channel_views(size_t channel) const {
  const SyncChannel& c = plan_->channels().at(channel);
  std::vector<WeightView> views;
  for (const ChannelPiece& piece : c.pieces) {
    const WeightView& whole = views_[piece.parameter].view;
    const size_t offset = side_ == Side::ExpertSyncLearner ? piece.learner_offset : piece.actor_offset;
    std::string name = whole.name;
    if (c.experts.count > 0)
      name += "[experts " + std::to_string(c.experts.first) + ".." +
              std::to_string(c.experts.first + c.experts.count - 1) + "]";
    views.push_back({std::move(name), static_cast<std::uint8_t*>(whole.data) + offset, piece.bytes});
  }
  return views;
}

}  // namespace moerl::sync
