// [pretrain] easier_levels: which difficulty each demonstration is played at.
// The levels must cover the whole range evenly (a curriculum that lowers a
// family to any of them finds a base that knows it), never go below 1 and
// never above the configured difficulty.

#include <catch2/catch.hpp>

#include <map>

#include "moerl/learner/pretrain.h"

using moerl::learner::demonstration_difficulty;

TEST_CASE("demonstrations cover the configured difficulty and the easier levels evenly", "[pretrain]") {
  std::map<int, int> seen;
  const int demos = 7000;
  for (int i = 0; i < demos; ++i) ++seen[demonstration_difficulty(7, 6, static_cast<std::uint64_t>(i))];
  REQUIRE(seen.size() == 7);
  for (const auto& [level, count] : seen) {
    CHECK(level >= 1);
    CHECK(level <= 7);
    CHECK(count > demos / 7 - 150);  // about 1000 each
    CHECK(count < demos / 7 + 150);
  }
}

TEST_CASE("easier levels stop at 1, and none keeps every demonstration at the difficulty", "[pretrain]") {
  for (int i = 0; i < 500; ++i) {
    const auto index = static_cast<std::uint64_t>(i);
    CHECK(demonstration_difficulty(7, 0, index) == 7);
    const int low = demonstration_difficulty(3, 6, index);
    CHECK(low >= 1);
    CHECK(low <= 3);
    CHECK(demonstration_difficulty(1, 4, index) == 1);
  }
}
