#include "policy_bench_args.h"

#include <cstdio>

#include "moerl/core/error.h"
#include "moerl/hf/hf_config.h"
#include "moerl/hf/policy_loader.h"
#include "moerl/learner/pretrain.h"

namespace moerl::bench {

PolicyBenchArgs parse_policy_bench_args(const std::vector<std::string>& args, const std::string& who,
                                        const std::string& usage, const OwnOption& own) {
  PolicyBenchArgs out;
  out.config_path = std::string(MOERL_SOURCE_DIR) + "/configs/quickstart.toml";
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::function<const std::string&()> value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw Error(who + ": " + a + " needs a value");
      return args[++i];
    };
    if (a == "--config" || a == "-c") {
      out.config_path = value();
    } else if (a == "--set") {
      out.overrides.push_back(value());
    } else if (a == "--init") {
      out.init_path = value();
    } else if (!own || !own(a, value)) {
      throw Error(who + ": unknown option '" + a + "' (options: " + usage + ")");
    }
  }
  return out;
}

std::int64_t whole_number(const std::string& text, const std::string& who, const std::string& option) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw Error(who + ": " + option + ": '" + text + "' is not a whole number");
  return v;
}

model::Policy make_bench_policy(const config::Config& config, const std::string& init_path, const std::string& who) {
  torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
  const bool built_in = hf::hf_directory(config.model.source).empty();
  model::Policy policy = built_in ? model::Policy(config.model, config.moe) : hf::load_hf_policy(config);
  if (!init_path.empty()) {
    learner::load_policy(policy, init_path);
  } else if (built_in) {
    std::fprintf(stderr, "%s: no --init: the built-in model has its random initial weights\n", who.c_str());
  }
  policy->eval();
  return policy;
}

}  // namespace moerl::bench
