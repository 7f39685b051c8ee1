#pragma once
// Expert load of the MoE layers, counted over some forwards (a learner
// step's micro-batches, an actor's last decode steps) and recorded as the
// gauges moe.layer.<L>.expert.<E>.load (the share of the layer's routed
// token assignments), moe.layer.<L>.imbalance (max over mean) and the counter
// moe.layer.<L>.dropped_tokens; the Prometheus page labels them by layer and
// expert (prometheus_text.h).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moerl::telemetry {

struct ExpertLoad {
  std::vector<std::vector<std::int64_t>> tokens;  // [layers][experts] assignments routed
  std::vector<std::int64_t> dropped;              // [layers] assignments dropped by capacity
  void add(std::size_t layer, const std::vector<std::int64_t>& tokens_per_expert, std::int64_t dropped_tokens);
  bool empty() const { return tokens.empty(); }
};

// Into the process's registry; layers that routed nothing are left as they were.
void record_expert_load(const ExpertLoad& load);

}  // namespace moerl::telemetry
