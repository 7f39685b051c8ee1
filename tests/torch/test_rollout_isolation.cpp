// Deterministic mode's engine option: with isolate_sessions a session's
// tokens, log-probs and routing are bitwise the same whether it runs alone or
// next to other sessions (float32 weights, where batch shape changes rounding),
// and prompts longer than max_step_tokens are chunked by the session alone.

#include <catch2/catch.hpp>

#include <vector>

#include "moerl/model/policy.h"
#include "moerl/text/tokenizer.h"
#include "moerl/rollout/generation_engine.h"

using moerl::rollout::EngineOptions;
using moerl::rollout::GeneratedTurn;
using moerl::rollout::GenerationEngine;
using moerl::rollout::SamplingParams;
using moerl::rollout::StopParams;
using moerl::text::SpecialTokens;

namespace {

moerl::model::Policy float_policy() {
  moerl::config::ModelSection m;
  m.d_model = 48;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.d_ff = 64;
  m.max_seq_len = 256;
  m.init_std = 0.1;
  moerl::config::MoeSection e;
  e.num_experts = 4;
  e.top_k = 2;
  e.d_expert = 24;
  torch::manual_seed(3);
  moerl::model::Policy p(m, e);
  p->eval();
  return p;
}

std::vector<std::int64_t> prompt(std::int64_t n, std::int64_t salt) {
  std::vector<std::int64_t> t{SpecialTokens::kBos, SpecialTokens::kUser};
  for (std::int64_t i = 0; i < n; ++i) t.push_back(32 + (i * 11 + salt * 17) % 90);
  t.push_back(SpecialTokens::kEndOfTurn);
  t.push_back(SpecialTokens::kAssistant);
  return t;
}

// Two turns of session 7 (seed 99), with `others` sessions sharing every step.
std::vector<GeneratedTurn> run_session(int others, std::int64_t max_step_tokens) {
  torch::NoGradGuard no_grad;
  EngineOptions options;
  options.isolate_sessions = true;
  options.max_step_tokens = max_step_tokens;
  GenerationEngine engine(float_policy(), options);
  SamplingParams sampling;
  StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 12;
  const std::vector<std::uint64_t> ids = [&] {
    std::vector<std::uint64_t> v{7};
    for (int k = 0; k < others; ++k) v.push_back(100 + static_cast<std::uint64_t>(k));
    return v;
  }();
  for (std::uint64_t id : ids) {
    engine.add_session(id, id == 7 ? 99 : id * 31);
    engine.append_prompt(
        id, prompt(id == 7 ? 40 : 10 + static_cast<std::int64_t>(id % 7) * 9, static_cast<std::int64_t>(id)));
    engine.start_turn(id, sampling, stop);
  }
  std::vector<GeneratedTurn> turns;
  while (turns.size() < 2) {
    REQUIRE(engine.has_work());
    for (std::uint64_t id : engine.step()) {
      GeneratedTurn turn = engine.take_turn(id);
      if (id != 7) {
        // Keep the others busy with new turns of different lengths.
        engine.append_prompt(id, prompt(3 + static_cast<std::int64_t>(id % 5), static_cast<std::int64_t>(id) + 1));
        engine.start_turn(id, sampling, stop);
        continue;
      }
      turns.push_back(std::move(turn));
      if (turns.size() < 2) {
        engine.append_prompt(7, prompt(5, 2));
        engine.start_turn(7, sampling, stop);
      }
    }
  }
  return turns;
}

}  // namespace

TEST_CASE("isolated sessions generate the same bits alone and in company", "[rollout][deterministic]") {
  const std::int64_t chunk = GENERATE(2048, 16);  // 16: the 44-token prompt is prefilled in chunks
  const std::vector<GeneratedTurn> alone = run_session(0, chunk);
  const std::vector<GeneratedTurn> crowded = run_session(5, chunk);
  REQUIRE(alone.size() == 2);
  for (size_t t = 0; t < 2; ++t) {
    INFO("turn " << t << ", max_step_tokens " << chunk);
    CHECK(alone[t].tokens == crowded[t].tokens);
    CHECK(alone[t].logprobs == crowded[t].logprobs);  // float equality: bitwise
    CHECK(alone[t].model_logprobs == crowded[t].model_logprobs);
    CHECK(torch::equal(alone[t].expert_indices, crowded[t].expert_indices));
  }
}
