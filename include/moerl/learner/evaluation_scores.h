#pragma once
// Held-out success rates and how sure we are of them. Evaluation plays a
// few hundred episodes per family at most, so a success rate alone says
// little: 64 episodes leave about +-12 points of noise. Every rate comes
// with a 95% Wilson score interval (well behaved near 0% and 100%, where
// the normal approximation gives intervals outside [0, 1]), and every gain
// with Newcombe's hybrid score interval for a difference of two
// proportions, built from the two Wilson intervals (Newcombe 1998, method
// 10). Before and after play the same seeds, so the pairs are positively
// correlated and the unpaired interval is, if anything, too wide: a gain
// whose lower end is above 0 is real.

#include <map>
#include <string>

namespace moerl {
class JsonValue;
class JsonWriter;
}  // namespace moerl

namespace moerl::learner {

struct Interval {
  double low = 0;
  double high = 0;
};

// 95% Wilson score interval of `successes` out of `trials`; [0, 1] when trials is 0.
Interval wilson_interval(int successes, int trials);

struct FamilyScore {
  int episodes = 0;  // played to the end by the policy (environment failures not included)
  int successes = 0;
  int env_failures = 0;  // evaluation sessions whose environment failed for good
  double reward = 0;
  double success_rate() const { return episodes ? static_cast<double>(successes) / episodes : 0.0; }
  double mean_reward() const { return episodes ? reward / episodes : 0.0; }
  Interval success_interval() const { return wilson_interval(successes, episodes); }
};

struct Gain {
  double value = 0;   // after - before, success rates
  Interval interval;  // 95%, Newcombe's hybrid score interval
};
Gain success_gain(const FamilyScore& before, const FamilyScore& after);

using ScoreTable = std::map<std::string, FamilyScore>;  // family -> score

// {"family": {"success", "ci_low", "ci_high", "episodes", "successes", "reward", "reward_sum", "env_failures"}}
void write_scores(JsonWriter& json, const ScoreTable& table);
ScoreTable read_scores(const JsonValue& value);
// {"family": {"value", "ci_low", "ci_high"}} for the families in both tables.
void write_gains(JsonWriter& json, const ScoreTable& before, const ScoreTable& after);

}  // namespace moerl::learner
