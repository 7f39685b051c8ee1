// Periodic held-out evaluation ([eval] every_steps): a round's bookkeeping
// (learner/periodic_evaluation.h), its record on disk and the regression
// test against a reference (learner/evaluation_record.h).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "family_score_fixture.h"
#include "moerl/core/error.h"
#include "moerl/learner/periodic_evaluation.h"

using namespace moerl;
using namespace moerl::learner;
using moerl::learner::testing::score;

namespace {

rollout::TaskGroup eval_group(std::uint64_t id, const std::string& family) {
  rollout::TaskGroup g;
  g.group_id = id;
  g.task.family = family;
  g.evaluation = true;
  g.size = 1;
  return g;
}

rollout::Trajectory episode(std::uint64_t group, const std::string& family, bool success, std::int32_t version) {
  rollout::Trajectory t;
  t.group_id = group;
  t.task.family = family;
  t.success = success;
  t.tokens = {1, 2, 3};
  t.versions = {-1, version, version};
  t.generated = {0, 1, 1};
  return t;
}

}  // namespace

TEST_CASE("a periodic round is due at multiples of every_steps, one at a time, never at the last step",
          "[evaluation][periodic]") {
  PeriodicEvaluation off(0, 1.0);
  CHECK_FALSE(off.due(10, false));
  PeriodicEvaluation p(5, 1.0);
  CHECK_FALSE(p.due(4, false));
  CHECK(p.due(5, false));
  CHECK_FALSE(p.due(5, true));
  p.begin(5, {eval_group(100, "sort"), eval_group(101, "sort")}, {});
  CHECK_FALSE(p.due(10, false));  // the round of v5 is still out
  CHECK(p.owns(100));
  CHECK_FALSE(p.owns(7));
  p.record(episode(100, "sort", true, 5));
  CHECK_FALSE(p.take_finished());
  p.record(episode(101, "sort", false, 6));
  const auto done = p.take_finished();
  REQUIRE(done);
  CHECK(done->version == 5);
  CHECK(done->sampled.at("sort").episodes == 2);
  CHECK(done->sampled.at("sort").successes == 1);
  CHECK(done->lowest_version == 5);
  CHECK(done->highest_version == 6);
  CHECK(p.due(10, false));
}

TEST_CASE("greedy twins score apart; an abandoned round never finishes", "[evaluation][periodic]") {
  PeriodicEvaluation p(5, 1.0);
  p.begin(10, {eval_group(1, "maze"), eval_group(2, "maze")}, {2});
  p.record(episode(1, "maze", false, 10));
  p.record(episode(2, "maze", true, 10));
  const auto done = p.take_finished();
  REQUIRE(done);
  CHECK(done->sampled.at("maze").successes == 0);
  CHECK(done->greedy.at("maze").successes == 1);
  p.begin(15, {eval_group(3, "maze")}, {});
  p.abandon();
  p.record(episode(3, "maze", true, 15));
  CHECK_FALSE(p.take_finished());
}

TEST_CASE("evaluation records round-trip through their file; a damaged one is named", "[evaluation][periodic]") {
  const std::string dir = (std::filesystem::temp_directory_path() / "moerl-eval-records").string();
  std::filesystem::remove_all(dir);
  EvaluationRecord r;
  r.version = 12;
  r.lowest_version = 12;
  r.highest_version = 13;
  r.temperature = 1.0;
  r.sampled = {{"sort", score(30, 64)}, {"guess", score(10, 64)}};
  r.greedy = {{"sort", score(40, 64)}};
  write_evaluation(dir, r);
  CHECK(std::filesystem::exists(dir + "/v000012.eval.json"));
  const auto back = read_evaluation(dir, 12);
  REQUIRE(back);
  CHECK(back->version == 12);
  CHECK(back->highest_version == 13);
  CHECK(back->sampled.at("sort").successes == 30);
  CHECK(back->sampled.at("guess").episodes == 64);
  CHECK(back->sampled.at("sort").reward == Approx(30.0));
  CHECK(back->greedy.at("sort").successes == 40);
  CHECK_FALSE(read_evaluation(dir, 13));
  EvaluationRecord base;
  base.sampled = {{"sort", score(1, 4)}};
  write_evaluation(dir, base);
  CHECK(std::filesystem::exists(dir + "/base.eval.json"));
  CHECK(read_evaluation(dir, -1)->sampled.at("sort").successes == 1);
  std::ofstream(dir + "/v000014.eval.json") << "{\"version\": 14";
  CHECK_THROWS_WITH(read_evaluation(dir, 14), Catch::Contains("v000014.eval.json"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a regression is a family below the reference beyond the interval of the difference",
          "[evaluation][periodic]") {
  const ScoreTable reference = {{"sort", score(48, 64)}, {"guess", score(32, 64)}};
  // 40/64 vs 48/64: within the noise. 16/64 vs 32/64: beyond it.
  const ScoreTable candidate = {{"sort", score(40, 64)}, {"guess", score(16, 64)}, {"maze", score(0, 64)}};
  const std::vector<std::string> worse = regressions(reference, candidate);
  REQUIRE(worse.size() == 1);
  CHECK(worse[0].rfind("guess 25% vs 50% (-25 points", 0) == 0);
  CHECK(regressions(reference, reference).empty());
  CHECK(regressions(reference, {{"sort", score(0, 0)}}).empty());  // nothing played: nothing judged
}
