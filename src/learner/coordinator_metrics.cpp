// Learner 0's Prometheus page and the log warnings that watch the same
// metrics (learner/coordinator.h).
#include <spdlog/spdlog.h>

#include "moerl/learner/coordinator.h"
#include "moerl/telemetry/resident_memory.h"
#include "moerl/telemetry/prometheus_text.h"

namespace moerl::learner {

std::string Coordinator::prometheus_page() const {
  std::map<int, telemetry::MetricsSnapshot> snapshots;
  std::set<int> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshots = aggregator_.latest();
    released = gone_by_release_;
  }
  // Learner 0's own metrics as of this scrape, not of its last step.
  telemetry::record_resident_memory();
  snapshots[world_.rank()] = telemetry::metrics().snapshot();
  std::vector<telemetry::PrometheusSample> extra;
  if (heartbeat_)
    for (const runtime::HeartbeatThread::RankAge& age : heartbeat_->rank_ages()) {
      // A released env worker left on purpose: nothing of it to watch.
      if (released.count(age.rank)) {
        snapshots.erase(age.rank);
        continue;
      }
      const telemetry::PrometheusLabels labels = {{"rank", std::to_string(age.rank)},
                                                  {"role", runtime::role_name(age.role)}};
      extra.push_back({"moerl_rank_up", "1 while the rank is part of the job, 0 once it was declared lost.", labels,
                       age.lost ? 0.0 : 1.0});
      // A lost rank's last metrics would look current for ever (an actor
      // behind for good, a heartbeat age that pages for the rest of a job
      // that failed over): its series end with it; moerl_rank_up says so.
      if (age.lost) {
        snapshots.erase(age.rank);
        continue;
      }
      extra.push_back({"moerl_rank_heartbeat_age_seconds", "Since learner 0 last heard a heartbeat of the rank.",
                       labels, age.silent_s});
    }
  return telemetry::render_exposition(snapshots, extra);
}

void Coordinator::log_metric_warnings() {
  for (const telemetry::MetricWarning& warning : metric_warnings_.check(aggregator_.latest())) {
    if (warning.started)
      spdlog::warn("{}", warning.message);
    else
      spdlog::info("{}", warning.message);
  }
}

}  // namespace moerl::learner
