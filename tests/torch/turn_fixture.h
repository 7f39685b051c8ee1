#pragma once
// Episodes built from their generated flags, for the tests of what the
// learner reads per turn (PPO's targets, credit per turn). Token values do
// not matter there, only which targets were generated and the turn rewards.
//
// Fixture: three episodes whose targets (tokens 1..n-1) are
//   A: 10 targets, actions at targets 2-3 and 7-8, rewards 0.5 and 2
//   B:  5 targets, actions at targets 1-2 and 4; the second never reached the
//       environment (one reward, 0.25); the overlong bonus -0.5
//   C:  3 targets, one action at target 1, two rewards reported (1 and 2)

#include <vector>

#include "moerl/rollout/trajectory.h"

namespace turn_fixture {

inline moerl::rollout::Trajectory episode(std::vector<std::uint8_t> generated, std::vector<float> turn_rewards) {
  moerl::rollout::Trajectory t;
  const size_t n = generated.size();
  t.tokens.assign(n, 65);
  t.generated = std::move(generated);
  t.behaviour_logprobs.assign(n, 0.f);
  t.versions.assign(n, 0);
  t.turn_rewards = std::move(turn_rewards);
  for (float r : t.turn_rewards) t.reward += r;
  return t;
}

struct ThreeEpisodes {
  std::vector<moerl::rollout::Trajectory> storage{episode({0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0}, {0.5f, 2.f}),
                                                  episode({0, 0, 1, 1, 0, 1}, {0.25f}),
                                                  episode({0, 0, 1, 0}, {1.f, 2.f})};
  std::vector<const moerl::rollout::Trajectory*> episodes{&storage[0], &storage[1], &storage[2]};
  std::vector<float> bonus{0.f, -0.5f, 0.f};
};

}  // namespace turn_fixture
