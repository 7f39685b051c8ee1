#pragma once
// Learner 0's curriculum over the training tasks ([env] curriculum and
// adaptive_weights): what difficulty each family's new training groups get,
// and how often each family is drawn.
//
// Difficulty: a family's success at its current level, over a sample of
// curriculum_window training episodes, above curriculum_raise_at raises the
// level by one, below curriculum_lower_at lowers it. The sample is the first
// groups *started* at the level, and it decides only once all of them have
// finished: episodes that end sooner must not decide alone, or a family
// whose failures end quickly (a wrong key ends a lookup; success takes every
// hop) would be judged on its failures (a 12-hop lookup run went up and down
// between 8 and 12 hops 53 times in 150 steps that way). Episodes still in
// flight at an older level decide nothing; after each decision the next
// groups started form the next sample. A sample group that never comes back
// (dropped as stale, lost with an actor) is given up once twice the window
// of later episodes at the level has come back. GRPO learns nothing
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
  std::uint64_t group_id = 0;
};

class Curriculum {
 public:
  // [env] and its [env.<family>] overrides: the families, their starting levels and the curriculum keys.
  Curriculum(const config::EnvSection& env, const config::EnvFamilySections& families);

  // The difficulty a new training group of `family` is played at; the
  // group (its id and episode count) may join the level's sample.
  int start_group(const std::string& family, std::uint64_t group_id, int episodes);
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
  struct GroupTally {
    int expected = 0;
    int reported = 0;
    int successes = 0;
  };
  // The first groups started at the current level, which decide the next move.
  struct LevelSample {
    std::map<std::uint64_t, GroupTally> groups;
    size_t episodes = 0;       // what the groups will bring
    bool closed = false;       // no more groups join (missing ones were given up)
    size_t late_episodes = 0;  // at this level, from groups outside the sample
  };
  struct FamilyState {
    int difficulty = 1;
    int min_difficulty = 1;
    int max_difficulty = 1;
    LevelSample sample;
    double fast = 0, slow = 0;  // moving averages of success (learning progress)
    std::int64_t seen = 0;
  };
  void give_up_missing_groups(FamilyState& state);
  void maybe_move(const std::string& family, FamilyState& state);

  bool curriculum_ = false;
  bool adaptive_weights_ = false;
  size_t window_ = 32;
  double raise_at_ = 0.75;
  double lower_at_ = 0.25;
  std::map<std::string, FamilyState> families_;
};

}  // namespace moerl::learner
