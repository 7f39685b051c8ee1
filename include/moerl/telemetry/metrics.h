#pragma once
// The metrics registry every module records into: counters (only go up),
// gauges (last value) and histograms (distributions with p50/p90/p99). One
// registry per process, tagged with the rank and role; snapshots travel to
// learner 0 as MetricsReport messages (runtime/metrics_report.h).
//
// Names are dotted and carry their unit: "rollout.decode_tokens_per_s",
// "env.step_latency_s", "sync.bytes".

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "moerl/telemetry/histogram.h"

namespace moerl::telemetry {

struct MetricsSnapshot {
  std::int32_t rank = -1;
  std::string role;
  double taken_at_s = 0;  // seconds since the Unix epoch
  std::map<std::string, double> counters;
  std::map<std::string, double> gauges;
  std::map<std::string, Histogram> histograms;
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(int rank, std::string role) : rank_(rank), role_(std::move(role)) {}

  void set_identity(int rank, std::string role);
  void add(const std::string& counter, double amount = 1.0);
  void set(const std::string& gauge, double value);
  void record(const std::string& histogram, double value);

  MetricsSnapshot snapshot() const;

 private:
  mutable std::mutex mutex_;  // records come from compute, I/O and heartbeat threads
  int rank_ = -1;
  std::string role_;
  std::map<std::string, double> counters_;
  std::map<std::string, double> gauges_;
  std::map<std::string, Histogram> histograms_;
};

// The process-wide registry.
MetricsRegistry& metrics();

double unix_time_seconds();

}  // namespace moerl::telemetry
