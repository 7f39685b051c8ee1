#include "moerl/learner/evaluation_scores.h"

#include <algorithm>
#include <cmath>

#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"

namespace moerl::learner {
namespace {

constexpr double kZ95 = 1.959963984540054;  // two-sided 95% normal quantile

}  // namespace

Interval wilson_interval(int successes, int trials) {
  if (trials <= 0) return {0.0, 1.0};
  const double n = trials;
  const double p = successes / n;
  const double z2 = kZ95 * kZ95;
  const double centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = kZ95 / (1 + z2 / n) * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

Gain success_gain(const FamilyScore& before, const FamilyScore& after) {
  const double p1 = before.success_rate(), p2 = after.success_rate();
  const Interval i1 = before.success_interval(), i2 = after.success_interval();
  Gain gain;
  gain.value = p2 - p1;
  gain.interval.low = gain.value - std::sqrt((p2 - i2.low) * (p2 - i2.low) + (i1.high - p1) * (i1.high - p1));
  gain.interval.high = gain.value + std::sqrt((i2.high - p2) * (i2.high - p2) + (p1 - i1.low) * (p1 - i1.low));
  return gain;
}

void write_scores(JsonWriter& json, const ScoreTable& table) {
  json.begin_object();
  for (const auto& [family, score] : table) {
    const Interval ci = score.success_interval();
    json.key(family)
        .begin_object()
        .key("success")
        .value(score.success_rate())
        .key("ci_low")
        .value(ci.low)
        .key("ci_high")
        .value(ci.high)
        .key("episodes")
        .value(score.episodes)
        .key("successes")
        .value(score.successes)
        .key("reward")
        .value(score.mean_reward())
        .key("reward_sum")
        .value(score.reward)
        .key("env_failures")
        .value(score.env_failures)
        .end_object();
  }
  json.end_object();
}

ScoreTable read_scores(const JsonValue& value) {
  ScoreTable table;
  for (const auto& [family, entry] : value.as_object()) {
    FamilyScore& score = table[family];
    score.episodes = static_cast<int>(entry.at("episodes").as_number());
    score.successes = static_cast<int>(entry.at("successes").as_number());
    score.reward = entry.at("reward_sum").as_number();
    score.env_failures = static_cast<int>(entry.at("env_failures").as_number());
  }
  return table;
}

void write_gains(JsonWriter& json, const ScoreTable& before, const ScoreTable& after) {
  json.begin_object();
  for (const auto& [family, a] : after) {
    const auto b = before.find(family);
    if (b == before.end()) continue;
    const Gain gain = success_gain(b->second, a);
    json.key(family)
        .begin_object()
        .key("value")
        .value(gain.value)
        .key("ci_low")
        .value(gain.interval.low)
        .key("ci_high")
        .value(gain.interval.high)
        .end_object();
  }
  json.end_object();
}

}  // namespace moerl::learner
