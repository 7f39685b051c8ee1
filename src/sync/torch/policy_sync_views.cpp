#include "moerl/sync/policy_sync_views.h"

#include <string>

#include "moerl/core/check.h"

namespace moerl::sync {
namespace {

// "layers.L.mlp.experts.<anything>" with L a MoE layer.
bool routed_expert_tensor(const model::PolicyImpl& policy, const std::string& name) {
  for (std::int64_t layer : policy.moe_layer_indices())
    if (name.rfind("layers." + std::to_string(layer) + ".mlp.experts.", 0) == 0) return true;
  return false;
}

}  // namespace

std::vector<ShardedWeightView> policy_sync_views(const model::PolicyImpl& policy, std::vector<WeightView> views) {
  const auto parameters = policy.named_parameters(/*recurse=*/true);
  MOERL_CHECK(views.size() == parameters.size(), "expert sync: " + std::to_string(views.size()) +
                                                     " weight views for a policy of " +
                                                     std::to_string(parameters.size()) + " parameters");
  std::vector<ShardedWeightView> marked;
  for (size_t i = 0; i < views.size(); ++i) {
    MOERL_CHECK(views[i].name == parameters[i].key(),
                "expert sync: weight view " + views[i].name + " where the policy has " + parameters[i].key());
    const bool split = routed_expert_tensor(policy, views[i].name);
    marked.push_back({std::move(views[i]), split});
  }
  return marked;
}

}  // namespace moerl::sync
