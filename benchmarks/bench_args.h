#pragma once
// What the benchmarks that take a run's configuration share (bench topk,
// kv, rollout, algos, e2e): reading `--config F --set k=v --init FILE` and
// the benchmark's own options, with errors that name the benchmark.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moerl::bench {

struct PolicyBenchArgs {
  std::string config_path;  // default_config unless --config is given
  std::vector<std::string> overrides;
  std::string init_path;
};

// configs/quickstart.toml of the source tree.
std::string quickstart_config();

// Reads args. An option not among --config/-c, --set and --init goes to
// `own(option, value)` when own knows it (returns true), where value()
// takes the next argument; otherwise it is an error naming the benchmark
// (`who`, e.g. "bench topk") and listing `usage`.
using OwnOption = std::function<bool(const std::string& option, const std::function<const std::string&()>& value)>;
PolicyBenchArgs parse_policy_bench_args(const std::vector<std::string>& args, const std::string& who,
                                        const std::string& usage, const OwnOption& own,
                                        const std::string& default_config = quickstart_config());

// A whole number for `option`; throws moerl::Error naming who and option.
std::int64_t whole_number(const std::string& text, const std::string& who, const std::string& option);

}  // namespace moerl::bench
