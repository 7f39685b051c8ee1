// [algo] credit = "turn": the per-turn advantages of a step's episodes, and
// which tokens of a micro-batch get which turn's advantage.

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "algo_test_support.h"
#include "moerl/learner/episode_batch.h"
#include "moerl/learner/turn_credit.h"
#include "turn_fixture.h"

using namespace moerl;
using algo_test::require_close_values;

namespace {

// turn_fixture's three episodes; A and B are one group, C another.
struct Fixture : turn_fixture::ThreeEpisodes {
  torch::Tensor groups = torch::tensor(std::vector<std::int64_t>{4, 4, 9}, torch::kInt64);
};

}  // namespace

TEST_CASE("credit per turn: turn rewards are centred within the group and summed to the episode's end",
          "[learner][algo]") {
  Fixture f;
  // Group 4's turn rewards 0.5, 2, 0.25, -0.5 have mean 0.5625: deviations
  // -0.0625, 1.4375 | -0.3125, -1.0625. C is alone: 0.
  const std::vector<torch::Tensor> centred = learner::turn_credit_advantages(f.episodes, f.bonus, f.groups, false);
  REQUIRE(centred.size() == 3);
  require_close_values("A", centred[0], {1.375, 1.4375}, 1e-6);
  require_close_values("B", centred[1], {-1.375, -1.0625}, 1e-6);
  require_close_values("C", centred[2], {0.0}, 1e-6);
  // GRPO also rescales each group's sums to unit std (unbiased): the sums
  // 1.375, 1.4375, -1.375, -1.0625 have mean 0.09375.
  double squares = 0;
  for (double sum : {1.375, 1.4375, -1.375, -1.0625}) squares += (sum - 0.09375) * (sum - 0.09375);
  const double std = std::sqrt(squares / 3);
  const std::vector<torch::Tensor> scaled = learner::turn_credit_advantages(f.episodes, f.bonus, f.groups, true);
  require_close_values("A scaled", scaled[0], {1.375 / std, 1.4375 / std}, 1e-5);
  require_close_values("B scaled", scaled[1], {-1.375 / std, -1.0625 / std}, 1e-5);
}

TEST_CASE("credit per turn: every target gets its turn's advantage, in a micro-batch of any episodes",
          "[learner][algo]") {
  Fixture f;
  const std::vector<torch::Tensor> advantages = learner::turn_credit_advantages(f.episodes, f.bonus, f.groups, false);
  const learner::EpisodeBatch batch = learner::make_episode_batch(f.episodes, false);
  const torch::Tensor tokens = learner::turn_credit_token_advantages(batch, f.episodes, advantages);
  // Targets before and in A's first action belong to turn 0, the rest to turn 1.
  require_close_values("all three", tokens,
                       {1.375, 1.375, 1.375, 1.375, 1.4375, 1.4375, 1.4375, 1.4375, 1.4375, 1.4375,  // A
                        -1.375, -1.375, -1.375, -1.0625, -1.0625,                                    // B
                        0, 0, 0},                                                                    // C
                       1e-6);
  // A micro-batch of B and C alone takes their advantages as computed for the whole step.
  const std::vector<const rollout::Trajectory*> part{f.episodes[1], f.episodes[2]};
  const learner::EpisodeBatch part_batch = learner::make_episode_batch(part, false);
  require_close_values("B and C",
                       learner::turn_credit_token_advantages(part_batch, part, {advantages[1], advantages[2]}),
                       {-1.375, -1.375, -1.375, -1.0625, -1.0625, 0, 0, 0}, 1e-6);
  // Advantages that do not match an episode's turns are refused, not spread.
  f.storage[1].episode_id = 17;
  CHECK_THROWS_WITH(learner::turn_credit_token_advantages(part_batch, part, {advantages[2], advantages[1]}),
                    Catch::Contains("episode 17 has 2 turns but 1 turn advantages"));
}
