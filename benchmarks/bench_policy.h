#pragma once
// The run's policy for the single-process benchmarks on a policy (bench
// topk, kv, rollout), built as every rank of a job builds it.

#include <string>

#include "moerl/config/config.h"
#include "moerl/model/policy.h"

namespace moerl::bench {

// The hf: source's weights or the built-in architecture (seeded by
// run.seed), then init_path's weights when given; in eval mode. Says on
// stderr when the built-in model keeps its random weights.
model::Policy make_bench_policy(const config::Config& config, const std::string& init_path, const std::string& who);

}  // namespace moerl::bench
