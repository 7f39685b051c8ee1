#include "decode_timing.h"

#include <string>

#include "moerl/bench/timing.h"
#include "moerl/core/check.h"

namespace moerl::bench {

void start_decode_sessions(rollout::GenerationEngine& engine, const std::vector<std::vector<std::int64_t>>& prompts,
                           std::int64_t tokens_each) {
  rollout::SamplingParams sampling;
  sampling.greedy = true;
  rollout::StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = tokens_each;
  for (std::size_t s = 0; s < prompts.size(); ++s) {
    const auto room = static_cast<std::int64_t>(prompts[s].size()) + tokens_each;
    MOERL_CHECK(room < engine.context_budget(),
                "decode timing: prompt " + std::to_string(s) + " (" + std::to_string(prompts[s].size()) +
                    " tokens) and " + std::to_string(tokens_each) + " decoded tokens exceed the context budget of " +
                    std::to_string(engine.context_budget()));
    const auto id = static_cast<std::uint64_t>(s);
    engine.add_session(id, id + 1);
    engine.append_prompt(id, prompts[s]);
    engine.start_turn(id, sampling, stop);
  }
  engine.step();  // prefill + first token
}

DecodeTiming time_decode_steps(rollout::GenerationEngine& engine, const std::vector<std::vector<std::int64_t>>& prompts,
                               std::int64_t steps, std::int64_t warmup) {
  // One more than the steps: the prefill step samples the first token.
  start_decode_sessions(engine, prompts, warmup + steps + 1);
  for (std::int64_t i = 0; i < warmup; ++i) engine.step();
  DecodeTiming timing;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < steps; ++i) {
    const auto step_start = std::chrono::steady_clock::now();
    engine.step();
    timing.step_s.push_back(seconds_since(step_start));
  }
  timing.total_s = seconds_since(start);
  timing.tokens = static_cast<std::int64_t>(prompts.size()) * steps;
  timing.kv_bytes = engine.kv_bytes_in_use();
  for (std::size_t s = 0; s < prompts.size(); ++s) engine.remove_session(static_cast<std::uint64_t>(s));
  return timing;
}

}  // namespace moerl::bench
