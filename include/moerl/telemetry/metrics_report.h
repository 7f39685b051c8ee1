#pragma once
// Carrying metrics snapshots to learner 0 and writing them out. Each rank
// sends a MetricsReport every [telemetry] metrics_interval_s; learner 0 keeps
// the latest per rank and appends one JSON line per step to the run's
// metrics file:
//
//   {"step": 12, "time": 1764420000.5, "time_ms": 1764420000512,
//    "roles": {"actor": {"ranks": 2, "counters": {...}, "gauges": {...},
//                        "histograms": {"x": {"count":..,"mean":..,"p50":..,"p90":..,"p99":..,"max":..}}}},
//    "ranks": [{"rank": 0, "role": "learner", "counters": {...}, ...}, ...]}
//
// Role aggregates sum counters, average gauges and merge histograms.

#include <fstream>
#include <map>
#include <string>

#include "moerl/runtime/message.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::telemetry {

struct MetricsReport {
  static constexpr runtime::MessageType kType = runtime::MessageType::MetricsReport;
  MetricsSnapshot snapshot;
  void encode(runtime::ByteWriter& w) const;
  static MetricsReport decode(runtime::ByteReader& r);
};

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

// A resumed run writes the steps after its checkpoint again: keeps the lines
// of `path` whose "step" is at most `step` (a line that does not parse is
// dropped too) and returns how many were dropped. Rewrites the file through a
// temporary name and a rename; a missing file is left missing.
std::int64_t keep_lines_through_step(const std::string& path, std::int64_t step);

// Appends lines to a JSON-lines file, flushing each so a crash loses nothing written.
class JsonLinesFile {
 public:
  explicit JsonLinesFile(const std::string& path);  // creates parent directories
  void append(const std::string& line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream file_;
};

}  // namespace moerl::telemetry

namespace moerl::runtime {
class Mailbox;
}

namespace moerl::telemetry {

// The gauge process.resident_bytes: this process's resident memory now.
void record_resident_memory();

// Sends this rank's metrics snapshot to learner 0 every [telemetry]
// metrics_interval_s; role loops call maybe_send() between units of work.
class MetricsReporter {
 public:
  MetricsReporter(runtime::Mailbox& mailbox, double interval_s, int coordinator_rank = 0);
  void maybe_send();
  void send_now();

 private:
  runtime::Mailbox& mailbox_;
  double interval_s_;
  int coordinator_;
  double next_at_ = 0;
};

}  // namespace moerl::telemetry
