#include "moerl/runtime/lost_ranks.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>

namespace moerl::runtime {

bool LostRanks::add(const RankLost& lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const RankLost& known : lost_)
    if (known.rank == lost.rank) return false;
  lost_.push_back(lost);
  return true;
}

std::vector<RankLost> LostRanks::all() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_;
}

std::set<int> LostRanks::ranks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<int> out;
  for (const RankLost& lost : lost_) out.insert(lost.rank);
  return out;
}

bool LostRanks::contains(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(lost_.begin(), lost_.end(), [rank](const RankLost& lost) { return lost.rank == rank; });
}

std::uint64_t LostRanks::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_.size();
}

void LostRanks::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  lost_.clear();
}

LostRanks& lost_ranks() {
  static LostRanks registry;
  return registry;
}

void fence(const std::string& host, std::int64_t pid, const std::string& this_host) {
  if (pid <= 0 || host != this_host || pid == static_cast<std::int64_t>(getpid())) return;
  ::kill(static_cast<pid_t>(pid), SIGKILL);
}

void fence(const RankLost& lost, const std::string& this_host) { fence(lost.host, lost.pid, this_host); }

}  // namespace moerl::runtime
