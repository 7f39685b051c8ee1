#include "moerl/learner/episode_inbox.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "moerl/telemetry/metrics.h"

namespace moerl::learner {

EpisodeInbox::EpisodeInbox(int group_size, double incomplete_after_s)
    : group_size_(group_size), incomplete_after_s_(incomplete_after_s) {}

void EpisodeInbox::add(rollout::Trajectory episode, double now) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t id = episode.group_id;
    if (cancelled_.count(id)) return;  // its group was replaced: this one is a straggler
    ++received_;
    Group& group = groups_[id];
    group.last_arrival = now;
    group.members.push_back(std::move(episode));
    ++arrivals_;
  }
  arrived_.notify_all();
}

void EpisodeInbox::lost_in_malformed_message() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++received_;  // it arrived: the drain at the end must not wait for it
    ++unaccounted_;
    ++arrivals_;
  }
  arrived_.notify_all();
}

std::vector<std::uint64_t> EpisodeInbox::complete_ids(double now) {
  std::vector<std::uint64_t> complete;
  for (const auto& [id, group] : groups_) {
    const auto held = static_cast<std::int64_t>(group.members.size());
    if (held >= group_size_) {
      complete.push_back(id);
    } else if (unaccounted_ > 0 && now - group.last_arrival > incomplete_after_s_) {
      unaccounted_ = std::max<std::int64_t>(0, unaccounted_ - (group_size_ - held));
      telemetry::metrics().add("learner.incomplete_groups");
      spdlog::warn("group {} taken with {} of {} episodes (the rest were lost in malformed messages)", id, held,
                   group_size_);
      complete.push_back(id);
    }
  }
  return complete;
}

std::vector<std::vector<rollout::Trajectory>> EpisodeInbox::take_groups(size_t quota, double now) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::uint64_t> complete = complete_ids(now);
  if (complete.size() < quota) return {};
  complete.resize(quota);
  std::vector<std::vector<rollout::Trajectory>> taken;
  for (std::uint64_t id : complete) {
    taken.push_back(std::move(groups_[id].members));
    groups_.erase(id);
    taken_.insert(id);
  }
  return taken;
}

std::vector<std::uint64_t> EpisodeInbox::cancel_incomplete(const std::vector<std::uint64_t>& ids) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::uint64_t> cancelled;
  for (std::uint64_t id : ids) {
    if (taken_.count(id) || cancelled_.count(id)) continue;
    const auto it = groups_.find(id);
    if (it != groups_.end() && static_cast<int>(it->second.members.size()) >= group_size_) continue;
    if (it != groups_.end()) {
      received_ -= static_cast<std::int64_t>(it->second.members.size());
      groups_.erase(it);
    }
    cancelled_.insert(id);
    cancelled.push_back(id);
  }
  return cancelled;
}

std::int64_t EpisodeInbox::received() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return received_;
}

std::string EpisodeInbox::partial_groups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string listed;
  for (const auto& [id, group] : groups_) {
    if (static_cast<int>(group.members.size()) >= group_size_) continue;
    listed += (listed.empty() ? "" : ", ") + std::to_string(id) + " (" + std::to_string(group.members.size()) + "/" +
              std::to_string(group_size_) + ")";
  }
  return listed.empty() ? "none" : listed;
}

size_t EpisodeInbox::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t held = 0;
  for (const auto& [id, group] : groups_) held += group.members.size();
  return held;
}

bool EpisodeInbox::wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::uint64_t seen = arrivals_;
  return arrived_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return arrivals_ != seen; });
}

void EpisodeInbox::notify() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++arrivals_;
  }
  arrived_.notify_all();
}

void EpisodeInbox::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.clear();
}

}  // namespace moerl::learner
