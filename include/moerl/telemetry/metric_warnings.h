#pragma once
// The two conditions an operator must see even without Prometheus (the
// alert rules in configs/prometheus/alerts.yml watch the same ones): an MoE
// layer whose expert load is imbalanced, and an environment family whose
// step latency P99 is too high. Learner 0 checks the latest metrics of every
// rank after each step and logs what this returns.
//
// A condition is reported when it starts, again every `repeat_every` checks
// while it lasts, and once when it ends, so that a job that stays imbalanced
// for hours does not fill its log. The P99 is of the steps since the last
// check (all env workers' histograms merged), and only once `min_steps`
// steps arrived, so one slow step in a quiet minute does not count.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moerl/telemetry/metrics.h"

namespace moerl::telemetry {

struct MetricWarningOptions {
  double imbalance_ratio = 2.0;  // [telemetry] imbalance_warn_ratio
  double env_p99_s = 0.5;        // [telemetry] env_p99_warn_s
  std::uint64_t min_steps = 20;
  int repeat_every = 100;
};

struct MetricWarning {
  bool started = true;  // false: the condition ended (log at info)
  std::string message;
};

class MetricWarnings {
 public:
  explicit MetricWarnings(MetricWarningOptions options) : options_(options) {}
  std::vector<MetricWarning> check(const std::map<int, MetricsSnapshot>& latest);

 private:
  struct Condition {
    bool active = false;
    int checks_since_report = 0;
  };
  // Reports `key`'s state change (or its repeat) into `out`.
  void note(const std::string& key, bool holds, const std::string& when_on, const std::string& when_off,
            std::vector<MetricWarning>& out);
  void check_imbalance(const std::map<int, MetricsSnapshot>& latest, std::vector<MetricWarning>& out);
  void check_env_latency(const std::map<int, MetricsSnapshot>& latest, std::vector<MetricWarning>& out);

  MetricWarningOptions options_;
  std::map<std::string, Condition> conditions_;
  std::map<std::string, Histogram> env_latency_seen_;  // family -> merged histogram at the last check
};

}  // namespace moerl::telemetry
