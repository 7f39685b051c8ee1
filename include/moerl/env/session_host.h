#pragma once
// The sessions one env worker hosts, and the policy that keeps them alive.
// No MPI in here (env_worker.h serves it over messages), so the timeout,
// retry and recovery logic is tested directly.
//
// Requests for different sessions run concurrently on a thread pool; those
// for one session run in order. An attempt fails when the environment throws,
// overruns its deadline ([env] timeout_s per step, plus [env.external]
// startup_timeout_s for a fresh process) or answers with a reward that is
// not finite or outside [env] reward_min..reward_max; open, step, snapshot and
// restore all fail the same way. A failed attempt is retried after a backoff
// on a fresh environment that is opened again and replays the session's
// actions (sessions are deterministic), up to [env] max_retries times; then
// the request ends the session with the error and its FailureReason in the
// reply. Counters: env.retries.<family>[.<reason>],
// env.failures.<family>[.<reason>], env.timeouts.<family>, and
// env.invalid_utf8.<family> for observations whose ill-formed UTF-8 was
// replaced by U+FFFD. Nothing waits without a deadline.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <string>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/core/thread_pool.h"
#include "moerl/env/env_failure.h"
#include "moerl/env/environment.h"
#include "moerl/env/session_snapshot.h"

namespace moerl::config {
struct Config;
}  // namespace moerl::config

namespace moerl::env {

enum class RequestKind : std::uint8_t { Open = 1, Step = 2, Close = 3, Snapshot = 4, Restore = 5 };
const char* request_kind_name(RequestKind kind);

struct EnvRequest {
  RequestKind kind = RequestKind::Step;
  std::uint64_t request_id = 0;
  std::uint64_t session = 0;
  int client = -1;                        // the rank to answer (MPI layer); -1 locally
  TaskSpec task;                          // Open
  std::string action;                     // Step
  bool to_archive = false;                // Snapshot: also write it to the archive directory
  std::vector<std::uint8_t> snapshot;     // Restore: SessionSnapshot bytes ...
  std::string archive_path;               // ... or a snapshot file to read
  std::vector<std::string> replay_after;  // Restore: actions taken since that snapshot, applied after it
};

struct EnvReply {
  RequestKind kind = RequestKind::Step;
  std::uint64_t request_id = 0;
  std::uint64_t session = 0;
  int client = -1;
  bool ok = true;  // false: the request failed; `error` says why (for a step: after retries)
  std::string error;
  FailureReason failure = FailureReason::FailureNone;  // why, when !ok
  std::string observation;
  double reward = 0;
  bool done = false;  // the session is over (also true when a step failed for good)
  bool success = false;
  int turn = 0;      // turns taken after this request
  int attempts = 0;  // 1 = first try worked
  std::map<std::string, std::string> info;
  std::vector<std::uint8_t> snapshot;  // Snapshot: SessionSnapshot bytes
  std::string archive_path;  // Snapshot with to_archive; a Step's periodic snapshot ([env] snapshot_every_turns)
};

struct SessionHostOptions {
  config::EnvSection env;
  config::ExternalEnvSection external;
  config::FaultsSection faults;
  int threads = 1;
  std::string archive_dir = "archive/env";
};

// The options of a run's env worker: [env], [env.external], [faults], and
// its threads from [env] threads or the rank's compute threads.
SessionHostOptions session_host_options(const config::Config& config, int compute_threads);

class SessionHost {
 public:
  explicit SessionHost(SessionHostOptions options);
  ~SessionHost();

  // Queues a request; never blocks on an environment.
  void submit(EnvRequest request);
  // Replies that are ready, after applying timeouts and scheduling retries.
  std::vector<EnvReply> poll();
  // Blocks until a reply is ready or max_wait_s passes; then poll().
  std::vector<EnvReply> wait(double max_wait_s);

  // Failover: ends every session that `client` (a lost actor's rank) opened;
  // returns how many. Their environments are interrupted and dropped.
  size_t close_sessions_of(int client);

  size_t live_sessions() const;
  size_t busy_sessions() const;
  // Elastic capacity: new Open requests beyond it are refused (existing
  // sessions continue).
  void set_capacity(size_t sessions);
  size_t capacity() const;

 private:
  struct Attempt;
  struct Session;

  void start_next(Session& session);
  void launch(Session& session, EnvRequest request, int attempt_number);
  void finish(Session& session, const std::shared_ptr<Attempt>& attempt, std::vector<EnvReply>& out);
  void give_up_or_retry(Session& session, const std::shared_ptr<Attempt>& attempt, FailureReason reason,
                        const std::string& error, std::vector<EnvReply>& out);
  // Writes a step's periodic snapshot to the archive; returns its path ("" if it failed).
  std::string archive_snapshot(const Session& session, const std::vector<std::uint8_t>& native) const;
  // What is wrong with a finished attempt's result (reward range), or an empty string.
  std::string invalid_result(const Attempt& attempt) const;
  std::unique_ptr<Environment> make_environment(const std::string& family) const;
  EnvReply refuse(const EnvRequest& request, const std::string& error) const;

  SessionHostOptions options_;
  size_t capacity_;
  std::map<std::uint64_t, std::unique_ptr<Session>> sessions_;
  std::vector<EnvReply> immediate_;  // replies that needed no environment
  // Signalled by attempts as they finish, so wait() can sleep.
  std::shared_ptr<std::pair<std::mutex, std::condition_variable>> finished_signal_;
  ThreadPool pool_;
};

}  // namespace moerl::env
