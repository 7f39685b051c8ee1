// The built-in task families: determinism, the scripted expert, malformed
// actions, snapshots, reward shaping and budgets, for every family and
// difficulty; plus the `calc` tool's parser.

#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>

#include "moerl/core/error.h"
#include "moerl/env/calculator.h"
#include "moerl/env/environment.h"
#include "moerl/env/task_family.h"

using namespace moerl::env;

namespace {

struct Turn {
  std::string action;
  std::string observation;
  double reward = 0.0;
  bool done = false;
  std::map<std::string, std::string> info;
  bool operator==(const Turn& o) const {
    return action == o.action && observation == o.observation && reward == o.reward && done == o.done && info == o.info;
  }
};

std::string describe(const Turn& t) {
  std::ostringstream out;
  out << "action=" << t.action << " obs=" << t.observation << " reward=" << t.reward << " done=" << t.done;
  for (const auto& [k, v] : t.info) out << " " << k << "=" << v;
  return out.str();
}

std::string info_of(const std::map<std::string, std::string>& info, const std::string& key) {
  const auto found = info.find(key);
  return found == info.end() ? std::string() : found->second;
}

std::uint64_t action_seed(std::uint64_t seed, int turn) { return seed * 1000003ULL + static_cast<std::uint64_t>(turn); }

TaskSpec spec_of(const std::string& family, int difficulty, std::uint64_t seed,
                 RewardShaping shaping = RewardShaping::Sparse, int max_turns = 0) {
  TaskSpec spec;
  spec.family = family;
  spec.difficulty = difficulty;
  spec.seed = seed;
  spec.shaping = shaping;
  spec.max_turns = max_turns;
  return spec;
}

// Plays the expert until the episode ends (or `limit` turns).
std::vector<Turn> play_expert(Environment& env, double error_rate, std::uint64_t seed, int limit = 1 << 30) {
  std::vector<Turn> turns;
  while (!env.done() && static_cast<int>(turns.size()) < limit) {
    Turn t;
    t.action = env.expert_action(error_rate, action_seed(seed, env.turns_taken()));
    const StepResult r = env.step(t.action);
    t.observation = r.observation;
    t.reward = r.reward;
    t.done = r.done;
    t.info = r.info;
    turns.push_back(t);
  }
  return turns;
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const auto& f : builtin_families()) names.push_back(f.name);
  return names;
}

int max_difficulty(const std::string& family) { return find_builtin_family(family)->max_difficulty; }

// Actions that are invalid in every family.
const std::vector<std::string> kGarbage = {
    "",
    " ",
    "\n\n",
    "\t \r\n",
    "hello world",
    "99999999999999999999999999999999",
    "-9223372036854775809",
    "swap 99999999999999999999 1",
    "guess 1e9",
    "get",
    "answer",
    "calc",
    "move",
    "move sideways",
    "swap -1 0",
    "swap 0",
    "guess",
    "\xc3\xb1\xe2\x86\x92\xf0\x9f\x98\x80",  // ñ→😀
    "guess \xef\xbc\x95",                    // fullwidth digit five
    "\xff\xfe\x00\x01",
    std::string("up\0down", 7),
    std::string(5000, 'a'),
    std::string(2000, '('),
    "answer 1 2 3",
    "get a b",
    "UP UP",
    ":::",
};

}  // namespace

TEST_CASE("the registry lists the five built-in families", "[env]") {
  const auto names = family_names();
  REQUIRE(names == std::vector<std::string>{"arithmetic", "maze", "guess", "sort", "lookup"});
  for (const auto& f : builtin_families()) {
    INFO(f.name);
    CHECK(f.max_difficulty >= 5);
    CHECK(!f.summary.empty());
    CHECK(find_builtin_family(f.name) == &f);
    CHECK(make_builtin_environment(f.name) != nullptr);
  }
  CHECK(find_builtin_family("chess") == nullptr);
  try {
    make_builtin_environment("chess");
    FAIL("unknown family accepted");
  } catch (const moerl::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("chess") != std::string::npos);
    CHECK(what.find("arithmetic") != std::string::npos);
    CHECK(what.find("lookup") != std::string::npos);
  }
}

TEST_CASE("open refuses bad specs and misuse throws", "[env]") {
  for (const auto& name : family_names()) {
    INFO(name);
    auto env = make_builtin_environment(name);
    CHECK_THROWS_AS(env->step("x"), moerl::Error);   // before open
    CHECK_THROWS_AS(env->snapshot(), moerl::Error);  // before open
    CHECK_THROWS_AS(env->expert_action(0.0, 1), moerl::Error);
    CHECK_THROWS_AS(env->open(spec_of(name, 0, 1)), moerl::Error);
    CHECK_THROWS_AS(env->open(spec_of(name, max_difficulty(name) + 1, 1)), moerl::Error);
    CHECK_THROWS_AS(env->open(spec_of(name, 1, 1, RewardShaping::Sparse, -1)), moerl::Error);
    CHECK_THROWS_AS(env->open(spec_of(name == "maze" ? "sort" : "maze", 1, 1)), moerl::Error);
    TaskSpec unnamed = spec_of("", 1, 1);
    CHECK_NOTHROW(env->open(unnamed));
  }
}

TEST_CASE("families are deterministic given the seed", "[env]") {
  for (const auto& name : family_names()) {
    for (int d : {1, max_difficulty(name)}) {
      INFO(name << " difficulty " << d);
      auto a = make_builtin_environment(name);
      auto b = make_builtin_environment(name);
      const std::string intro_a = a->open(spec_of(name, d, 42));
      const std::string intro_b = b->open(spec_of(name, d, 42));
      CHECK(intro_a == intro_b);
      const auto ta = play_expert(*a, 0.3, 7);
      const auto tb = play_expert(*b, 0.3, 7);
      REQUIRE(ta.size() == tb.size());
      for (size_t k = 0; k < ta.size(); ++k) {
        INFO("turn " << k << ": " << describe(ta[k]) << " vs " << describe(tb[k]));
        CHECK(ta[k] == tb[k]);
      }
      // Reopening the same object resets it completely.
      CHECK(a->open(spec_of(name, d, 42)) == intro_a);
      CHECK(a->turns_taken() == 0);
      CHECK_FALSE(a->done());

      // Other seeds give other tasks (the intro, or the feedback to the same play).
      int differing = 0;
      for (std::uint64_t seed = 100; seed < 105; ++seed) {
        auto c = make_builtin_environment(name);
        std::string transcript = c->open(spec_of(name, d, seed));
        for (const auto& t : play_expert(*c, 0.0, 1)) transcript += "|" + t.observation;
        auto e = make_builtin_environment(name);
        std::string reference = e->open(spec_of(name, d, 42));
        for (const auto& t : play_expert(*e, 0.0, 1)) reference += "|" + t.observation;
        differing += transcript != reference;
      }
      CHECK(differing >= 4);
    }
  }
}

TEST_CASE("the expert at error rate 0 succeeds at every difficulty", "[env]") {
  for (const auto& name : family_names()) {
    for (int d = 1; d <= max_difficulty(name); ++d) {
      for (std::uint64_t seed = 1; seed <= 6; ++seed) {
        INFO(name << " difficulty " << d << " seed " << seed);
        auto env = make_builtin_environment(name);
        const std::string intro = env->open(spec_of(name, d, seed));
        CHECK(intro.size() <= 400);
        const auto turns = play_expert(*env, 0.0, seed);
        REQUIRE(!turns.empty());
        CHECK(env->done());
        CHECK(env->succeeded());
        CHECK(turns.back().info.at("success") == "1");
        CHECK(turns.back().reward == 1.0);
        CHECK(env->turns_taken() == static_cast<int>(turns.size()));
        CHECK(env->turns_taken() <= env->max_turns());
        for (const auto& t : turns) {
          INFO(describe(t));
          CHECK(t.info.count("invalid") == 0);
          CHECK(t.observation.size() <= 200);
        }
      }
    }
  }
}

TEST_CASE("horizons span a few turns to 50+", "[env]") {
  int longest = 0, shortest = 1 << 30;
  for (const auto& name : family_names()) {
    for (int d : {1, max_difficulty(name)}) {
      auto env = make_builtin_environment(name);
      env->open(spec_of(name, d, 3));
      const int turns = static_cast<int>(play_expert(*env, 0.0, 3).size());
      longest = std::max(longest, turns);
      shortest = std::min(shortest, turns);
      if (d == max_difficulty(name)) {
        INFO(name << " expert turns at the top difficulty: " << turns);
        CHECK(turns >= 30);
      }
    }
  }
  CHECK(shortest <= 3);
  CHECK(longest >= 50);
}

TEST_CASE("the expert with error rate 0.3 still mostly succeeds within the budget", "[env]") {
  for (const auto& name : family_names()) {
    for (int d : {1, (max_difficulty(name) + 1) / 2, max_difficulty(name)}) {
      int successes = 0;
      const int episodes = 20;
      for (int seed = 1; seed <= episodes; ++seed) {
        INFO(name << " difficulty " << d << " seed " << seed);
        auto env = make_builtin_environment(name);
        env->open(spec_of(name, d, static_cast<std::uint64_t>(seed)));
        const auto turns = play_expert(*env, 0.3, static_cast<std::uint64_t>(seed) + 99);
        CHECK(env->done());
        CHECK(env->turns_taken() <= env->max_turns());
        CHECK(turns.back().info.count("success") == 1);
        successes += env->succeeded();
      }
      INFO(name << " difficulty " << d << ": " << successes << "/" << episodes << " successes");
      CHECK(successes >= episodes / 2);
    }
  }
}

TEST_CASE("error rate 1 makes the expert err", "[env]") {
  for (const auto& name : family_names()) {
    INFO(name);
    auto env = make_builtin_environment(name);
    env->open(spec_of(name, 3, 5));
    int differs = 0;
    for (std::uint64_t s = 0; s < 10; ++s) differs += env->expert_action(1.0, s) != env->expert_action(0.0, s);
    CHECK(differs >= 8);
  }
}

TEST_CASE("malformed actions are refused, use a turn, and never throw", "[env]") {
  for (const auto& name : family_names()) {
    INFO(name);
    auto env = make_builtin_environment(name);
    env->open(spec_of(name, 2, 11, RewardShaping::Shaped, 1000));
    int turn = 0;
    for (const auto& garbage : kGarbage) {
      INFO("action " << turn << " (" << garbage.size() << " bytes)");
      StepResult r;
      REQUIRE_NOTHROW(r = env->step(garbage));
      ++turn;
      CHECK(env->turns_taken() == turn);
      CHECK(r.observation.rfind("invalid action: ", 0) == 0);
      CHECK(info_of(r.info, "invalid") == "1");
      CHECK(r.reward == Approx(-0.01));
      CHECK_FALSE(r.done);
      CHECK(r.observation.size() <= 200);
    }
    // A valid action afterwards still works.
    const StepResult ok = env->step(env->expert_action(0.0, 1));
    CHECK(ok.info.count("invalid") == 0);
  }
}

TEST_CASE("family-specific illegal actions", "[env]") {
  auto check_invalid = [](Environment& env, const std::string& action, const std::string& why) {
    INFO(action);
    const StepResult r = env.step(action);
    CHECK(r.observation.rfind("invalid action: ", 0) == 0);
    CHECK(r.observation.find(why) != std::string::npos);
    CHECK(info_of(r.info, "invalid") == "1");
  };
  auto sort = make_builtin_environment("sort");
  sort->open(spec_of("sort", 1, 1, RewardShaping::Sparse, 100));
  check_invalid(*sort, "swap 0 3", "out of range");
  check_invalid(*sort, "swap 1 1", "differ");
  check_invalid(*sort, "swap a b", "not an integer");
  check_invalid(*sort, "sort it", "unknown verb");

  auto guess = make_builtin_environment("guess");
  guess->open(spec_of("guess", 1, 1, RewardShaping::Sparse, 100));
  check_invalid(*guess, "guess 0", "outside 1..10");
  check_invalid(*guess, "guess 11", "outside 1..10");
  check_invalid(*guess, "guess five", "not an integer");

  auto maze = make_builtin_environment("maze");
  maze->open(spec_of("maze", 1, 1, RewardShaping::Sparse, 100));
  // The start is the top-left cell: the outer wall is above and to the left.
  check_invalid(*maze, "up", "wall");
  check_invalid(*maze, "move left", "wall");
  check_invalid(*maze, "jump", "unknown move");

  auto lookup = make_builtin_environment("lookup");
  lookup->open(spec_of("lookup", 1, 1, RewardShaping::Sparse, 100));
  check_invalid(*lookup, "get", "usage");
  check_invalid(*lookup, "fetch abcd", "unknown verb");
  const StepResult missing = lookup->step("get zzzzzz");
  CHECK(missing.info.count("invalid") == 0);
  CHECK(info_of(missing.info, "not_found") == "1");

  auto arithmetic = make_builtin_environment("arithmetic");
  arithmetic->open(spec_of("arithmetic", 1, 1, RewardShaping::Sparse, 100));
  check_invalid(*arithmetic, "answer twelve", "not an integer");
  check_invalid(*arithmetic, "compute 1+1", "unknown verb");
  const StepResult zero = arithmetic->step("calc 1/0");
  CHECK(zero.observation == "calc error: division by zero");
  CHECK(zero.info.count("invalid") == 0);
  CHECK(info_of(zero.info, "calc_error") == "1");
  const StepResult bad = arithmetic->step("calc 1 +");
  CHECK(bad.observation.rfind("calc error: ", 0) == 0);
  CHECK(arithmetic->step("calc (2+3)*4").observation == "= 20");
  CHECK(arithmetic->step("CALC 7 / 2").observation == "= 3");
}

TEST_CASE("actions accept harmless variations", "[env]") {
  auto maze = make_builtin_environment("maze");
  const std::string intro = maze->open(spec_of("maze", 4, 9, RewardShaping::Sparse, 100));
  const std::string best = maze->expert_action(0.0, 0);
  CHECK(maze->step("  Move " + best + "\n").info.count("invalid") == 0);
  const std::string next = maze->expert_action(0.0, 0);
  CHECK(maze->step(std::string(1, next[0])).info.count("invalid") == 0);

  auto guess = make_builtin_environment("guess");
  guess->open(spec_of("guess", 2, 9));
  CHECK(guess->step("50").info.count("invalid") == 0);
  CHECK(guess->step("Guess: 25").info.count("invalid") == 0);

  auto sort = make_builtin_environment("sort");
  sort->open(spec_of("sort", 3, 9, RewardShaping::Sparse, 100));
  CHECK(sort->step("swap 0,1").info.count("invalid") == 0);
  CHECK(sort->step("swap 0, 1").info.count("invalid") == 0);
}

TEST_CASE("snapshot -> restore into a fresh session continues identically", "[env]") {
  for (const auto& name : family_names()) {
    for (int d : {1, 3, max_difficulty(name)}) {
      for (auto shaping : {RewardShaping::Sparse, RewardShaping::Shaped}) {
        INFO(name << " difficulty " << d << " shaped " << (shaping == RewardShaping::Shaped));
        const TaskSpec spec = spec_of(name, d, 1234, shaping);
        auto original = make_builtin_environment(name);
        original->open(spec);
        const auto head = play_expert(*original, 0.3, 55, 3);
        if (original->done()) continue;
        const auto bytes = original->snapshot();
        CHECK(bytes.size() < 4096);
        const auto tail = play_expert(*original, 0.3, 55);

        auto copy = make_builtin_environment(name);
        copy->restore(bytes);
        CHECK(copy->turns_taken() == static_cast<int>(head.size()));
        CHECK(copy->max_turns() == original->max_turns());
        CHECK_FALSE(copy->done());
        CHECK(copy->snapshot() == bytes);
        const auto replay = play_expert(*copy, 0.3, 55);
        REQUIRE(replay.size() == tail.size());
        for (size_t k = 0; k < tail.size(); ++k) {
          INFO("turn " << k << ": " << describe(tail[k]) << " vs " << describe(replay[k]));
          CHECK(tail[k] == replay[k]);
        }
        CHECK(copy->succeeded() == original->succeeded());

        // A finished session restores as finished, and refuses further steps.
        auto finished = make_builtin_environment(name);
        finished->restore(original->snapshot());
        CHECK(finished->done());
        CHECK(finished->succeeded() == original->succeeded());
        CHECK_THROWS_AS(finished->step("x"), moerl::Error);
      }
    }
  }
}

TEST_CASE("restoring corrupted or foreign snapshots throws and keeps the session", "[env]") {
  std::map<std::string, std::vector<std::uint8_t>> snapshots;
  for (const auto& name : family_names()) {
    auto env = make_builtin_environment(name);
    env->open(spec_of(name, 2, 77));
    play_expert(*env, 0.0, 1, 1);
    snapshots[name] = env->snapshot();
  }
  for (const auto& name : family_names()) {
    INFO(name);
    auto env = make_builtin_environment(name);
    env->open(spec_of(name, 2, 5));
    const auto before = env->snapshot();
    const auto& good = snapshots[name];

    for (const auto& [other, bytes] : snapshots) {
      if (other == name) continue;
      try {
        env->restore(bytes);
        FAIL("restored a '" << other << "' snapshot");
      } catch (const moerl::Error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find(other) != std::string::npos);
        CHECK(what.find("family") != std::string::npos);
      }
    }
    CHECK_THROWS_AS(env->restore({}), moerl::Error);
    CHECK_THROWS_AS(env->restore({'M', 'E', 'N', 'V'}), moerl::Error);
    std::vector<std::uint8_t> text(good.size(), 'x');
    CHECK_THROWS_WITH(env->restore(text), Catch::Contains("magic"));
    for (size_t cut = 0; cut < good.size(); ++cut) {
      std::vector<std::uint8_t> truncated(good.begin(), good.begin() + cut);
      CHECK_THROWS_AS(env->restore(truncated), moerl::Error);
    }
    for (size_t at = 0; at < good.size(); ++at) {
      for (std::uint8_t flip : {0x01, 0x80}) {
        auto corrupted = good;
        corrupted[at] ^= flip;
        CHECK_THROWS_AS(env->restore(corrupted), moerl::Error);
      }
    }
    auto longer = good;
    longer.push_back(0);
    CHECK_THROWS_AS(env->restore(longer), moerl::Error);
    // Every refusal left the session untouched.
    CHECK(env->snapshot() == before);
    // A fresh session that refused a snapshot stays unopened.
    auto fresh = make_builtin_environment(name);
    CHECK_THROWS_AS(fresh->restore(text), moerl::Error);
    CHECK_THROWS_AS(fresh->step("x"), moerl::Error);
    // And the good one still restores.
    CHECK_NOTHROW(env->restore(good));
    CHECK(env->snapshot() == good);
  }
}

TEST_CASE("sparse and shaped rewards differ as documented", "[env]") {
  for (const auto& name : family_names()) {
    for (int d : {1, 4}) {
      INFO(name << " difficulty " << d);
      auto sparse = make_builtin_environment(name);
      auto shaped = make_builtin_environment(name);
      sparse->open(spec_of(name, d, 31, RewardShaping::Sparse));
      shaped->open(spec_of(name, d, 31, RewardShaping::Shaped));
      const auto ts = play_expert(*sparse, 0.0, 1);
      const auto th = play_expert(*shaped, 0.0, 1);
      REQUIRE(ts.size() == th.size());
      double sum_sparse = 0.0, sum_shaped = 0.0;
      int nonzero_steps = 0;
      for (size_t k = 0; k < ts.size(); ++k) {
        CHECK(ts[k].observation == th[k].observation);
        if (k + 1 < ts.size()) {
          CHECK(ts[k].reward == 0.0);
          nonzero_steps += th[k].reward != 0.0;
        }
        sum_sparse += ts[k].reward;
        sum_shaped += th[k].reward;
      }
      CHECK(ts.back().reward == 1.0);
      CHECK(sum_sparse == 1.0);
      // Every family pays 0.5 of progress on an expert's successful episode.
      CHECK(sum_shaped == Approx(1.5).margin(1e-9));
      if (ts.size() > 2) CHECK(nonzero_steps > 0);
    }
  }
}

TEST_CASE("shaped rewards penalise regress", "[env]") {
  // Sort: a swap that adds inversions is negative; swapping back restores.
  auto sort = make_builtin_environment("sort");
  sort->open(spec_of("sort", 5, 8, RewardShaping::Shaped, 100));
  const double forward = sort->step("swap 0 1").reward;
  const double back = sort->step("swap 0 1").reward;
  CHECK(forward == Approx(-back));
  CHECK(forward != 0.0);

  // Maze: a wrong turn and back sums to zero.
  auto maze = make_builtin_environment("maze");
  maze->open(spec_of("maze", 6, 8, RewardShaping::Shaped, 500));
  double total = 0.0;
  for (const auto& t : play_expert(*maze, 0.4, 3)) total += t.reward;
  if (maze->succeeded()) {
    // 0.5 progress + 1 success - 0.01 per wall bump.
    CHECK(total <= 1.5 + 1e-9);
  }
}

TEST_CASE("the budget ends the episode", "[env]") {
  for (const auto& name : family_names()) {
    INFO(name);
    auto env = make_builtin_environment(name);
    env->open(spec_of(name, 3, 2, RewardShaping::Sparse, 3));
    CHECK(env->max_turns() == 3);
    CHECK_FALSE(env->step("nonsense").done);
    CHECK_FALSE(env->step("nonsense").done);
    const StepResult last = env->step("nonsense");
    CHECK(last.done);
    CHECK(last.info.at("success") == "0");
    CHECK(last.info.at("invalid") == "1");
    CHECK(last.reward == 0.0);
    CHECK(last.observation.find("out of turns") != std::string::npos);
    CHECK(env->done());
    CHECK_FALSE(env->succeeded());
    CHECK(env->turns_taken() == 3);
    CHECK_THROWS_AS(env->step("x"), moerl::Error);
    CHECK_THROWS_AS(env->expert_action(0.0, 1), moerl::Error);

    // The default budget grows with difficulty and fits the expert.
    auto small = make_builtin_environment(name);
    auto large = make_builtin_environment(name);
    small->open(spec_of(name, 1, 2));
    large->open(spec_of(name, max_difficulty(name), 2));
    CHECK(small->max_turns() < large->max_turns());
    CHECK(large->max_turns() >= 50);
  }
}

TEST_CASE("wrong answers end arithmetic and lookup episodes", "[env]") {
  for (const std::string name : {"arithmetic", "lookup"}) {
    auto env = make_builtin_environment(name);
    env->open(spec_of(name, 2, 3));
    const StepResult r = env->step("answer -123456");
    CHECK(r.done);
    CHECK(r.info.at("success") == "0");
    CHECK(r.observation.rfind("wrong", 0) == 0);
    CHECK_FALSE(env->succeeded());
  }
}

TEST_CASE("guess feedback brackets the target", "[env]") {
  auto env = make_builtin_environment("guess");
  env->open(spec_of("guess", 3, 17));
  std::int64_t lo = 1, hi = 1000;
  for (int turn = 0; turn < 20 && !env->done(); ++turn) {
    const std::int64_t g = lo + (hi - lo) / 2;
    const StepResult r = env->step("guess " + std::to_string(g));
    if (r.observation == "higher") {
      lo = g + 1;
    } else if (r.observation == "lower") {
      hi = g - 1;
    } else {
      CHECK(r.observation == "correct");
    }
    CHECK(lo <= hi);
  }
  CHECK(env->succeeded());
  CHECK(env->turns_taken() <= 10);
}

TEST_CASE("lookup reveals the chain one hop at a time", "[env]") {
  auto env = make_builtin_environment("lookup");
  const std::string intro = env->open(spec_of("lookup", 4, 21));
  const auto at = intro.find(" from key ");
  REQUIRE(at != std::string::npos);
  std::string key = intro.substr(at + 10, 4);
  for (int hop = 0; hop < 4; ++hop) {
    const StepResult r = env->step("get " + key);
    REQUIRE(r.observation.rfind(key + " = ", 0) == 0);
    key = r.observation.substr(key.size() + 3);
  }
  CHECK(key.size() == 3);  // the final value is a 3-digit number
  CHECK(env->step("answer " + key).info.at("success") == "1");
}

TEST_CASE("maze observations are a 5x5 window with the goal offset", "[env]") {
  auto env = make_builtin_environment("maze");
  const std::string intro = env->open(spec_of("maze", 5, 4));
  const auto grid_start = intro.find('\n');
  REQUIRE(grid_start != std::string::npos);
  const std::string grid = intro.substr(grid_start + 1);
  CHECK(grid.size() == 5 * 6 - 1);
  CHECK(grid[2 * 6 + 2] == '@');
  CHECK(grid.substr(0, 5) == "#####");  // the outer wall above the start cell
  CHECK(intro.find("goal ") != std::string::npos);
  CHECK(intro.find(" down") != std::string::npos);
  CHECK(intro.find(" right") != std::string::npos);
}

// The right-hand rule computed from an observation alone: the 5x5 window
// (the walls next to '@') and the previous move.
std::string right_hand_move(const std::string& observation, const std::string& previous) {
  const std::string grid = observation.substr(observation.find('\n') + 1);
  REQUIRE(grid.size() == 5 * 6 - 1);
  REQUIRE(grid[2 * 6 + 2] == '@');
  const std::map<std::string, char> next_to_me = {
      {"up", grid[1 * 6 + 2]}, {"down", grid[3 * 6 + 2]}, {"left", grid[2 * 6 + 1]}, {"right", grid[2 * 6 + 3]}};
  const std::map<std::string, std::vector<std::string>> order = {{"up", {"right", "up", "left", "down"}},
                                                                 {"right", {"down", "right", "up", "left"}},
                                                                 {"down", {"left", "down", "right", "up"}},
                                                                 {"left", {"up", "left", "down", "right"}}};
  for (const std::string& move : order.at(previous))
    if (next_to_me.at(move) != '#') return move;
  return "none";
}

TEST_CASE("the maze expert follows the right-hand wall: each move follows from what the player sees", "[env]") {
  for (int d : {1, 3, 6}) {
    for (std::uint64_t seed = 1; seed <= 5; ++seed) {
      INFO("maze difficulty " << d << " seed " << seed);
      auto env = make_builtin_environment("maze");
      std::string observation = env->open(spec_of("maze", d, seed));
      std::string previous = "down";  // the heading at the start
      int turns = 0;
      while (!env->done()) {
        const std::string action = env->expert_action(0.0, 0);
        CHECK(action == right_hand_move(observation, previous));
        observation = env->step(action).observation;
        previous = action;
        ++turns;
      }
      CHECK(env->succeeded());
      const int cells = (d + 2) * (d + 2);
      CHECK(turns <= 2 * (cells - 1));  // at most one tour of the maze
    }
  }
}

TEST_CASE("calculator: precedence, parentheses and signs", "[env]") {
  auto value = [](const std::string& text) {
    const CalcResult r = evaluate_integer_expression(text);
    INFO(text << " -> " << (r.ok ? std::to_string(r.value) : "error: " + r.error));
    REQUIRE(r.ok);
    return r.value;
  };
  CHECK(value("1+2*3") == 7);
  CHECK(value("(1+2)*3") == 9);
  CHECK(value("10-4-3") == 3);
  CHECK(value("100/10/5") == 2);
  CHECK(value("2*3/4") == 1);
  CHECK(value("2*(3/4)") == 0);
  CHECK(value("7/2") == 3);
  CHECK(value("-7/2") == -3);  // truncates toward zero
  CHECK(value("7/-2") == -3);
  CHECK(value("-3*-3") == 9);
  CHECK(value("--5") == 5);
  CHECK(value("+5") == 5);
  CHECK(value("3 - -5") == 8);
  CHECK(value("3-(-5)") == 8);
  CHECK(value(" ( ( 4 ) ) ") == 4);
  CHECK(value("0") == 0);
  CHECK(value("007") == 7);
  CHECK(value("9223372036854775807") == 9223372036854775807LL);
  CHECK(value("-9223372036854775807-1") == std::numeric_limits<std::int64_t>::min());
  CHECK(value("1+2*3-4/2+(5-6)*7") == 1 + 6 - 2 - 7);
  CHECK(value(std::string(64, '(') + "1" + std::string(64, ')')) == 1);
}

TEST_CASE("calculator: errors are messages, never crashes", "[env]") {
  auto error = [](const std::string& text) {
    const CalcResult r = evaluate_integer_expression(text);
    INFO(text << " -> " << (r.ok ? std::to_string(r.value) : "error: " + r.error));
    CHECK_FALSE(r.ok);
    CHECK(!r.error.empty());
    return r.error;
  };
  CHECK(error("1/0") == "division by zero");
  CHECK(error("5/(3-3)") == "division by zero");
  CHECK(error("9223372036854775808") == "number too large");
  CHECK(error("9223372036854775807+1") == "overflow");
  CHECK(error("4611686018427387904*2") == "overflow");
  CHECK(error("-9223372036854775807-2") == "overflow");
  CHECK(error("(-9223372036854775807-1)/-1") == "overflow");
  CHECK(error("-(-9223372036854775807-1)") == "overflow");
  CHECK(error("") == "empty expression");
  CHECK(error("   ") == "empty expression");
  CHECK(error("1+") == "expression ends early");
  CHECK(error("(1+2") == "missing ')'");
  CHECK(error("1+2)").find("unexpected ')'") == 0);
  CHECK(error("2 3").find("unexpected '3'") == 0);
  CHECK(error("1.5").find("unexpected '.'") == 0);
  CHECK(error("x+1").find("unexpected 'x'") == 0);
  CHECK(error("1 + \xc3\xb1").find("unexpected '?'") == 0);
  CHECK(error("()").find("unexpected ')'") == 0);
  CHECK(error("1**2").find("unexpected '*'") == 0);
  CHECK(error(std::string(65, '(') + "1" + std::string(65, ')')).find("nesting too deep") == 0);
  CHECK(error(std::string(200, '-') + "1").find("nesting too deep") == 0);
  CHECK(error(std::string(kCalcMaxLength + 1, '1')).find("expression too long") == 0);
  CHECK(error(std::string(100000, '(')).find("expression too long") == 0);
}
