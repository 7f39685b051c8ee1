// Episodes whose context the actor rebuilt (rollout.context_policy =
// drop_oldest_turns): the learner scores each context window as a row of
// its own, in the packed order its routing and turns follow; the wire format
// checks the windows; the engine's replace_context prefills the new context.

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <vector>

#include "moerl/learner/episode_batch.h"
#include "moerl/model/policy.h"
#include "moerl/rollout/generation_engine.h"
#include "moerl/rollout/trajectory.h"
#include "moerl/runtime/wire.h"

using namespace moerl;

namespace {

// tokens 10, 11, 12, ...; generated flags as given; windows as given.
rollout::Trajectory windowed(std::vector<std::uint8_t> generated, std::vector<std::int32_t> starts) {
  rollout::Trajectory t;
  const size_t n = generated.size();
  for (size_t i = 0; i < n; ++i) t.tokens.push_back(static_cast<std::int32_t>(10 + i));
  t.generated = std::move(generated);
  for (size_t i = 0; i < n; ++i) t.behaviour_logprobs.push_back(t.generated[i] ? -0.5f - static_cast<float>(i) : 0.f);
  t.versions.assign(n, 3);
  t.window_starts = std::move(starts);
  t.turn_rewards = {1.f, 2.f, 4.f};
  return t;
}

std::vector<std::int64_t> ints(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kLong).contiguous();
  return std::vector<std::int64_t>(c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel());
}

}  // namespace

TEST_CASE("a rebuilt context is a row of its own; targets never cross a window", "[learner][context]") {
  // Window 0: tokens 0-6 (actions at 3-4 and 6); window 1: tokens 7-12,
  // re-fed head 7-8 (not generated), then a kept prompt and action 11-12.
  rollout::Trajectory a = windowed({0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 1, 1}, {7});
  rollout::Trajectory b = windowed({0, 1, 1, 0}, {});  // one window
  b.turn_rewards = {0.5f};
  const learner::EpisodeBatch batch = learner::make_episode_batch({&a, &b}, false);
  REQUIRE(batch.inputs.size(0) == 3);  // a's two windows, then b
  CHECK(ints(batch.lengths) == std::vector<std::int64_t>{6, 5, 3});
  // Row inputs: each window's tokens but its last.
  CHECK(ints(batch.inputs[0].narrow(0, 0, 6)) == std::vector<std::int64_t>{10, 11, 12, 13, 14, 15});
  CHECK(ints(batch.inputs[1].narrow(0, 0, 5)) == std::vector<std::int64_t>{17, 18, 19, 20, 21});
  // Targets: every token but the first of each window (token 17 starts window 1, it is no target).
  CHECK(ints(batch.targets) == std::vector<std::int64_t>{11, 12, 13, 14, 15, 16, 18, 19, 20, 21, 22, 11, 12, 13});
  CHECK(ints(batch.loss_mask) == std::vector<std::int64_t>{0, 0, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0});
  CHECK(ints(batch.sequence_index) == std::vector<std::int64_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1});
  CHECK(batch.generated_tokens == 5 + 2);
  CHECK(batch.behaviour_logprobs[2].item<float>() == Approx(-3.5f));  // token 3's

  // Turns follow the same targets: a's third action is in window 1; the
  // window boundary ends the second action.
  const learner::EpisodeTurns turns = learner::episode_turns({&a, &b}, {0.f, 0.f});
  CHECK(ints(turns.turn_index) == std::vector<std::int64_t>{0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0});
  CHECK(turns.turn_rewards.size(0) == 3 + 1);
}

TEST_CASE("routing replay covers every window's fed positions", "[learner][context]") {
  rollout::Trajectory a = windowed({0, 0, 1, 1, 0, 0, 1}, {4});
  a.moe_layers = 1;
  a.top_k = 2;
  // Fed positions: 3 in window 0, 2 in window 1 = n - windows = 5.
  for (int p = 0; p < 5; ++p) a.routing.insert(a.routing.end(), {static_cast<std::uint8_t>(p), 7});
  const learner::EpisodeBatch batch = learner::make_episode_batch({&a}, true);
  REQUIRE(batch.forced_experts.defined());
  CHECK(ints(batch.forced_experts.select(2, 0)).size() == 5);
  CHECK(ints(batch.forced_experts.select(2, 0).squeeze(1)) == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  a.routing.resize(8);  // one position short
  CHECK_THROWS_WITH(learner::make_episode_batch({&a}, true), Catch::Contains("routing does not cover"));
}

TEST_CASE("the wire format carries the windows and refuses windows that cannot be scored", "[rollout][context]") {
  rollout::Trajectory a = windowed({0, 0, 1, 1, 0, 0, 1}, {4});
  a.dropped_turns = 2;
  runtime::ByteWriter w;
  a.encode(w);
  runtime::ByteReader r(w.bytes());
  const rollout::Trajectory back = rollout::Trajectory::decode(r);
  CHECK(back.window_starts == std::vector<std::int32_t>{4});
  CHECK(back.dropped_turns == 2);
  CHECK(back.windows() == 2);
  for (const std::vector<std::int32_t>& bad : {std::vector<std::int32_t>{1}, {6}, {3, 4}, {-2}}) {
    rollout::Trajectory t = windowed({0, 0, 1, 1, 0, 0, 1}, bad);
    runtime::ByteWriter bw;
    t.encode(bw);
    runtime::ByteReader br(bw.bytes());
    CHECK_THROWS_WITH(rollout::Trajectory::decode(br), Catch::Contains("window_starts"));
  }
}

TEST_CASE("replace_context: the engine prefills the new context and decodes from it", "[rollout][context]") {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  config::ModelSection m;
  m.vocab_size = 264;
  m.d_model = 32;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.d_ff = 48;
  m.max_seq_len = 64;
  config::MoeSection dense;
  dense.enabled = false;
  model::Policy policy(m, dense);
  policy->eval();
  rollout::GenerationEngine engine(policy, rollout::EngineOptions{});
  rollout::SamplingParams greedy;
  greedy.greedy = true;
  rollout::StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 3;
  // Session 1 has a long context, then replaced by {5, 6, 7}; session 2 starts at {5, 6, 7}.
  engine.add_session(1, 9);
  engine.append_prompt(1, {40, 41, 42, 43, 44, 45, 46, 47});
  engine.start_turn(1, greedy, stop);
  while (!engine.turn_ready(1)) engine.step();
  engine.take_turn(1);
  engine.replace_context(1, {5, 6, 7});
  CHECK(engine.fed_length(1) == 0);
  CHECK(engine.context(1) == std::vector<std::int64_t>{5, 6, 7});
  engine.add_session(2, 9);
  engine.append_prompt(2, {5, 6, 7});
  engine.start_turn(1, greedy, stop);
  engine.start_turn(2, greedy, stop);
  while (!engine.turn_ready(1) || !engine.turn_ready(2)) engine.step();
  const rollout::GeneratedTurn one = engine.take_turn(1), two = engine.take_turn(2);
  CHECK(one.context_truncated);
  CHECK_FALSE(two.context_truncated);
  CHECK(one.tokens == two.tokens);  // the same context gives the same greedy tokens
  CHECK(engine.fed_length(1) == 3 + 2);
  CHECK_THROWS(engine.replace_context(1, std::vector<std::int64_t>(64, 5)));  // over the budget
}
