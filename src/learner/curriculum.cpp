#include "moerl/learner/curriculum.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"
#include "moerl/env/task_family.h"
#include "moerl/env/task_mix.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

// Moving averages of a family's success per training episode: the fast one
// follows about the last 20 episodes, the slow one the last 200.
constexpr double kFastRate = 0.05;
constexpr double kSlowRate = 0.005;
// Share a family keeps when its success stands still.
constexpr double kWeightFloor = 0.2;

// |fast - slow| of the two averages, each corrected for its start at 0 (as
// Adam corrects its moments): without it the slow average spends hundreds of
// episodes climbing from 0, which reads as progress that is not there.
double learning_progress(double fast, double slow, std::int64_t seen) {
  if (seen == 0) return 0;
  const double n = static_cast<double>(seen);
  const double fast_mean = fast / (1 - std::pow(1 - kFastRate, n));
  const double slow_mean = slow / (1 - std::pow(1 - kSlowRate, n));
  return std::fabs(fast_mean - slow_mean);
}

}  // namespace

Curriculum::Curriculum(const config::EnvSection& env_section, const config::EnvFamilySections& families)
    : curriculum_(env_section.curriculum),
      adaptive_weights_(env_section.adaptive_weights),
      window_(static_cast<size_t>(env_section.curriculum_window)),
      raise_at_(env_section.curriculum_raise_at),
      lower_at_(env_section.curriculum_lower_at) {
  for (const std::string& family : env_section.families) {
    FamilyState state;
    state.difficulty = env::make_task(env_section, families, family, 0).difficulty;
    state.min_difficulty = 1;
    // External environments say nothing of their range: only the configured level.
    const env::TaskFamily* builtin = env::find_builtin_family(family);
    state.max_difficulty = builtin ? builtin->max_difficulty : state.difficulty;
    if (env_section.curriculum_max_difficulty > 0)
      state.max_difficulty =
          std::min<int>(state.max_difficulty, static_cast<int>(env_section.curriculum_max_difficulty));
    state.max_difficulty = std::max(state.max_difficulty, state.difficulty);
    if (!builtin) state.min_difficulty = state.difficulty;
    families_[family] = state;
  }
}

int Curriculum::start_group(const std::string& family, std::uint64_t group_id, int episodes) {
  const auto found = families_.find(family);
  if (found == families_.end()) return 1;
  FamilyState& state = found->second;
  LevelSample& sample = state.sample;
  if (curriculum_ && !sample.closed && sample.episodes < window_ && episodes > 0) {
    sample.groups[group_id].expected = episodes;
    sample.episodes += static_cast<size_t>(episodes);
  }
  return state.difficulty;
}

void Curriculum::record(const EpisodeOutcome& outcome) {
  const auto found = families_.find(outcome.family);
  if (found == families_.end()) return;
  FamilyState& state = found->second;
  const double success = outcome.success ? 1.0 : 0.0;
  ++state.seen;
  state.fast += kFastRate * (success - state.fast);
  state.slow += kSlowRate * (success - state.slow);
  if (!curriculum_ || outcome.difficulty != state.difficulty) return;  // played at an older level
  LevelSample& sample = state.sample;
  const auto group = sample.groups.find(outcome.group_id);
  if (group != sample.groups.end() && group->second.reported < group->second.expected) {
    ++group->second.reported;
    group->second.successes += outcome.success ? 1 : 0;
  } else if (++sample.late_episodes >= 2 * window_) {
    give_up_missing_groups(state);
  }
  maybe_move(outcome.family, state);
}

void Curriculum::give_up_missing_groups(FamilyState& state) {
  LevelSample& sample = state.sample;
  for (auto it = sample.groups.begin(); it != sample.groups.end();)
    it = it->second.reported < it->second.expected ? sample.groups.erase(it) : std::next(it);
  sample.closed = !sample.groups.empty();  // decide on what came back; with nothing, start a new sample
  if (!sample.closed) sample = LevelSample{};
  sample.late_episodes = 0;
}

void Curriculum::maybe_move(const std::string& family, FamilyState& state) {
  LevelSample& sample = state.sample;
  if (sample.groups.empty() || (!sample.closed && sample.episodes < window_)) return;
  int episodes = 0, successes = 0;
  for (const auto& [id, tally] : sample.groups) {
    if (tally.reported < tally.expected) return;  // a group of the sample is still being played
    episodes += tally.reported;
    successes += tally.successes;
  }
  const double rate = static_cast<double>(successes) / std::max(episodes, 1);
  sample = LevelSample{};  // the next groups started form the next sample
  int next = state.difficulty;
  if (rate >= raise_at_ && state.difficulty < state.max_difficulty) next = state.difficulty + 1;
  if (rate <= lower_at_ && state.difficulty > state.min_difficulty) next = state.difficulty - 1;
  if (next == state.difficulty) return;
  spdlog::info("curriculum: {} difficulty {} -> {} (success {:.0f}% over the first {} training episodes started at {})",
               family, state.difficulty, next, 100 * rate, episodes, state.difficulty);
  telemetry::metrics().add("curriculum." + family + ".changes");
  state.difficulty = next;
}

int Curriculum::difficulty(const std::string& family) const {
  const auto found = families_.find(family);
  return found == families_.end() ? 1 : found->second.difficulty;
}

std::map<std::string, double> Curriculum::weight_scales() const {
  std::map<std::string, double> scales;
  double most = 0;
  for (const auto& [family, state] : families_)
    most = std::max(most, learning_progress(state.fast, state.slow, state.seen));
  for (const auto& [family, state] : families_) {
    const double progress = learning_progress(state.fast, state.slow, state.seen);
    scales[family] = adaptive_weights_ && most > 0 ? kWeightFloor + (1 - kWeightFloor) * progress / most : 1.0;
  }
  return scales;
}

void Curriculum::publish_metrics() const {
  const std::map<std::string, double> scales = weight_scales();
  for (const auto& [family, state] : families_) {
    if (curriculum_) telemetry::metrics().set("curriculum." + family + ".difficulty", state.difficulty);
    if (adaptive_weights_) {
      telemetry::metrics().set("curriculum." + family + ".weight", scales.at(family));
      telemetry::metrics().set("curriculum." + family + ".progress",
                               learning_progress(state.fast, state.slow, state.seen));
    }
  }
}

void Curriculum::write_json(JsonWriter& json) const {
  json.begin_object();
  for (const auto& [family, state] : families_)
    json.key(family)
        .begin_object()
        .key("difficulty")
        .value(state.difficulty)
        .key("fast")
        .value(state.fast)
        .key("slow")
        .value(state.slow)
        .key("seen")
        .value(state.seen)
        .end_object();
  json.end_object();
}

void Curriculum::restore(const JsonValue& value) {
  for (const auto& [family, entry] : value.as_object()) {
    const auto found = families_.find(family);
    if (found == families_.end()) continue;  // a family no longer configured
    FamilyState& state = found->second;
    state.difficulty =
        std::clamp(static_cast<int>(entry.at("difficulty").as_number()), state.min_difficulty, state.max_difficulty);
    state.fast = entry.at("fast").as_number();
    state.slow = entry.at("slow").as_number();
    state.seen = static_cast<std::int64_t>(entry.at("seen").as_number());
    state.sample = LevelSample{};
  }
}

}  // namespace moerl::learner
