#include "moerl/runtime/rank_health.h"

#include <iomanip>
#include <sstream>

namespace moerl::runtime {

std::string LostRank::describe() const {
  std::ostringstream out;
  out << "rank " << rank << " (" << role_name(role) << " " << role_index;
  if (!host.empty()) out << " on host " << host << ", pid " << pid;
  out << ") lost: " << why;
  return out.str();
}

RankHealth::RankHealth(const RankLayout& layout, double timeout_s, double now)
    : layout_(layout), timeout_s_(timeout_s), started_(now) {
  for (int rank = 0; rank < layout.world_size(); ++rank)
    if (rank != RankLayout::kCoordinatorRank) ranks_[rank] = State{};
}

void RankHealth::beat(const Heartbeat& heartbeat, double now) {
  const auto it = ranks_.find(heartbeat.rank);
  if (it == ranks_.end() || it->second.lost) return;  // a lost rank stays lost
  it->second.last = heartbeat;
  it->second.heard = true;
  it->second.last_seen = now;
}

void RankHealth::published(std::int64_t version, double now) {
  if (version <= published_version_) return;
  published_version_ = version;
  published_at_ = now;
}

LostRank RankHealth::declare(int rank, State& state, double now, const std::string& why) {
  state.lost = true;
  LostRank lost;
  lost.rank = rank;
  const RankAssignment who = layout_.assignment(rank);
  lost.role = who.role;
  lost.role_index = who.index;
  if (state.heard) {
    lost.host = state.last.host;
    lost.pid = state.last.pid;
  }
  lost.silent_s = now - (state.heard ? state.last_seen : started_);
  lost.why = why;
  return lost;
}

std::vector<LostRank> RankHealth::check(double now, const std::vector<int>& failed_by_mpi) {
  std::vector<LostRank> lost;
  for (int rank : failed_by_mpi) {
    const auto it = ranks_.find(rank);
    if (it != ranks_.end() && !it->second.lost) lost.push_back(declare(rank, it->second, now, "MPI reports it dead"));
  }
  for (auto& [rank, state] : ranks_) {
    if (state.lost) continue;
    std::ostringstream why;
    why << std::fixed << std::setprecision(1);
    if (state.heard && now - state.last_seen > timeout_s_) {
      why << "no heartbeat for " << now - state.last_seen << " s ([cluster] heartbeat_timeout_s)";
      lost.push_back(declare(rank, state, now, why.str()));
    } else if (!state.heard && now - started_ > 2 * timeout_s_) {
      why << "no heartbeat at all in the " << now - started_ << " s since the start";
      lost.push_back(declare(rank, state, now, why.str()));
    }
  }
  return lost;
}

std::vector<std::string> RankHealth::actors_behind(double now) {
  std::vector<std::string> behind;
  if (published_version_ <= 0 || now - published_at_ < timeout_s_) return behind;
  for (auto& [rank, state] : ranks_) {
    if (state.lost || !state.heard || layout_.assignment(rank).role != Role::Actor) continue;
    if (state.last.weight_version >= published_version_ || state.reported_behind >= published_version_) continue;
    state.reported_behind = published_version_;
    std::ostringstream out;
    out << std::fixed << std::setprecision(1) << "actor " << state.last.role_index << " (rank " << rank
        << ") still generates with policy version " << state.last.weight_version << ", " << now - published_at_
        << " s after version " << published_version_ << " was published";
    behind.push_back(out.str());
  }
  return behind;
}

bool RankHealth::is_lost(int rank) const {
  const auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.lost;
}

void RankHealth::revive(int rank, double now) {
  const auto it = ranks_.find(rank);
  if (it == ranks_.end()) return;
  it->second.lost = false;
  it->second.heard = true;
  it->second.last_seen = now;
  it->second.last.pid = 0;  // until its first beat says which process it is
}

const Heartbeat* RankHealth::last(int rank) const {
  const auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.heard ? &it->second.last : nullptr;
}

double RankHealth::last_heard(int rank) const {
  const auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.heard ? it->second.last_seen : started_;
}

}  // namespace moerl::runtime
