#pragma once
// The `external` task family: a user program speaking the JSON-lines
// protocol of docs/external_env.md on its stdin/stdout. One process per
// session, started on open(); anything it does wrong (exits, stalls, writes
// invalid JSON, another request's id or wrong fields, refuses) becomes an
// ExternalEnvError with its FailureReason, which the env worker answers by
// restarting the process and replaying the session. Actions are sent as valid
// UTF-8 (ill-formed bytes of the model's text become U+FFFD).

#include <functional>
#include <memory>
#include <string>

#include "moerl/env/child_process.h"
#include "moerl/env/env_failure.h"
#include "moerl/env/environment.h"

namespace moerl {
class JsonWriter;
}

namespace moerl::env {

// Every failure of an external environment, with the reason the env worker
// counts it under (env_failure.h).
class ExternalEnvError : public EnvironmentFailure {
 public:
  using EnvironmentFailure::EnvironmentFailure;
};

struct ExternalEnvOptions {
  std::string command;            // started with /bin/sh -c
  double startup_timeout_s = 10;  // first answer (open) must come by then
  double request_timeout_s = 10;  // every later answer
};

class ExternalEnvironment : public Environment {
 public:
  explicit ExternalEnvironment(ExternalEnvOptions options);
  ~ExternalEnvironment() override;

  std::string open(const TaskSpec& task) override;
  StepResult step(const std::string& action) override;
  std::vector<std::uint8_t> snapshot() const override;
  void restore(const std::vector<std::uint8_t>& bytes) override;
  std::string expert_action(double error_rate, std::uint64_t seed) const override;
  void interrupt() override;
  bool done() const override { return done_; }
  bool succeeded() const override { return success_; }
  int turns_taken() const override { return turns_; }
  int max_turns() const override { return max_turns_; }

 private:
  // Sends one request, {"id", "op", "session"} and what `fields` writes into
  // the object after them, and returns the validated answer object's fields.
  class Answer;
  using Fields = std::function<void(JsonWriter&)>;
  Answer request(const std::string& op, const Fields& fields, double timeout_s) const;

  ExternalEnvOptions options_;
  std::unique_ptr<ChildProcess> process_;
  std::string session_;
  mutable std::uint64_t next_request_id_ = 1;
  bool done_ = false;
  bool success_ = false;
  int turns_ = 0;
  int max_turns_ = 0;
};

}  // namespace moerl::env
