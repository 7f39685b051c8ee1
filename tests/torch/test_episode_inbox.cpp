// A learner's episode inbox: what counts as received (the end-of-run drain
// waits on it), when a group is complete, what a cancelled group gives back,
// and the partial groups a stalled drain names.

#include <catch2/catch.hpp>

#include "moerl/learner/episode_inbox.h"

using moerl::learner::EpisodeInbox;
using moerl::rollout::Trajectory;

namespace {

Trajectory member(std::uint64_t group, std::uint64_t episode) {
  Trajectory t;
  t.group_id = group;
  t.episode_id = episode;
  return t;
}

}  // namespace

TEST_CASE("an inbox hands out complete groups and names the partial ones", "[inbox]") {
  EpisodeInbox inbox(/*group_size=*/2, /*incomplete_after_s=*/5.0);
  inbox.add(member(7, 1), 0.0);
  inbox.add(member(9, 2), 0.0);
  inbox.add(member(9, 3), 0.0);
  CHECK(inbox.received() == 3);
  CHECK(inbox.partial_groups() == "7 (1/2)");
  // One complete group (9); asking for two gives none.
  CHECK(inbox.take_groups(2, 0.0).empty());
  const auto taken = inbox.take_groups(1, 0.0);
  REQUIRE(taken.size() == 1);
  CHECK(taken[0].size() == 2);
  CHECK(taken[0][0].group_id == 9);
  // Taking does not uncount: the drain counts arrivals, not what is held.
  CHECK(inbox.received() == 3);
  CHECK(inbox.held() == 1);
  inbox.add(member(7, 4), 0.0);
  CHECK(inbox.partial_groups() == "none");
}

TEST_CASE("a cancelled group stops counting and ignores stragglers", "[inbox]") {
  EpisodeInbox inbox(3, 5.0);
  inbox.add(member(4, 1), 0.0);
  inbox.add(member(5, 2), 0.0);
  inbox.add(member(5, 3), 0.0);
  inbox.add(member(5, 4), 0.0);
  // Group 5 is complete and stays; group 4 is cancelled; 6 never arrived.
  const auto cancelled = inbox.cancel_incomplete({4, 5, 6});
  CHECK(cancelled == std::vector<std::uint64_t>{4, 6});
  CHECK(inbox.received() == 3);
  inbox.add(member(4, 5), 0.0);
  inbox.add(member(6, 6), 0.0);
  CHECK(inbox.received() == 3);
  CHECK(inbox.partial_groups() == "none");
}

TEST_CASE("after a malformed message a quiet partial group is taken as it is", "[inbox]") {
  EpisodeInbox inbox(2, 5.0);
  inbox.add(member(1, 1), 0.0);
  inbox.lost_in_malformed_message();
  CHECK(inbox.received() == 2);  // the lost one arrived, as far as the drain is concerned
  CHECK(inbox.take_groups(1, 4.0).empty());
  const auto taken = inbox.take_groups(1, 6.0);
  REQUIRE(taken.size() == 1);
  CHECK(taken[0].size() == 1);
}
