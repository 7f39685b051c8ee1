#pragma once
// [cluster] placement: which process takes which job rank. The rank layout
// (rank_layout.h) is fixed: learners first, then actors, env workers and
// standby actors. Under "rank_order" the launcher's order is the job's, so
// where a role runs is decided by the launcher (hostfile order, Slurm's
// heterogeneous components). Under "host_groups" moerl decides: the processes
// on hosts matching training_hosts become the learners and those on the
// inference hosts the other roles, whatever order the launcher started them
// in; a layout that does not fit stops the job before any work, naming the
// group, its hosts and its counts. The job then runs on a communicator split
// from the launcher's in job-rank order, so every later rank number (logs,
// rank records, heartbeats) is the job rank.

#include <mpi.h>

#include <string>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/core/error.h"

namespace moerl::runtime {

// A layout that does not fit the job's hosts; `key` is the config key to
// blame, so that the caller reports it with that key's file and line.
class PlacementError : public Error {
 public:
  PlacementError(std::string key, const std::string& message) : Error(message), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// gethostname(): the machine's own name (fencing a rank by pid is only safe on it).
std::string machine_hostname();

// The name placement matches against: $MOERL_HOST_NAME where set (in a
// container the hostname is the pod's, the node is elsewhere), else Slurm's
// node name ($SLURMD_NODENAME: the names a user writes in a hostlist), else
// gethostname().
std::string placement_host_name();

// The job rank of each process (index: its rank in the launcher's order),
// given each process's host name. Throws PlacementError when a host is in
// neither group or in both, or a group's rank count differs from the roles it
// must hold.
std::vector<int> plan_placement(const config::ClusterSection& cluster, const std::vector<std::string>& host_of_rank);

// The job's communicator. Collective over `parent`: every process gathers
// every host name and computes the same plan, so a layout that does not fit
// throws the same error on every rank (and none waits for another).
class PlacedWorld {
 public:
  PlacedWorld(const config::ClusterSection& cluster, MPI_Comm parent);
  ~PlacedWorld();
  PlacedWorld(const PlacedWorld&) = delete;
  PlacedWorld& operator=(const PlacedWorld&) = delete;

  MPI_Comm comm() const { return comm_; }
  int job_rank() const { return job_rank_; }
  // The job rank of each launcher rank: how a rank number from a
  // launcher-ordered communicator (the abort channel) is reported.
  const std::vector<int>& job_rank_of_launcher_rank() const { return job_rank_of_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int job_rank_ = 0;
  std::vector<int> job_rank_of_;
};

}  // namespace moerl::runtime
