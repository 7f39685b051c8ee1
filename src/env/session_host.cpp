#include "moerl/env/session_host.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <sstream>
#include <thread>

#include "moerl/config/config.h"
#include "moerl/core/hash.h"
#include "moerl/core/utf8.h"
#include "moerl/env/external_environment.h"
#include "moerl/env/task_family.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::env {
namespace {

double now_s() { return runtime::monotonic_seconds(); }

enum class Fault { None, Crash, Hang };

// Which injected fault (if any) hits this attempt: a pure function of the
// fault seed, session, turn and attempt, so a test knows what to expect.
Fault choose_fault(const config::FaultsSection& f, std::uint64_t session, int turn, int attempt) {
  if (attempt > f.env_fault_attempts) return Fault::None;
  if (f.env_crash_rate <= 0 && f.env_hang_rate <= 0) return Fault::None;
  const std::uint64_t h = mix64(static_cast<std::uint64_t>(f.env_fault_seed) ^ mix64(session) ^
                                mix64(static_cast<std::uint64_t>(turn) << 20 | static_cast<std::uint64_t>(attempt)));
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;
  if (u < f.env_crash_rate) return Fault::Crash;
  if (u < f.env_crash_rate + f.env_hang_rate) return Fault::Hang;
  return Fault::None;
}

std::unique_ptr<Environment> create_environment(const std::string& family, const config::ExternalEnvSection& external,
                                                double timeout_s) {
  if (family == "external") {
    if (external.command.empty())
      throw EnvironmentFailure(FailureReason::FailureCannotStart,
                               "task family 'external' needs [env.external] command");
    return std::make_unique<ExternalEnvironment>(
        ExternalEnvOptions{external.command, external.startup_timeout_s, timeout_s});
  }
  return make_builtin_environment(family);
}

}  // namespace

SessionHostOptions session_host_options(const config::Config& config, int compute_threads) {
  SessionHostOptions options;
  options.env = config.env;
  options.external = config.env_external;
  options.faults = config.faults;
  // Environment steps mostly wait (on processes, on I/O); a few threads per
  // core keep them overlapped without taking compute from the rank.
  options.threads = config.env.threads > 0 ? static_cast<int>(config.env.threads) : std::max(2, 2 * compute_threads);
  options.archive_dir = config.env_archive_directory();
  return options;
}

const char* request_kind_name(RequestKind kind) {
  switch (kind) {
    case RequestKind::Open: return "open";
    case RequestKind::Step: return "step";
    case RequestKind::Close: return "close";
    case RequestKind::Snapshot: return "snapshot";
    case RequestKind::Restore: return "restore";
  }
  return "unknown";
}

struct SessionHost::Attempt {
  EnvRequest request;
  int number = 1;
  bool fresh = false;  // build, open and replay before the request
  std::vector<std::string> replay;
  std::shared_ptr<Environment> env;  // the environment this attempt uses
  double started = 0;
  double deadline = 0;
  std::atomic<bool> done{false};
  // Results (written by the pool thread before `done`).
  std::string error;
  FailureReason reason = FailureReason::FailureNone;
  std::string observation;
  StepResult step;
  std::vector<std::uint8_t> native;
  SessionSnapshot restored;
};

struct SessionHost::Session {
  std::uint64_t id = 0;
  int client = -1;  // the actor that opened (or restored) it
  TaskSpec task;
  std::vector<std::string> actions;
  std::shared_ptr<Environment> env;  // null: must be rebuilt by replay
  std::deque<EnvRequest> queue;
  std::shared_ptr<Attempt> running;
  bool retry_pending = false;
  double retry_at = 0;
  EnvRequest retry_request;
  int retry_number = 0;
  bool opened = false;
  bool over = false;
  int turn = 0;
};

SessionHost::SessionHost(SessionHostOptions options)
    : options_(std::move(options)),
      capacity_(static_cast<size_t>(options_.env.sessions_per_worker)),
      finished_signal_(std::make_shared<std::pair<std::mutex, std::condition_variable>>()),
      pool_(options_.threads) {}

SessionHost::~SessionHost() {
  // Interrupt running steps so external processes die now, not at exit.
  for (auto& [id, session] : sessions_)
    if (session->running && session->running->env) session->running->env->interrupt();
}

size_t SessionHost::live_sessions() const { return sessions_.size(); }

size_t SessionHost::close_sessions_of(int client) {
  size_t closed = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second->client != client) {
      ++it;
      continue;
    }
    if (it->second->running && it->second->running->env) it->second->running->env->interrupt();
    it = sessions_.erase(it);
    ++closed;
  }
  return closed;
}
size_t SessionHost::busy_sessions() const {
  return static_cast<size_t>(std::count_if(sessions_.begin(), sessions_.end(), [](const auto& s) {
    return s.second->running != nullptr || s.second->retry_pending;
  }));
}
void SessionHost::set_capacity(size_t sessions) { capacity_ = sessions; }
size_t SessionHost::capacity() const { return capacity_; }

std::unique_ptr<Environment> SessionHost::make_environment(const std::string& family) const {
  return create_environment(family, options_.external, options_.env.timeout_s);
}

EnvReply SessionHost::refuse(const EnvRequest& request, const std::string& error) const {
  EnvReply reply;
  reply.kind = request.kind;
  reply.request_id = request.request_id;
  reply.session = request.session;
  reply.client = request.client;
  reply.ok = false;
  reply.failure = FailureReason::FailureRejected;
  reply.error = "session " + std::to_string(request.session) + ": " + error;
  return reply;
}

void SessionHost::submit(EnvRequest request) {
  auto found = sessions_.find(request.session);
  const bool creates = request.kind == RequestKind::Open || request.kind == RequestKind::Restore;
  if (creates) {
    if (found != sessions_.end()) {
      immediate_.push_back(refuse(request, std::string("cannot ") + request_kind_name(request.kind) +
                                               ": the session already exists on this worker"));
      return;
    }
    if (sessions_.size() >= capacity_) {
      immediate_.push_back(refuse(request, "this env worker is at capacity (" + std::to_string(capacity_) +
                                               " sessions, [env] sessions_per_worker)"));
      return;
    }
    auto session = std::make_unique<Session>();
    session->id = request.session;
    session->client = request.client;
    session->task = request.task;
    found = sessions_.emplace(request.session, std::move(session)).first;
  } else if (found == sessions_.end()) {
    immediate_.push_back(
        refuse(request, std::string("cannot ") + request_kind_name(request.kind) + ": no such session on this worker"));
    return;
  }
  Session& session = *found->second;
  session.queue.push_back(std::move(request));
  if (!session.running && !session.retry_pending) start_next(session);
}

void SessionHost::start_next(Session& session) {
  while (!session.queue.empty() && !session.running && !session.retry_pending) {
    EnvRequest request = std::move(session.queue.front());
    session.queue.pop_front();
    if (request.kind == RequestKind::Close) {
      EnvReply reply;
      reply.kind = RequestKind::Close;
      reply.request_id = request.request_id;
      reply.session = session.id;
      reply.client = request.client;
      reply.turn = session.turn;
      reply.done = true;
      reply.success = session.env && session.env->succeeded();
      immediate_.push_back(reply);
      // Erasing the session destroys it; the caller's reference must not be used after.
      sessions_.erase(session.id);
      return;
    }
    if (request.kind == RequestKind::Step && session.over) {
      immediate_.push_back(refuse(request, "cannot step: the session is over"));
      continue;
    }
    if ((request.kind == RequestKind::Step || request.kind == RequestKind::Snapshot) && !session.opened) {
      immediate_.push_back(refuse(request, "cannot step: the session failed to open"));
      continue;
    }
    launch(session, std::move(request), 1);
  }
}

void SessionHost::launch(Session& session, EnvRequest request, int attempt_number) {
  auto attempt = std::make_shared<Attempt>();
  attempt->number = attempt_number;
  attempt->started = now_s();
  const bool creates = request.kind == RequestKind::Open || request.kind == RequestKind::Restore;
  attempt->fresh = creates || !session.env;
  if (!creates && attempt->fresh) attempt->replay = session.actions;
  attempt->env = attempt->fresh ? nullptr : session.env;
  attempt->request = std::move(request);
  const auto& env = options_.env;
  double budget = env.timeout_s * (1.0 + static_cast<double>(attempt->replay.size()));
  if (attempt->fresh && session.task.family == "external") budget += options_.external.startup_timeout_s;
  attempt->deadline = attempt->started + budget;
  session.running = attempt;

  const TaskSpec task = session.task;
  const std::uint64_t session_id = session.id;
  const int turn = session.turn + 1;
  const config::ExternalEnvSection external = options_.external;
  const config::FaultsSection faults = options_.faults;
  const double timeout_s = env.timeout_s;
  const std::int64_t snapshot_every = env.snapshot_every_turns;
  auto signal = finished_signal_;
  pool_.submit([attempt, task, session_id, turn, external, faults, timeout_s, snapshot_every, signal] {
    Attempt& a = *attempt;
    try {
      const EnvRequest& r = a.request;
      if (r.kind == RequestKind::Restore) {
        a.restored =
            r.archive_path.empty() ? SessionSnapshot::decode(r.snapshot) : SessionSnapshot::read_file(r.archive_path);
      }
      const TaskSpec& spec = r.kind == RequestKind::Restore ? a.restored.task : task;
      if (a.fresh) {
        a.env = create_environment(spec.family, external, timeout_s);
        a.observation = a.env->open(spec);
        for (const std::string& action : a.replay) a.env->step(action);
      }
      switch (r.kind) {
        case RequestKind::Open: break;
        case RequestKind::Step:
          switch (choose_fault(faults, session_id, turn, a.number)) {
            case Fault::Crash:
              a.env->interrupt();  // an external process really dies
              if (spec.family != "external")
                throw EnvironmentFailure(FailureReason::FailureCrashed, "injected crash ([faults] env_crash_rate)");
              break;
            case Fault::Hang: std::this_thread::sleep_for(std::chrono::duration<double>(faults.env_hang_s)); break;
            case Fault::None: break;
          }
          a.step = a.env->step(r.action);
          // A periodic snapshot for failover; one that fails costs nothing but itself.
          if (snapshot_every > 0 && turn % snapshot_every == 0 && !a.step.done) {
            try {
              a.native = a.env->snapshot();
            } catch (const std::exception&) {
              a.native.clear();
            }
          }
          break;
        case RequestKind::Snapshot: a.native = a.env->snapshot(); break;
        case RequestKind::Restore:
          if (a.restored.native.empty()) {
            for (const std::string& action : a.restored.actions) a.env->step(action);
          } else {
            a.env->restore(a.restored.native);
          }
          for (const std::string& action : r.replay_after) a.env->step(action);
          break;
        case RequestKind::Close: break;
      }
    } catch (const EnvironmentFailure& failure) {
      a.error = failure.what();
      a.reason = failure.reason();
    } catch (const std::exception& error) {
      a.error = error.what();
      a.reason = FailureReason::FailureCrashed;
    }
    {
      std::lock_guard<std::mutex> lock(signal->first);
      a.done = true;
    }
    signal->second.notify_all();
  });
}

void SessionHost::give_up_or_retry(Session& session, const std::shared_ptr<Attempt>& attempt, FailureReason reason,
                                   const std::string& error, std::vector<EnvReply>& out) {
  session.running.reset();
  session.env.reset();  // whatever state it had is suspect: rebuild by replay
  const std::string family = session.task.family;
  const std::string reason_name = failure_reason_name(reason);
  if (attempt->number <= options_.env.max_retries) {
    telemetry::metrics().add("env.retries." + family);
    telemetry::metrics().add("env.retries." + family + "." + reason_name);
    session.retry_pending = true;
    session.retry_at = now_s() + options_.env.retry_backoff_s * std::pow(2.0, attempt->number - 1);
    session.retry_request = attempt->request;
    session.retry_number = attempt->number + 1;
    return;
  }
  telemetry::metrics().add("env.failures." + family);
  telemetry::metrics().add("env.failures." + family + "." + reason_name);
  EnvReply reply =
      refuse(attempt->request, std::string(request_kind_name(attempt->request.kind)) + " failed after " +
                                   std::to_string(attempt->number) + " attempts (" + reason_name + "): " + error);
  reply.failure = reason;
  reply.attempts = attempt->number;
  reply.turn = session.turn;
  reply.done = true;
  session.over = true;
  if (attempt->request.kind == RequestKind::Open || attempt->request.kind == RequestKind::Restore)
    session.opened = false;
  out.push_back(std::move(reply));
}

std::string SessionHost::archive_snapshot(const Session& session, const std::vector<std::uint8_t>& native) const {
  // One file per session, replaced each time: the latest is the one a failover restores from.
  const std::string path = options_.archive_dir + "/session-" + std::to_string(session.id) + ".snap";
  try {
    SessionSnapshot{session.id, session.task, session.actions, native}.write_file(path);
  } catch (const std::exception& error) {
    telemetry::metrics().add("env.snapshot_failures");
    return "";
  }
  telemetry::metrics().add("env.snapshots");
  return path;
}

std::string SessionHost::invalid_result(const Attempt& attempt) const {
  if (attempt.request.kind != RequestKind::Step) return "";
  const double reward = attempt.step.reward;
  if (std::isfinite(reward) && reward >= options_.env.reward_min && reward <= options_.env.reward_max) return "";
  std::ostringstream out;
  out << "reward " << reward << " is " << (std::isfinite(reward) ? "outside" : "not finite; allowed:") << " ["
      << options_.env.reward_min << ", " << options_.env.reward_max << "] ([env] reward_min, reward_max)";
  return out.str();
}

void SessionHost::finish(Session& session, const std::shared_ptr<Attempt>& attempt, std::vector<EnvReply>& out) {
  const EnvRequest& r = attempt->request;
  if (!attempt->error.empty()) {
    give_up_or_retry(session, attempt, attempt->reason, attempt->error, out);
    return;
  }
  if (const std::string invalid = invalid_result(*attempt); !invalid.empty()) {
    give_up_or_retry(session, attempt, FailureReason::FailureInvalidReward, invalid, out);
    return;
  }
  session.running.reset();
  session.env = attempt->env;
  EnvReply reply;
  reply.kind = r.kind;
  reply.request_id = r.request_id;
  reply.session = session.id;
  reply.client = r.client;
  reply.attempts = attempt->number;
  const std::string& family = session.task.family;
  switch (r.kind) {
    case RequestKind::Open:
      session.opened = true;
      reply.observation = attempt->observation;
      break;
    case RequestKind::Step:
      session.actions.push_back(r.action);
      ++session.turn;
      reply.observation = attempt->step.observation;
      reply.reward = attempt->step.reward;
      reply.done = attempt->step.done;
      reply.info = attempt->step.info;
      session.over = reply.done;
      telemetry::metrics().add("env.steps." + family);
      telemetry::metrics().record("env.step_latency_s." + family, now_s() - attempt->started);
      if (!attempt->native.empty()) reply.archive_path = archive_snapshot(session, attempt->native);
      break;
    case RequestKind::Snapshot: {
      const SessionSnapshot snapshot{session.id, session.task, session.actions, attempt->native};
      reply.snapshot = snapshot.encode();
      if (r.to_archive) {
        reply.archive_path = options_.archive_dir + "/session-" + std::to_string(session.id) + "-turn-" +
                             std::to_string(session.turn) + ".snap";
        snapshot.write_file(reply.archive_path);
      }
      break;
    }
    case RequestKind::Restore:
      session.task = attempt->restored.task;
      session.actions = attempt->restored.actions;
      session.actions.insert(session.actions.end(), r.replay_after.begin(), r.replay_after.end());
      session.turn = static_cast<int>(session.actions.size());
      session.opened = true;
      session.over = session.env->done();
      reply.observation = attempt->observation;
      break;
    case RequestKind::Close: break;
  }
  reply.turn = session.turn;
  reply.success = session.env->succeeded();
  reply.done = reply.done || session.env->done();
  // (An external environment's answers are repaired, and counted, before they are parsed: external_environment.cpp.)
  if (!reply.observation.empty()) {
    Utf8Repair repaired = repair_utf8(reply.observation);
    if (repaired.replacements > 0) {
      telemetry::metrics().add("env.invalid_utf8." + family);
      reply.observation = std::move(repaired.text);
    }
  }
  out.push_back(std::move(reply));
}

std::vector<EnvReply> SessionHost::poll() {
  std::vector<EnvReply> out = std::move(immediate_);
  immediate_.clear();
  const double now = now_s();
  std::vector<std::uint64_t> ids;
  for (const auto& [id, session] : sessions_) ids.push_back(id);
  for (const std::uint64_t id : ids) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) continue;
    Session& session = *it->second;
    if (const auto attempt = session.running) {
      if (attempt->done.load()) {
        finish(session, attempt, out);
      } else if (now > attempt->deadline) {
        // Give up on it: kill what can be killed, and let a new thread take its place
        // while the abandoned step runs out on its own.
        telemetry::metrics().add("env.timeouts." + session.task.family);
        if (attempt->env) attempt->env->interrupt();
        pool_.add_thread();
        give_up_or_retry(session, attempt, FailureReason::FailureTimeout,
                         "timed out after " +
                             std::to_string(static_cast<int>(std::round((now - attempt->started) * 1000))) +
                             " ms ([env] timeout_s)",
                         out);
      }
    }
    if (session.retry_pending && now >= session.retry_at) {
      session.retry_pending = false;
      launch(session, session.retry_request, session.retry_number);
    }
    if (!session.running && !session.retry_pending) start_next(session);
  }
  std::vector<EnvReply> late = std::move(immediate_);
  immediate_.clear();
  out.insert(out.end(), std::make_move_iterator(late.begin()), std::make_move_iterator(late.end()));
  telemetry::metrics().set("env.live_sessions", static_cast<double>(sessions_.size()));
  return out;
}

std::vector<EnvReply> SessionHost::wait(double max_wait_s) {
  const double deadline = now_s() + max_wait_s;
  for (;;) {
    std::vector<EnvReply> replies = poll();
    if (!replies.empty()) return replies;
    const double left = deadline - now_s();
    if (left <= 0) return replies;
    // Sleep until an attempt finishes, a deadline or retry comes due, or 5 ms.
    double next_event = std::min(left, 0.005);
    for (const auto& [id, session] : sessions_) {
      if (session->running) next_event = std::min(next_event, std::max(0.0, session->running->deadline - now_s()));
      if (session->retry_pending) next_event = std::min(next_event, std::max(0.0, session->retry_at - now_s()));
    }
    std::unique_lock<std::mutex> lock(finished_signal_->first);
    finished_signal_->second.wait_for(lock, std::chrono::duration<double>(next_event), [this] {
      for (const auto& [id, session] : sessions_)
        if (session->running && session->running->done.load()) return true;
      return false;
    });
  }
}

}  // namespace moerl::env
