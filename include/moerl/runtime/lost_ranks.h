#pragma once
// The ranks this process knows to be lost (RankLost notices from learner 0,
// taken by the heartbeat thread), for the roles to act on: an actor restores
// the sessions of a lost env worker, a standby actor takes a lost actor's
// place, an env worker closes a lost actor's sessions, and the end of the
// job waits for the living ranks only. Process-wide and thread-safe.
//
// Fencing: a rank declared lost may be frozen rather than dead; a frozen
// process would hold a fault-tolerant MPI's shrink (and mpirun's exit) for
// ever. Every rank on the lost rank's host SIGKILLs it (fence()), so that MPI
// sees it dead and the survivors can go on.

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "moerl/runtime/failover_messages.h"

namespace moerl::runtime {

//
// Rejoining: an env worker that left (released or lost) may come back as a
// new process that joined the running job (runtime/env_join.h). Its notices
// stay in the history (all(), epoch()), but it is no longer lost (contains(),
// ranks()) until a new notice says it was lost again.
class LostRanks {
 public:
  // Records a notice (once per loss of a rank); true when it was new.
  bool add(const RankLost& lost);
  // Every notice so far, oldest first (rejoined ranks' included).
  std::vector<RankLost> all() const;
  std::set<int> ranks() const;  // lost now
  bool contains(int rank) const;
  // Lost now or before a rejoin: the ranks whose first process is gone.
  std::set<int> ever_lost() const;
  // Grows with every new notice: a role compares it with the epoch it last acted on.
  std::uint64_t epoch() const;
  // `rank`, lost, lives again; true when it was lost until now.
  bool rejoin(int rank);
  // Every rejoin after the first `taken` ones, in order (a role counts what it took).
  std::vector<int> rejoined_since(std::uint64_t taken) const;
  void clear();  // tests

 private:
  bool lost_now(int rank) const;  // mutex_ held

  mutable std::mutex mutex_;
  std::vector<RankLost> lost_;
  std::set<int> rejoined_;    // ranks whose latest notice a rejoin followed
  std::vector<int> rejoins_;  // every rejoin, in order
};

LostRanks& lost_ranks();

// SIGKILLs process `pid` of `host` when that is `this_host` (and it is not us).
void fence(const std::string& host, std::int64_t pid, const std::string& this_host);
// The lost rank's process, the same way.
void fence(const RankLost& lost, const std::string& this_host);

}  // namespace moerl::runtime
