// comm::describe_missing: the text a timed-out collective carries, from what
// each member answered (the MPI side is tests/mpi/test_stall_inspector_mpi.cpp).

#include <catch2/catch.hpp>

#include "moerl/comm/stall_inspector.h"

using namespace moerl::comm;

namespace {

MemberAnswer answered(std::int64_t newest, bool finished, std::string what = "") {
  MemberAnswer a;
  a.state = MemberAnswer::State::Answered;
  a.newest = newest;
  a.newest_finished = finished;
  a.newest_what = std::move(what);
  return a;
}

MemberAnswer state(MemberAnswer::State s) {
  MemberAnswer a;
  a.state = s;
  return a;
}

}  // namespace

TEST_CASE("stall report: each member under what it answered", "[comm][stall]") {
  // Member 1 asks about collective #7 of a group whose members are job ranks 10..15.
  const std::vector<int> world = {10, 11, 12, 13, 14, 15};
  const std::vector<MemberAnswer> answers = {
      answered(7, false),                                             // waiting in it
      MemberAnswer{},                                                 // the asker itself
      state(MemberAnswer::State::NoAnswer),                           // stopped or busy
      answered(6, false, "MPI barrier in g"),                         // behind
      state(MemberAnswer::State::Died),                               // gone
      answered(8, false, "MPI broadcast of 4 byte from rank 0 in g")  // already past it
  };
  const std::string text = describe_missing(7, 1, answers, world, 1.5);
  INFO(text);
  CHECK_THAT(text, Catch::StartsWith("collective #7 of the group: missing member 2 (job rank 12) did not answer "
                                     "within 1.5 s (not waiting in any collective of this group"));
  CHECK_THAT(text, Catch::Contains("member 3 (job rank 13) is still in collective #6: MPI barrier in g"));
  CHECK_THAT(text, Catch::Contains("member 4 (job rank 14) died"));
  CHECK_THAT(text, Catch::Contains("; waiting in it: member 0 (job rank 10), member 1 (job rank 11); "
                                   "done with it: member 5 (job rank 15)"));
}

TEST_CASE("stall report: a member that finished its part is not missing", "[comm][stall]") {
  // A broadcast's root finishes once its bytes are out; the others still wait.
  const std::string text =
      describe_missing(3, 1, {answered(3, true), MemberAnswer{}, answered(3, false)}, {0, 1, 2}, 1);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("every member answered from inside it or past it"));
  CHECK_THAT(text,
             Catch::Contains("waiting in it: member 1 (job rank 1), member 2 (job rank 2); done with it: member 0"));
}

TEST_CASE("stall report: the asking time follows the timeout within bounds", "[comm][stall]") {
  CHECK(stall_grace_s(0.1) == 1.0);
  CHECK(stall_grace_s(8) == 2.0);
  CHECK(stall_grace_s(600) == 5.0);
}
