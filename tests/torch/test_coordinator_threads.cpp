// The work-request/episode protocol between learner 0's task coordinator and
// an actor, with threads as ranks (runtime/in_process_transport.h): the same
// script as tests/mpi/test_coordinator_mpi.cpp (evaluation first, training
// groups bounded by staleness, replacements as steps consume groups, the
// final evaluation on the final weights, then the end) without mpirun. The
// actor thread records what it received; Catch2 checks run on the main
// thread only (its assertions are not thread-safe).

#include <catch2/catch.hpp>

#include <exception>
#include <set>
#include <thread>

#include "moerl/learner/task_coordinator.h"
#include "moerl/runtime/in_process_transport.h"
#include "moerl/setup/config_loading.h"

using namespace moerl;

namespace {

config::Config coordinator_config() {
  return setup::load_config_text(R"(
[env]
families = ["guess"]
[rollout]
group_size = 2
eval_episodes = 1
[algo]
groups_per_step = 2
[sync]
max_staleness = 1
asynchronous = true
)",
                                 "coordinator.toml");
}

rollout::TaskAssignment ask(runtime::Mailbox& mailbox, int free_slots) {
  mailbox.send(0, rollout::WorkRequest{free_slots, {}});
  return mailbox.receive<rollout::TaskAssignment>(0, 20.0).second;
}

rollout::Trajectory evaluation_episode(const rollout::TaskGroup& group) {
  rollout::Trajectory t;
  t.group_id = group.group_id;
  t.task = group.task;
  t.evaluation = true;
  t.success = true;
  t.reward = 1.0;
  return t;
}

// What the actor thread saw, for the main thread to check.
struct ActorView {
  rollout::TaskAssignment eval, train, more, final_eval, end;
  bool answered_before_a_step = true;
  std::exception_ptr failure;
};

// The actor's side of the script; a Ping tells rank 0 that a phase is done.
void actor_script(runtime::Mailbox& mailbox, ActorView& view) {
  try {
    const auto phase_done = [&] { mailbox.send(0, runtime::Ping{}); };
    view.eval = ask(mailbox, 100);
    phase_done();
    if (!view.eval.groups.empty()) mailbox.send(0, evaluation_episode(view.eval.groups[0]));
    view.train = ask(mailbox, 100);
    mailbox.send(0, rollout::WorkRequest{100, {}});  // answered only after a step
    view.answered_before_a_step = mailbox.try_receive<rollout::TaskAssignment>(0).has_value();
    phase_done();
    view.more = mailbox.receive<rollout::TaskAssignment>(0, 20.0).second;
    phase_done();
    view.final_eval = ask(mailbox, 100);
    phase_done();
    if (!view.final_eval.groups.empty()) mailbox.send(0, evaluation_episode(view.final_eval.groups[0]));
    view.end = ask(mailbox, 100);
    phase_done();
  } catch (...) {
    view.failure = std::current_exception();
  }
}

// Rank 0 serves until the actor says (a Ping) it got what this phase expects.
bool serve_until(learner::TaskCoordinator& coordinator, runtime::Mailbox& mailbox, std::int64_t version) {
  const double deadline = runtime::monotonic_seconds() + 20;
  while (!mailbox.try_receive<runtime::Ping>(1)) {
    coordinator.serve(version);
    if (runtime::monotonic_seconds() > deadline) return false;
  }
  return true;
}

// Joins the actor thread however the main thread leaves the test.
struct JoinOnExit {
  std::thread& thread;
  ~JoinOnExit() {
    if (thread.joinable()) thread.join();
  }
};

}  // namespace

TEST_CASE("the coordinator's protocol runs with threads as ranks", "[coordinator][in_process]") {
  const auto hub = runtime::InProcessHub::create(2);
  runtime::Mailbox coordinator_box(hub->transport(0), 20.0), actor_box(hub->transport(1), 20.0);
  CHECK(coordinator_box.comm() == MPI_COMM_NULL);
  CHECK(actor_box.rank() == 1);
  CHECK(actor_box.size() == 2);
  const config::Config config = coordinator_config();
  ActorView view;
  std::thread actor(actor_script, std::ref(actor_box), std::ref(view));
  JoinOnExit join_actor{actor};
  bool served = true;
  learner::TaskCoordinator coordinator(learner::task_coordinator_settings(config), coordinator_box, 1, {1});
  const auto phase = coordinator.phase();
  served = served && serve_until(coordinator, coordinator_box, 0);  // the evaluation group is out
  std::optional<rollout::Trajectory> before;
  if (served) before = coordinator_box.receive<rollout::Trajectory>(1, 20.0).second;
  if (before) coordinator.record_evaluation(*before);
  const auto phase_after_eval = coordinator.phase();
  served = served && serve_until(coordinator, coordinator_box, 0);  // 4 training groups out, the next waits
  coordinator.on_step(2, 0, 1, false);                              // one step consumed 2 groups
  served = served && serve_until(coordinator, coordinator_box, 1);  // 2 replacements out
  coordinator.on_step(2, 0, 2, true);                               // the last step: final evaluation
  const auto phase_final = coordinator.phase();
  served = served && serve_until(coordinator, coordinator_box, 2);
  std::optional<rollout::Trajectory> after;
  if (served) after = coordinator_box.receive<rollout::Trajectory>(1, 20.0).second;
  if (after) coordinator.record_evaluation(*after);
  const auto phase_done = coordinator.phase();
  served = served && serve_until(coordinator, coordinator_box, 2);
  actor.join();
  if (view.failure) std::rethrow_exception(view.failure);
  REQUIRE(served);

  CHECK(phase == learner::TaskCoordinator::Phase::EvalBefore);
  CHECK(phase_after_eval == learner::TaskCoordinator::Phase::Train);
  CHECK(phase_final == learner::TaskCoordinator::Phase::EvalAfter);
  CHECK(phase_done == learner::TaskCoordinator::Phase::Done);
  REQUIRE(view.eval.groups.size() == 1);
  CHECK(view.eval.groups[0].evaluation);
  CHECK(view.eval.groups[0].size == 1);
  // Bounded staleness: groups_per_step * (1 + max_staleness) = 4 in flight.
  REQUIRE(view.train.groups.size() == 4);
  std::set<std::uint64_t> seeds;
  for (const auto& g : view.train.groups) {
    CHECK_FALSE(g.evaluation);
    CHECK(g.size == 2);
    CHECK(g.task.family == "guess");
    CHECK(g.min_version == 0);
    seeds.insert(g.task.seed);
  }
  CHECK(seeds.size() == 4);
  CHECK_FALSE(view.answered_before_a_step);
  CHECK(view.more.groups.size() == 2);
  REQUIRE(view.final_eval.groups.size() == 1);
  CHECK(view.final_eval.groups[0].evaluation);
  CHECK(view.final_eval.groups[0].min_version == 2);
  CHECK(view.final_eval.groups[0].task.seed == view.eval.groups[0].task.seed);
  CHECK(view.end.finished);
  CHECK(coordinator.before().at("guess").successes == 1);
  CHECK(coordinator.after().at("guess").episodes == 1);
}

TEST_CASE("in-process frames keep their order per sender and match by type and source", "[in_process]") {
  const auto hub = runtime::InProcessHub::create(3);
  runtime::Mailbox zero(hub->transport(0), 1.0), one(hub->transport(1), 1.0), two(hub->transport(2), 1.0);
  one.send(0, rollout::WorkRequest{1, {}});
  two.send(0, rollout::WorkRequest{2, {}});
  one.send(0, rollout::WorkRequest{3, {}});
  one.send(0, runtime::Ping{});
  CHECK(zero.receive<rollout::WorkRequest>(2).second.free_slots == 2);               // by source
  CHECK(zero.receive<runtime::Ping>(MPI_ANY_SOURCE).first == 1);                     // by type, past older frames
  CHECK(zero.receive<rollout::WorkRequest>(MPI_ANY_SOURCE).second.free_slots == 1);  // in order
  CHECK(zero.receive<rollout::WorkRequest>(1).second.free_slots == 3);
  CHECK_FALSE(zero.try_receive<rollout::WorkRequest>());
  CHECK_THROWS_AS(zero.receive<runtime::Ping>(1, 0.05), runtime::TimeoutError);
  CHECK_THROWS_WITH(zero.send(3, runtime::Ping{}), Catch::Contains("outside the world of 3"));
  CHECK_THROWS_WITH(runtime::InProcessHub::create(0), Catch::Contains("at least one rank"));
}
