#pragma once
// What every learner records into the metrics registry after a step (its
// share of the batch): step and weight version, trained tokens, training
// reward and success per family, and each MoE layer's expert load, so that
// the Prometheus page and the metrics file show them (telemetry/).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moerl/learner/evaluation_scores.h"
#include "moerl/telemetry/expert_load.h"

namespace moerl::learner {

void record_step_metrics(std::int64_t step, std::int64_t version, std::int64_t trained_tokens,
                         const std::map<std::string, FamilyScore>& by_family, const telemetry::ExpertLoad& load);

// "eval.<family>.<mode>.success" (with _ci_low/_ci_high) for one table;
// `stable` records the reference the alerts compare against instead.
void record_evaluation_metrics(const std::map<std::string, FamilyScore>& table, const std::string& mode, bool stable);

}  // namespace moerl::learner
