#include "moerl/learner/episode_receiver.h"

#include <chrono>

#include "moerl/config/config.h"
#include "moerl/runtime/failover_messages.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {

EpisodeReceiverSettings episode_receiver_settings(const config::Config& config) {
  EpisodeReceiverSettings settings;
  settings.malformed_message_limit = config.cluster.malformed_message_limit;
  settings.metrics_interval_s = config.telemetry.metrics_interval_s;
  return settings;
}

EpisodeReceiver::EpisodeReceiver(const EpisodeReceiverSettings& settings, const runtime::World& world,
                                 runtime::Mailbox& mailbox, EpisodeInbox& inbox)
    : world_(world),
      mailbox_(mailbox),
      inbox_(inbox),
      malformed_(world.layout(), settings.malformed_message_limit, world.role_label()),
      reporter_(mailbox, settings.metrics_interval_s) {
  thread_ = std::thread([this] { loop(); });
}

EpisodeReceiver::~EpisodeReceiver() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void EpisodeReceiver::loop() {
  while (!stopping_) {
    try {
      receive_once();
    } catch (const std::exception& error) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = world_.role_label() + "'s episode receiver failed: " + error.what();
      inbox_.notify();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void EpisodeReceiver::receive_once() {
  reporter_.maybe_send();
  // A lost actor's groups: cancel those not complete; learner 0 replaces them.
  while (auto cancel = mailbox_.try_receive<runtime::GroupsCancelled>(runtime::RankLayout::kCoordinatorRank)) {
    runtime::GroupsCancelledReply reply;
    reply.lost_rank = cancel->second.lost_rank;
    reply.cancelled = inbox_.cancel_incomplete(cancel->second.groups);
    mailbox_.send(runtime::RankLayout::kCoordinatorRank, reply);
  }
  for (;;) {
    std::optional<std::pair<int, rollout::Trajectory>> message;
    try {
      message = mailbox_.try_receive<rollout::Trajectory>();
    } catch (const runtime::MessageError& error) {
      telemetry::metrics().add("learner.malformed_messages");
      inbox_.lost_in_malformed_message();
      if (auto stop = malformed_.drop(error)) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failure_) failure_ = *stop;
        inbox_.notify();
      }
      continue;
    }
    if (!message) return;
    rollout::Trajectory& episode = message->second;
    const auto learner = static_cast<std::uint64_t>(world_.role_index());
    const auto learners = static_cast<std::uint64_t>(world_.layout().count(runtime::Role::Learner));
    if (episode.evaluation || episode.group_id % learners != learner) {
      const std::string what = episode.evaluation ? "an evaluation episode (they go to learner 0)"
                                                  : "an episode of group " + std::to_string(episode.group_id);
      if (auto stop = malformed_.drop(runtime::MessageError(
              what + " from rank " + std::to_string(message->first) + " reached " + world_.role_label(),
              message->first))) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failure_) failure_ = *stop;
      }
      continue;
    }
    inbox_.add(std::move(episode), runtime::monotonic_seconds());
  }
}

std::optional<std::string> EpisodeReceiver::take_failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_ || failure_taken_) return std::nullopt;
  failure_taken_ = true;
  return failure_;
}

}  // namespace moerl::learner
