#pragma once
// Parameter counts as MoE model cards quote them: total parameters, and
// parameters active per token (every dense parameter, the router, the shared
// experts, and top_k of the num_experts routed experts). Embedding and LM
// head count as active (a tied head counts once).

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/config/sections.h"

namespace moerl::model {

class PolicyImpl;

struct ParameterCount {
  std::string component;  // embedding, attention, norms, dense_ffn, router, routed_experts, shared_experts, lm_head
  std::int64_t total = 0;
  std::int64_t active = 0;
};

struct ParameterReport {
  std::vector<ParameterCount> components;  // fixed order, zero rows included
  std::int64_t total = 0;
  std::int64_t active = 0;

  const ParameterCount& component(const std::string& name) const;  // throws if unknown
  // A fixed-width table, one row per component plus a total row, with exact
  // counts and human-readable sizes (e.g. "1.23M").
  std::string format() const;
};

// Counts the parameters the policy actually holds, classified by name.
ParameterReport parameter_report(PolicyImpl& policy);
// The same numbers computed from the config alone (no model built).
ParameterReport expected_parameter_report(const config::ModelSection& model, const config::MoeSection& moe);

}  // namespace moerl::model
