#pragma once
// The env worker role: a SessionHost served over the message layer. Actors
// talk to it through EnvClient.

#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "moerl/env/env_messages.h"
#include "moerl/env/session_host.h"
#include "moerl/runtime/mailbox.h"

namespace moerl::env {

class EnvWorkerService {
 public:
  EnvWorkerService(SessionHost& host, runtime::Mailbox& mailbox, int coordinator_rank = 0);

  // One round: take every pending request, advance the sessions (waiting at
  // most max_wait_s when idle), send every ready reply. Returns replies sent.
  int serve_once(double max_wait_s = 0.002);
  // Serves until should_stop() says so.
  void serve(const std::function<bool()>& should_stop);
  std::int64_t replies_sent() const { return replies_sent_; }

 private:
  // Sessions of actors that learner 0 declared lost hold capacity for nothing.
  void close_sessions_of_lost_actors();

  SessionHost& host_;
  runtime::Mailbox& mailbox_;
  int coordinator_;
  std::uint64_t lost_epoch_ = 0;
  std::int64_t replies_sent_ = 0;
};

// The actor's side: requests go to the worker that owns the session
// (session number modulo workers, unless restored elsewhere); replies come
// back in one queue.
class EnvClient {
 public:
  EnvClient(runtime::Mailbox& mailbox, std::vector<int> worker_ranks);

  std::uint64_t open(std::uint64_t session, const TaskSpec& task);
  std::uint64_t step(std::uint64_t session, const std::string& action);
  std::uint64_t close(std::uint64_t session);
  std::uint64_t snapshot(std::uint64_t session, bool to_archive);
  // Restores on `worker_index` (any worker may take any session).
  std::uint64_t restore(std::uint64_t session, const std::vector<std::uint8_t>& snapshot, int worker_index);
  std::uint64_t restore_from_archive(std::uint64_t session, const std::string& path, int worker_index);

  std::optional<EnvReply> poll();
  // The next reply; TimeoutError naming the workers when none arrives in time.
  EnvReply wait(double timeout_s);

  // The worker that hosts `session`: where it was restored, else its default
  // (session number modulo workers), else -- when that one is lost -- a living one.
  int worker_of(std::uint64_t session) const;
  size_t workers() const { return workers_.size(); }

  // Failover: `rank` is lost; new sessions go elsewhere. The caller restores
  // that worker's sessions with restore_on() (a living worker: pick_living()).
  void mark_lost(int rank);
  // `rank` lives again (a new process joined in its place): its sessions go to it again.
  void mark_rejoined(int rank) { lost_.erase(rank); }
  std::vector<int> living_workers() const;
  int pick_living(std::uint64_t session) const;  // -1 when none lives
  std::uint64_t restore_on(std::uint64_t session, const std::vector<std::uint8_t>& snapshot, int worker_rank);
  std::uint64_t open_on(std::uint64_t session, const TaskSpec& task, int worker_rank);
  // Restores from an archived snapshot, then applies `replay_after` (the actions since it).
  std::uint64_t restore_from_archive_on(std::uint64_t session, const std::string& path,
                                        const std::vector<std::string>& replay_after, int worker_rank);
  // Workers that a send found dead (fault-tolerant MPI) since the last call.
  std::vector<int> take_newly_lost();

 private:
  std::uint64_t send(EnvRequest request, int worker);

  runtime::Mailbox& mailbox_;
  std::vector<int> workers_;
  std::map<std::uint64_t, int> placement_;  // sessions moved off their default worker
  std::set<int> lost_;
  std::vector<int> newly_lost_;
  std::uint64_t next_request_ = 1;
};

}  // namespace moerl::env
