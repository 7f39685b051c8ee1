#include "moerl/runtime/placement.h"

#include <fnmatch.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "moerl/core/check.h"
#include "moerl/core/join.h"

namespace moerl::runtime {
namespace {

constexpr int kHostNameBytes = 256;

bool matches_any(const std::vector<std::string>& patterns, const std::string& host) {
  for (const std::string& pattern : patterns)
    if (fnmatch(pattern.c_str(), host.c_str(), 0) == 0) return true;
  return false;
}

std::string joined(const std::set<std::string>& names) { return names.empty() ? "none" : join(names, ", "); }

std::string pattern_list(const std::vector<std::string>& patterns) {
  std::string text = "[";
  for (const std::string& p : patterns) text += (text.size() > 1 ? ", \"" : "\"") + p + "\"";
  return text + "]";
}

[[noreturn]] void placement_error(const std::string& key, const std::string& message) {
  throw PlacementError(key, message);
}

enum class Group { Training, Inference };

Group group_of(const config::ClusterSection& cluster, const std::string& host, int rank) {
  const bool training = matches_any(cluster.training_hosts, host);
  const bool inference = cluster.inference_hosts.empty() ? !training : matches_any(cluster.inference_hosts, host);
  const std::string where = "rank " + std::to_string(rank) + " runs on host '" + host + "'";
  if (training && inference)
    placement_error("cluster.inference_hosts", where + ", which matches both training_hosts " +
                                                   pattern_list(cluster.training_hosts) + " and inference_hosts " +
                                                   pattern_list(cluster.inference_hosts));
  if (!training && !inference)
    placement_error("cluster.inference_hosts", where + ", which matches neither training_hosts " +
                                                   pattern_list(cluster.training_hosts) + " nor inference_hosts " +
                                                   pattern_list(cluster.inference_hosts));
  return training ? Group::Training : Group::Inference;
}

// Every process's placement host name, in the order of `parent` (collective).
std::vector<std::string> gather_host_names(MPI_Comm parent, int size) {
  char mine[kHostNameBytes] = {};
  std::strncpy(mine, placement_host_name().c_str(), sizeof mine - 1);
  std::vector<char> all(static_cast<size_t>(size) * kHostNameBytes);
  MOERL_MPI_CHECK(MPI_Allgather(mine, kHostNameBytes, MPI_CHAR, all.data(), kHostNameBytes, MPI_CHAR, parent));
  std::vector<std::string> host_of_rank;
  for (int r = 0; r < size; ++r) host_of_rank.emplace_back(&all[static_cast<size_t>(r) * kHostNameBytes]);
  return host_of_rank;
}

}  // namespace

std::string machine_hostname() {
  char name[kHostNameBytes] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

std::string placement_host_name() {
  for (const char* variable : {"MOERL_HOST_NAME", "SLURMD_NODENAME"})
    if (const char* name = std::getenv(variable); name != nullptr && *name != '\0') return name;
  return machine_hostname();
}

std::vector<int> plan_placement(const config::ClusterSection& cluster, const std::vector<std::string>& host_of_rank) {
  const int size = static_cast<int>(host_of_rank.size());
  std::vector<int> job_rank(static_cast<size_t>(size));
  if (cluster.placement == config::Placement::RankOrder) {
    for (int rank = 0; rank < size; ++rank) job_rank[static_cast<size_t>(rank)] = rank;
    return job_rank;
  }
  std::vector<int> training, inference;
  std::set<std::string> training_hosts, inference_hosts;
  for (int rank = 0; rank < size; ++rank) {
    const std::string& host = host_of_rank[static_cast<size_t>(rank)];
    if (group_of(cluster, host, rank) == Group::Training) {
      training.push_back(rank);
      training_hosts.insert(host);
    } else {
      inference.push_back(rank);
      inference_hosts.insert(host);
    }
  }
  const std::int64_t others = cluster.actors + cluster.env_workers + cluster.standby_actors;
  if (static_cast<std::int64_t>(training.size()) != cluster.learners ||
      static_cast<std::int64_t>(inference.size()) != others) {
    placement_error("cluster.placement",
                    "\"host_groups\" does not fit: the training group (training_hosts " +
                        pattern_list(cluster.training_hosts) + ": hosts " + joined(training_hosts) + ") has " +
                        std::to_string(training.size()) + " rank(s) for " + std::to_string(cluster.learners) +
                        " learner(s); the inference group (hosts " + joined(inference_hosts) + ") has " +
                        std::to_string(inference.size()) + " rank(s) for " + std::to_string(others) +
                        " actor, env worker and standby actor rank(s). Start as many processes on each "
                        "group's hosts as its roles need (hostfile slots, srun tasks per component)");
  }
  // Learners take job ranks [0, L) in the launcher's order, the other roles the rest.
  int next = 0;
  for (int rank : training) job_rank[static_cast<size_t>(rank)] = next++;
  for (int rank : inference) job_rank[static_cast<size_t>(rank)] = next++;
  return job_rank;
}

PlacedWorld::PlacedWorld(const config::ClusterSection& cluster, MPI_Comm parent) {
  int rank = 0, size = 0;
  MOERL_MPI_CHECK(MPI_Comm_rank(parent, &rank));
  MOERL_MPI_CHECK(MPI_Comm_size(parent, &size));
  if (cluster.placement == config::Placement::RankOrder) {
    // The launcher's order is the job's: no host names to gather, no new communicator.
    job_rank_of_ = plan_placement(cluster, std::vector<std::string>(static_cast<size_t>(size)));
    job_rank_ = rank;
    comm_ = parent;
    return;
  }
  job_rank_of_ = plan_placement(cluster, gather_host_names(parent, size));
  job_rank_ = job_rank_of_[static_cast<size_t>(rank)];
  MOERL_MPI_CHECK(MPI_Comm_split(parent, 0, job_rank_, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  owned_ = true;
}

PlacedWorld::~PlacedWorld() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

}  // namespace moerl::runtime
