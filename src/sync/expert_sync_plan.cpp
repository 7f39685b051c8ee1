#include "moerl/sync/expert_sync_plan.h"

#include <algorithm>

#include "moerl/core/check.h"
#include "moerl/core/hash.h"

namespace moerl::sync {

std::string describe(const ExpertSyncLayout& layout) {
  return "E = " + std::to_string(layout.experts) + ", P_L = " + std::to_string(layout.learner_members) +
         ", P_A = " + std::to_string(layout.actor_members);
}

ExpertRange expert_range(std::int64_t experts, int member, int members) {
  MOERL_CHECK(members >= 1 && member >= 0 && member < members,
              "expert sync: member " + std::to_string(member) + " of " + std::to_string(members));
  MOERL_CHECK(experts % members == 0, "expert sync: " + std::to_string(experts) +
                                          " experts cannot be split evenly over " + std::to_string(members) +
                                          " members");
  const std::int64_t count = experts / members;
  return {member * count, count};
}

size_t SyncChannel::bytes() const {
  size_t total = 0;
  for (const ChannelPiece& piece : pieces) total += piece.bytes;
  return total;
}

ExpertSyncPlan::ExpertSyncPlan(ExpertSyncLayout layout, std::vector<SyncedParameter> parameters)
    : layout_(layout), parameters_(std::move(parameters)) {
  MOERL_CHECK(layout_.experts >= 1 && layout_.learner_members >= 1 && layout_.actor_members >= 1 &&
                  layout_.experts % layout_.learner_members == 0 && layout_.experts % layout_.actor_members == 0,
              "expert sync: P_L and P_A must divide the number of experts (" + describe(layout_) + ")");
  SyncChannel replicated;
  replicated.name = "replicated";
  for (size_t p = 0; p < parameters_.size(); ++p) {
    if (parameters_[p].split || parameters_[p].bytes == 0) continue;
    replicated.pieces.push_back({p, 0, 0, parameters_[p].bytes});
  }
  if (!replicated.pieces.empty()) channels_.push_back(std::move(replicated));
  add_expert_channels();
}

// One channel per overlapping (learner member, actor member) pair, walking
// both partitions of [0, E) together: each step ends at the nearer boundary.
void ExpertSyncPlan::add_expert_channels() {
  const bool any_split =
      std::any_of(parameters_.begin(), parameters_.end(), [](const SyncedParameter& p) { return p.split; });
  if (!any_split) return;
  const std::int64_t E = layout_.experts;
  int m = 0, a = 0;
  std::int64_t at = 0;
  while (at < E) {
    const ExpertRange learner = expert_range(E, m, layout_.learner_members);
    const ExpertRange actor = expert_range(E, a, layout_.actor_members);
    const std::int64_t end = std::min(learner.first + learner.count, actor.first + actor.count);
    SyncChannel channel;
    channel.learner = m;
    channel.actor_member = a;
    channel.experts = {at, end - at};
    channel.name = "experts " + std::to_string(at) + ".." + std::to_string(end - 1) + ": learner " + std::to_string(m) +
                   " -> actor member " + std::to_string(a);
    for (size_t p = 0; p < parameters_.size(); ++p) {
      const SyncedParameter& parameter = parameters_[p];
      if (!parameter.split || parameter.bytes == 0) continue;
      const size_t row = parameter.bytes;
      channel.pieces.push_back({p, static_cast<size_t>(at - learner.first) * row,
                                static_cast<size_t>(at - actor.first) * row, static_cast<size_t>(end - at) * row});
    }
    channels_.push_back(std::move(channel));
    if (end == learner.first + learner.count) ++m;
    if (end == actor.first + actor.count) ++a;
    at = end;
  }
}

std::vector<size_t> ExpertSyncPlan::learner_channels(int member) const {
  std::vector<size_t> mine;
  for (size_t c = 0; c < channels_.size(); ++c)
    if (channels_[c].learner == member) mine.push_back(c);
  return mine;
}

std::vector<size_t> ExpertSyncPlan::actor_channels(int member) const {
  std::vector<size_t> mine;
  for (size_t c = 0; c < channels_.size(); ++c)
    if (channels_[c].reaches(member)) mine.push_back(c);
  return mine;
}

size_t ExpertSyncPlan::learner_bytes(size_t parameter) const {
  const SyncedParameter& p = parameters_.at(parameter);
  return p.split ? p.bytes * static_cast<size_t>(layout_.experts / layout_.learner_members) : p.bytes;
}

size_t ExpertSyncPlan::actor_bytes(size_t parameter) const {
  const SyncedParameter& p = parameters_.at(parameter);
  return p.split ? p.bytes * static_cast<size_t>(layout_.experts / layout_.actor_members) : p.bytes;
}

size_t ExpertSyncPlan::actor_total_bytes() const {
  size_t total = 0;
  for (size_t p = 0; p < parameters_.size(); ++p) total += actor_bytes(p);
  return total;
}

std::uint64_t ExpertSyncPlan::model_fingerprint() const {
  const std::int64_t experts = layout_.experts;
  std::uint64_t hash = fnv1a(&experts, sizeof experts);
  for (const SyncedParameter& p : parameters_) {
    hash = fnv1a(p.name.data(), p.name.size(), hash);
    const std::uint64_t fields[2] = {p.split ? 1u : 0u, p.bytes};
    hash = fnv1a(fields, sizeof fields, hash);
  }
  return hash;
}

}  // namespace moerl::sync
