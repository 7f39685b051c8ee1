#pragma once
// The training episodes that reached one learner, grouped: filled by a
// receiving thread (learner 0's coordinator, the other learners' episode
// receiver) while the learner computes, taken a step's groups at a time.
//
// A group is complete when all its members arrived (failure records count: a
// session that failed for good is a member that carries nothing to train on),
// or, after a malformed message was dropped, when it has been quiet for
// `incomplete_after_s` (its missing members were most likely in it).
// Cancelled groups (their actor was lost) give back what they held and ignore
// later arrivals: a replacement group of a new id takes their place.

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "moerl/rollout/trajectory.h"

namespace moerl::learner {

class EpisodeInbox {
 public:
  EpisodeInbox(int group_size, double incomplete_after_s);

  // A training episode or failure record of one of this learner's groups.
  void add(rollout::Trajectory episode, double now);
  // A message that claimed to be an episode and did not decode.
  void lost_in_malformed_message();

  // `quota` complete groups, oldest first, or none while fewer are complete.
  std::vector<std::vector<rollout::Trajectory>> take_groups(size_t quota, double now);
  // Cancels the groups of `ids` that are not complete (or already taken);
  // returns the ids cancelled. Their members stop counting as received.
  std::vector<std::uint64_t> cancel_incomplete(const std::vector<std::uint64_t>& ids);

  // Training episodes that arrived (and still count: cancelled groups' do not).
  std::int64_t received() const;
  size_t held() const;  // arrived and not taken into a step
  // The groups that some members reached and others not yet: "id (held/size)", for a stall's message.
  std::string partial_groups() const;
  // Waits at most timeout_s for an arrival (or a notify()); true if something arrived.
  bool wait(double timeout_s);
  void notify();  // wakes wait() (a stop, a failure)
  void clear();   // the end of the run: what is left is not trained on

 private:
  struct Group {
    std::vector<rollout::Trajectory> members;
    double last_arrival = 0;
  };
  std::vector<std::uint64_t> complete_ids(double now);

  int group_size_;
  double incomplete_after_s_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::uint64_t arrivals_ = 0;
  std::map<std::uint64_t, Group> groups_;
  std::set<std::uint64_t> taken_;  // groups already trained on (or dropped) by a step
  std::set<std::uint64_t> cancelled_;
  std::int64_t received_ = 0;
  std::int64_t unaccounted_ = 0;  // members lost in malformed messages
};

}  // namespace moerl::learner
