#include "moerl/runtime/lost_ranks.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>

namespace moerl::runtime {

bool LostRanks::lost_now(int rank) const {
  return !rejoined_.count(rank) &&
         std::any_of(lost_.begin(), lost_.end(), [rank](const RankLost& lost) { return lost.rank == rank; });
}

bool LostRanks::add(const RankLost& lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lost_now(lost.rank)) return false;
  rejoined_.erase(lost.rank);
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
  for (const RankLost& lost : lost_)
    if (!rejoined_.count(lost.rank)) out.insert(lost.rank);
  return out;
}

bool LostRanks::contains(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_now(rank);
}

std::set<int> LostRanks::ever_lost() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<int> out;
  for (const RankLost& lost : lost_) out.insert(lost.rank);
  return out;
}

bool LostRanks::rejoin(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!lost_now(rank)) return false;
  rejoined_.insert(rank);
  rejoins_.push_back(rank);
  return true;
}

std::vector<int> LostRanks::rejoined_since(std::uint64_t taken) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (taken >= rejoins_.size()) return {};
  return std::vector<int>(rejoins_.begin() + static_cast<std::ptrdiff_t>(taken), rejoins_.end());
}

std::uint64_t LostRanks::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_.size();
}

void LostRanks::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  lost_.clear();
  rejoined_.clear();
  rejoins_.clear();
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
