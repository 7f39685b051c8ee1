// Advantage estimators, dynamic sampling, overlong penalty and the turn
// layout + GAE, against hand-computed small examples.

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "algo_test_support.h"
#include "moerl/algo/advantages.h"
#include "moerl/algo/gae.h"
#include "moerl/algo/token_batch.h"
#include "moerl/core/error.h"

namespace algo = moerl::algo;

namespace {

using algo_test::f64;
using algo_test::i64;

void require_values(const std::string& what, const torch::Tensor& got, const std::vector<double>& want,
                    double tol = 1e-6) {
  algo_test::require_close_values(what, got, want, tol);
}

// Two groups interleaved (ids 7 and 3) plus a singleton group (id 9).
const std::vector<double> kRewards = {1, 3, 0, 1, 0, 1, 2, 5};
const std::vector<std::int64_t> kGroups = {7, 3, 7, 3, 7, 7, 3, 9};

}  // namespace

TEST_CASE("GRPO advantages are group-normalised", "[algo]") {
  // Group 7: rewards 1,0,0,1: mean 0.5, unbiased std sqrt(1/3), population std 0.5.
  // Group 3: rewards 3,1,2: mean 2, unbiased std 1, population std sqrt(2/3).
  // Group 9: one sample: advantage 0.
  const double a7 = 0.5 / std::sqrt(1.0 / 3.0);
  auto adv = algo::grpo_advantages(f64(kRewards), i64(kGroups));
  require_values("grpo unbiased", adv, {a7, 1, -a7, -1, -a7, a7, 0, 0}, 1e-5);

  algo::GroupAdvantageOptions pop;
  pop.unbiased_std = false;
  const double b3 = 1.0 / std::sqrt(2.0 / 3.0);
  adv = algo::grpo_advantages(f64(kRewards), i64(kGroups), pop);
  require_values("grpo population", adv, {1, b3, -1, -b3, -1, 1, 0, 0}, 1e-5);
  CHECK(adv.scalar_type() == torch::kDouble);
}

TEST_CASE("Dr.GRPO advantages are centred only", "[algo]") {
  auto adv = algo::dr_grpo_advantages(f64(kRewards), i64(kGroups));
  require_values("dr_grpo", adv, {0.5, 1, -0.5, -1, -0.5, 0.5, 0, 0}, 1e-12);
}

TEST_CASE("RLOO advantages use the leave-one-out baseline", "[algo]") {
  // Group 7: 1 - (0+0+1)/3 = 2/3; 0 - (1+0+1)/3 = -2/3.
  // Group 3: 3 - (1+2)/2 = 1.5; 1 - (3+2)/2 = -1.5; 2 - (3+1)/2 = 0.
  auto adv = algo::rloo_advantages(f64(kRewards), i64(kGroups));
  require_values("rloo", adv, {2.0 / 3, 1.5, -2.0 / 3, -1.5, -2.0 / 3, 2.0 / 3, 0, 0}, 1e-12);
}

TEST_CASE("Turn advantages normalise every turn reward within the group and sum the later ones", "[algo]") {
  // Episodes 0 and 1 form group 5, episode 2 is alone in group 8.
  const std::vector<double> rewards = {0.25, 0.25, 1.0, 0.0, 0.5, 1.0, 0.0};
  const std::vector<std::int64_t> episode = {0, 0, 0, 1, 1, 2, 2};
  const std::vector<std::int64_t> groups = {5, 5, 8};
  // Group 5's turn rewards have mean 0.4: deviations -0.15 -0.15 0.6 | -0.4 0.1;
  // group 8's mean 0.5: 0.5 -0.5. Sums from each turn to its episode's end:
  const std::vector<double> centred_sums = {0.30, 0.45, 0.6, -0.3, 0.1, 0.0, -0.5};
  algo::GroupAdvantageOptions no_std;
  no_std.normalize_by_std = false;
  require_values("turn dr_grpo", algo::turn_group_advantages(f64(rewards), i64(episode), i64(groups), no_std),
                 centred_sums, 1e-12);
  // With the std, the sums are rescaled to unit std per group (the rewards'
  // own std cancels): group 5's sums have mean 0.23 and unbiased std
  // sqrt(0.488 / 4); group 8's sqrt(0.125).
  const double s5 = std::sqrt(0.488 / 4), s8 = std::sqrt(0.125);
  require_values("turn grpo", algo::turn_group_advantages(f64(rewards), i64(episode), i64(groups)),
                 {0.30 / s5, 0.45 / s5, 0.6 / s5, -0.3 / s5, 0.1 / s5, 0.0, -0.5 / s8}, 1e-5);
  // An episode's one turn with the whole reward is the episode-level advantage.
  require_values("one turn each",
                 algo::turn_group_advantages(f64(kRewards), i64({0, 1, 2, 3, 4, 5, 6, 7}), i64(kGroups)),
                 {0.5 / std::sqrt(1.0 / 3.0), 1, -0.5 / std::sqrt(1.0 / 3.0), -1, -0.5 / std::sqrt(1.0 / 3.0),
                  0.5 / std::sqrt(1.0 / 3.0), 0, 0},
                 1e-5);
  CHECK_THROWS_WITH(algo::turn_group_advantages(f64({1, 2}), i64({1, 0}), i64({3, 3})),
                    Catch::Contains("turn 1 names episode 0") && Catch::Contains("nondecreasing"));
  CHECK_THROWS_WITH(algo::turn_group_advantages(f64({1, 2}), i64({0, 2}), i64({3, 3})),
                    Catch::Contains("turn 1 names episode 2"));
}

TEST_CASE("Advantages broadcast onto tokens", "[algo]") {
  auto seq = i64({0, 0, 1, 1, 1, 2});
  auto tok = algo::broadcast_to_tokens(f64({0.5, -1, 2}), seq);
  require_values("broadcast", tok, {0.5, 0.5, -1, -1, -1, 2}, 0);
  auto lengths = algo::generated_lengths(seq, i64({0, 1, 1, 0, 1, 1}), 4);
  CHECK(lengths.scalar_type() == torch::kLong);
  require_values("lengths", lengths, {1, 2, 1, 0}, 0);
}

TEST_CASE("Dynamic sampling drops groups with zero reward variance", "[algo]") {
  // Group 1 all 1 (dropped), group 2 mixed (kept), group 3 a singleton
  // (dropped), group 4 all 2 (dropped).
  auto f = algo::filter_zero_variance_groups(f64({1, 1, 1, 0, 1, 0, 0.5, 2, 2}), i64({1, 1, 1, 2, 2, 2, 3, 4, 4}));
  REQUIRE(f.kept.scalar_type() == torch::kBool);
  require_values("kept", f.kept.to(torch::kDouble), {0, 0, 0, 1, 1, 1, 0, 0, 0}, 0);
  CHECK(f.dropped_episodes == 6);
  CHECK(f.dropped_groups == 3);
  CHECK(f.kept_groups == 1);
}

TEST_CASE("Overlong penalty is linear inside the cache window", "[algo]") {
  algo::OverlongOptions o;
  o.max_length = 20;
  o.cache_length = 4;  // free up to 16 tokens
  auto p = algo::overlong_penalty(i64({0, 15, 16, 17, 18, 19, 20, 21, 100}), o);
  CHECK(p.scalar_type() == torch::kFloat);
  require_values("penalty", p, {0, 0, 0, -0.25, -0.5, -0.75, -1, -1, -1}, 1e-7);
  o.factor = 0.5;
  p = algo::overlong_penalty(f64({16, 17, 20, 21}), o);
  CHECK(p.scalar_type() == torch::kDouble);
  require_values("penalty x0.5", p, {0, -0.125, -0.5, -0.5}, 1e-12);
  o.cache_length = 0;
  CHECK_THROWS_AS(algo::overlong_penalty(i64({1}), o), moerl::Error);
}

TEST_CASE("Turn layout reads V(s) where each action's first token is scored", "[algo]") {
  // Positions are packed targets (position t holds the state that scores target t).
  // Episode 0: turn 0 = obs[0] act[1,2]; turn 1 = obs[3,4] act[5] trailing obs[6].
  // Episode 1: turn 0 = obs[7] act[8]; turn 1 = obs[9] act[10].
  auto seq = i64({0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1});
  auto turn = i64({0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1});
  auto mask = i64({0, 1, 1, 0, 0, 1, 0, 0, 1, 0, 1});
  auto layout = algo::make_turn_layout(seq, turn, mask, 2);
  CHECK(layout.num_turns == 4);
  require_values("token_turn", layout.token_turn.to(torch::kDouble), {0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3}, 0);
  require_values("turn_episode", layout.turn_episode.to(torch::kDouble), {0, 0, 1, 1}, 0);
  // The state that scores each action's first token has read the whole
  // observation before it: positions 1, 5, 8 and 10 (not 0, 4, 7, 9, which
  // miss the observation's last token).
  require_values("value_position", layout.value_position.to(torch::kDouble), {1, 5, 8, 10}, 0);
  require_values("turn_offsets", layout.turn_offsets.to(torch::kDouble), {0, 2, 4}, 0);

  auto token_values = torch::arange(11, torch::kDouble).mul(0.1).set_requires_grad(true);
  auto v = algo::gather_turn_values(token_values, layout);
  require_values("turn values", v, {0.1, 0.5, 0.8, 1.0}, 1e-12);
  v.sum().backward();
  require_values("value grad", token_values.grad(), {0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 1}, 0);

  // An action at an episode's first target is read there (its state has read the episode's first token).
  auto opening = algo::make_turn_layout(i64({0, 0, 1, 1}), i64({0, 0, 0, 0}), i64({1, 0, 0, 1}), 2);
  require_values("value_position of an opening action", opening.value_position.to(torch::kDouble), {0, 3}, 0);
  // A turn without an action is an error.
  CHECK_THROWS_AS(algo::make_turn_layout(i64({0, 0, 0}), i64({0, 0, 1}), i64({0, 1, 0}), 1), moerl::Error);
}

TEST_CASE("GAE over turns matches the hand-rolled recursion", "[algo]") {
  const std::vector<double> r = {0.5, 1.0, 0.0, -1.0, 2.0};
  const std::vector<double> v = {0.2, 0.4, 0.1, 0.3, 0.5};
  const std::vector<std::int64_t> ep = {0, 0, 1, 1, 2};
  algo::GaeOptions o;
  o.gamma = 0.9;
  o.lambda = 0.8;
  // By hand: episode 0: A1 = 1 - .4 = .6; A0 = .5 + .9*.4 - .2 + .72*.6 = 1.092.
  // Episode 1: A1 = -1 - .3 = -1.3; A0 = .9*.3 - .1 + .72*(-1.3) = -.766. Episode 2: 1.5.
  auto g = algo::gae_over_turns(f64(r), f64(v), i64(ep), o);
  require_values("gae by hand", g.advantages, {1.092, 0.6, -0.766, -1.3, 1.5}, 1e-12);
  require_values("returns by hand", g.returns, {1.292, 1.0, -0.666, -1.0, 2.0}, 1e-12);

  // Longer random episodes in float against a double recursion written the
  // other way round (lambda-returns: G_k = r_k + gamma((1-lambda) V_{k+1} + lambda G_{k+1})).
  torch::manual_seed(3);
  const std::vector<std::int64_t> lens = {1, 4, 7, 2};
  std::vector<std::int64_t> episode;
  for (std::size_t n = 0; n < lens.size(); ++n)
    for (std::int64_t k = 0; k < lens[n]; ++k) episode.push_back(static_cast<std::int64_t>(n));
  const auto m = static_cast<std::int64_t>(episode.size());
  auto rr = torch::randn({m});
  auto vv = torch::randn({m});
  auto boot = torch::randn({4});
  o.gamma = 0.97;
  o.lambda = 0.9;
  auto got = algo::gae_over_turns(rr, vv, i64(episode), o, boot);
  CHECK(got.advantages.scalar_type() == torch::kFloat);
  auto rd = rr.to(torch::kDouble);
  auto vd = vv.to(torch::kDouble);
  std::vector<double> want_ret(m), want_adv(m);
  std::int64_t end = m;
  for (std::int64_t n = static_cast<std::int64_t>(lens.size()) - 1; n >= 0; --n) {
    const std::int64_t begin = end - lens[n];
    const double bv = boot[n].item<double>();
    double next_g = bv, next_v = bv;
    for (std::int64_t k = end - 1; k >= begin; --k) {
      const double rk = rd[k].item<double>();
      const double gk = k == end - 1 ? rk + o.gamma * bv : rk + o.gamma * ((1 - o.lambda) * next_v + o.lambda * next_g);
      want_ret[k] = gk;
      want_adv[k] = gk - vd[k].item<double>();
      next_g = gk;
      next_v = vd[k].item<double>();
    }
    end = begin;
  }
  require_values("gae random", got.advantages, want_adv, 1e-5);
  require_values("returns random", got.returns, want_ret, 1e-5);

  // Turn advantages onto tokens through the layout's token_turn.
  auto tok = algo::broadcast_to_tokens(f64({1, 2, 3}), i64({0, 0, 1, 2, 2}));
  require_values("turn broadcast", tok, {1, 1, 2, 3, 3}, 0);
}
