#include "moerl/env/env_release.h"

#include <spdlog/spdlog.h>

#include <cstdlib>

#include "moerl/runtime/exit_record.h"
#include "moerl/runtime/failover_messages.h"
#include "moerl/runtime/logging.h"

namespace moerl::env {

ReleaseOnSignal::ReleaseOnSignal(runtime::Mailbox& mailbox, runtime::StopCoordinator& stop, double answer_timeout_s,
                                 int coordinator_rank)
    : mailbox_(mailbox), stop_(stop), answer_timeout_s_(answer_timeout_s), coordinator_(coordinator_rank) {}

void ReleaseOnSignal::fall_back_to_stop(const std::string& why) {
  settled_ = true;
  stop_.request_stop("signal " + std::to_string(signal_) + " on rank " + std::to_string(mailbox_.rank()) + " (" + why +
                     ")");
}

bool ReleaseOnSignal::released() {
  if (settled_) return false;
  if (signal_ == 0) {
    signal_ = stop_.take_stop_signal();
    if (signal_ == 0) return false;
    asked_at_ = runtime::monotonic_seconds();
    spdlog::warn("env worker: signal {}: asking learner 0 to release this env worker", signal_);
    try {
      mailbox_.send(coordinator_, runtime::EnvReleaseRequest{"signal " + std::to_string(signal_)});
    } catch (const runtime::PeerLostError&) {
      fall_back_to_stop("learner 0 is gone");
    }
    return false;
  }
  if (auto reply = mailbox_.try_receive<runtime::EnvReleaseReply>(coordinator_)) {
    if (reply->second.granted) {
      settled_ = true;
      return true;
    }
    fall_back_to_stop("not released: " + reply->second.refusal);
    return false;
  }
  // Learner 0 stays silent when the whole job is stopping: its Stop comes instead.
  if (runtime::monotonic_seconds() - asked_at_ > answer_timeout_s_)
    fall_back_to_stop("learner 0 did not answer the release request within " +
                      std::to_string(static_cast<int>(answer_timeout_s_)) + " s");
  return false;
}

void leave_job_released(const std::string& role_label) {
  spdlog::warn("{}: released by learner 0: leaving the job (its sessions move to the other env workers)", role_label);
  runtime::flush_logs();
  runtime::exit_with_record(0);
}

}  // namespace moerl::env
