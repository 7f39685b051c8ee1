#pragma once
// Private helpers shared by the built-in task families: a portable PRNG,
// action parsing, and FamilySession, the base that owns the bookkeeping every
// family shares (turn budget, done/success, reward shaping, the snapshot
// container). A family only supplies task generation, one-action semantics,
// its expert, and the encoding of its dynamic state.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moerl/env/environment.h"
#include "moerl/runtime/wire.h"

namespace moerl::env::detail {

// splitmix64 (Steele, Lea, Flood 2014) as a stream generator. Chosen over
// <random> distributions because their output differs between standard
// libraries, and sessions must replay identically on every node.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  // Uniform in [0, n) without modulo bias; n must be > 0.
  std::uint64_t below(std::uint64_t n);
  // Uniform in [lo, hi] (inclusive).
  std::int64_t range(std::int64_t lo, std::int64_t hi);
  // Uniform double in [0, 1).
  double unit();
  // True with probability p (p <= 0 never, p >= 1 always).
  bool chance(double p);

 private:
  std::uint64_t state_;
};

// A well-mixed seed from several inputs (family tag, difficulty, task seed).
std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b);
std::uint64_t hash_text(const std::string& text);

// An action split into a lower-case verb and whitespace-separated arguments.
// Leading/trailing whitespace (including newlines) is ignored; a trailing ':'
// on the verb is dropped ("answer: 12").
struct Action {
  std::string verb;
  std::vector<std::string> args;
  std::string rest;  // everything after the verb, trimmed (for `calc <expr>`)
};
Action parse_action(const std::string& text);

// Strict decimal integer: optional sign, digits only, no overflow.
std::optional<std::int64_t> parse_int(const std::string& text);

// A short, printable-ASCII rendering of agent text for error messages.
std::string quote(const std::string& text, size_t max_len = 16);

// Actions longer than this are refused without parsing.
inline constexpr size_t kMaxActionBytes = 1024;

// What a family's apply() reports for one action.
struct Outcome {
  std::string observation;
  double progress_reward = 0.0;  // shaped component (ignored under Sparse)
  bool invalid = false;
  bool finished = false;  // the action ends the episode (answer given, goal reached, ...)
  bool success = false;   // only meaningful when finished
  std::vector<std::pair<std::string, std::string>> info;
};

// Shaped rewards of invalid actions: a small, uniform penalty in every family.
inline constexpr double kInvalidPenalty = -0.01;
inline constexpr double kSuccessReward = 1.0;

Outcome invalid(const std::string& why);

class FamilySession : public Environment {
 public:
  std::string open(const TaskSpec& task) final;
  StepResult step(const std::string& action) final;
  std::vector<std::uint8_t> snapshot() const final;
  void restore(const std::vector<std::uint8_t>& bytes) final;
  std::string expert_action(double error_rate, std::uint64_t seed) const final;

  bool done() const final { return done_; }
  bool succeeded() const final { return success_; }
  int turns_taken() const final { return turns_; }
  int max_turns() const final { return max_turns_; }

 protected:
  FamilySession(std::string family, std::uint32_t format_version, int max_difficulty);

  // Builds the task for spec().difficulty from a generator seeded by the
  // spec; must be a pure function of (difficulty, rng) and reset all state.
  virtual void generate(Rng& rng) = 0;
  virtual int default_max_turns() const = 0;
  // The first observation: the task and the action syntax.
  virtual std::string intro() const = 0;
  // What the intro does not show of the task (a hidden target, the maze
  // layout): hashed with the intro into the snapshot's task digest.
  virtual std::string hidden_task() const { return {}; }
  virtual Outcome apply(const Action& action) = 0;
  // The optimal action, and a plausible mistake drawn from `rng`.
  virtual std::string expert_best() const = 0;
  virtual std::string expert_mistake(Rng& rng) const = 0;
  // Dynamic state only: the static task is regenerated from the spec and
  // checked against a digest of the intro.
  virtual void save_state(runtime::ByteWriter& out) const = 0;
  // Must validate every field (throw via snapshot_check) before use.
  virtual void load_state(runtime::ByteReader& in) = 0;

  const TaskSpec& spec() const { return spec_; }
  const std::string& family() const { return family_; }
  [[noreturn]] void snapshot_error(const std::string& what) const;
  void snapshot_check(bool condition, const std::string& what) const {
    if (!condition) snapshot_error(what);
  }

 private:
  void start(const TaskSpec& task);
  void decode(const std::vector<std::uint8_t>& bytes);

  std::string family_;
  std::uint32_t format_version_;
  int max_difficulty_;
  TaskSpec spec_;
  bool opened_ = false;
  bool done_ = false;
  bool success_ = false;
  int turns_ = 0;
  int max_turns_ = 0;
  std::uint64_t task_digest_ = 0;
};

}  // namespace moerl::env::detail
