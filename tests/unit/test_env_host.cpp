// The env worker's engine: concurrent sessions, timeouts, retries by replay,
// recorded failures, snapshots that move sessions between hosts, elastic
// capacity, and the external-process family (with a Python environment that
// crashes, hangs or writes garbage on request).

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "moerl/env/child_process.h"
#include "moerl/env/external_environment.h"
#include "moerl/env/session_host.h"
#include "moerl/env/task_family.h"
#include "moerl/telemetry/metrics.h"

using namespace moerl::env;

namespace {

const std::string kReachEnv = std::string("python3 ") + MOERL_SOURCE_DIR + "/examples/external_env/reach_env.py";

SessionHostOptions fast_options() {
  SessionHostOptions options;
  options.threads = 2;
  options.env.timeout_s = 2.0;
  options.env.max_retries = 2;
  options.env.retry_backoff_s = 0.01;
  options.archive_dir = (std::filesystem::temp_directory_path() / "moerl-test-archive").string();
  return options;
}

EnvRequest request(RequestKind kind, std::uint64_t session, std::uint64_t id) {
  EnvRequest r;
  r.kind = kind;
  r.session = session;
  r.request_id = id;
  return r;
}

EnvRequest open_request(std::uint64_t session, const std::string& family, std::uint64_t seed, int difficulty = 2) {
  EnvRequest r = request(RequestKind::Open, session, 1000 + session);
  r.task.family = family;
  r.task.seed = seed;
  r.task.difficulty = difficulty;
  return r;
}

// Waits for the reply to `request_id` (other replies are an error here).
EnvReply await(SessionHost& host, std::uint64_t request_id, double timeout_s = 30) {
  const double give_up = timeout_s;
  double waited = 0;
  while (waited < give_up) {
    for (EnvReply& reply : host.wait(0.05)) {
      REQUIRE(reply.request_id == request_id);
      return reply;
    }
    waited += 0.05;
  }
  FAIL("no reply to request " << request_id << " within " << timeout_s << " s");
  return {};
}

// Plays a whole session through the host with the expert of a mirror env,
// returning observations. The mirror runs the same deterministic task.
std::vector<std::string> play_through_host(SessionHost& host, std::uint64_t session, const TaskSpec& task,
                                           std::vector<int>* attempts = nullptr) {
  EnvRequest open = request(RequestKind::Open, session, 1);
  open.task = task;
  host.submit(open);
  std::vector<std::string> seen{await(host, 1).observation};
  auto mirror = make_builtin_environment(task.family);
  mirror->open(task);
  for (std::uint64_t id = 2; !mirror->done(); ++id) {
    const std::string action = mirror->expert_action(0.2, id);
    mirror->step(action);
    EnvRequest step = request(RequestKind::Step, session, id);
    step.action = action;
    host.submit(step);
    const EnvReply reply = await(host, id);
    REQUIRE(reply.ok);
    seen.push_back(reply.observation);
    if (attempts) attempts->push_back(reply.attempts);
  }
  return seen;
}

std::vector<std::string> play_directly(const TaskSpec& task) {
  auto env = make_builtin_environment(task.family);
  std::vector<std::string> seen{env->open(task)};
  for (std::uint64_t id = 2; !env->done(); ++id) seen.push_back(env->step(env->expert_action(0.2, id)).observation);
  return seen;
}

}  // namespace

TEST_CASE("many sessions of every family run concurrently and match direct play", "[env][host]") {
  SessionHostOptions options = fast_options();
  options.threads = 4;
  SessionHost host(options);
  std::map<std::uint64_t, std::string> family_of;
  std::uint64_t id = 0;
  for (const TaskFamily& family : builtin_families())
    for (int k = 0; k < 8; ++k) {
      family_of[id] = family.name;
      host.submit(open_request(id, family.name, 50 + id));
      ++id;
    }
  // Drive them all with a fixed action each turn until every one is over.
  std::map<std::uint64_t, int> turns;
  size_t finished = 0;
  std::uint64_t next_request = 1;
  while (finished < family_of.size()) {
    const auto replies = host.wait(5.0);
    REQUIRE_FALSE(replies.empty());
    for (const EnvReply& reply : replies) {
      REQUIRE(reply.ok);
      if (reply.done || reply.turn >= 60) {
        ++finished;
        continue;
      }
      EnvRequest step = request(RequestKind::Step, reply.session, ++next_request);
      step.action = "nonsense";  // invalid everywhere: the budget must still end each episode
      host.submit(step);
      ++turns[reply.session];
    }
  }
  CHECK(host.busy_sessions() == 0);
  for (const auto& [session, count] : turns) CHECK(count <= 60);
}

TEST_CASE("a session played through the host equals direct play", "[env][host]") {
  SessionHost host(fast_options());
  for (const TaskFamily& family : builtin_families()) {
    TaskSpec task;
    task.family = family.name;
    task.seed = 7;
    task.difficulty = 2;
    INFO(family.name);
    CHECK(play_through_host(host, std::hash<std::string>{}(family.name), task) == play_directly(task));
  }
}

TEST_CASE("injected crashes and hangs are retried by replay and the session goes on", "[env][host][faults]") {
  SessionHostOptions options = fast_options();
  options.env.timeout_s = 0.3;
  options.faults.env_crash_rate = 0.25;
  options.faults.env_hang_rate = 0.15;
  options.faults.env_hang_s = 1.0;
  options.faults.env_fault_attempts = 1;  // only first attempts fail: every retry succeeds
  options.faults.env_fault_seed = 11;
  SessionHost host(options);
  auto& metrics = moerl::telemetry::metrics();
  const auto before = metrics.snapshot();
  TaskSpec task;
  task.family = "sort";
  task.seed = 3;
  task.difficulty = 3;
  std::vector<int> attempts;
  // Observations equal uninterrupted play: retries replayed the session exactly.
  CHECK(play_through_host(host, 77, task, &attempts) == play_directly(task));
  const int retried = static_cast<int>(std::count_if(attempts.begin(), attempts.end(), [](int a) { return a > 1; }));
  INFO("steps " << attempts.size() << ", retried " << retried);
  CHECK(retried >= 1);
  const auto after = metrics.snapshot();
  auto delta = [&](const std::string& name) {
    const auto a = after.counters.find(name);
    const auto b = before.counters.find(name);
    return (a == after.counters.end() ? 0.0 : a->second) - (b == before.counters.end() ? 0.0 : b->second);
  };
  CHECK(delta("env.retries.sort") == retried);
  CHECK(delta("env.timeouts.sort") >= 0);
}

TEST_CASE("a step that keeps failing ends the session with a recorded error", "[env][host][faults]") {
  SessionHostOptions options = fast_options();
  options.env.max_retries = 2;
  options.faults.env_crash_rate = 1.0;
  options.faults.env_fault_attempts = 100;  // permanent
  SessionHost host(options);
  host.submit(open_request(5, "guess", 1));
  REQUIRE(await(host, 1005).ok);
  EnvRequest step = request(RequestKind::Step, 5, 2);
  step.action = "guess 10";
  host.submit(step);
  const EnvReply reply = await(host, 2);
  CHECK_FALSE(reply.ok);
  CHECK(reply.done);
  CHECK(reply.attempts == 3);
  CHECK_THAT(reply.error, Catch::Contains("session 5: step failed after 3 attempts (crashed): injected crash"));
  CHECK(reply.failure == FailureReason::FailureCrashed);
  // The session is over; further steps are refused, close still works.
  step.request_id = 3;
  host.submit(step);
  CHECK_THAT(await(host, 3).error, Catch::Contains("the session is over"));
  host.submit(request(RequestKind::Close, 5, 4));
  CHECK(await(host, 4).ok);
  CHECK(host.live_sessions() == 0);
}

TEST_CASE("a hung step hits the timeout and a fresh environment takes over", "[env][host][faults]") {
  SessionHostOptions options = fast_options();
  options.env.timeout_s = 0.2;
  options.faults.env_hang_rate = 1.0;
  options.faults.env_hang_s = 2.0;
  options.faults.env_fault_attempts = 1;
  SessionHost host(options);
  host.submit(open_request(9, "lookup", 4));
  REQUIRE(await(host, 1009).ok);
  EnvRequest step = request(RequestKind::Step, 9, 2);
  step.action = "get nothing";
  const auto start = std::chrono::steady_clock::now();
  host.submit(step);
  const EnvReply reply = await(host, 2);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(reply.ok);
  CHECK(reply.attempts == 2);
  CHECK(took < 1.5);  // did not wait out the 2 s hang
}

TEST_CASE("snapshots move a session to another host and it continues identically", "[env][host][snapshot]") {
  SessionHost first(fast_options()), second(fast_options());
  TaskSpec task;
  task.family = "maze";
  task.seed = 21;
  task.difficulty = 3;
  EnvRequest open = request(RequestKind::Open, 1, 1);
  open.task = task;
  first.submit(open);
  REQUIRE(await(first, 1).ok);
  auto mirror = make_builtin_environment("maze");
  mirror->open(task);
  std::uint64_t id = 2;
  for (int k = 0; k < 4; ++k, ++id) {
    EnvRequest step = request(RequestKind::Step, 1, id);
    step.action = mirror->expert_action(0.0, id);
    mirror->step(step.action);
    first.submit(step);
    REQUIRE(await(first, id).ok);
  }
  EnvRequest snap = request(RequestKind::Snapshot, 1, id);
  snap.to_archive = true;
  first.submit(snap);
  const EnvReply snapped = await(first, id++);
  REQUIRE(snapped.ok);
  REQUIRE(std::filesystem::exists(snapped.archive_path));
  const SessionSnapshot decoded = SessionSnapshot::decode(snapped.snapshot);
  CHECK(decoded.actions.size() == 4);

  // Restore on the second host from the archive file, continue both.
  EnvRequest restore = request(RequestKind::Restore, 1, id);
  restore.archive_path = snapped.archive_path;
  second.submit(restore);
  REQUIRE(await(second, id++).ok);
  while (!mirror->done()) {
    EnvRequest step = request(RequestKind::Step, 1, id);
    step.action = mirror->expert_action(0.0, id);
    const StepResult expected = mirror->step(step.action);
    second.submit(step);
    const EnvReply reply = await(second, id++);
    REQUIRE(reply.ok);
    CHECK(reply.observation == expected.observation);
    CHECK(reply.reward == expected.reward);
    CHECK(reply.done == expected.done);
  }
  CHECK(mirror->succeeded());

  auto corrupt = snapped.snapshot;
  corrupt[corrupt.size() / 2] ^= 0x40;
  CHECK_THROWS_WITH(SessionSnapshot::decode(corrupt), Catch::Contains("checksum mismatch"));
}

TEST_CASE("capacity limits new sessions and can change at run time", "[env][host]") {
  SessionHostOptions options = fast_options();
  options.env.sessions_per_worker = 2;
  SessionHost host(options);
  host.submit(open_request(1, "guess", 1));
  host.submit(open_request(2, "guess", 2));
  host.submit(open_request(3, "guess", 3));
  std::map<std::uint64_t, EnvReply> replies;
  while (replies.size() < 3)
    for (EnvReply& r : host.wait(1.0)) replies[r.session] = r;
  CHECK(replies[1].ok);
  CHECK(replies[2].ok);
  CHECK_FALSE(replies[3].ok);
  CHECK_THAT(replies[3].error, Catch::Contains("at capacity (2 sessions"));
  host.set_capacity(3);
  host.submit(open_request(3, "guess", 3));
  CHECK(await(host, 1003).ok);
  EnvRequest unknown = request(RequestKind::Step, 99, 5);
  host.submit(unknown);
  CHECK_THAT(await(host, 5).error, Catch::Contains("session 99: cannot step: no such session"));
}

TEST_CASE("the external family runs the Python example through the host", "[env][external]") {
  SessionHostOptions options = fast_options();
  options.external.command = kReachEnv;
  SessionHost host(options);
  EnvRequest open = open_request(1, "external", 5, 1);
  host.submit(open);
  const EnvReply opened = await(host, 1001);
  REQUIRE(opened.ok);
  CHECK_THAT(opened.observation, Catch::Contains("Reach the target"));
  EnvRequest step = request(RequestKind::Step, 1, 2);
  step.action = "add 3";
  host.submit(step);
  const EnvReply stepped = await(host, 2);
  REQUIRE(stepped.ok);
  CHECK_THAT(stepped.observation, Catch::Contains("turns left"));
  step.request_id = 3;
  step.action = "jump";
  host.submit(step);
  CHECK_THAT(await(host, 3).observation, Catch::StartsWith("invalid action: "));
}

TEST_CASE("an external process that crashes, hangs or writes garbage is restarted and replayed",
          "[env][external][faults]") {
  for (const char* fault : {"--crash-at-turn", "--hang-at-turn", "--garbage-at-turn"}) {
    INFO(fault);
    const auto marker = std::filesystem::temp_directory_path() / ("moerl-reach-marker-" + std::string(fault + 2));
    std::filesystem::remove(marker);
    SessionHostOptions options = fast_options();
    options.env.timeout_s = 1.0;
    options.external.command = kReachEnv + " " + fault + " 2 --marker " + marker.string();
    SessionHost host(options);
    host.submit(open_request(1, "external", 8, 2));
    REQUIRE(await(host, 1001).ok);
    std::vector<EnvReply> steps;
    for (std::uint64_t id = 2; id <= 4; ++id) {
      EnvRequest step = request(RequestKind::Step, 1, id);
      step.action = "add 1";
      host.submit(step);
      steps.push_back(await(host, id));
      REQUIRE(steps.back().ok);
    }
    CHECK(steps[0].attempts == 1);
    CHECK(steps[1].attempts == 2);  // turn 2 failed once, then the restarted process answered
    CHECK(steps[2].attempts == 1);
    CHECK(std::filesystem::exists(marker));
    // The replay put the new process in the right state: three "add 1" applied.
    CHECK_THAT(steps[2].observation, Catch::Contains("turns left " + std::to_string(12 - 3)));
  }
}

TEST_CASE("an external command that cannot start fails clearly after retries", "[env][external][faults]") {
  SessionHostOptions options = fast_options();
  options.external.command = "exit 7";
  SessionHost host(options);
  host.submit(open_request(1, "external", 1));
  const EnvReply reply = await(host, 1001);
  CHECK_FALSE(reply.ok);
  CHECK_THAT(reply.error, Catch::Contains("open failed after 3 attempts") && Catch::Contains("exited with status 7"));
  CHECK(reply.failure == FailureReason::FailureCrashed);
  // A command the shell cannot find is reported as such.
  options.external.command = "/nonexistent/moerl-env --flag";
  SessionHost missing(options);
  missing.submit(open_request(2, "external", 1));
  const EnvReply not_found = await(missing, 1002);
  CHECK_FALSE(not_found.ok);
  CHECK(not_found.failure == FailureReason::FailureCannotStart);
  CHECK_THAT(not_found.error,
             Catch::Contains("(cannot_start)") && Catch::Contains("the shell could not run the command"));
}

TEST_CASE("an external process answering with wrong fields is refused clearly", "[env][external][faults]") {
  // A shell "environment" that answers every request with the right id but no observation.
  SessionHostOptions options = fast_options();
  options.env.max_retries = 1;
  options.external.command =
      "while read -r line; do id=$(echo \"$line\" | sed 's/.*\"id\":\\([0-9]*\\).*/\\1/'); "
      "echo \"{\\\"id\\\":$id,\\\"ok\\\":true}\"; done";
  SessionHost host(options);
  host.submit(open_request(1, "external", 1));
  const EnvReply reply = await(host, 1001);
  CHECK_FALSE(reply.ok);
  CHECK_THAT(reply.error, Catch::Contains("open failed after 2 attempts") &&
                              Catch::Contains("wrong fields: missing field 'observation'"));
}

namespace {

const std::string kFlakyEnv = std::string("python3 ") + MOERL_SOURCE_DIR + "/tests/fixtures/flaky_env.py";

// Opens session 1 of the flaky environment with `fault` on every attempt at
// turn 1 (or on open), steps it once, and returns the step's (or open's) reply.
EnvReply flaky_reply(const std::string& fault, SessionHostOptions options) {
  options.external.command = kFlakyEnv + " --faults " + fault + " --at-turn 1 --slow-s 3";
  SessionHost host(options);
  host.submit(open_request(1, "external", 4));
  const EnvReply opened = await(host, 1001);
  if (!opened.ok) return opened;
  EnvRequest step = request(RequestKind::Step, 1, 2);
  step.action = "4";
  host.submit(step);
  return await(host, 2);
}

}  // namespace

TEST_CASE("every external misbehaviour fails its attempts with a reason, then the session", "[env][external][faults]") {
  struct Case {
    const char* fault;
    FailureReason reason;
    const char* phrase;
  };
  const Case cases[] = {
      {"crash", FailureReason::FailureCrashed, "exited with status 3"},
      {"hang", FailureReason::FailureTimeout, "(timeout)"},
      {"not_json", FailureReason::FailureInvalidJson, "invalid JSON"},
      {"debug_line", FailureReason::FailureInvalidJson, "DEBUG: stepping the session"},
      {"wrong_id", FailureReason::FailureWrongId, "with the id of another"},
      {"missing_field", FailureReason::FailureMissingField, "missing field 'reward'"},
      {"nan_reward", FailureReason::FailureInvalidReward, "reward nan is not finite"},
      {"inf_reward", FailureReason::FailureInvalidReward, "reward inf is not finite"},
      {"refuse", FailureReason::FailureRefused, "the test environment refuses turn 1"},
      {"slow_open", FailureReason::FailureTimeout, "did not answer 'open' within 1"},
  };
  for (const Case& c : cases) {
    INFO(c.fault);
    SessionHostOptions options = fast_options();
    options.env.timeout_s = 1.0;
    options.env.max_retries = 1;
    options.external.startup_timeout_s = 1.0;
    const double before = moerl::telemetry::metrics()
                              .snapshot()
                              .counters["env.failures.external." + std::string(failure_reason_name(c.reason))];
    const EnvReply reply = flaky_reply(c.fault, options);
    CHECK_FALSE(reply.ok);
    CHECK(reply.done);
    CHECK(failure_reason_name(reply.failure) == std::string(failure_reason_name(c.reason)));
    CHECK(reply.attempts == 2);
    CHECK_THAT(reply.error,
               Catch::Contains("failed after 2 attempts (" + std::string(failure_reason_name(c.reason)) + ")") &&
                   Catch::Contains(c.phrase));
    const double after = moerl::telemetry::metrics()
                             .snapshot()
                             .counters["env.failures.external." + std::string(failure_reason_name(c.reason))];
    CHECK(after - before == 1);
  }
}

TEST_CASE("rewards outside [env] reward_min..reward_max fail the attempt; finite ones inside pass",
          "[env][external][faults]") {
  SessionHostOptions options = fast_options();
  options.env.max_retries = 0;
  CHECK(flaky_reply("big_reward", options).ok);  // 1e6 is finite: the default bounds allow it
  options.env.reward_max = 10;
  const EnvReply reply = flaky_reply("big_reward", options);
  CHECK_FALSE(reply.ok);
  CHECK(reply.failure == FailureReason::FailureInvalidReward);
  CHECK_THAT(reply.error, Catch::Contains("reward 1e+06 is outside [-inf, 10] ([env] reward_min, reward_max)"));
}

TEST_CASE("an observation with invalid UTF-8 is repaired with U+FFFD and counted", "[env][external]") {
  SessionHostOptions options = fast_options();
  const auto counters = [] { return moerl::telemetry::metrics().snapshot().counters; };
  const double before = counters()["env.invalid_utf8.external"];
  const EnvReply reply = flaky_reply("bad_utf8", options);
  REQUIRE(reply.ok);
  CHECK(reply.attempts == 1);
  CHECK_THAT(reply.observation, Catch::StartsWith("caf\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD say 4"));
  CHECK(counters()["env.invalid_utf8.external"] - before == 1);
}

TEST_CASE("no environment process outlives its session, its host or a failed attempt", "[env][external][faults]") {
  // Earlier tests' abandoned attempts let go of their processes shortly
  // after they end: count from a settled table.
  for (int i = 0; i < 500 && live_child_process_groups() != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const int before = live_child_process_groups();
  {
    SessionHostOptions options = fast_options();
    options.env.timeout_s = 0.5;
    options.env.max_retries = 1;
    flaky_reply("hang", options);  // the hung processes are killed at their deadline
    options.external.command = kFlakyEnv;
    SessionHost host(options);
    host.submit(open_request(7, "external", 1));
    REQUIRE(await(host, 1007).ok);
    CHECK(live_child_process_groups() == before + 1);
  }  // the host goes with a live session
  // Killed at once; an abandoned attempt's thread lets go of its (dead)
  // process when its read returns, shortly after.
  for (int i = 0; i < 500 && live_child_process_groups() != before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(live_child_process_groups() == before);
}

TEST_CASE("an environment process dies with its env worker, even by SIGKILL", "[env][external][faults]") {
  // A child of this test plays the env worker: it starts an environment
  // process (the watchdog starts with it), reports its pid, and SIGKILLs itself.
  int report[2];
  REQUIRE(pipe(report) == 0);
  const pid_t worker = fork();
  REQUIRE(worker >= 0);
  if (worker == 0) {
    ChildProcess environment("sleep 300");
    const pid_t pid = environment.pid();
    if (write(report[1], &pid, sizeof pid) != sizeof pid) _exit(2);
    raise(SIGKILL);
  }
  close(report[1]);
  pid_t environment = -1;
  REQUIRE(read(report[0], &environment, sizeof environment) == sizeof environment);
  close(report[0]);
  int status = 0;
  REQUIRE(waitpid(worker, &status, 0) == worker);
  CHECK(WIFSIGNALED(status));
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    // Gone, or a zombie waiting for init to reap it.
    std::ifstream stat("/proc/" + std::to_string(environment) + "/stat");
    std::string text;
    std::getline(stat, text);
    gone = text.empty() || text.find(") Z") != std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(gone);
  if (!gone) kill(-environment, SIGKILL);
}
