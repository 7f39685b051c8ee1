// Rank layout, thread choice and the benchmark result format.

#include <catch2/catch.hpp>

#include "moerl/bench/report.h"
#include "moerl/runtime/rank_layout.h"
#include "moerl/runtime/world.h"

using namespace moerl::runtime;

TEST_CASE("ranks are laid out learners, actors, env workers, standby", "[runtime]") {
  moerl::config::ClusterSection cluster;
  cluster.learners = 2;
  cluster.actors = 3;
  cluster.env_workers = 2;
  cluster.standby_actors = 1;
  const RankLayout layout(cluster);
  CHECK(layout.world_size() == 8);
  const Role expected[] = {Role::Learner, Role::Learner,   Role::Actor,     Role::Actor,
                           Role::Actor,   Role::EnvWorker, Role::EnvWorker, Role::StandbyActor};
  const int index[] = {0, 1, 0, 1, 2, 0, 1, 0};
  for (int rank = 0; rank < 8; ++rank) {
    INFO("rank " << rank);
    CHECK(layout.assignment(rank).role == expected[rank]);
    CHECK(layout.assignment(rank).index == index[rank]);
  }
  CHECK(layout.ranks_of(Role::EnvWorker) == std::vector<int>{5, 6});
  CHECK_THROWS_WITH(layout.assignment(8), Catch::Contains("outside the rank layout"));
}

TEST_CASE("compute threads: environment, then config, then cores per rank", "[runtime]") {
  CHECK(choose_compute_threads(0, nullptr, 16, 4) == 4);
  CHECK(choose_compute_threads(0, nullptr, 2, 5) == 1);
  CHECK(choose_compute_threads(3, nullptr, 16, 4) == 3);
  CHECK(choose_compute_threads(3, "2", 16, 4) == 2);
  CHECK(choose_compute_threads(0, "", 8, 2) == 4);
}

TEST_CASE("benchmark reports: ratios and the shared JSON format", "[bench]") {
  moerl::bench::BenchCase faster{
      "ours", {{"experts", std::int64_t{64}}}, {{"tokens_per_s", 300.0}}, {{"tokens_per_s", 100.0}}, "tokens_per_s",
      true};
  moerl::bench::BenchCase latency{"p99", {}, {{"latency_s", 0.2}}, {{"latency_s", 0.5}}, "latency_s", false};
  moerl::bench::BenchCase none{"plain", {}, {{"x", 1.0}}, {}, "", true};
  CHECK(*faster.ratio() == Approx(3.0));
  CHECK(*latency.ratio() == Approx(2.5));
  CHECK_FALSE(none.ratio().has_value());

  moerl::bench::BenchReport report{"moe", {{"cores", std::int64_t{2}}}, {faster, none}};
  const std::string json = report.to_json();
  CHECK_THAT(
      json,
      Catch::StartsWith(
          R"({"bench":"moe","host":{"cores":2},"cases":[{"name":"ours","params":{"experts":64},"metrics":{"tokens_per_s":300},"baseline":{"tokens_per_s":100},"ratio":3,)"));
  CHECK_THAT(json, Catch::Contains(R"("name":"plain","params":{},"metrics":{"x":1},"baseline":{},"ratio":null)"));
  const std::string table = report.to_table();
  CHECK_THAT(table, Catch::Contains("3.00x tokens_per_s"));
  CHECK_FALSE(moerl::bench::describe_host().empty());
}
