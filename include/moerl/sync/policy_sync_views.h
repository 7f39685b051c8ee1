#pragma once
// A Policy's weight views for expert-sharded weight sync
// (sync/sharded_weight_sync.h): which of them are routed expert tensors.

#include <vector>

#include "moerl/model/policy.h"
#include "moerl/sync/expert_sync_channels.h"

namespace moerl::sync {

// `views` in the policy's parameters() order and named as its parameters
// (module_weight_views(policy), or HostWeights(policy, wire).views() for a
// policy on a device or in another dtype), each marked split when it is a
// routed expert tensor layers.L.mlp.experts.* of a MoE layer. A policy built
// without an expert group holds every expert: its expert tensors are still
// split, as a share of all E (P = 1), so that it syncs with learners or
// actors that do split them.
std::vector<ShardedWeightView> policy_sync_views(const model::PolicyImpl& policy, std::vector<WeightView> views);

}  // namespace moerl::sync
