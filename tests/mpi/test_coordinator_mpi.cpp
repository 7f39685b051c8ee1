// Learner 0's task coordinator against a stand-in actor (rank 1): evaluation
// first, then training groups bounded by staleness, replacements as steps
// consume groups, the final evaluation on the final weights, then the end.

#include <catch2/catch.hpp>
#include <mpi.h>

#include <set>

#include "moerl/learner/task_coordinator.h"
#include "moerl/setup/config_loading.h"

using namespace moerl;

namespace {

config::Config coordinator_config(bool asynchronous) {
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
)",
                                 "coordinator.toml",
                                 {std::string("sync.asynchronous=") + (asynchronous ? "true" : "false")});
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

// Rank 0 serves until the actor says (a Ping) it got what this phase expects.
void serve_until(learner::TaskCoordinator& coordinator, runtime::Mailbox& mailbox, std::int64_t version) {
  const double deadline = runtime::monotonic_seconds() + 20;
  while (!mailbox.try_receive<runtime::Ping>(1)) {
    coordinator.serve(version);
    REQUIRE(runtime::monotonic_seconds() < deadline);
  }
}

void phase_done(runtime::Mailbox& mailbox) { mailbox.send(0, runtime::Ping{}); }

}  // namespace

TEST_CASE("the coordinator evaluates, bounds staleness, replaces consumed groups, then finishes", "[coordinator]") {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {
    runtime::Mailbox mailbox(comm, 20.0);
    const config::Config config = coordinator_config(true);
    if (mailbox.rank() == 0) {
      learner::TaskCoordinator coordinator(learner::task_coordinator_settings(config), mailbox, 1, {1});
      CHECK(coordinator.phase() == learner::TaskCoordinator::Phase::EvalBefore);
      serve_until(coordinator, mailbox, 0);  // the actor got its evaluation group
      auto [source, episode] = mailbox.receive<rollout::Trajectory>(1, 20.0);
      coordinator.record_evaluation(episode);
      CHECK(coordinator.phase() == learner::TaskCoordinator::Phase::Train);
      serve_until(coordinator, mailbox, 0);  // 4 training groups out, the next request waits
      coordinator.on_step(2, 0, 1, false);   // one step consumed 2 groups
      serve_until(coordinator, mailbox, 1);  // 2 replacements out
      coordinator.on_step(2, 0, 2, true);    // the last step: final evaluation on version 2
      CHECK(coordinator.phase() == learner::TaskCoordinator::Phase::EvalAfter);
      serve_until(coordinator, mailbox, 2);
      auto [source2, after] = mailbox.receive<rollout::Trajectory>(1, 20.0);
      coordinator.record_evaluation(after);
      CHECK(coordinator.phase() == learner::TaskCoordinator::Phase::Done);
      serve_until(coordinator, mailbox, 2);
      CHECK(coordinator.before().at("guess").successes == 1);
      CHECK(coordinator.after().at("guess").episodes == 1);
      CHECK_THAT(coordinator.summary_json(2, 1.0, 0), Catch::Contains(R"("before":{"guess":{"success":1,)"));
    } else {
      const rollout::TaskAssignment eval = ask(mailbox, 100);
      REQUIRE(eval.groups.size() == 1);
      CHECK(eval.groups[0].evaluation);
      CHECK(eval.groups[0].size == 1);
      phase_done(mailbox);
      mailbox.send(0, evaluation_episode(eval.groups[0]));

      const rollout::TaskAssignment train = ask(mailbox, 100);
      // Bounded staleness: groups_per_step * (1 + max_staleness) = 4 in flight.
      REQUIRE(train.groups.size() == 4);
      std::set<std::uint64_t> seeds;
      for (const auto& g : train.groups) {
        CHECK_FALSE(g.evaluation);
        CHECK(g.size == 2);
        CHECK(g.task.family == "guess");
        CHECK(g.min_version == 0);  // asynchronous: start with whatever weights are there
        seeds.insert(g.task.seed);
      }
      CHECK(seeds.size() == 4);
      mailbox.send(0, rollout::WorkRequest{100, {}});  // answered only after a step
      CHECK_FALSE(mailbox.try_receive<rollout::TaskAssignment>(0).has_value());
      phase_done(mailbox);
      const rollout::TaskAssignment more = mailbox.receive<rollout::TaskAssignment>(0, 20.0).second;
      CHECK(more.groups.size() == 2);
      phase_done(mailbox);
      const rollout::TaskAssignment final_eval = ask(mailbox, 100);
      REQUIRE(final_eval.groups.size() == 1);
      CHECK(final_eval.groups[0].evaluation);
      CHECK(final_eval.groups[0].min_version == 2);                       // evaluated with the final weights only
      CHECK(final_eval.groups[0].task.seed == eval.groups[0].task.seed);  // the same held-out seed
      phase_done(mailbox);
      mailbox.send(0, evaluation_episode(final_eval.groups[0]));
      const rollout::TaskAssignment end = ask(mailbox, 100);
      CHECK(end.finished);
      phase_done(mailbox);
    }
  }
  MPI_Comm_free(&comm);
}
