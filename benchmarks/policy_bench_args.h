#pragma once
// What the single-process benchmarks on a policy share (bench topk, bench
// kv): reading `--config F --set k=v --init FILE` and the benchmark's own
// options, and building the run's policy as every rank of a job would.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moerl/config/config.h"
#include "moerl/model/policy.h"

namespace moerl::bench {

struct PolicyBenchArgs {
  std::string config_path;  // default: configs/quickstart.toml of the source tree
  std::vector<std::string> overrides;
  std::string init_path;
};

// Reads args into `out`. An option not among --config/-c, --set and --init
// goes to `own(option, value)` when own knows it (returns true), where
// value() takes the next argument; otherwise it is an error naming the
// benchmark (`who`, e.g. "bench topk") and listing `usage`.
using OwnOption = std::function<bool(const std::string& option, const std::function<const std::string&()>& value)>;
PolicyBenchArgs parse_policy_bench_args(const std::vector<std::string>& args, const std::string& who,
                                        const std::string& usage, const OwnOption& own);

// A whole number for `option`; throws moerl::Error naming who and option.
std::int64_t whole_number(const std::string& text, const std::string& who, const std::string& option);

// The run's policy: the hf: source's weights or the built-in architecture
// (seeded by run.seed), then init_path's weights when given; in eval mode.
// Says on stderr when the built-in model keeps its random weights.
model::Policy make_bench_policy(const config::Config& config, const std::string& init_path, const std::string& who);

}  // namespace moerl::bench
