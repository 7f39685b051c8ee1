#pragma once
// Why an environment attempt, and in the end a session, failed. A small fixed
// vocabulary: counters per (family, reason) stay few and mean the same in
// every run, and docs/external_env.md says what each one costs.

#include <cstdint>
#include <optional>
#include <string>

#include "moerl/core/error.h"

namespace moerl::env {

enum class FailureReason : std::uint8_t {
  FailureNone = 0,
  FailureTimeout = 1,        // no answer within [env] timeout_s ([env.external] startup_timeout_s for open)
  FailureCrashed = 2,        // the process exited or closed its pipes; a built-in environment threw
  FailureInvalidJson = 3,    // a line that is not one JSON object (a debug print on stdout is one)
  FailureWrongId = 4,        // an answer echoing another request's id
  FailureMissingField = 5,   // a required answer field missing or of the wrong type
  FailureRefused = 6,        // the environment answered {"ok": false}
  FailureInvalidReward = 7,  // a reward that is not finite or lies outside [env] reward_min..reward_max
  FailureCannotStart = 8,    // the command could not be started
  FailureRejected = 9,       // the env worker refused the request (at capacity, unknown session)
  FailureNoReply = 10,       // the actor heard nothing from the env worker within its deadline
};
constexpr std::uint8_t kMaxFailureReason = 10;

// "timeout", "crashed", "invalid_json", ...: the names used in metrics and summary.json.
const char* failure_reason_name(FailureReason reason);
std::optional<FailureReason> failure_reason_from_name(const std::string& name);

// An environment failed in a way the env worker retries: the reason says how.
class EnvironmentFailure : public Error {
 public:
  EnvironmentFailure(FailureReason reason, const std::string& what) : Error(what), reason_(reason) {}
  FailureReason reason() const { return reason_; }

 private:
  FailureReason reason_;
};

}  // namespace moerl::env
