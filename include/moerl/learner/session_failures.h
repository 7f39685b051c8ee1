#pragma once
// Learner 0's books on environment sessions that failed for good, and the
// circuit breaker that pauses a family whose sessions keep failing.
//
// Why a breaker: a family whose environment is down (a crashed service, a
// bad command) would otherwise take a share of every step's groups and give
// nothing back but retries. It opens on `failures_to_pause` consecutive
// failed sessions of one family as one actor saw them (every actor counts
// its own streak, so the decision needs no success reports from the other
// learners' groups), stays open for the cooldown, then lets sessions through
// again; a family still broken trips it at its next failure, since the
// actors' streaks only reset on a session that completes.

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"
#include "moerl/env/env_failure.h"

namespace moerl::learner {

// Sessions that failed for good, per family and reason.
class FailureTally {
 public:
  void add(const std::string& family, const std::string& reason, std::int64_t count = 1);
  void add(const FailureTally& other);
  std::int64_t total() const;
  std::int64_t of(const std::string& family) const;
  const std::map<std::string, std::map<std::string, std::int64_t>>& by_family() const { return counts_; }
  // {"family": {"reason": count, ...}, ...}
  void write_json(JsonWriter& json) const;
  static FailureTally from_json(const JsonValue& value);  // throws JsonError
  // "guess 12 (timeout 12), sort 1 (crashed 1)"; "none" when empty.
  std::string describe() const;

 private:
  std::map<std::string, std::map<std::string, std::int64_t>> counts_;
};

class FamilyBreaker {
 public:
  FamilyBreaker(std::int64_t failures_to_pause, double cooldown_s);

  // A failure record of `family` whose actor has now seen `streak` failures
  // in a row. True when this record opened the breaker (the family is paused
  // from `now` for the cooldown).
  bool on_failure(const std::string& family, std::int32_t streak, const std::string& error, double now);
  bool is_paused(const std::string& family, double now) const;
  std::set<std::string> paused(double now) const;
  // The error of the record that last paused `family`.
  std::string last_error(const std::string& family) const;
  std::int64_t pauses() const { return pauses_; }

 private:
  struct State {
    double paused_until = 0;
    std::string error;
  };
  std::int64_t failures_to_pause_;
  double cooldown_s_;
  std::map<std::string, State> families_;
  std::int64_t pauses_ = 0;
};

}  // namespace moerl::learner
