#pragma once
// Carrying metrics snapshots to learner 0: the MetricsReport wire message and
// the MetricsReporter that sends this rank's snapshot every [telemetry]
// metrics_interval_s. Learner 0 keeps the latest per rank
// (telemetry/metrics_aggregator.h) and writes them out
// (telemetry/metrics_file.h, the Prometheus page).

#include "moerl/runtime/message.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::runtime {

class Mailbox;

struct MetricsReport {
  static constexpr MessageType kType = MessageType::MetricsReport;
  telemetry::MetricsSnapshot snapshot;
  void encode(ByteWriter& w) const;
  static MetricsReport decode(ByteReader& r);  // throws WireError on an inconsistent histogram
};

// Role loops call maybe_send() between units of work; learner 0 itself only
// records its resident memory (it reads its own registry).
class MetricsReporter {
 public:
  MetricsReporter(Mailbox& mailbox, double interval_s, int coordinator_rank = 0);
  void maybe_send();
  void send_now();
  // Sends at once unless a report already went out: a rank calls it when it
  // first has work to show (an actor's first shipped episode), so that a job
  // shorter than one interval still finds the rank in learner 0's per-step
  // metrics lines.
  void send_first_news();

 private:
  Mailbox& mailbox_;
  double interval_s_;
  int coordinator_;
  double next_at_ = 0;
  bool sent_any_ = false;
};

}  // namespace moerl::runtime
