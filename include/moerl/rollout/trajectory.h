#pragma once
// What actors send learners: finished episodes, and the work protocol
// between actors and learner 0 (actors ask for work, learner 0 hands out
// task groups). Plain vectors, no tensors: these cross the wire.

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/env/env_failure.h"
#include "moerl/env/environment.h"
#include "moerl/runtime/message.h"

namespace moerl::rollout {

// One GRPO group: `size` episodes of the same task (same family and seed),
// sampled independently.
struct TaskGroup {
  std::uint64_t group_id = 0;
  env::TaskSpec task;
  std::int32_t size = 1;
  bool evaluation = false;       // not trained on; reported in the before/after table
  bool greedy = false;           // an evaluation played at temperature 0 (rollout.eval_greedy)
  std::int64_t min_version = 0;  // the actor starts it only with weights at least this new
};

struct WorkRequest {
  static constexpr runtime::MessageType kType = runtime::MessageType::WorkRequest;
  std::int32_t free_slots = 0;  // episodes the actor could start now
  // Groups whose every episode (or failure record) the actor has sent since
  // its last request: learner 0 stops counting them as the actor's if it is lost.
  std::vector<std::uint64_t> delivered;
  // The actor's last word after `finished`: every episode it will ever send
  // was sent before this message (free_slots is 0, nothing is asked).
  bool done_sending = false;
  void encode(runtime::ByteWriter& w) const;
  static WorkRequest decode(runtime::ByteReader& r);
};

struct TaskAssignment {
  static constexpr runtime::MessageType kType = runtime::MessageType::TaskAssignment;
  std::vector<TaskGroup> groups;
  bool finished = false;  // no more work will come: the actor drains and stops
  void encode(runtime::ByteWriter& w) const;
  static TaskAssignment decode(runtime::ByteReader& r);
};

// A finished episode. tokens is the whole context the actor fed its model,
// in order; generated[i] = 1 where the policy sampled tokens[i]. When the
// actor rebuilt the context to fit its budget (rollout.context_policy =
// "drop_oldest_turns"), tokens holds one context window after the other:
// window w starts at window_starts[w - 1] (window 0 at 0) and begins again
// from position 0 with the task statement and the newest turns, re-fed as
// tokens that are not generated (they were trained on in their first
// window). The learner scores every window as a sequence of its own.
struct Trajectory {
  static constexpr runtime::MessageType kType = runtime::MessageType::Trajectory;
  std::uint64_t episode_id = 0;
  std::uint64_t group_id = 0;
  std::int32_t actor = -1;
  env::TaskSpec task;
  bool evaluation = false;
  std::vector<std::int32_t> tokens;         // [n]
  std::vector<std::uint8_t> generated;      // [n]
  std::vector<float> behaviour_logprobs;    // [n]; 0 where not generated
  std::vector<std::int32_t> versions;       // [n]; policy version that produced the token, -1 if not generated
  std::vector<std::int32_t> window_starts;  // token index of each context window after the first; increasing
  std::vector<std::uint8_t> routing;        // [(n - windows) * moe_layers * top_k] experts of every fed position
  std::int32_t moe_layers = 0;
  std::int32_t top_k = 0;
  std::vector<float> turn_rewards;  // reward of each environment step
  double reward = 0;                // sum of turn rewards
  bool success = false;
  bool truncated = false;          // the context budget ended it
  std::int32_t dropped_turns = 0;  // turns dropped from the context to fit the budget (it went on)
  double wall_s = 0;               // open to close
  // A session that failed for good (its environment used up its retries, or
  // the env worker never answered) travels as a failure record: the arrays
  // are empty, learners count it and leave it (and its share of the group
  // statistics) out of training.
  env::FailureReason failure = env::FailureReason::FailureNone;
  std::string error;                  // the last error, naming the session and environment
  std::int32_t failure_turn = 0;      // environment turns completed before the failure
  std::int32_t failure_attempts = 0;  // attempts of the request that failed
  std::int32_t failure_streak = 0;    // the actor's consecutive failed sessions of this family, this one included
  bool failed() const { return failure != env::FailureReason::FailureNone; }
  std::int32_t turns() const { return static_cast<std::int32_t>(turn_rewards.size()); }
  std::int32_t min_version() const;  // oldest version among generated tokens (-1 if none)
  std::int32_t windows() const { return static_cast<std::int32_t>(window_starts.size()) + 1; }
  // [begin, end) of context window w (0 <= w < windows()).
  std::pair<size_t, size_t> window(std::int32_t w) const;

  void encode(runtime::ByteWriter& w) const;
  // Checks the arrays agree in length, and that a failure record carries no tokens.
  static Trajectory decode(runtime::ByteReader& r);
};

}  // namespace moerl::rollout
