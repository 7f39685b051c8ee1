// PPO's per-turn targets: which tokens form which turn, where the value head
// is read, GAE against hand-computed values, and the value loss gradient.

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "algo_test_support.h"
#include "moerl/learner/episode_batch.h"
#include "moerl/learner/ppo_targets.h"
#include "moerl/model/policy.h"
#include "turn_fixture.h"

using namespace moerl;
using algo_test::require_close_values;

namespace {

using turn_fixture::episode;
using Fixture = turn_fixture::ThreeEpisodes;

std::vector<double> as_doubles(const torch::Tensor& t) {
  auto d = t.detach().to(torch::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace

TEST_CASE("episode turns: runs of generated targets are the actions, rewards follow them", "[learner][ppo]") {
  Fixture f;
  const learner::EpisodeTurns turns = learner::episode_turns(f.episodes, f.bonus);
  const std::vector<double> want_turns{0, 0, 0, 0, 1, 1, 1, 1, 1, 1,  // A: the tail stays in the last turn
                                       0, 0, 0, 1, 1,                 // B
                                       0, 0, 0};                      // C
  require_close_values("turn_index", turns.turn_index, want_turns, 0);
  // B's cut-off action gets 0 plus the bonus; C's surplus reward joins its only turn.
  require_close_values("turn_rewards", turns.turn_rewards, {0.5, 2.0, 0.25, -0.5, 3.0}, 1e-7);
}

TEST_CASE("episode turns: an episode without a generated token is refused", "[learner][ppo]") {
  rollout::Trajectory t = episode({0, 0, 0}, {1.f});
  t.episode_id = 42;
  CHECK_THROWS_WITH(learner::episode_turns({&t}, {0.f}), Catch::Contains("episode 42"));
}

TEST_CASE("PPO targets: GAE over turns with a zero critic, and the value loss gradient", "[learner][ppo]") {
  Fixture f;
  const learner::EpisodeBatch batch = learner::make_episode_batch(f.episodes, false);
  torch::manual_seed(3);
  learner::ValueHead head(8);  // the output layer starts at zero: V = 0 everywhere
  const torch::Tensor hidden = torch::randn({batch.targets.size(0), 8});
  learner::PpoOptions options;
  options.gamma = 1.0;
  options.lambda = 0.5;
  options.whiten_advantages = false;
  const learner::PpoTargets t = learner::ppo_targets(batch, hidden, *head, f.episodes, f.bonus, options);
  // With V = 0, delta_k = r_k and A_k = r_k + lambda * A_{k+1}:
  //   A: A1 = 2, A0 = 0.5 + 0.5 * 2 = 1.5;  B: A1 = -0.5, A0 = 0.25 - 0.25 = 0;  C: 3.
  std::vector<double> want;
  for (int i = 0; i < 4; ++i) want.push_back(1.5);
  for (int i = 0; i < 6; ++i) want.push_back(2.0);
  for (int i = 0; i < 3; ++i) want.push_back(0.0);
  for (int i = 0; i < 2; ++i) want.push_back(-0.5);
  for (int i = 0; i < 3; ++i) want.push_back(3.0);
  require_close_values("token advantages", t.token_advantages, want, 1e-6);
  // Returns = A (V = 0): loss = 0.5 * mean(R^2) = 0.5 * (2.25 + 4 + 0 + 0.25 + 9) / 5.
  CHECK(t.value_loss.item<double>() == Approx(1.55).epsilon(1e-6));
  t.value_loss.backward();
  // d loss / d output bias = mean(V - R) = -(1.5 + 2 + 0 - 0.5 + 3) / 5.
  const torch::Tensor bias_grad = head->named_parameters()["output.bias"].grad();
  REQUIRE(bias_grad.defined());
  CHECK(bias_grad.item<double>() == Approx(-1.2).epsilon(1e-6));
}

TEST_CASE("PPO targets: the critic is read where each action's first token is scored", "[learner][ppo]") {
  Fixture f;
  const learner::EpisodeBatch batch = learner::make_episode_batch(f.episodes, false);
  const std::int64_t tokens = batch.targets.size(0);
  REQUIRE(tokens == 18);
  // A critic whose value is the packed position: hidden[t, 0] = 100 + t, an
  // identity hidden layer (SiLU(x) = x to 1e-40 at x >= 100) and an output
  // layer that subtracts 100.
  learner::ValueHead head(4);
  {
    torch::NoGradGuard no_grad;
    auto p = head->named_parameters();
    p["hidden.weight"].copy_(torch::eye(4));
    p["hidden.bias"].zero_();
    p["output.weight"].copy_(torch::tensor({{1.f, 0.f, 0.f, 0.f}}));
    p["output.bias"].fill_(-100.f);
  }
  torch::Tensor hidden = torch::zeros({tokens, 4});
  hidden.select(1, 0).copy_(torch::arange(tokens, torch::kFloat32) + 100);
  learner::PpoOptions options;
  options.gamma = 1.0;
  options.lambda = 1.0;
  options.whiten_advantages = false;
  const learner::PpoTargets t = learner::ppo_targets(batch, hidden, *head, f.episodes, f.bonus, options);
  // Value positions (packed): A's actions start at targets 2 and 7; B's
  // (packed from 10) at 11 and 14; C's at 16. The hidden state at those
  // positions is the one that scored the action's first token.
  // lambda = gamma = 1: A_k = (reward to go) - V_k.
  //   A: A0 = 2.5 - 2, A1 = 2 - 7;  B: A0 = -0.25 - 11, A1 = -0.5 - 14;  C: 3 - 16.
  const std::vector<double> got = as_doubles(t.token_advantages);
  CHECK(got[0] == Approx(0.5).margin(1e-4));
  CHECK(got[4] == Approx(-5.0).margin(1e-4));
  CHECK(got[10] == Approx(-11.25).margin(1e-4));
  CHECK(got[13] == Approx(-14.5).margin(1e-4));
  CHECK(got[17] == Approx(-13.0).margin(1e-4));
  CHECK(t.value_mean == Approx((2 + 7 + 11 + 14 + 16) / 5.0).margin(1e-4));
}

TEST_CASE("PPO targets: V(s) of a real policy sees the observation's last token", "[learner][ppo]") {
  // Two one-turn episodes that differ only in the last observation token
  // before the action (as the chat layout's assistant header ends every
  // observation). The policy's state that scores the action has read that
  // token, so the critic's V(s) must depend on it; a critic read one
  // position earlier could not tell the two states apart.
  config::ModelSection model;
  model.vocab_size = 64;
  model.d_model = 16;
  model.num_layers = 1;
  model.num_heads = 2;
  model.num_kv_heads = 1;
  model.d_ff = 32;
  model.max_seq_len = 16;
  config::MoeSection moe;
  moe.enabled = false;
  torch::manual_seed(5);
  model::Policy policy(model, moe);
  policy->eval();
  auto one_turn = [](std::int32_t last_observation_token) {
    rollout::Trajectory t = episode({0, 0, 0, 0, 1, 1}, {1.f});
    t.tokens = {1, 10, 20, last_observation_token, 30, 31};
    return t;
  };
  std::vector<rollout::Trajectory> storage{one_turn(40), one_turn(41)};
  const std::vector<const rollout::Trajectory*> episodes{&storage[0], &storage[1]};
  const learner::EpisodeBatch batch = learner::make_episode_batch(episodes, false);
  torch::NoGradGuard no_grad;
  const model::PolicyOutput out = policy->forward(batch.inputs, batch.lengths);
  learner::ValueHead head(model.d_model);
  torch::nn::init::normal_(head->named_parameters()["output.weight"], 0.0, 1.0);
  learner::PpoOptions options;
  options.lambda = 1.0;
  options.whiten_advantages = false;
  const learner::PpoTargets t = learner::ppo_targets(batch, out.hidden, *head, episodes, {0.f, 0.f}, options);
  // Same reward, so the advantages (1 - V) differ exactly where the values do.
  const std::vector<double> got = as_doubles(t.token_advantages);
  REQUIRE(got.size() == 10);
  INFO("A of episode 0: " << got[0] << ", of episode 1: " << got[5]);
  CHECK(std::fabs(got[0] - got[5]) > 1e-4);
}

TEST_CASE("PPO targets: whitened advantages have zero mean and unit std over turns", "[learner][ppo]") {
  Fixture f;
  const learner::EpisodeBatch batch = learner::make_episode_batch(f.episodes, false);
  learner::ValueHead head(8);
  learner::PpoOptions options;
  options.lambda = 0.5;
  const learner::PpoTargets t =
      learner::ppo_targets(batch, torch::randn({batch.targets.size(0), 8}), *head, f.episodes, f.bonus, options);
  // Turn advantages (1.5, 2, 0, -0.5, 3) whitened: read one token of each turn.
  const std::vector<double> got = as_doubles(t.token_advantages);
  const std::vector<double> turn{got[0], got[4], got[10], got[13], got[15]};
  const double mean = (1.5 + 2 + 0 - 0.5 + 3) / 5;
  double var = 0;
  for (double a : {1.5, 2.0, 0.0, -0.5, 3.0}) var += (a - mean) * (a - mean) / 4;
  CHECK(turn[0] == Approx((1.5 - mean) / std::sqrt(var)).margin(1e-5));
  CHECK(turn[3] == Approx((-0.5 - mean) / std::sqrt(var)).margin(1e-5));
}
