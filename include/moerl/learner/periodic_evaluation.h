#pragma once
// Held-out evaluation during training ([eval] every_steps): every N learner
// steps learner 0 queues the held-out seeds again (the same seeds as the
// evaluations before and after training, so all of them compare), the
// actors play them between training groups with version V or newer, and
// once every episode is back the round becomes an EvaluationRecord of V
// (evaluation_record.h) that the learner writes beside V's checkpoint and
// compares with the `stable` version. One round at a time: a round still
// out when the next is due delays it to the next multiple of N.

#include <cstdint>
#include <deque>
#include <optional>
#include <set>

#include "moerl/learner/evaluation_record.h"
#include "moerl/rollout/trajectory.h"

namespace moerl::learner {

class PeriodicEvaluation {
 public:
  PeriodicEvaluation(std::int64_t every_steps, double temperature) : every_(every_steps), temperature_(temperature) {}

  // Whether a round starts after the step that made `version`.
  bool due(std::int64_t version, bool training_done) const {
    return every_ > 0 && !training_done && outstanding_ == 0 && version > 0 && version % every_ == 0;
  }
  // A round of `groups` (evaluation groups already queued by the caller;
  // `greedy` ones are played at temperature 0).
  void begin(std::int64_t version, const std::vector<rollout::TaskGroup>& groups,
             const std::set<std::uint64_t>& greedy);
  bool owns(std::uint64_t group_id) const { return groups_.count(group_id) > 0; }
  // One episode of the round (each group once: the caller drops repeats).
  void record(const rollout::Trajectory& episode);
  // Training is over: the round still out will not be finished (its late
  // episodes are still owned, and ignored).
  void abandon();
  std::optional<EvaluationRecord> take_finished();

 private:
  std::int64_t every_;
  double temperature_;
  std::set<std::uint64_t> groups_;  // of every round, finished or not
  std::set<std::uint64_t> greedy_;
  int outstanding_ = 0;  // of the current round
  EvaluationRecord current_;
  std::deque<EvaluationRecord> finished_;
};

}  // namespace moerl::learner
