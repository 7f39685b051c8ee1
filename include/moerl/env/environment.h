#pragma once
// One session of one task: the interface every task family implements, the
// built-in ones in-process and `external` through a child process.
//
// A session is deterministic given (family, difficulty, seed) and the actions:
// replaying the same actions reproduces every observation and reward, and
// snapshot() -> restore() on a fresh session continues exactly where the
// original was (the env worker uses this to retry a step after a crash and to
// move a session to another worker or actor).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace moerl::env {

enum class RewardShaping {
  Sparse,  // 1 on success at the end, 0 otherwise
  Shaped,  // small per-step rewards for progress, plus the success reward
};

struct TaskSpec {
  std::string family;  // "arithmetic", "maze", "guess", "sort", "lookup", "external"
  int difficulty = 1;  // 1 (easiest) .. max_difficulty of the family
  std::uint64_t seed = 0;
  RewardShaping shaping = RewardShaping::Sparse;
  int max_turns = 0;  // step budget; 0 = the family's default for the difficulty
};

struct StepResult {
  std::string observation;
  double reward = 0.0;
  bool done = false;
  // Free-form facts for logs and metrics: "invalid" = "1", "success" = "1", ...
  std::map<std::string, std::string> info;
};

class Environment {
 public:
  virtual ~Environment() = default;

  // Starts the session; returns the first observation (the task statement).
  virtual std::string open(const TaskSpec& task) = 0;
  // Applies one action. Malformed or illegal actions return an observation
  // starting "invalid action: " with info["invalid"] = "1", use up one turn,
  // and never throw. Stepping a finished session is an error (throws).
  virtual StepResult step(const std::string& action) = 0;

  virtual std::vector<std::uint8_t> snapshot() const = 0;
  virtual void restore(const std::vector<std::uint8_t>& bytes) = 0;  // throws on bad bytes

  // The scripted expert's next action. With probability error_rate it makes a
  // plausible mistake instead; `seed` makes the choice reproducible.
  virtual std::string expert_action(double error_rate, std::uint64_t seed) const = 0;

  // Makes a step that is running on another thread return soon (with an
  // error). The env worker calls it on a step that exceeded its timeout;
  // an external environment kills its process. In-process families cannot be
  // interrupted and keep the default (their abandoned step finishes on its own).
  virtual void interrupt() {}

  virtual bool done() const = 0;
  virtual bool succeeded() const = 0;  // the family's success check
  virtual int turns_taken() const = 0;
  virtual int max_turns() const = 0;
};

}  // namespace moerl::env
