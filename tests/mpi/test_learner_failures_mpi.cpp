// Sessions that failed for good and malformed messages cost data, never the
// job: a real Learner (rank 0, coordinating and publishing) trains on what a
// scripted actor (rank 1) sends, in synchronous mode. Rank 2 is the env
// worker the layout needs; nothing talks to it.
//
// The actor's script, by the group's position in the order learner 0 hands
// groups out (group ids count up from 0):
//   group 0: every member a failure record     -> the group is dropped
//   group 1: members 0 and 1 failure records   -> step 1 trains on members 2, 3
//   groups 2, 3: every member a failure record -> no step from zero episodes;
//                                                 two new groups replace them
//   group 5: member 3 arrives as a malformed frame -> dropped with a warning,
//                                                 the group is taken with 3
//   others: whole groups.
// So step 1 trains on 2 episodes, step 2 on 4 + 3, step 3 on 8; learner 0's
// books count 14 failure records. A second run sends malformed frames only:
// [cluster] malformed_message_limit of them stop the job cleanly, naming the
// actor's rank.

#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <deque>
#include <thread>

#include "moerl/comm/mpi_communicator.h"
#include "moerl/learner/learner.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/world.h"
#include "moerl/setup/config_loading.h"
#include "moerl/sync/module_weights.h"
#include "moerl/sync/weight_sync.h"
#include "learner_test_support.h"
#include "scripted_turns.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

constexpr int kGroupSize = 4;

config::Config failures_config(const std::string& output_dir, const std::string& name) {
  return setup::load_config_text(R"(
[run]
seed = 11
[cluster]
learners = 1
actors = 1
env_workers = 1
message_timeout_s = 8.0
malformed_message_limit = 3
[model]
d_model = 32
num_layers = 1
num_heads = 2
num_kv_heads = 1
d_ff = 64
max_seq_len = 512
[moe]
num_experts = 4
top_k = 2
d_expert = 32
[env]
families = ["sort"]
[rollout]
group_size = 4
sessions_per_actor = 8
max_tokens_per_episode = 512
eval_episodes = 0
[algo]
groups_per_step = 2
drop_zero_variance_groups = false
[optim]
total_steps = 3
[sync]
asynchronous = false
[checkpoint]
every_steps = 0
)",
                                 "failures.toml", {"run.output_dir=" + output_dir, "run.name=" + name});
}

enum class Member { Episode, FailureRecord, Malformed };

Member script(std::uint64_t group, int sample) {
  if (group == 0 || group == 2 || group == 3) return Member::FailureRecord;
  if (group == 1 && sample < 2) return Member::FailureRecord;
  if (group == 5 && sample == 3) return Member::Malformed;
  return Member::Episode;
}

rollout::Trajectory episode(const rollout::TaskGroup& group, int sample) {
  rollout::Trajectory t;
  t.episode_id = (group.group_id << 16) | static_cast<std::uint64_t>(sample);
  t.group_id = group.group_id;
  t.actor = 0;
  t.task = group.task;
  moerl_test::ScriptedRandom random(group.task.seed * 7919ull + static_cast<std::uint64_t>(sample));
  moerl_test::append_scripted_turns(
      t, random, {10, 10, 6, 10}, static_cast<std::int32_t>(group.min_version),
      [](int, moerl_test::ScriptedRandom& r) { return static_cast<float>(r.below(3)) / 2.f; });
  return t;
}

rollout::Trajectory failure_record(const rollout::TaskGroup& group, int sample) {
  rollout::Trajectory t;
  t.episode_id = (group.group_id << 16) | static_cast<std::uint64_t>(sample);
  t.group_id = group.group_id;
  t.task = group.task;
  t.failure = env::FailureReason::FailureCrashed;
  t.error = "session " + std::to_string(t.episode_id) + ": step failed after 3 attempts (crashed): scripted";
  t.failure_turn = 1;
  t.failure_attempts = 3;
  t.failure_streak = 1;  // never enough to pause the family
  return t;
}

void send_malformed(runtime::Mailbox& mailbox, int rank) {
  // A well-framed payload (its CRC matches) that does not decode as a Trajectory.
  const std::vector<std::uint8_t> garbage(37, 0xAB);
  mailbox.send_frame(0, rollout::Trajectory::kType, runtime::frame_message(rollout::Trajectory::kType, rank, garbage));
}

// Plays the script against learner 0 until it says there is no more work and
// closes the weight publication. Returns "" or what went wrong.
std::string scripted_actor(const config::Config& config, const runtime::World& world, runtime::Mailbox& mailbox,
                           model::Policy policy, bool only_malformed) {
  comm::MpiCommunicator sync_comm(world.sync_comm(), "weight-sync group");
  sync::WeightReceiver receiver(sync_comm, sync::module_weight_views(*policy),
                                sync::sync_options(config.sync, config.cluster.message_timeout_s));
  std::deque<rollout::TaskGroup> waiting;
  bool finished = false, requested = false;
  std::int64_t version = 0;
  int malformed_sent = 0;
  const double deadline = runtime::monotonic_seconds() + 120;
  while (!receiver.closed()) {
    if (runtime::monotonic_seconds() > deadline) return "the scripted actor's run took over 120 s";
    if (receiver.poll()) version = receiver.apply();
    if (!finished && !requested) {
      mailbox.send(0, rollout::WorkRequest{static_cast<std::int32_t>(config.rollout.sessions_per_actor), {}});
      requested = true;
    }
    if (auto assignment = mailbox.try_receive<rollout::TaskAssignment>(0)) {
      requested = false;
      finished = finished || assignment->second.finished;
      for (const rollout::TaskGroup& g : assignment->second.groups) waiting.push_back(g);
    }
    if (only_malformed && malformed_sent < config.cluster.malformed_message_limit) {
      send_malformed(mailbox, world.rank());
      ++malformed_sent;
    }
    while (!only_malformed && !waiting.empty() && waiting.front().min_version <= version) {
      const rollout::TaskGroup group = waiting.front();
      waiting.pop_front();
      for (int k = 0; k < group.size; ++k) {
        switch (script(group.group_id, k)) {
          case Member::Episode: mailbox.send(0, episode(group, k)); break;
          case Member::FailureRecord: mailbox.send(0, failure_record(group, k)); break;
          case Member::Malformed: send_malformed(mailbox, world.rank()); break;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return "";
}

struct FailuresRun {
  std::vector<learner::StepStats> steps;
  std::string job_failure;
  std::int64_t crashed_records = 0;
  std::string actor_error;
};

FailuresRun run_script(const std::string& output_dir, const std::string& name, bool only_malformed) {
  const config::Config config = failures_config(output_dir, name);
  FailuresRun run;
  runtime::World world(config, MPI_COMM_WORLD);
  runtime::Mailbox mailbox(world.message_comm(), config.cluster.message_timeout_s);
  runtime::StopCoordinator stop(mailbox);
  torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
  model::Policy policy(config.model, config.moe);
  if (world.role() == runtime::Role::Learner) {
    comm::MpiCommunicator learner_comm(world.role_comm(), "learner group");
    comm::MpiCommunicator sync_comm(world.sync_comm(), "weight-sync group");
    learner::Learner learner(learner::learner_settings(config), world, mailbox, policy, learner_comm, &sync_comm);
    learner.set_step_observer([&](const learner::StepStats& st) { run.steps.push_back(st); });
    learner.run(stop);
    run.job_failure = learner.job_failure();
    const auto summary = config.run_directory() + "/summary.json";
    if (std::filesystem::exists(summary)) {
      const JsonValue s =
          JsonValue::parse(std::string(std::istreambuf_iterator<char>(std::ifstream(summary).rdbuf()), {}));
      if (const std::optional<JsonValue> sort = s.at("env_failures").find("sort"))
        run.crashed_records = static_cast<std::int64_t>(sort->at("crashed").as_number());
    }
  } else if (world.role() == runtime::Role::Actor) {
    policy->eval();
    torch::NoGradGuard no_grad;
    run.actor_error = scripted_actor(config, world, mailbox, policy, only_malformed);
  }
  moerl_test::polite_barrier(MPI_COMM_WORLD);
  int length = static_cast<int>(run.actor_error.size());
  MPI_Bcast(&length, 1, MPI_INT, 1, MPI_COMM_WORLD);
  run.actor_error.resize(static_cast<size_t>(length));
  MPI_Bcast(run.actor_error.data(), length, MPI_CHAR, 1, MPI_COMM_WORLD);
  return run;
}

}  // namespace

TEST_CASE("failure records and a malformed episode cost their data, never a step or the job", "[learner_failures]") {
  torch::set_num_threads(1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string output_dir = moerl_test::shared_temp_dir("moerl_failures_");
  const FailuresRun run = run_script(output_dir, "script", false);
  CHECK(run.actor_error.empty());
  if (rank == 0) {
    INFO("job failure: " << run.job_failure);
    CHECK(run.job_failure.empty());
    REQUIRE(run.steps.size() == 3);
    CHECK(run.steps[0].episodes == 2);
    CHECK(run.steps[0].failed_groups == 1);
    CHECK(run.steps[0].env_failures == 6);
    CHECK(run.steps[1].episodes == 7);
    CHECK(run.steps[1].env_failures == 0);
    CHECK(run.steps[2].episodes == 8);
    for (const auto& st : run.steps) CHECK(st.updated);
    CHECK(run.crashed_records == 14);
  }
  moerl_test::polite_barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(output_dir);
}

TEST_CASE("malformed messages up to [cluster] malformed_message_limit stop the job cleanly, naming the sender",
          "[learner_failures]") {
  torch::set_num_threads(1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string output_dir = moerl_test::shared_temp_dir("moerl_malformed_");
  const FailuresRun run = run_script(output_dir, "malformed", true);
  CHECK(run.actor_error.empty());
  if (rank == 0) {
    CHECK(run.steps.empty());
    CHECK_THAT(run.job_failure, Catch::Contains("actor rank 1 sent 3 malformed messages") &&
                                    Catch::Contains("[cluster] malformed_message_limit") &&
                                    Catch::Contains("malformed Trajectory message from rank 1: field task:"));
  }
  moerl_test::polite_barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(output_dir);
}
