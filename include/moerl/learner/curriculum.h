#pragma once
// Learner 0's curriculum over the training tasks ([env] curriculum and
// adaptive_weights): what difficulty each family's new training groups get,
// and how often each family is drawn.
//
// Difficulty: a family's recent success at its current level (the last
// curriculum_window training episodes played at that level) above
// curriculum_raise_at raises the level by one, below curriculum_lower_at
// lowers it; the window starts empty at every change, so episodes still in
// flight at the old level never decide the next move. GRPO learns nothing
// from groups that all succeed or all fail (their advantages are zero), so
// keeping every family where it succeeds sometimes keeps its groups useful.
//
// Weights: absolute learning progress (Matiisen et al. 2017, "Teacher-Student
// Curriculum Learning"): |fast - slow| of two moving averages of a family's
// training success. A family whose success moves gets more of the new
// groups; one that stands still (mastered, or hopeless at its level) keeps
// a floor share so a change in it is still seen. The configured
// [env.<family>] weight multiplies the result.
//
// Evaluation never follows the curriculum: held-out episodes keep the
// configured difficulty, so before and after stay comparable.

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "moerl/config/sections.h"

namespace moerl {
class JsonValue;
class JsonWriter;
}  // namespace moerl

namespace moerl::learner {

// One finished training episode, as the curriculum sees it.
struct EpisodeOutcome {
  std::string family;
  int difficulty = 1;
  bool success = false;
};

class Curriculum {
 public:
  // [env] and its [env.<family>] overrides: the families, their starting levels and the curriculum keys.
  Curriculum(const config::EnvSection& env, const config::EnvFamilySections& families);

  void record(const EpisodeOutcome& outcome);
  // The difficulty of `family`'s next training groups.
  int difficulty(const std::string& family) const;
  // Multipliers of the configured family weights (1 without adaptive_weights).
  std::map<std::string, double> weight_scales() const;
  // Sets curriculum.<family>.difficulty / .weight in the telemetry metrics.
  void publish_metrics() const;

  // Levels and moving averages, for the checkpoint's books (the windows start empty on resume).
  void write_json(JsonWriter& json) const;
  void restore(const JsonValue& value);

 private:
  struct FamilyState {
    int difficulty = 1;
    int min_difficulty = 1;
    int max_difficulty = 1;
    std::deque<bool> window;    // successes at the current level, newest last
    double fast = 0, slow = 0;  // moving averages of success (learning progress)
    std::int64_t seen = 0;
  };
  void maybe_move(const std::string& family, FamilyState& state);

  bool curriculum_ = false;
  bool adaptive_weights_ = false;
  size_t window_ = 32;
  double raise_at_ = 0.75;
  double lower_at_ = 0.25;
  std::map<std::string, FamilyState> families_;
};

}  // namespace moerl::learner
