// [cluster] placement: which launcher rank takes which job rank, and the
// errors that stop a layout which does not fit before any work.

#include <catch2/catch.hpp>

#include "moerl/runtime/placement.h"

using namespace moerl::runtime;
using moerl::config::ClusterSection;
using moerl::config::Placement;

namespace {

// 2 learners, 2 actors, 1 env worker, 1 standby actor: 6 ranks.
ClusterSection two_groups(std::vector<std::string> training, std::vector<std::string> inference = {}) {
  ClusterSection cluster;
  cluster.learners = 2;
  cluster.actors = 2;
  cluster.env_workers = 1;
  cluster.standby_actors = 1;
  cluster.placement = Placement::HostGroups;
  cluster.training_hosts = std::move(training);
  cluster.inference_hosts = std::move(inference);
  return cluster;
}

std::string placement_error_text(const ClusterSection& cluster, const std::vector<std::string>& hosts,
                                 std::string* key = nullptr) {
  try {
    plan_placement(cluster, hosts);
  } catch (const PlacementError& error) {
    if (key != nullptr) *key = error.key();
    return error.what();
  }
  FAIL("the layout was accepted");
  return {};
}

}  // namespace

TEST_CASE("rank_order keeps the launcher's order whatever the hosts", "[placement]") {
  ClusterSection cluster;
  cluster.learners = 1;
  cluster.actors = 2;
  CHECK(plan_placement(cluster, {"b", "a", "c"}) == std::vector<int>{0, 1, 2});
}

TEST_CASE("host_groups gives the learner ranks to the training hosts in launcher order", "[placement]") {
  // The launcher interleaved the hosts: training processes at launcher ranks 1 and 4.
  const std::vector<std::string> hosts = {"infer-0", "train-0", "infer-0", "infer-1", "train-1", "infer-1"};
  const std::vector<int> job_rank = plan_placement(two_groups({"train-*"}), hosts);
  CHECK(job_rank == std::vector<int>{2, 0, 3, 4, 1, 5});
  // Naming the inference hosts explicitly gives the same plan.
  CHECK(plan_placement(two_groups({"train-*"}, {"infer-?"}), hosts) == job_rank);
  // Several patterns per group; exact names are patterns too.
  CHECK(plan_placement(two_groups({"train-0", "train-1"}, {"infer-0", "infer-[1-9]"}), hosts) == job_rank);
}

TEST_CASE("a host in neither group or in both stops the layout naming the rank and host", "[placement]") {
  const std::vector<std::string> hosts = {"train-0", "train-0", "infer-0", "infer-0", "login", "infer-0"};
  std::string key;
  const std::string neither = placement_error_text(two_groups({"train-*"}, {"infer-*"}), hosts, &key);
  CHECK(key == "cluster.inference_hosts");
  CHECK_THAT(neither, Catch::Contains("rank 4 runs on host 'login'") && Catch::Contains("matches neither"));
  const std::string both = placement_error_text(two_groups({"train-*"}, {"*"}), hosts);
  CHECK_THAT(both, Catch::Contains("rank 0 runs on host 'train-0'") && Catch::Contains("matches both"));
}

TEST_CASE("group counts that do not fit the roles are an error naming both groups", "[placement]") {
  // Three processes on the training host for two learners.
  const std::vector<std::string> hosts = {"train-0", "train-0", "train-0", "infer-0", "infer-0", "infer-0"};
  std::string key;
  const std::string text = placement_error_text(two_groups({"train-*"}), hosts, &key);
  CHECK(key == "cluster.placement");
  CHECK_THAT(text, Catch::Contains("has 3 rank(s) for 2 learner(s)"));
  CHECK_THAT(text, Catch::Contains("hosts train-0)"));
  CHECK_THAT(text, Catch::Contains("(hosts infer-0) has 3 rank(s) for 4 actor, env worker and standby actor"));
  // No process on the training hosts at all.
  const std::string none = placement_error_text(two_groups({"gpu-*"}), std::vector<std::string>(6, "cpu-0"));
  CHECK_THAT(none, Catch::Contains("hosts none) has 0 rank(s) for 2 learner(s)"));
}
