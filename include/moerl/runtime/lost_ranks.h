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

class LostRanks {
 public:
  // Records a notice (once per rank); true when it was new.
  bool add(const RankLost& lost);
  std::vector<RankLost> all() const;
  std::set<int> ranks() const;
  bool contains(int rank) const;
  // Grows with every new notice: a role compares it with the epoch it last acted on.
  std::uint64_t epoch() const;
  void clear();  // tests

 private:
  mutable std::mutex mutex_;
  std::vector<RankLost> lost_;
};

LostRanks& lost_ranks();

// SIGKILLs process `pid` of `host` when that is `this_host` (and it is not us).
void fence(const std::string& host, std::int64_t pid, const std::string& this_host);
// The lost rank's process, the same way.
void fence(const RankLost& lost, const std::string& this_host);

}  // namespace moerl::runtime
