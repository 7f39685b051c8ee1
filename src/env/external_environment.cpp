#include "moerl/env/external_environment.h"

#include <atomic>

#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"
#include "moerl/core/utf8.h"
#include "moerl/runtime/wire.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::env {
namespace {

std::atomic<std::uint64_t> g_session_counter{0};

const char* shaping_name(RewardShaping shaping) { return shaping == RewardShaping::Shaped ? "shaped" : "sparse"; }

}  // namespace

// A validated answer. Field accessors turn a missing or mistyped field into
// an ExternalEnvError that names the process and the request.
class ExternalEnvironment::Answer {
 public:
  Answer(JsonValue value, std::string context, std::size_t utf8_repairs)
      : value_(std::move(value)), context_(std::move(context)), utf8_repairs_(utf8_repairs) {}
  template <typename F>
  auto guarded(F&& read) const -> decltype(read()) {
    try {
      return read();
    } catch (const JsonError& error) {
      throw ExternalEnvError(FailureReason::FailureMissingField, context_ + " with wrong fields: " + error.what());
    }
  }
  std::string text(const char* key) const {
    return guarded([&] { return value_.at(key).as_string(); });
  }
  double number(const char* key) const {
    return guarded([&] { return value_.at(key).as_number(); });
  }
  bool flag(const char* key) const {
    return guarded([&] { return value_.at(key).as_bool(); });
  }
  bool has(const char* key) const { return value_.find(key).has_value(); }
  std::optional<JsonValue> find(const char* key) const { return value_.find(key); }
  // An answer that carries an observation: counts it in env.invalid_utf8.external
  // when its line held ill-formed UTF-8 (replaced by U+FFFD before parsing).
  void count_invalid_utf8() const {
    if (utf8_repairs_ > 0) telemetry::metrics().add("env.invalid_utf8.external");
  }

 private:
  JsonValue value_;
  std::string context_;
  std::size_t utf8_repairs_ = 0;
};

ExternalEnvironment::ExternalEnvironment(ExternalEnvOptions options) : options_(std::move(options)) {}

ExternalEnvironment::~ExternalEnvironment() {
  if (process_) {
    try {
      JsonWriter line;
      line.begin_object().key("id").value(0).key("op").value("close").key("session").value(session_).end_object();
      process_->write_line(line.str());
    } catch (const std::exception&) {
      // Already gone: the destructor of process_ reaps it either way.
    }
  }
}

void ExternalEnvironment::interrupt() {
  if (process_) process_->kill();
}

ExternalEnvironment::Answer ExternalEnvironment::request(const std::string& op, const Fields& fields,
                                                         double timeout_s) const {
  if (!process_) throw ExternalEnvError(FailureReason::FailureCrashed, "external environment used before open()");
  const std::uint64_t id = next_request_id_++;
  JsonWriter message;
  message.begin_object()
      .key("id")
      .value(static_cast<std::int64_t>(id))
      .key("op")
      .value(op)
      .key("session")
      .value(session_);
  if (fields) fields(message);
  message.end_object();
  const std::string& line = message.str();
  const std::string who =
      "external environment '" + options_.command + "' (pid " + std::to_string(process_->pid()) + ")";
  try {
    process_->write_line(line);
    const std::optional<std::string> reply = process_->read_line(timeout_s);
    if (!reply)
      throw ExternalEnvError(FailureReason::FailureTimeout,
                             who + " did not answer '" + op + "' within " + std::to_string(timeout_s) + " s");
    // stdout carries protocol lines only: a debug print there is an invalid answer (docs/external_env.md).
    // JSON text is UTF-8 (nlohmann refuses anything else), while an observation
    // may hold any bytes: each ill-formed sequence becomes U+FFFD (docs/external_env.md).
    const Utf8Repair text = repair_utf8(*reply);
    JsonValue value;
    try {
      value = JsonValue::parse(text.text, JsonNumbers::JsonNumbersPythonNonFinite);
    } catch (const JsonError& error) {
      throw ExternalEnvError(FailureReason::FailureInvalidJson, who + " answered '" + op + "' with invalid JSON (" +
                                                                    error.what() + "): " + reply->substr(0, 200));
    }
    if (!value.is_object())
      throw ExternalEnvError(FailureReason::FailureInvalidJson, who + " answered '" + op + "' with a non-object");
    if (value.at("id").as_number() != static_cast<double>(id))
      throw ExternalEnvError(FailureReason::FailureWrongId, who + " answered request " + std::to_string(id) + " ('" +
                                                                op + "') with the id of another");
    if (!value.at("ok").as_bool()) {
      const std::optional<JsonValue> error = value.find("error");
      throw ExternalEnvError(
          FailureReason::FailureRefused,
          who + " refused '" + op + "': " + (error ? error->as_string() : std::string("no error text")));
    }
    return Answer(std::move(value), who + " answered '" + op + "'", text.replacements);
  } catch (const JsonError& error) {
    throw ExternalEnvError(FailureReason::FailureMissingField,
                           who + " answered '" + op + "' with wrong fields: " + error.what());
  } catch (const ProcessError& error) {
    throw ExternalEnvError(error.reason(), error.what());
  }
}

std::string ExternalEnvironment::open(const TaskSpec& task) {
  process_ = std::make_unique<ChildProcess>(options_.command);
  session_ = "s" + std::to_string(g_session_counter.fetch_add(1));
  done_ = success_ = false;
  turns_ = 0;
  const Answer answer = request(
      "open",
      [&](JsonWriter& fields) {
        fields.key("family")
            .value(task.family)
            .key("difficulty")
            .value(task.difficulty)
            .key("seed")
            .value(static_cast<std::int64_t>(task.seed))
            .key("shaping")
            .value(shaping_name(task.shaping))
            .key("max_turns")
            .value(task.max_turns);
      },
      options_.startup_timeout_s);
  max_turns_ = answer.has("max_turns") ? static_cast<int>(answer.number("max_turns")) : task.max_turns;
  std::string observation = answer.text("observation");
  answer.count_invalid_utf8();
  return observation;
}

StepResult ExternalEnvironment::step(const std::string& action) {
  if (done_) throw ExternalEnvError(FailureReason::FailureRefused, "step on a finished external session");
  const std::string text = repair_utf8(action).text;
  const Answer answer = request(
      "step", [&](JsonWriter& fields) { fields.key("action").value(text); }, options_.request_timeout_s);
  StepResult result;
  result.observation = answer.text("observation");
  result.reward = answer.number("reward");
  result.done = answer.flag("done");
  answer.count_invalid_utf8();
  if (const std::optional<JsonValue> info = answer.find("info")) {
    answer.guarded([&] {
      for (const auto& [key, value] : info->as_object()) result.info[key] = value.as_string();
      return 0;
    });
  }
  ++turns_;
  done_ = result.done;
  if (answer.has("success")) success_ = answer.flag("success");
  result.info["success"] = success_ ? "1" : "0";
  return result;
}

std::vector<std::uint8_t> ExternalEnvironment::snapshot() const {
  const Answer answer = request("snapshot", nullptr, options_.request_timeout_s);
  runtime::ByteWriter w;
  w.put_string("external-v1");
  w.put<std::int32_t>(turns_);
  w.put<std::int32_t>(max_turns_);
  w.put<std::uint8_t>(done_);
  w.put<std::uint8_t>(success_);
  w.put_string(answer.text("state"));
  return w.take();
}

void ExternalEnvironment::restore(const std::vector<std::uint8_t>& bytes) {
  runtime::ByteReader r(bytes);
  try {
    if (r.get_string() != "external-v1")
      throw ExternalEnvError(FailureReason::FailureCrashed, "not an external-environment snapshot");
    const int turns = r.get<std::int32_t>();
    const int max_turns = r.get<std::int32_t>();
    const bool done = r.get<std::uint8_t>() != 0;
    const bool success = r.get<std::uint8_t>() != 0;
    const std::string state = r.get_string();
    r.expect_end();
    request(
        "restore", [&](JsonWriter& fields) { fields.key("state").value(state); }, options_.request_timeout_s);
    turns_ = turns;
    max_turns_ = max_turns;
    done_ = done;
    success_ = success;
  } catch (const runtime::WireError& error) {
    throw ExternalEnvError(FailureReason::FailureCrashed,
                           std::string("corrupt external-environment snapshot: ") + error.what());
  }
}

std::string ExternalEnvironment::expert_action(double error_rate, std::uint64_t seed) const {
  return request(
             "expert",
             [&](JsonWriter& fields) {
               fields.key("error_rate").value(error_rate);
               fields.key("seed").value(static_cast<std::int64_t>(seed & ((1ull << 53) - 1)));
             },
             options_.request_timeout_s)
      .text("action");
}

}  // namespace moerl::env
