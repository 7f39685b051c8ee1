#pragma once
// The receiving thread of a learner other than learner 0 (learner 0's
// Coordinator does this for it): takes the training episodes of this
// learner's groups into its EpisodeInbox while the learner computes, drops
// malformed messages (a failure once one rank sent too many), and sends this
// rank's metrics reports to learner 0.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "moerl/learner/episode_inbox.h"
#include "moerl/runtime/malformed_messages.h"
#include "moerl/runtime/world.h"
#include "moerl/runtime/metrics_report.h"

namespace moerl::config {
struct Config;
}  // namespace moerl::config

namespace moerl::learner {

struct EpisodeReceiverSettings {
  std::int64_t malformed_message_limit = 5;  // [cluster]: from one rank, before the job stops
  double metrics_interval_s = 5.0;           // [telemetry]: how often this rank reports to learner 0
};

EpisodeReceiverSettings episode_receiver_settings(const config::Config& config);

class EpisodeReceiver {
 public:
  EpisodeReceiver(const EpisodeReceiverSettings& settings, const runtime::World& world, runtime::Mailbox& mailbox,
                  EpisodeInbox& inbox);
  ~EpisodeReceiver();  // stops the thread
  EpisodeReceiver(const EpisodeReceiver&) = delete;
  EpisodeReceiver& operator=(const EpisodeReceiver&) = delete;

  // A reason to stop the job (too many malformed messages from one rank), once.
  std::optional<std::string> take_failure();

 private:
  void loop();
  void receive_once();

  const runtime::World& world_;
  runtime::Mailbox& mailbox_;
  EpisodeInbox& inbox_;
  runtime::MalformedMessages malformed_;
  runtime::MetricsReporter reporter_;
  std::mutex mutex_;
  std::optional<std::string> failure_;
  bool failure_taken_ = false;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace moerl::learner
