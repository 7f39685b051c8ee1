#pragma once
// Learner 0's view of every other rank from their heartbeats: who was last
// heard from when, what weights each actor holds, and who is lost. A rank is
// declared lost once: when it fell silent for [cluster] heartbeat_timeout_s
// (a frozen or dead rank), never beat within twice that after the start, or
// when a fault-tolerant MPI reports it dead. An actor still on an older
// weight version than the one published, heartbeat_timeout_s after that
// publication, is flagged as behind (a warning, once per version).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moerl/runtime/heartbeat_messages.h"
#include "moerl/runtime/rank_layout.h"

namespace moerl::runtime {

struct LostRank {
  int rank = -1;
  Role role = Role::Actor;
  int role_index = -1;
  std::string host;  // "" if it never beat
  std::int64_t pid = 0;
  double silent_s = 0;           // since its last heartbeat (or since the start)
  std::string why;               // "no heartbeat for 10.2 s", "MPI reports it dead", ...
  std::string describe() const;  // "rank 3 (env_worker 0 on host vm, pid 1234) lost: ..."
};

class RankHealth {
 public:
  RankHealth(const RankLayout& layout, double timeout_s, double now);

  void beat(const Heartbeat& heartbeat, double now);
  // The newest policy version published, and when.
  void published(std::int64_t version, double now);
  // Ranks declared lost by this call: silent ones, and those in `failed_by_mpi`.
  std::vector<LostRank> check(double now, const std::vector<int>& failed_by_mpi = {});
  // Actors behind the published version for longer than the timeout (each reported once per version).
  std::vector<std::string> actors_behind(double now);

  bool is_lost(int rank) const;
  // A lost rank lives again (a new process joined in its place): watched
  // from `now` on, as if it had just beaten.
  void revive(int rank, double now);
  const Heartbeat* last(int rank) const;  // null if it never beat
  double last_heard(int rank) const;      // monotonic time; the start if never

 private:
  struct State {
    Heartbeat last;
    bool heard = false;
    double last_seen = 0;
    bool lost = false;
    std::int64_t reported_behind = -1;  // the version it was last reported behind
  };
  LostRank declare(int rank, State& state, double now, const std::string& why);

  RankLayout layout_;
  double timeout_s_;
  double started_;
  std::map<int, State> ranks_;  // every rank but learner 0
  std::int64_t published_version_ = 0;
  double published_at_ = 0;
};

}  // namespace moerl::runtime
