// Dynamic sampling ([algo] drop_zero_variance_groups) keeps the groups whose
// rewards are all equal out of the learner's forward and backward passes. The
// claim: the step is the one it would be had those groups never been taken.
// A real Learner (rank 0) takes one update() on a batch with zero-variance
// groups, a second Learner from the same initial weights one update() on the
// same batch with those groups removed beforehand, and the loss statistics,
// the gradients and the weights after the AdamW step must be equal, for every
// loss normalisation, with and without micro-batches. The MoE load-balancing
// and z-losses are switched off ([moe] aux_loss_weight = z_loss_weight = 0):
// they average over the tokens fed, so they are the terms where the claim
// does not hold.
//
// Why bitwise: both learners run on one thread in one process from the same
// weights; the kept episodes' advantages are computed per group, so what the
// learner trains on and how it normalises must be the same numbers in the
// same order. A wrong normaliser (the dropped groups' tokens or sequences
// counted in a denominator or in a micro-batch's share) scales the loss and
// gradients by a ratio of counts, and a tolerance is not needed to see it.
//
// A control shows the data can tell: with dynamic sampling off, the
// zero-variance groups count in the normalisation and the loss differs.
//
// Ranks 1 and 2 are the actor and env worker the layout needs; nothing talks
// to them.

#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "moerl/comm/mpi_communicator.h"
#include "moerl/core/hash.h"
#include "moerl/learner/learner.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/world.h"
#include "moerl/setup/config_loading.h"
#include "learner_test_support.h"
#include "scripted_turns.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

constexpr int kGroups = 5;
constexpr int kGroupSize = 4;
constexpr int kTopK = 2;
constexpr int kExperts = 4;

bool zero_variance(int group) { return group == 0 || group == 3; }

config::Config sampling_config(const std::string& output_dir, const std::string& normalization, int accumulation,
                               bool drop) {
  return setup::load_config_text(R"(
[run]
name = "dynamic_sampling"
seed = 11
[cluster]
learners = 1
actors = 1
env_workers = 1
message_timeout_s = 30.0
[model]
d_model = 32
num_layers = 2
num_heads = 2
num_kv_heads = 1
d_ff = 64
max_seq_len = 512
[moe]
num_experts = 4
top_k = 2
d_expert = 32
aux_loss_weight = 0.0
z_loss_weight = 0.0
[env]
families = ["sort", "guess"]
[rollout]
group_size = 4
max_tokens_per_episode = 512
eval_episodes = 0
[algo]
groups_per_step = 5
routing_check_interval = 1
[optim]
lr = 0.003
total_steps = 1
[checkpoint]
every_steps = 0
)",
                                 "dynamic_sampling.toml",
                                 {"run.output_dir=" + output_dir, "algo.normalization=\"" + normalization + "\"",
                                  "optim.grad_accumulation=" + std::to_string(accumulation),
                                  std::string("algo.drop_zero_variance_groups=") + (drop ? "true" : "false")});
}

// One scripted episode, a function of (group, sample) only: turns of observed
// and generated tokens with behaviour log-probs near the untrained model's,
// recorded routing for every fed position, and rewards that vary within a
// group unless the group is a zero-variance one.
rollout::Trajectory scripted_episode(int group, int sample, int moe_layers) {
  rollout::Trajectory t;
  t.group_id = static_cast<std::uint64_t>(group);
  t.episode_id = (t.group_id << 16) | static_cast<std::uint64_t>(sample);
  t.task.family = group % 2 == 0 ? "sort" : "guess";
  t.task.seed = 1000 + static_cast<std::uint64_t>(group);
  moerl_test::ScriptedRandom random(t.task.seed * 1000003ull + static_cast<std::uint64_t>(sample));
  // Group 0 succeeds alike, group 3 fails alike; in the rest the first turn's
  // reward grows with the sample by more than the later turns can make up.
  moerl_test::append_scripted_turns(
      t, random, {6, 12, 5, 16}, /*version=*/0, [&](int turn, moerl_test::ScriptedRandom&) {
        const float varying =
            turn == 0 ? 0.25f * static_cast<float>(sample) : 0.1f * static_cast<float>((group + turn) % 2);
        const float alike = turn == 0 && group == 0 ? 1.f : 0.f;  // whatever the number of turns
        return zero_variance(group) ? alike : varying;
      });
  // Two distinct experts per fed position and MoE layer.
  t.moe_layers = moe_layers;
  t.top_k = kTopK;
  for (size_t p = 0; p + 1 < t.tokens.size(); ++p)
    for (int layer = 0; layer < moe_layers; ++layer) {
      const auto first = static_cast<std::uint8_t>(random.below(kExperts));
      t.routing.push_back(first);
      t.routing.push_back(static_cast<std::uint8_t>((first + 1 + random.below(kExperts - 1)) % kExperts));
    }
  t.success = t.reward > 1.0;
  return t;
}

struct Outcome {
  learner::StepStats stats;
  moerl_test::ParameterValues grads, weights;  // after the step
};

// One update() of a fresh Learner (initial weights from the run seed).
// The communicators a Learner is built with (learner 0's side of them).
struct LearnerComms {
  comm::MpiCommunicator& learners;
  comm::MpiCommunicator& sync;
};

Outcome one_update(const config::Config& config, const runtime::World& world, runtime::Mailbox& mailbox,
                   LearnerComms comms, const std::vector<rollout::Trajectory>& episodes) {
  torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
  model::Policy policy(config.model, config.moe);
  comm::MpiCommunicator& learner_comm = comms.learners;
  comm::MpiCommunicator& sync_comm = comms.sync;
  learner::Learner learner(learner::learner_settings(config), world, mailbox, policy, learner_comm, &sync_comm);
  std::vector<const rollout::Trajectory*> batch;
  for (const auto& e : episodes) batch.push_back(&e);
  Outcome outcome;
  outcome.stats = learner.update(batch);
  for (const auto& p : policy->parameters())
    outcome.grads.push_back(p.grad().defined() ? moerl_test::float_values(p.grad()) : std::vector<float>{});
  outcome.weights = moerl_test::parameter_values(policy->parameters());
  return outcome;
}

void check_same_step(const config::Config& config, const runtime::World& world, runtime::Mailbox& mailbox,
                     LearnerComms comms, const config::Config& no_dropping) {
  const int moe_layers = static_cast<int>(config.model.num_layers);  // every layer is an MoE layer here
  std::vector<rollout::Trajectory> all, kept;
  for (int g = 0; g < kGroups; ++g)
    for (int s = 0; s < kGroupSize; ++s) {
      all.push_back(scripted_episode(g, s, moe_layers));
      if (!zero_variance(g)) kept.push_back(all.back());
    }
  const Outcome with_dropped = one_update(config, world, mailbox, comms, all);
  const Outcome without = one_update(config, world, mailbox, comms, kept);
  const learner::StepStats& a = with_dropped.stats;
  const learner::StepStats& b = without.stats;

  // The dropped groups were seen (counted, their tokens reported) but not trained on.
  CHECK(a.zero_variance_groups == 2);
  CHECK(b.zero_variance_groups == 0);
  CHECK(a.episodes == kGroups * kGroupSize);
  CHECK(b.episodes == (kGroups - 2) * kGroupSize);
  CHECK(a.tokens > b.tokens);
  CHECK(a.updated);
  CHECK(b.updated);
  // A real loss, so equality says something.
  CHECK(std::isfinite(a.loss));
  CHECK(a.loss != 0.0);
  CHECK(a.loss == b.loss);
  CHECK(a.importance_weight_mean == b.importance_weight_mean);
  CHECK(a.behaviour_gap == b.behaviour_gap);
  CHECK(a.clip_fraction == b.clip_fraction);
  CHECK(a.entropy == b.entropy);
  CHECK(a.kl == b.kl);
  CHECK(moerl_test::differing_parameters(with_dropped.grads, without.grads).empty());
  CHECK(moerl_test::differing_parameters(with_dropped.weights, without.weights).empty());

  // The weights moved: the comparison is of a real step.
  torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
  model::Policy initial(config.model, config.moe);
  CHECK(
      !moerl_test::differing_parameters(moerl_test::parameter_values(initial->parameters()), without.weights).empty());

  // Control: counted in the normalisation, the zero-variance groups change the loss.
  const Outcome counted = one_update(no_dropping, world, mailbox, comms, all);
  CHECK(counted.stats.zero_variance_groups == 0);
  CHECK(counted.stats.loss != b.loss);
}

}  // namespace

TEST_CASE("dynamic sampling: a step on a batch with zero-variance groups equals the step without them",
          "[learner_dynamic_sampling]") {
  torch::set_num_threads(1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string output_dir = moerl_test::shared_temp_dir("moerl_dynamic_sampling_");

  for (const std::string normalization : {"token", "sequence", "constant"})
    for (const int accumulation : {1, 3}) {
      const config::Config config = sampling_config(output_dir, normalization, accumulation, true);
      const config::Config no_dropping = sampling_config(output_dir, normalization, accumulation, false);
      runtime::World world(config, MPI_COMM_WORLD);
      runtime::Mailbox mailbox(world.message_comm(), config.cluster.message_timeout_s);
      // Duplicating a communicator is collective: the actor takes part in the sync group's.
      std::optional<comm::MpiCommunicator> sync_comm;
      if (world.sync_comm() != MPI_COMM_NULL) sync_comm.emplace(world.sync_comm(), "weight-sync group");
      if (world.role() == runtime::Role::Learner) {
        comm::MpiCommunicator learner_comm(world.role_comm(), "learner group");
        INFO("normalization " << normalization << ", grad_accumulation " << accumulation);
        check_same_step(config, world, mailbox, LearnerComms{learner_comm, *sync_comm}, no_dropping);
      }
      moerl_test::polite_barrier(MPI_COMM_WORLD);
    }
  if (rank == 0) std::filesystem::remove_all(output_dir);
}
