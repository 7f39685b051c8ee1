#pragma once
// Learner 0's view of every rank's metrics: the latest snapshot per rank (as
// MetricsReport messages bring them), aggregated per role, and the JSON line
// per step that the run's metrics file holds:
//
//   {"step": 12, "time": 1764420000.5, "time_ms": 1764420000512,
//    "roles": {"actor": {"ranks": 2, "counters": {...}, "gauges": {...},
//                        "histograms": {"x": {"count":..,"mean":..,"p50":..,"p90":..,"p99":..,"max":..}}}},
//    "ranks": [{"rank": 0, "role": "learner", "counters": {...}, ...}, ...]}
//
// Role aggregates sum counters, average gauges and merge histograms.

#include <cstdint>
#include <map>
#include <string>

#include "moerl/telemetry/metrics.h"

namespace moerl::telemetry {

class MetricsAggregator {
 public:
  void update(const MetricsSnapshot& snapshot);
  size_t ranks_reported() const { return latest_.size(); }
  const std::map<int, MetricsSnapshot>& latest() const { return latest_; }
  // Aggregates of the latest snapshots, per role.
  std::map<std::string, MetricsSnapshot> by_role() const;
  std::string json_line(std::int64_t step) const;

 private:
  std::map<int, MetricsSnapshot> latest_;
};

}  // namespace moerl::telemetry
