// The learner's update depends on the data, not on the mode: a real Learner
// (rank 0, coordinating and publishing) trains on the trajectories of a
// scripted actor (rank 1) once in synchronous and once in asynchronous mode,
// and every step's loss statistics and the final weights are bitwise equal.
// Rank 2 is the env worker the layout needs; nothing talks to it.
//
// The scripted actor behaves like rollout::Actor where the modes differ: it
// asks learner 0 for work, starts a group only once it holds weights at least
// as new as the group's min_version (synchronous mode: the weights published
// after the previous step), and applies every publication it receives. What
// it sends does not depend on timing: each episode's tokens, behaviour
// log-probs, versions and rewards are a function of (task seed, sample).
//
// Why bitwise: both runs execute the same sequence of floating-point
// operations on one thread, in one process, from the same initial weights; the
// mode may only change which episodes form a step and in which order, and any
// such change shows up as a different number. A tolerance would hide exactly
// the defect this test is for.
//
// Asynchronous mode hands out more groups than the run trains on (up to
// (1 + max_staleness) steps' worth). The scripted actor sends those only
// after learner 0 has said there is no more work, with sends that complete
// only when the learner takes them (MPI_Issend): learner 0 must keep taking
// in trajectories until every episode it handed out has arrived (a job that
// tore down earlier left actors stuck in their sends).

#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <thread>

#include "moerl/comm/mpi_communicator.h"
#include "moerl/core/hash.h"
#include "moerl/learner/learner.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/world.h"
#include "learner_test_support.h"
#include "scripted_turns.h"
#include "moerl/setup/config_loading.h"
#include "moerl/storage/checksum.h"
#include "moerl/sync/module_weights.h"
#include "moerl/sync/weight_sync.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

constexpr std::int64_t kSteps = 4;
constexpr std::int64_t kGroupsPerStep = 2;
constexpr double kTimeoutS = 30.0;

config::Config modes_config(const std::string& output_dir, bool asynchronous) {
  return setup::load_config_text(
      R"(
[run]
name = "modes"
seed = 7
[cluster]
learners = 1
actors = 1
env_workers = 1
message_timeout_s = 30.0
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
families = ["sort", "guess"]
[rollout]
group_size = 4
sessions_per_actor = 8
max_tokens_per_episode = 512
eval_episodes = 0
[algo]
groups_per_step = 2
[optim]
lr = 0.003
total_steps = 4
[sync]
interval = 1
max_staleness = 1
[checkpoint]
every_steps = 0
)",
      "modes.toml",
      {"run.output_dir=" + output_dir, std::string("sync.asynchronous=") + (asynchronous ? "true" : "false")});
}

// One episode of the scripted actor: a function of (task seed, sample) only.
// Turns of observation tokens (not generated) and action tokens (generated,
// with behaviour log-probs near the untrained model's and the policy version
// of the step the group is for).
rollout::Trajectory scripted_episode(const rollout::TaskGroup& group, int sample) {
  rollout::Trajectory t;
  t.episode_id = (group.group_id << 16) | static_cast<std::uint64_t>(sample);
  t.group_id = group.group_id;
  t.actor = 0;
  t.task = group.task;
  moerl_test::ScriptedRandom random(group.task.seed * 1000003ull + static_cast<std::uint64_t>(sample));
  // The version a synchronous run samples this group with (the step it is for).
  const auto version = static_cast<std::int32_t>(static_cast<std::int64_t>(group.group_id) / kGroupsPerStep);
  // Every third group fails alike: no reward variance, dynamic sampling drops it.
  moerl_test::append_scripted_turns(t, random, {12, 20, 8, 24}, version, [&](int, moerl_test::ScriptedRandom& r) {
    return group.group_id % 3 == 2 ? 0.f : static_cast<float>(r.below(3)) / 2.f;
  });
  t.success = t.reward > 1.0;
  return t;
}

// A send that completes only once the receiver has taken the message
// (MPI_Issend): whether learner 0 still takes in trajectories, whatever their size.
bool send_taken(const runtime::World& world, const rollout::Trajectory& t, std::string& error) {
  runtime::ByteWriter w;
  t.encode(w);
  const std::vector<std::uint8_t> frame = runtime::frame_message(rollout::Trajectory::kType, world.rank(), w.bytes());
  MPI_Request request;
  MPI_Issend(frame.data(), static_cast<int>(frame.size()), MPI_BYTE, 0, static_cast<int>(rollout::Trajectory::kType),
             world.message_comm(), &request);
  const double deadline = runtime::monotonic_seconds() + kTimeoutS;
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done && runtime::monotonic_seconds() > deadline) {
      MPI_Cancel(&request);
      MPI_Request_free(&request);
      error = "learner 0 did not take episode " + std::to_string(t.episode_id) + " of group " +
              std::to_string(t.group_id) + " within " + std::to_string(kTimeoutS) + " s";
      return false;
    }
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

std::uint32_t weights_crc(model::PolicyImpl& policy) {
  std::uint32_t crc = 0;
  for (const auto& view : sync::module_weight_views(policy)) crc = storage::crc32c(view.data, view.bytes, crc);
  return crc;
}

struct ActorResult {
  std::string error;              // empty when every send was taken and the publication closed
  std::int64_t last_version = 0;  // the newest weights applied
  std::uint32_t weights_crc = 0;  // of those weights
  std::int64_t groups = 0, held_back = 0;
};

ActorResult scripted_actor(const config::Config& config, const runtime::World& world, runtime::Mailbox& mailbox,
                           model::Policy policy) {
  ActorResult result;
  comm::MpiCommunicator sync_comm(world.sync_comm(), "weight-sync group");
  sync::WeightReceiver receiver(sync_comm, sync::module_weight_views(*policy),
                                sync::sync_options(config.sync, config.cluster.message_timeout_s));
  std::deque<rollout::TaskGroup> waiting, held_back;
  bool finished = false, requested = false;
  std::int64_t version = 0;
  auto send_group = [&](const rollout::TaskGroup& group) {
    for (int k = 0; k < group.size && result.error.empty(); ++k)
      send_taken(world, scripted_episode(group, k), result.error);
  };
  const double deadline = runtime::monotonic_seconds() + 120;
  while (result.error.empty() && !(finished && waiting.empty())) {
    if (receiver.poll()) version = receiver.apply();
    if (!finished && !requested) {
      mailbox.send(0, rollout::WorkRequest{static_cast<std::int32_t>(config.rollout.sessions_per_actor), {}});
      requested = true;
    }
    if (auto assignment = mailbox.try_receive<rollout::TaskAssignment>(0)) {
      requested = false;
      finished = finished || assignment->second.finished;
      for (const rollout::TaskGroup& g : assignment->second.groups) {
        ++result.groups;
        // More than the run trains on: these finish only after training (a slow actor's).
        (static_cast<std::int64_t>(g.group_id) >= kSteps * kGroupsPerStep ? held_back : waiting).push_back(g);
      }
    }
    // As rollout::Actor: a group starts once the weights it needs are here, in order.
    while (result.error.empty() && !waiting.empty() && waiting.front().min_version <= version) {
      send_group(waiting.front());
      waiting.pop_front();
    }
    if (runtime::monotonic_seconds() > deadline) result.error = "the scripted actor's run took over 120 s";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  result.held_back = static_cast<std::int64_t>(held_back.size());
  for (const rollout::TaskGroup& g : held_back)
    if (result.error.empty()) send_group(g);
  const double close_deadline = runtime::monotonic_seconds() + kTimeoutS;
  while (!receiver.closed() && runtime::monotonic_seconds() < close_deadline) {
    if (receiver.poll()) version = receiver.apply();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (result.error.empty() && !receiver.closed()) result.error = "learner 0 did not close the weight publication";
  result.last_version = version;
  result.weights_crc = weights_crc(*policy);
  return result;
}

struct ModeRun {
  std::vector<learner::StepStats> steps;         // rank 0
  moerl_test::ParameterValues weights;           // rank 0: the final parameters
  std::uint32_t initial_crc = 0, final_crc = 0;  // rank 0: of the learner's weights
  ActorResult actor;                             // every rank (broadcast from the actor)
};

ModeRun run_mode(const std::string& output_dir, bool asynchronous) {
  const config::Config config = modes_config(output_dir, asynchronous);
  ModeRun run;
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
    run.initial_crc = weights_crc(*policy);
    learner.run(stop);
    run.final_crc = weights_crc(*policy);
    run.weights = moerl_test::parameter_values(policy->parameters());
  } else if (world.role() == runtime::Role::Actor) {
    policy->eval();
    torch::NoGradGuard no_grad;
    run.actor = scripted_actor(config, world, mailbox, policy);
  }
  moerl_test::polite_barrier(MPI_COMM_WORLD);
  // Everyone learns how the actor's side went (rank 1 is the actor).
  std::int64_t numbers[4] = {run.actor.last_version, run.actor.weights_crc, run.actor.groups, run.actor.held_back};
  MPI_Bcast(numbers, 4, MPI_INT64_T, 1, MPI_COMM_WORLD);
  int error_length = static_cast<int>(run.actor.error.size());
  MPI_Bcast(&error_length, 1, MPI_INT, 1, MPI_COMM_WORLD);
  run.actor.error.resize(static_cast<size_t>(error_length));
  MPI_Bcast(run.actor.error.data(), error_length, MPI_CHAR, 1, MPI_COMM_WORLD);
  run.actor.last_version = numbers[0];
  run.actor.weights_crc = static_cast<std::uint32_t>(numbers[1]);
  run.actor.groups = numbers[2];
  run.actor.held_back = numbers[3];
  return run;
}

}  // namespace

TEST_CASE("synchronous and asynchronous modes produce the same losses and weights for the same data",
          "[learner_modes]") {
  torch::set_num_threads(1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string output_dir = moerl_test::shared_temp_dir("moerl_modes_");

  const ModeRun sync_run = run_mode(output_dir, false);
  const ModeRun async_run = run_mode(output_dir, true);
  if (rank == 0) std::filesystem::remove_all(output_dir);

  for (const ModeRun* run : {&sync_run, &async_run}) {
    const char* mode = run == &sync_run ? "synchronous" : "asynchronous";
    INFO(mode << " run");
    CHECK(run->actor.error == "");
    CHECK(run->actor.last_version == kSteps);  // the actor applied the final publication
  }
  // Synchronous mode hands out exactly what it trains on; asynchronous mode
  // more (so the drain at the end is exercised).
  CHECK(sync_run.actor.groups == kSteps * kGroupsPerStep);
  CHECK(sync_run.actor.held_back == 0);
  CHECK(async_run.actor.held_back > 0);
  if (rank != 0) return;

  REQUIRE(sync_run.steps.size() == static_cast<size_t>(kSteps));
  REQUIRE(async_run.steps.size() == static_cast<size_t>(kSteps));
  std::int64_t dropped = 0;
  for (size_t s = 0; s < sync_run.steps.size(); ++s) {
    const learner::StepStats& a = sync_run.steps[s];
    const learner::StepStats& b = async_run.steps[s];
    INFO("step " << s + 1 << ": synchronous vs asynchronous");
    CHECK(a.updated);
    CHECK(a.episodes == b.episodes);
    CHECK(a.generated_tokens == b.generated_tokens);
    CHECK(a.reward_mean == b.reward_mean);
    // The loss must be a real number that moves, or equality would prove little.
    CHECK(std::isfinite(a.loss));
    CHECK(a.loss != 0.0);
    CHECK(a.loss == b.loss);
    CHECK(a.importance_weight_mean == b.importance_weight_mean);
    CHECK(a.behaviour_gap == b.behaviour_gap);
    CHECK(a.clip_fraction == b.clip_fraction);
    CHECK(a.entropy == b.entropy);
    CHECK(a.zero_variance_groups == b.zero_variance_groups);
    dropped += a.zero_variance_groups;
  }
  CHECK(dropped > 0);  // some steps trained on part of their episodes
  CHECK(sync_run.steps.front().loss != sync_run.steps.back().loss);
  // The weights after the last step, parameter by parameter, byte for byte.
  REQUIRE(sync_run.weights.size() == async_run.weights.size());
  const std::vector<size_t> differing = moerl_test::differing_parameters(sync_run.weights, async_run.weights);
  INFO("first differing parameter: " << (differing.empty() ? sync_run.weights.size() : differing.front()));
  CHECK(differing.empty());
  // The weights moved, and the actor holds exactly what the learner ended with.
  CHECK(sync_run.final_crc != sync_run.initial_crc);
  CHECK(sync_run.initial_crc == async_run.initial_crc);
  CHECK(sync_run.actor.weights_crc == sync_run.final_crc);
  CHECK(async_run.actor.weights_crc == async_run.final_crc);
}
