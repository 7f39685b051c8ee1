// `scripts/launch.sh -n 3 bench update [--config C] [--set k=v] [--init FILE|hf:DIR]
//  [--episodes N] [--reps R] [--write-batch FILE]`: the wall time of one
// learner update (Learner::update: advantages, micro-batches, forward,
// clipped policy loss, backward, gradient clipping, AdamW) on a fixed
// synthetic batch of multi-turn GRPO episodes, against the plain forward and
// backward of the same micro-batches with logits at every position (what a
// plain implementation runs; the learner's head runs at generated positions
// only), in the same process. --write-batch writes the batch (tokens, generated
// mask, behaviour log-probs, rewards, advantages) and the optimiser settings
// as JSON, so that another implementation (benchmarks/peer/grpo_update.py)
// trains on the identical batch.
//
// Why three ranks: a Learner belongs to a job (its World, mailbox and
// weight-sync group need an actor and an env worker beside it). Ranks 1 and
// 2 only take part in building the World and then wait without spinning, so
// that rank 0 has the cores.

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include <unistd.h>

#include "bench_args.h"
#include "bench_policy.h"
#include "moerl/algo/advantages.h"
#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/core/check.h"
#include "moerl/core/json_writer.h"
#include "moerl/learner/episode_batch.h"
#include "moerl/learner/learner.h"
#include "moerl/setup/config_loading.h"
#include "moerl/text/tokenizer.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/mpi_session.h"
#include "moerl/runtime/world.h"

namespace moerl::bench {
namespace {

constexpr const char* kWho = "bench update";

struct UpdateArgs {
  PolicyBenchArgs policy;
  std::int64_t episodes = 0;  // 0: [algo] groups_per_step x [rollout] group_size
  std::int64_t reps = 0;      // 0: 5 (2 with --quick)
  std::string batch_path;     // --write-batch
};

UpdateArgs parse_update_args(const BenchOptions& options) {
  UpdateArgs out;
  const auto own = [&](const std::string& option, const std::function<const std::string&()>& value) {
    if (option == "--episodes") {
      out.episodes = whole_number(value(), kWho, option);
    } else if (option == "--reps") {
      out.reps = whole_number(value(), kWho, option);
    } else if (option == "--write-batch") {
      out.batch_path = value();
    } else {
      return false;
    }
    return true;
  };
  out.policy = parse_policy_bench_args(options.args, kWho,
                                       "--config F, --set section.key=value, --init FILE|hf:DIR, --episodes N, "
                                       "--reps R, --write-batch FILE",
                                       own);
  if (out.policy.init_path.rfind("hf:", 0) == 0) {  // as bench rollout: the hf: directory is the model's source
    out.policy.overrides.push_back("model.source=" + out.policy.init_path);
    out.policy.init_path.clear();
  }
  MOERL_CHECK(out.episodes >= 0 && out.reps >= 0, std::string(kWho) + ": --episodes and --reps must not be negative");
  return out;
}

// The run's configuration laid out as the three-rank job this benchmark is,
// writing nothing that lasts: no checkpoints, no held-out evaluation, and
// the learning rate at step 0 equal to [optim] lr (no warm-up).
config::Config update_config(const PolicyBenchArgs& args, const std::string& scratch_dir) {
  std::vector<std::string> overrides = args.overrides;
  for (const char* o : {"cluster.learners=1", "cluster.actors=1", "cluster.env_workers=1", "checkpoint.every_steps=0",
                        "rollout.eval_episodes=0", "optim.warmup_steps=0"})
    overrides.push_back(o);
  overrides.push_back("run.output_dir=" + scratch_dir);
  return setup::load_config_file(args.config_path, overrides);
}

// A multi-turn episode of about 190 tokens, as an actor sends it: a task
// statement, then 3-4 turns of a generated action (about half [rollout]
// max_tokens_per_turn tokens) and an observation. Text-like byte tokens;
// behaviour log-probs are filled in later from the policy itself.
rollout::Trajectory synthetic_episode(std::mt19937_64& random, std::uint64_t group, std::uint64_t index,
                                      std::int64_t turn_tokens, std::int64_t vocab) {
  using text::SpecialTokens;
  rollout::Trajectory t;
  t.group_id = group;
  t.episode_id = (group << 16) | index;
  t.task.family = "sort";
  t.task.seed = 1000 + group;
  const std::int64_t byte_range = std::min<std::int64_t>(vocab, 122) - 32;
  auto push = [&](std::int64_t token, bool generated) {
    t.tokens.push_back(static_cast<std::int32_t>(token));
    t.generated.push_back(generated ? 1 : 0);
    t.behaviour_logprobs.push_back(0.f);
    t.versions.push_back(generated ? 0 : -1);
  };
  auto text = [&](std::int64_t n, bool generated) {
    for (std::int64_t i = 0; i < n; ++i) push(32 + static_cast<std::int64_t>(random() % byte_range), generated);
  };
  push(SpecialTokens::kBos, false);
  push(SpecialTokens::kUser, false);
  text(40 + static_cast<std::int64_t>(random() % 30), false);
  const int turns = 3 + static_cast<int>(random() % 2);
  for (int turn = 0; turn < turns; ++turn) {  // about 12 generated and 26 observed tokens a turn
    push(SpecialTokens::kAssistant, false);
    text(turn_tokens / 4 + static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(turn_tokens / 2 + 1)), true);
    push(SpecialTokens::kUser, false);
    text(20 + static_cast<std::int64_t>(random() % 12), false);
    t.turn_rewards.push_back(0.f);
  }
  t.turn_rewards.back() = static_cast<float>(random() % 2);  // success or not: the group's rewards vary
  t.reward = t.turn_rewards.back();
  t.success = t.reward > 0;
  return t;
}

// Behaviour log-probs near the policy's own (the actor ran a version very
// like the learner's): its log-prob of every generated token plus a little
// noise, so that importance weights and clipping do some work.
void fill_behaviour_logprobs(model::Policy& policy, std::vector<rollout::Trajectory>& episodes,
                             std::mt19937_64& random) {
  torch::NoGradGuard no_grad;
  std::vector<const rollout::Trajectory*> all;
  for (const auto& e : episodes) all.push_back(&e);
  const learner::EpisodeBatch batch = learner::make_episode_batch(all, false);
  const torch::Tensor logp =
      learner::target_logprobs(policy->forward(batch.inputs, batch.lengths).logits, batch.targets).contiguous();
  const float* lp = logp.data_ptr<float>();
  std::normal_distribution<float> noise(0.f, 0.05f);
  std::int64_t at = 0;  // packed position of token p of an episode: its offset + p - 1
  for (auto& e : episodes) {
    for (size_t p = 1; p < e.tokens.size(); ++p, ++at)
      if (e.generated[p]) e.behaviour_logprobs[p] = lp[at] + noise(random);
  }
}

std::vector<rollout::Trajectory> synthetic_batch(model::Policy& policy, const config::Config& config,
                                                 std::int64_t episodes) {
  std::mt19937_64 random(static_cast<std::uint64_t>(config.run.seed) * 7919 + 17);
  const std::int64_t group_size = std::max<std::int64_t>(1, config.rollout.group_size);
  std::vector<rollout::Trajectory> batch;
  for (std::int64_t i = 0; i < episodes; ++i)
    batch.push_back(synthetic_episode(random, static_cast<std::uint64_t>(i / group_size),
                                      static_cast<std::uint64_t>(i % group_size), config.rollout.max_tokens_per_turn,
                                      config.model.vocab_size));
  fill_behaviour_logprobs(policy, batch, random);
  return batch;
}

const char* normalization_name(config::LossNormalization n) {
  switch (n) {
    case config::LossNormalization::Token: return "token";
    case config::LossNormalization::Sequence: return "sequence";
    case config::LossNormalization::Constant: return "constant";
  }
  return "?";
}

// The batch and what the update does with it, for another implementation.
// Advantages are GRPO's, computed as the learner computes them.
void write_batch(const std::string& path, const std::vector<rollout::Trajectory>& episodes,
                 const config::Config& config) {
  MOERL_CHECK(config.algo.advantage == config::AdvantageEstimator::Grpo,
              std::string(kWho) + ": --write-batch writes GRPO advantages; set algo.advantage=\"grpo\"");
  std::vector<float> rewards;
  std::vector<std::int64_t> groups;
  for (const auto& e : episodes) {
    rewards.push_back(static_cast<float>(e.reward));
    groups.push_back(static_cast<std::int64_t>(e.group_id));
  }
  const torch::Tensor advantages = algo::grpo_advantages(torch::tensor(rewards), torch::tensor(groups)).contiguous();
  JsonWriter w;
  w.begin_object();
  w.key("lr").value(config.optim.lr).key("beta1").value(config.optim.beta1).key("beta2").value(config.optim.beta2);
  w.key("weight_decay").value(config.optim.weight_decay).key("grad_clip").value(config.optim.grad_clip);
  w.key("grad_accumulation").value(config.optim.grad_accumulation);
  w.key("clip_low").value(config.algo.clip_low).key("clip_high").value(config.algo.clip_high);
  w.key("importance_cap").value(config.algo.importance_cap);
  w.key("normalization").value(normalization_name(config.algo.normalization));
  w.key("max_tokens_per_episode").value(config.rollout.max_tokens_per_episode);
  w.key("aux_loss_weight").value(config.moe.aux_loss_weight).key("z_loss_weight").value(config.moe.z_loss_weight);
  w.key("episodes").begin_array();
  for (size_t i = 0; i < episodes.size(); ++i) {
    const auto& e = episodes[i];
    w.begin_object().key("group").value(static_cast<std::int64_t>(e.group_id)).key("reward").value(e.reward);
    w.key("advantage").value(static_cast<double>(advantages.data_ptr<float>()[i]));
    w.key("tokens").begin_array();
    for (auto t : e.tokens) w.value(static_cast<std::int64_t>(t));
    w.end_array().key("generated").begin_array();
    for (auto g : e.generated) w.value(static_cast<std::int64_t>(g));
    w.end_array().key("behaviour_logprobs").begin_array();
    for (auto lp : e.behaviour_logprobs) w.value(static_cast<double>(lp));
    w.end_array().end_object();
  }
  w.end_array().end_object();
  std::ofstream out(path);
  out << w.str() << "\n";
  MOERL_CHECK(static_cast<bool>(out), std::string(kWho) + ": cannot write " + path);
}

// The floor: forward and backward of the same micro-batches (the summed
// log-probs of the targets as the loss), no statistics, loss terms or
// optimiser step.
double forward_backward_seconds(model::Policy& policy, const std::vector<const rollout::Trajectory*>& episodes,
                                std::int64_t chunks) {
  const auto n = static_cast<std::int64_t>(episodes.size());
  chunks = std::max<std::int64_t>(1, std::min(chunks, n));
  std::vector<learner::EpisodeBatch> batches;
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::vector<const rollout::Trajectory*> part(episodes.begin() + n * c / chunks,
                                                 episodes.begin() + n * (c + 1) / chunks);
    batches.push_back(learner::make_episode_batch(part, false));
  }
  policy->train();
  const auto start = std::chrono::steady_clock::now();
  policy->zero_grad(/*set_to_none=*/true);
  for (const auto& b : batches) {
    auto out = policy->forward(b.inputs, b.lengths);
    learner::target_logprobs(out.logits, b.targets).sum().backward();
  }
  return seconds_since(start);
}

struct UpdateTimes {
  std::vector<double> update_s, floor_s;
  learner::StepStats first;
};

UpdateTimes time_updates(learner::Learner& learner, model::Policy& policy,
                         const std::vector<rollout::Trajectory>& episodes, std::int64_t chunks, std::int64_t reps) {
  std::vector<const rollout::Trajectory*> batch;
  for (const auto& e : episodes) batch.push_back(&e);
  UpdateTimes t;
  // One untimed round first: the first calls allocate. Its statistics are
  // the first update's (the loss another implementation should match).
  t.first = learner.update(batch);
  forward_backward_seconds(policy, batch, chunks);
  for (std::int64_t r = 0; r < reps; ++r) {  // alternating, so that drift hits both alike
    const auto start = std::chrono::steady_clock::now();
    learner.update(batch);
    t.update_s.push_back(seconds_since(start));
    t.floor_s.push_back(forward_backward_seconds(policy, batch, chunks));
  }
  return t;
}

BenchCase update_case(const config::Config& config, const std::vector<rollout::Trajectory>& episodes,
                      const UpdateTimes& t, int threads) {
  std::int64_t tokens = 0, trained = 0;
  for (const auto& e : episodes) {
    tokens += static_cast<std::int64_t>(e.tokens.size());
    for (auto g : e.generated) trained += g;
  }
  const double median = percentile(t.update_s, 0.5), floor_median = percentile(t.floor_s, 0.5);
  BenchCase c;
  c.name = "grpo_update";
  c.params = {{"episodes", static_cast<std::int64_t>(episodes.size())},
              {"tokens", tokens},
              {"trained_tokens", trained},
              {"grad_accumulation", config.optim.grad_accumulation},
              {"d_model", config.model.d_model},
              {"layers", config.model.num_layers},
              {"experts", config.moe.num_experts},
              {"threads", std::int64_t{threads}}};
  c.metrics = {{"ms", median * 1e3},
               {"min_ms", *std::min_element(t.update_s.begin(), t.update_s.end()) * 1e3},
               {"first_loss", t.first.loss},
               {"tokens_per_s", static_cast<double>(tokens) / median}};
  c.baseline = {{"ms", floor_median * 1e3}, {"tokens_per_s", static_cast<double>(tokens) / floor_median}};
  c.ratio_metric = "ms";
  c.higher_is_better = false;  // ratio = forward+backward / update: the share of the update that is the floor
  return c;
}

// Waits for every rank without spinning: the idle ranks must leave rank 0 the cores.
void polite_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

BenchReport learner_report(const UpdateArgs& args, const config::Config& config, const runtime::World& world,
                           runtime::Mailbox& mailbox, comm::MpiCommunicator& sync_comm, const BenchOptions& options) {
  comm::MpiCommunicator learner_comm(world.role_comm(), "learner group");
  model::Policy policy = make_bench_policy(config, args.policy.init_path, kWho);
  const std::int64_t n = args.episodes > 0 ? args.episodes : config.algo.groups_per_step * config.rollout.group_size;
  const std::vector<rollout::Trajectory> episodes = synthetic_batch(policy, config, n);
  if (!args.batch_path.empty()) write_batch(args.batch_path, episodes, config);
  learner::Learner learner(learner::learner_settings(config), world, mailbox, policy, learner_comm, &sync_comm);
  const std::int64_t reps = args.reps > 0 ? args.reps : (options.quick ? 2 : 5);
  const UpdateTimes times = time_updates(learner, policy, episodes, config.optim.grad_accumulation, reps);
  BenchReport report;
  report.cases.push_back(update_case(config, episodes, times, at::get_num_threads()));
  return report;
}

BenchReport run_update_bench(const BenchOptions& options) {
  const UpdateArgs args = parse_update_args(options);
  const auto mpi = runtime::start_mpi_unless_running();
  int ranks = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MOERL_CHECK(ranks == 3, std::string(kWho) +
                              ": needs 3 ranks (a learner, an actor and an env worker; only the "
                              "learner works): scripts/launch.sh -n 3 bench update ...; got " +
                              std::to_string(ranks));
  // One scratch directory for the job (named after rank 0's pid), removed at the end.
  long long pid = static_cast<long long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const std::string scratch =
      (std::filesystem::temp_directory_path() / ("moerl_bench_update_" + std::to_string(pid))).string();
  const config::Config config = update_config(args.policy, scratch);
  BenchReport report;
  {
    runtime::World world(config, MPI_COMM_WORLD);
    runtime::Mailbox mailbox(world.message_comm(), config.cluster.message_timeout_s);
    // Duplicating a communicator is collective: the actor takes part in the sync group's.
    std::optional<comm::MpiCommunicator> sync_comm;
    if (world.sync_comm() != MPI_COMM_NULL) sync_comm.emplace(world.sync_comm(), "weight-sync group");
    std::string failure;
    if (world.role() == runtime::Role::Learner) {
      try {
        report = learner_report(args, config, world, mailbox, *sync_comm, options);
      } catch (const std::exception& e) {
        failure = e.what();  // after the barrier, so that the other ranks are not left waiting
      }
    } else {
      report.quiet = true;
    }
    polite_barrier();
    if (world.rank() == 0) std::filesystem::remove_all(scratch);
    if (!failure.empty()) throw Error(failure);
  }
  return report;
}

MOERL_BENCHMARK("update",
                "one learner update (GRPO, multi-turn episodes) ms vs forward+backward of the same micro-batches; "
                "run with scripts/launch.sh -n 3",
                run_update_bench);

}  // namespace
}  // namespace moerl::bench
