#include "moerl/learner/step_metrics.h"

#include "moerl/telemetry/metrics.h"

namespace moerl::learner {

void record_step_metrics(std::int64_t step, std::int64_t version, std::int64_t trained_tokens,
                         const std::map<std::string, FamilyScore>& by_family, const telemetry::ExpertLoad& load) {
  auto& m = telemetry::metrics();
  m.set("learner.step", static_cast<double>(step));
  m.set("learner.weight_version", static_cast<double>(version));
  m.add("learner.trained_tokens", static_cast<double>(trained_tokens));
  for (const auto& [family, score] : by_family) {
    if (score.episodes == 0) continue;
    m.set("train." + family + ".reward", score.mean_reward());
    m.set("train." + family + ".success", score.success_rate());
  }
  telemetry::record_expert_load(load);
}

void record_evaluation_metrics(const std::map<std::string, FamilyScore>& table, const std::string& mode, bool stable) {
  auto& m = telemetry::metrics();
  for (const auto& [family, score] : table) {
    if (score.episodes == 0) continue;
    if (stable) {
      m.set("eval_stable." + family + "." + mode + ".success", score.success_rate());
      continue;
    }
    const std::string prefix = "eval." + family + "." + mode + ".success";
    const Interval ci = score.success_interval();
    m.set(prefix, score.success_rate());
    m.set(prefix + "_ci_low", ci.low);
    m.set(prefix + "_ci_high", ci.high);
  }
}

}  // namespace moerl::learner
