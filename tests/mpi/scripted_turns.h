#pragma once
// Scripted episode content for the learner tests (mpi.learner_modes,
// mpi.learner_dynamic_sampling): turns of observation tokens (context) then
// action tokens (generated, with behaviour log-probs near an untrained
// model's), drawn from a counter-based random stream, so that an episode is a
// function of its seed only and never of timing.

#include <cstdint>
#include <functional>

#include "moerl/core/hash.h"
#include "moerl/rollout/trajectory.h"

namespace moerl_test {

// A deterministic random stream: splitmix-style mixing of a seed.
class ScriptedRandom {
 public:
  explicit ScriptedRandom(std::uint64_t seed) : state_(moerl::mix64(seed)) {}
  std::uint64_t next() { return state_ = moerl::mix64(state_); }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }

 private:
  std::uint64_t state_;
};

struct TurnShape {
  int observed_min, observed_spread;  // observation tokens per turn: min + [0, spread)
  int acted_min, acted_spread;        // action tokens per turn
};

// Appends 2 to 4 turns to `t` (tokens, generated mask, behaviour log-probs,
// versions: `version` on generated tokens, -1 on context), each followed by
// its reward turn_reward(turn, random) (into turn_rewards and reward).
inline void append_scripted_turns(moerl::rollout::Trajectory& t, ScriptedRandom& random, const TurnShape& shape,
                                  std::int32_t version, const std::function<float(int, ScriptedRandom&)>& turn_reward) {
  const int turns = 2 + random.below(3);
  for (int turn = 0; turn < turns; ++turn) {
    const int observed = shape.observed_min + random.below(shape.observed_spread);
    const int acted = shape.acted_min + random.below(shape.acted_spread);
    for (int i = 0; i < observed + acted; ++i) {
      const bool generated = i >= observed;
      t.tokens.push_back(static_cast<std::int32_t>(1 + random.below(250)));
      t.generated.push_back(generated ? 1 : 0);
      t.behaviour_logprobs.push_back(generated ? -5.6f + 0.5f * static_cast<float>(random.below(1000)) / 1000.f : 0.f);
      t.versions.push_back(generated ? version : -1);
    }
    const float reward = turn_reward(turn, random);
    t.turn_rewards.push_back(reward);
    t.reward += reward;
  }
}

}  // namespace moerl_test
