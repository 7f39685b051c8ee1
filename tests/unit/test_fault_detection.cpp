// Finding lost ranks (RankHealth), the end-of-job answer that names ranks to
// fence, and the [faults] plan grammar.

#include <catch2/catch.hpp>

#include "moerl/config/fault_plan.h"
#include "moerl/core/error.h"
#include "moerl/runtime/heartbeat_messages.h"
#include "moerl/runtime/lost_ranks.h"
#include "moerl/runtime/rank_health.h"

using namespace moerl;
using namespace moerl::runtime;

namespace {

RankLayout four_ranks() {  // learner 0, actors 1-2, env worker 3
  config::ClusterSection cluster;
  cluster.learners = 1;
  cluster.actors = 2;
  cluster.env_workers = 1;
  return RankLayout(cluster);
}

Heartbeat beat_of(int rank, std::int64_t version = 0) {
  Heartbeat h;
  h.rank = rank;
  h.role = rank == 3 ? "env_worker" : "actor";
  h.role_index = rank == 3 ? 0 : rank - 1;
  h.host = "node7";
  h.pid = 1000 + rank;
  h.weight_version = version;
  return h;
}

}  // namespace

TEST_CASE("a rank silent for the heartbeat timeout is declared lost once, named", "[runtime][heartbeat]") {
  RankHealth health(four_ranks(), 10.0, 0.0);
  for (int rank = 1; rank < 4; ++rank) health.beat(beat_of(rank), 1.0);
  health.beat(beat_of(1), 9.0);
  health.beat(beat_of(3), 9.0);
  CHECK(health.check(10.9).empty());  // rank 2: silent 9.9 s
  const std::vector<LostRank> lost = health.check(11.2);
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].rank == 2);
  CHECK(lost[0].role == Role::Actor);
  CHECK(lost[0].role_index == 1);
  CHECK(lost[0].silent_s == Approx(10.2));
  CHECK(lost[0].describe() ==
        "rank 2 (actor 1 on host node7, pid 1002) lost: no heartbeat for 10.2 s "
        "([cluster] heartbeat_timeout_s)");
  CHECK(health.is_lost(2));
  health.beat(beat_of(2), 11.5);          // a lost rank stays lost, even when it beats again
  CHECK(health.check(30.0).size() == 2);  // ranks 1 and 3 go silent too; 2 is not declared twice
}

TEST_CASE("MPI's word declares a rank lost at once; a rank that never beats, after twice the timeout",
          "[runtime][heartbeat]") {
  RankHealth health(four_ranks(), 5.0, 100.0);
  health.beat(beat_of(1), 100.5);
  health.beat(beat_of(2), 100.5);
  std::vector<LostRank> lost = health.check(101.0, {1});
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].rank == 1);
  CHECK(lost[0].why == "MPI reports it dead");
  CHECK(health.check(101.0, {1}).empty());  // once
  health.beat(beat_of(2), 109.0);
  CHECK(health.check(109.9).empty());  // rank 3 never beat: 9.9 s < 2 x 5 s
  lost = health.check(110.1);
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].rank == 3);
  CHECK(lost[0].host.empty());
  CHECK_THAT(lost[0].why, Catch::Contains("no heartbeat at all"));
}

TEST_CASE("an actor behind the published weights past the timeout is flagged once per version",
          "[runtime][heartbeat]") {
  RankHealth health(four_ranks(), 10.0, 0.0);
  health.published(3, 1.0);
  health.beat(beat_of(1, 3), 2.0);
  health.beat(beat_of(2, 2), 2.0);
  CHECK(health.actors_behind(10.0).empty());  // not yet timeout_s after the publication
  const std::vector<std::string> behind = health.actors_behind(11.5);
  REQUIRE(behind.size() == 1);
  CHECK_THAT(behind[0], Catch::Contains("actor 1 (rank 2"));
  CHECK(health.actors_behind(12.0).empty());
}

TEST_CASE("a revived rank (an env worker that joined again) is watched anew, and can be lost again",
          "[runtime][heartbeat]") {
  RankHealth health(four_ranks(), 10.0, 0.0);
  for (int rank = 1; rank < 4; ++rank) health.beat(beat_of(rank), 1.0);
  for (double t : {5.0, 10.0, 15.0, 20.0}) {
    health.beat(beat_of(1), t);
    health.beat(beat_of(2), t);
  }
  REQUIRE(health.check(12.0).size() == 1);  // env worker 3, silent since 1.0
  CHECK(health.is_lost(3));
  health.revive(3, 20.0);
  CHECK_FALSE(health.is_lost(3));
  CHECK(health.check(25.0).empty());  // silent 5 s since the revival: within the timeout
  Heartbeat newcomer = beat_of(3);
  newcomer.pid = 2003;
  health.beat(newcomer, 26.0);
  REQUIRE(health.last(3) != nullptr);
  CHECK(health.last(3)->pid == 2003);  // a revived rank's beats count again
  health.beat(beat_of(1), 30.0);
  health.beat(beat_of(2), 30.0);
  const std::vector<LostRank> lost = health.check(36.5);
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].rank == 3);
  CHECK(lost[0].pid == 2003);
}

TEST_CASE("lost ranks: a rejoin ends a loss but keeps the history, and a rejoined rank can be lost again",
          "[runtime][failover]") {
  LostRanks registry;
  RankLost first{4, "env_worker", 1, "node7", 1004, "released on its signal 15"};
  CHECK(registry.add(first));
  CHECK_FALSE(registry.add(first));  // once per loss
  CHECK(registry.contains(4));
  CHECK_FALSE(registry.rejoin(3));  // never lost
  CHECK(registry.rejoin(4));
  CHECK_FALSE(registry.rejoin(4));  // already back
  CHECK_FALSE(registry.contains(4));
  CHECK(registry.ranks().empty());
  CHECK(registry.ever_lost() == std::set<int>{4});
  CHECK(registry.epoch() == 1);  // the notice stays: roles index the history by epoch
  CHECK(registry.rejoined_since(0) == std::vector<int>{4});
  CHECK(registry.rejoined_since(1).empty());
  RankLost second{4, "env_worker", 1, "node7", 2004, "no heartbeat for 10.1 s"};
  CHECK(registry.add(second));  // the new process is lost in its turn
  CHECK(registry.contains(4));
  CHECK(registry.epoch() == 2);
  CHECK(registry.all().back().pid == 2004);
}

TEST_CASE("learner 0's end-of-job answer carries the ranks to fence", "[runtime][wire]") {
  EndOfJob answer;
  answer.status = 4;
  answer.fence = {{3, "node7", 1234}, {5, "node8", 99}};
  ByteWriter w;
  answer.encode(w);
  ByteReader r(w.bytes());
  const EndOfJob back = EndOfJob::decode(r);
  CHECK(back.status == 4);
  REQUIRE(back.fence.size() == 2);
  CHECK(back.fence[1].rank == 5);
  CHECK(back.fence[1].host == "node8");
  CHECK(back.fence[1].pid == 99);
}

TEST_CASE("[faults] plan entries: every form, and errors that name the entry", "[config][faults]") {
  using config::FaultKind;
  using config::FaultTrigger;
  config::FaultAction a = config::parse_fault("kill actor 1 at step 3");
  CHECK((a.kind == FaultKind::FaultKill && a.role == "actor" && a.index == 1));
  CHECK((a.trigger == FaultTrigger::TriggerStep && a.when == 3 && !a.every_attempt));
  a = config::parse_fault("freeze env_worker 0 at 12.5 s");
  CHECK((a.kind == FaultKind::FaultFreeze && a.role == "env_worker" && a.trigger == FaultTrigger::TriggerSeconds));
  CHECK(a.when == 12.5);
  a = config::parse_fault("slow actor 0 by 50 ms at step 2");
  CHECK((a.kind == FaultKind::FaultSlow && a.slow_ms == 50 && a.when == 2));
  a = config::parse_fault("kill actor 0 while receiving");
  CHECK(a.trigger == FaultTrigger::TriggerReceiving);
  a = config::parse_fault("corrupt bucket at step 4");
  CHECK((a.kind == FaultKind::FaultCorruptBucket && a.role == "learner"));
  a = config::parse_fault("corrupt message actor 1 at step 3");
  CHECK((a.kind == FaultKind::FaultCorruptMessage && a.index == 1));
  a = config::parse_fault("kill learner 0 at 2 s on every attempt");
  CHECK((a.every_attempt && a.role == "learner" && a.when == 2));

  CHECK_THROWS_WITH(config::parse_fault("kill wizard 0 at step 1"),
                    Catch::Contains("\"kill wizard 0 at step 1\"") && Catch::Contains("unknown role 'wizard'"));
  CHECK_THROWS_WITH(config::parse_fault("kill actor 0 soon"), Catch::Contains("expected \"at step N\""));
  CHECK_THROWS_WITH(config::parse_fault("freeze env_worker 0 while receiving"),
                    Catch::Contains("for killing an actor"));
  CHECK_THROWS_WITH(config::parse_fault("kill actor -1 at step 1"), Catch::Contains("a role index"));
  CHECK_THROWS_WITH(config::parse_fault("explode actor 0 at step 1"), Catch::Contains("unknown fault 'explode'"));
}
