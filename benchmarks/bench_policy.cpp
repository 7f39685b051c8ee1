#include "bench_policy.h"

#include <cstdio>

#include "moerl/hf/hf_config.h"
#include "moerl/model/hf_policy_loader.h"
#include "moerl/learner/pretrain.h"

namespace moerl::bench {

model::Policy make_bench_policy(const config::Config& config, const std::string& init_path, const std::string& who) {
  torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
  const bool built_in = hf::hf_directory(config.model.source).empty();
  model::Policy policy =
      built_in ? model::Policy(config.model, config.moe) : model::load_hf_policy(config.model, config.moe);
  if (!init_path.empty()) {
    learner::load_policy(policy, init_path);
  } else if (built_in) {
    std::fprintf(stderr, "%s: no --init: the built-in model has its random initial weights\n", who.c_str());
  }
  policy->eval();
  return policy;
}

}  // namespace moerl::bench
