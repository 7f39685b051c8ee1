// The curriculum over training tasks: levels move on the success of the
// first groups started at the current level, once all of them are back (not
// on the episodes that end first), within the family's range; the
// adaptive weights favour the family whose success moves; evaluation-free
// state survives a checkpoint; the family draw follows the scales.

#include <catch2/catch.hpp>

#include "moerl/config/config.h"
#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"
#include "moerl/env/task_mix.h"
#include "moerl/learner/curriculum.h"
#include "moerl/setup/config_loading.h"

using namespace moerl;
using moerl::learner::Curriculum;
using moerl::learner::EpisodeOutcome;

namespace {

config::Config curriculum_config(const std::string& extra = "") {
  return setup::load_config_text(
      "[env]\nfamilies = [\"sort\", \"guess\"]\ndifficulty = 1\ncurriculum = true\n"
      "curriculum_window = 4\ncurriculum_max_difficulty = 3\n" +
          extra,
      "curriculum.toml");
}

std::uint64_t next_group_id = 1;

// Episodes of one-episode groups at `difficulty`, each started and finished
// in turn (one started at an older level only finishes).
void play(Curriculum& curriculum, const std::string& family, int difficulty, int successes, int failures) {
  for (int i = 0; i < successes + failures; ++i) {
    const std::uint64_t id = next_group_id++;
    if (difficulty == curriculum.difficulty(family)) curriculum.start_group(family, id, 1);
    curriculum.record({family, difficulty, i < successes, id});
  }
}

}  // namespace

TEST_CASE("a full window of success raises the level, of failure lowers it", "[curriculum]") {
  const config::Config config = curriculum_config();
  Curriculum curriculum(config.env, config.env_families);
  CHECK(curriculum.difficulty("sort") == 1);
  play(curriculum, "sort", 1, 3, 0);
  CHECK(curriculum.difficulty("sort") == 1);  // the window is not full yet
  play(curriculum, "sort", 1, 1, 0);
  CHECK(curriculum.difficulty("sort") == 2);
  CHECK(curriculum.difficulty("guess") == 1);  // families move apart
  // Episodes still in flight at the old level decide nothing.
  play(curriculum, "sort", 1, 0, 8);
  CHECK(curriculum.difficulty("sort") == 2);
  // Half and half stays between the thresholds (0.25 < 0.5 < 0.75).
  play(curriculum, "sort", 2, 2, 2);
  CHECK(curriculum.difficulty("sort") == 2);
  play(curriculum, "sort", 2, 0, 4);
  CHECK(curriculum.difficulty("sort") == 1);
  // Bounds: never below 1, never above curriculum_max_difficulty.
  play(curriculum, "sort", 1, 0, 8);
  CHECK(curriculum.difficulty("sort") == 1);
  play(curriculum, "sort", 1, 4, 0);
  play(curriculum, "sort", 2, 4, 0);
  play(curriculum, "sort", 3, 8, 0);
  CHECK(curriculum.difficulty("sort") == 3);
}

TEST_CASE("the groups started first decide, not the episodes that end first", "[curriculum]") {
  // A lookup-like family: failures end early, successes take every hop. Two
  // groups of 2 start at level 2 (the window is 4); while they are played,
  // quick failures of groups started later come back first.
  const config::Config config = curriculum_config("[env.sort]\ndifficulty = 2\n");
  Curriculum curriculum(config.env, config.env_families);
  REQUIRE(curriculum.start_group("sort", 100, 2) == 2);
  REQUIRE(curriculum.start_group("sort", 101, 2) == 2);
  for (std::uint64_t id = 102; id < 105; ++id) {
    REQUIRE(curriculum.start_group("sort", id, 2) == 2);
    curriculum.record({"sort", 2, false, id});
    curriculum.record({"sort", 2, false, id});
  }
  CHECK(curriculum.difficulty("sort") == 2);  // six failures back, but none of the sample
  curriculum.record({"sort", 2, true, 100});
  curriculum.record({"sort", 2, true, 100});
  curriculum.record({"sort", 2, true, 101});
  CHECK(curriculum.difficulty("sort") == 2);  // the sample is not all back
  curriculum.record({"sort", 2, true, 101});
  CHECK(curriculum.difficulty("sort") == 3);  // 4 of 4 of the groups started first
}

TEST_CASE("a sample group that never comes back is given up after twice the window", "[curriculum]") {
  const config::Config config = curriculum_config("[env.sort]\ndifficulty = 2\n");  // window 4
  Curriculum curriculum(config.env, config.env_families);
  curriculum.start_group("sort", 1, 2);
  curriculum.start_group("sort", 2, 2);  // lost: it never comes back
  curriculum.record({"sort", 2, false, 1});
  curriculum.record({"sort", 2, false, 1});
  for (std::uint64_t id = 3; id < 7; ++id) {
    curriculum.start_group("sort", id, 2);
    curriculum.record({"sort", 2, true, id});
    if (id < 6) curriculum.record({"sort", 2, true, id});
  }
  CHECK(curriculum.difficulty("sort") == 2);  // 7 later episodes: still waiting for group 2
  curriculum.record({"sort", 2, true, 6});    // the 8th: group 2 is given up, group 1 decides
  CHECK(curriculum.difficulty("sort") == 1);  // 0 of 2: lowered
  // A sample with nothing back at all starts over with the next groups.
  Curriculum other(config.env, config.env_families);
  other.start_group("guess", 1, 4);  // lost
  for (std::uint64_t id = 2; id < 10; ++id) {
    other.start_group("guess", id, 1);
    other.record({"guess", 1, true, id});
  }
  for (std::uint64_t id = 10; id < 14; ++id) {
    other.start_group("guess", id, 1);
    other.record({"guess", 1, true, id});
  }
  CHECK(other.difficulty("guess") == 2);
}

TEST_CASE("without [env] curriculum the levels stay where the config puts them", "[curriculum]") {
  const config::Config config = curriculum_config("[env.sort]\ndifficulty = 2\n");
  config::Config off = config;
  off.env.curriculum = false;
  Curriculum curriculum(off.env, off.env_families);
  play(curriculum, "sort", 2, 16, 0);
  CHECK(curriculum.difficulty("sort") == 2);
  CHECK(curriculum.weight_scales().at("sort") == 1.0);
}

TEST_CASE("adaptive weights favour the family whose success moves", "[curriculum]") {
  config::Config config = curriculum_config();
  config.env.curriculum = false;
  config.env.adaptive_weights = true;
  Curriculum curriculum(config.env, config.env_families);
  // guess stands still at 50%; sort goes from failing to succeeding.
  for (int i = 0; i < 100; ++i) curriculum.record({"guess", 1, i % 2 == 0});
  play(curriculum, "sort", 1, 0, 50);
  play(curriculum, "sort", 1, 50, 0);
  const auto scales = curriculum.weight_scales();
  CHECK(scales.at("sort") == Approx(1.0));
  CHECK(scales.at("guess") < 0.5);
  CHECK(scales.at("guess") >= 0.2);  // the floor: a change in it is still seen
  // The draw follows the scales: a family scaled to nothing is never drawn.
  int sort_draws = 0;
  for (std::uint64_t draw = 0; draw < 2000; ++draw)
    sort_draws += env::pick_family(config.env, config.env_families, draw * 0x9E3779B97F4A7C15ull, {},
                                   {{"sort", 1.0}, {"guess", 0.0}}) == "sort";
  CHECK(sort_draws == 2000);
  int weighted = 0;
  for (std::uint64_t draw = 0; draw < 4000; ++draw)
    weighted += env::pick_family(config.env, config.env_families, draw * 0x9E3779B97F4A7C15ull, {},
                                 {{"sort", 3.0}, {"guess", 1.0}}) == "sort";
  CHECK(weighted == Approx(3000).margin(150));  // 3:1
}

TEST_CASE("levels and averages survive a checkpoint", "[curriculum]") {
  const config::Config config = curriculum_config();
  Curriculum first(config.env, config.env_families);
  play(first, "guess", 1, 4, 0);
  REQUIRE(first.difficulty("guess") == 2);
  JsonWriter json;
  first.write_json(json);
  Curriculum resumed(config.env, config.env_families);
  resumed.restore(JsonValue::parse(json.str()));
  CHECK(resumed.difficulty("guess") == 2);
  CHECK(resumed.difficulty("sort") == 1);
  // The window starts empty after a resume: three more successes do not move it yet.
  play(resumed, "guess", 2, 3, 0);
  CHECK(resumed.difficulty("guess") == 2);
  play(resumed, "guess", 2, 1, 0);
  CHECK(resumed.difficulty("guess") == 3);
}

TEST_CASE("curriculum thresholds that cross are refused naming the key", "[curriculum]") {
  CHECK_THROWS_WITH(
      curriculum_config("curriculum_raise_at = 0.3\ncurriculum_lower_at = 0.5\n"),
      Catch::Contains("curriculum.toml:8: [env] curriculum_lower_at: must be below env.curriculum_raise_at"));
}
