#pragma once
// Steady-state decode timing of a GenerationEngine, shared by `moerl bench
// rollout` (against sessions and context length) and `moerl bench topk`
// (against the number of active experts). Include after the LibTorch
// precompiled header.

#include <cstdint>
#include <vector>

#include "moerl/rollout/generation_engine.h"

namespace moerl::bench {

struct DecodeTiming {
  std::vector<double> step_s;  // wall seconds of each timed step
  std::int64_t tokens = 0;     // tokens decoded in the timed steps (one per session and step)
  double total_s = 0;          // wall seconds of all timed steps together
  std::int64_t kv_bytes = 0;   // KV cache bytes in use after the last step

  double tokens_per_s() const { return total_s > 0 ? static_cast<double>(tokens) / total_s : 0.0; }
};

// One session per prompt on `engine` (ids 0..n-1, which must be free), each
// generating `tokens_each` tokens greedily with no stop but that count,
// prefilled together with their first token (one engine step, untimed).
// Each prompt must leave room for tokens_each in the context budget, or
// this throws.
void start_decode_sessions(rollout::GenerationEngine& engine, const std::vector<std::vector<std::int64_t>>& prompts,
                           std::int64_t tokens_each);

// One session per prompt on `engine` (ids 0..n-1, which must be free),
// prefilled together with their first token and `warmup` decode steps
// (untimed), then `steps` timed decode steps in which every session decodes
// one token (greedy; no stop but the step count). The sessions are removed
// afterwards. Each prompt leaves room for warmup + steps + 1 tokens in the
// engine's context budget, or this throws.
DecodeTiming time_decode_steps(rollout::GenerationEngine& engine, const std::vector<std::vector<std::int64_t>>& prompts,
                               std::int64_t steps, std::int64_t warmup = 0);

}  // namespace moerl::bench
