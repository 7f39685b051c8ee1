#include "moerl/learner/periodic_evaluation.h"

#include <algorithm>

namespace moerl::learner {

void PeriodicEvaluation::begin(std::int64_t version, const std::vector<rollout::TaskGroup>& groups,
                               const std::set<std::uint64_t>& greedy) {
  current_ = EvaluationRecord();
  current_.version = version;
  current_.temperature = temperature_;
  outstanding_ = static_cast<int>(groups.size());
  for (const rollout::TaskGroup& g : groups) {
    groups_.insert(g.group_id);
    if (greedy.count(g.group_id)) greedy_.insert(g.group_id);
  }
}

void PeriodicEvaluation::record(const rollout::Trajectory& episode) {
  if (outstanding_ <= 0) return;  // a late episode of an abandoned round
  ScoreTable& table = greedy_.count(episode.group_id) ? current_.greedy : current_.sampled;
  FamilyScore& score = table[episode.task.family];
  if (episode.failed()) {
    ++score.env_failures;
  } else {
    ++score.episodes;
    score.successes += episode.success;
    score.reward += episode.reward;
    const std::int64_t lowest = episode.min_version();
    std::int64_t highest = lowest;
    for (std::int32_t v : episode.versions) highest = std::max<std::int64_t>(highest, v);
    if (lowest >= 0) {
      current_.lowest_version = current_.lowest_version < 0 ? lowest : std::min(current_.lowest_version, lowest);
      current_.highest_version = std::max(current_.highest_version, highest);
    }
  }
  if (--outstanding_ == 0) finished_.push_back(current_);
}

void PeriodicEvaluation::abandon() { outstanding_ = 0; }

std::optional<EvaluationRecord> PeriodicEvaluation::take_finished() {
  if (finished_.empty()) return std::nullopt;
  EvaluationRecord r = std::move(finished_.front());
  finished_.pop_front();
  return r;
}

}  // namespace moerl::learner
