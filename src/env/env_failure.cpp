#include "moerl/env/env_failure.h"

namespace moerl::env {

const char* failure_reason_name(FailureReason reason) {
  switch (reason) {
    case FailureReason::FailureNone: return "none";
    case FailureReason::FailureTimeout: return "timeout";
    case FailureReason::FailureCrashed: return "crashed";
    case FailureReason::FailureInvalidJson: return "invalid_json";
    case FailureReason::FailureWrongId: return "wrong_id";
    case FailureReason::FailureMissingField: return "missing_field";
    case FailureReason::FailureRefused: return "refused";
    case FailureReason::FailureInvalidReward: return "invalid_reward";
    case FailureReason::FailureCannotStart: return "cannot_start";
    case FailureReason::FailureRejected: return "rejected";
    case FailureReason::FailureNoReply: return "no_reply";
  }
  return "unknown";
}

std::optional<FailureReason> failure_reason_from_name(const std::string& name) {
  for (std::uint8_t value = 0; value <= kMaxFailureReason; ++value) {
    const auto reason = static_cast<FailureReason>(value);
    if (name == failure_reason_name(reason)) return reason;
  }
  return std::nullopt;
}

}  // namespace moerl::env
