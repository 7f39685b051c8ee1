#include "moerl/learner/learner.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

#include "moerl/algo/advantages.h"
#include "moerl/algo/policy_loss.h"
#include "moerl/algo/token_batch.h"
#include "moerl/learner/checkpointing.h"
#include "moerl/learner/episode_batch.h"
#include "moerl/learner/ppo_targets.h"
#include "moerl/sync/module_weights.h"
#include "moerl/storage/checksum.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

double now_s() { return runtime::monotonic_seconds(); }

algo::PolicyLossOptions loss_options(const config::AlgoSection& a, std::int64_t max_tokens) {
  algo::PolicyLossOptions o;
  o.ratio_level = a.gspo ? algo::RatioLevel::RatioSequence : algo::RatioLevel::RatioToken;
  o.clip_low = a.clip_low;
  o.clip_high = a.clip_high;
  switch (a.normalization) {
    case config::LossNormalization::Token: o.aggregation = algo::LossAggregation::TokenMean; break;
    case config::LossNormalization::Sequence: o.aggregation = algo::LossAggregation::SequenceMean; break;
    case config::LossNormalization::Constant:
      o.aggregation = algo::LossAggregation::ConstantNormalizer;
      o.constant_normalizer = static_cast<double>(max_tokens);
      break;
  }
  o.importance_cap = a.importance_cap;
  o.kl_estimator = a.kl == config::KlMode::K1 ? algo::KlEstimator::KlK1
                   : a.kl == config::KlMode::K3 ? algo::KlEstimator::KlK3 : algo::KlEstimator::KlNone;
  o.kl_coef = a.kl_coef;
  o.entropy_coef = a.entropy_coef;
  return o;
}

PpoOptions ppo_options(const config::AlgoSection& a) {
  PpoOptions o;
  o.gamma = a.gae_gamma;
  o.lambda = a.gae_lambda;
  o.value_clip = a.value_clip;
  o.whiten_advantages = a.whiten_advantages;
  return o;
}

// How often scripts/launch.sh restarted this job, and why the last time.
int launcher_restarts() {
  const char* restarts = std::getenv("MOERL_RESTARTS");
  return restarts ? std::max(0, std::atoi(restarts)) : 0;
}

std::string restart_cause() {
  const char* cause = std::getenv("MOERL_RESTART_CAUSE");
  return cause ? cause : "";
}

std::string format_duration(double seconds) {
  std::ostringstream out;
  const auto s = static_cast<long>(std::max(0.0, seconds));
  if (s >= 60) out << s / 60 << "m";
  out << std::setw(s >= 60 ? 2 : 1) << std::setfill('0') << s % 60 << "s";
  return out.str();
}

}  // namespace

Learner::Learner(const config::Config& config, const runtime::World& world, runtime::Mailbox& mailbox,
                 model::Policy policy, comm::Communicator& learner_comm, comm::Communicator* sync_comm,
                 const std::string& resume)
    : config_(config), world_(world), mailbox_(mailbox), policy_(policy), learner_comm_(learner_comm),
      watch_(config.cluster.message_timeout_s) {
  learners_ = learner_comm.size();
  reporter_ = std::make_unique<telemetry::MetricsReporter>(mailbox, config.telemetry.metrics_interval_s);
  auto options = torch::optim::AdamWOptions(config.optim.lr)
                     .betas(std::make_tuple(config.optim.beta1, config.optim.beta2))
                     .weight_decay(config.optim.weight_decay);
  optimizer_ = std::make_unique<torch::optim::AdamW>(policy_->parameters(), options);
  if (config.algo.advantage == config::AdvantageEstimator::Ppo) {
    value_head_ = ValueHead(config.model.d_model);
    auto value_options = std::make_unique<torch::optim::AdamWOptions>(options);
    value_options->lr(config.optim.lr * config.algo.value_lr_scale);
    optimizer_->add_param_group(torch::optim::OptimizerParamGroup(value_head_->parameters(), std::move(value_options)));
  }
  if (config.algo.kl != config::KlMode::None) {
    // The frozen reference: a copy of the starting weights.
    reference_ = model::Policy(config.model, config.moe);
    torch::NoGradGuard no_grad;
    auto source = policy_->parameters();
    auto target = reference_->parameters();
    for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
    reference_->eval();
    for (auto& p : reference_->parameters()) p.set_requires_grad(false);
  }
  if (world.is_coordinator()) {
    coordinator_ = std::make_unique<TaskCoordinator>(config, mailbox, learners_,
                                                     world.layout().ranks_of(runtime::Role::Actor));
    MOERL_CHECK(sync_comm != nullptr, "learner 0 needs the weight-sync communicator");
    publisher_ = std::make_unique<sync::WeightPublisher>(*sync_comm, sync::module_weight_views(*policy_),
                                                         sync::sync_options(config.sync, config.cluster.message_timeout_s));
  }
  if (world.is_coordinator()) checkpoints_ = std::make_unique<CheckpointSchedule>(config);
  rng_states_.assign(static_cast<size_t>(learners_), {});
  if (!resume.empty()) {
    if (const auto state = load_checkpoint(config, resume, *policy_, optimizer_.get(), value_head_module())) {
      step_ = state->step;
      version_ = state->version;
      staleness_ = state->staleness;
      // Each learner continues its own random stream (a checkpoint of
      // another learner count restores none).
      const auto rank = static_cast<size_t>(learner_comm.rank());
      if (state->rng_states.size() == static_cast<size_t>(learners_) && !state->rng_states[rank].empty()) {
        set_cpu_generator_state(state->rng_states[rank]);
      } else if (world.is_coordinator()) {
        spdlog::warn("resume: the checkpoint holds {} learner RNG states for {} learners; generators not restored",
                     state->rng_states.size(), learners_);
      }
      if (coordinator_) {
        coordinator_->resume(static_cast<std::uint64_t>(state->next_group), static_cast<std::uint64_t>(state->next_seed),
                             version_);
        restore_books(state->coordinator_books);
        if (launcher_restarts() > 0) {
          RankFailure restart;
          restart.kind = "restart " + std::to_string(launcher_restarts()) + " by scripts/launch.sh: " + restart_cause();
          restart.step = step_;
          coordinator_->record_rank_failure(restart);
        }
        checkpoints_->accept_latest();
        telemetry::metrics().add("learner.dropped_groups", static_cast<double>(staleness_.dropped_groups));
      }
    } else if (world.is_coordinator()) {
      spdlog::info("--resume auto: no checkpoint in {}; starting fresh", checkpoint_directory(config));
    }
  }
}

double Learner::learning_rate(std::int64_t step) const {
  const auto& o = config_.optim;
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / o.warmup_steps;
  if (!o.cosine) return o.lr;
  const double progress = static_cast<double>(step - o.warmup_steps) / std::max<std::int64_t>(1, o.total_steps - o.warmup_steps);
  return o.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * std::min(1.0, progress))));
}

void Learner::restore_books(const std::string& books) {
  // A resumed run keeps the first run's books: its `before` evaluation and
  // failure counts (checkpoints written before they were kept have none),
  // and each step once in the metrics file.
  if (!books.empty()) {
    try {
      coordinator_->restore_books(books);
    } catch (const JsonError& error) {
      spdlog::warn("resume: the checkpoint's coordinator books are unreadable ({}); summary.json starts them afresh",
                   error.what());
    }
  }
  const std::string metrics_path = config_.run_directory() + "/" + config_.telemetry.metrics_file;
  const std::int64_t dropped = telemetry::keep_lines_through_step(metrics_path, step_);
  if (dropped > 0)
    spdlog::info("resume: dropped {} lines past step {} from {} (those steps run again)", dropped, step_, metrics_path);
}

void Learner::receive_episodes() {
  for (;;) {
    std::optional<std::pair<int, rollout::Trajectory>> message;
    try {
      message = mailbox_.try_receive<rollout::Trajectory>();
    } catch (const runtime::MessageError& error) {
      drop_malformed(error, true);
      continue;
    }
    if (!message) return;
    take_episode(message->first, std::move(message->second));
  }
}

void Learner::take_episode(int source, rollout::Trajectory episode) {
  const double now = now_s();
  watch_.heard_from(source, now);
  watch_.progressed(now);
  if (episode.evaluation) {
    if (!coordinator_) {
      drop_malformed(runtime::MessageError("an evaluation episode from rank " + std::to_string(source) +
                                               " reached learner " + std::to_string(world_.role_index()) +
                                               " (they go to learner 0)",
                                           source),
                     false);
      return;
    }
    coordinator_->record_evaluation(episode);
    return;
  }
  // Failure records of every group reach learner 0 for its books; the group's
  // own learner also needs them to complete the group.
  if (episode.failed() && coordinator_) coordinator_->record_training_failure(episode);
  const bool mine = episode.group_id % static_cast<std::uint64_t>(learners_) == static_cast<std::uint64_t>(learner_comm_.rank());
  if (!mine) {
    if (!episode.failed())
      drop_malformed(runtime::MessageError("an episode of group " + std::to_string(episode.group_id) + " from rank " +
                                               std::to_string(source) + " reached learner " +
                                               std::to_string(learner_comm_.rank()) + " (not its learner)",
                                           source),
                     false);
    return;
  }
  ++received_episodes_;
  group_last_arrival_[episode.group_id] = now;
  groups_[episode.group_id].push_back(std::move(episode));
}

void Learner::drop_malformed(const runtime::MessageError& error, bool lost_episode) {
  // The message is lost, not the job. A lost episode counts as an arrival
  // (the drain at the end expects it) whose group may now stay one member short.
  const int rank = error.source();
  const std::int64_t count = ++malformed_by_rank_[rank];
  if (lost_episode) {
    ++received_episodes_;
    ++unaccounted_members_;
  }
  telemetry::metrics().add("learner.malformed_messages");
  const std::string sender = rank >= 0 ? runtime::role_name(world_.layout().assignment(rank).role) +
                                             std::string(" rank ") + std::to_string(rank)
                                       : std::string("an unknown rank");
  spdlog::warn("learner {}: dropped a malformed message from {} ({} of {} allowed): {}", world_.role_index(), sender,
               count, config_.cluster.malformed_message_limit, error.what());
  if (count >= config_.cluster.malformed_message_limit)
    fail_job(sender + " sent " + std::to_string(count) + " malformed messages ([cluster] malformed_message_limit); the last: " +
             error.what());
}

void Learner::fail_job(const std::string& reason, int status) {
  if (!pending_failure_.empty() || !job_failure_.empty()) return;
  pending_failure_ = reason;
  pending_failure_status_ = status;
}

void Learner::on_rank_lost(const runtime::LostRank& lost) {
  // Without failover (yet, or without a fault-tolerant MPI) every lost rank
  // ends the job cleanly: checkpoint saved, status 4, and scripts/launch.sh
  // restarts it with --resume auto.
  spdlog::error("{}", lost.describe());
  telemetry::metrics().add("coordinator.lost_ranks");
  RankFailure failure;
  failure.rank = lost.rank;
  failure.role = runtime::role_name(lost.role);
  failure.role_index = lost.role_index;
  failure.host = lost.host;
  failure.kind = "lost: " + lost.why;
  failure.detected_after_s = lost.silent_s;
  failure.step = step_;
  coordinator_->record_rank_failure(failure);
  fail_job(lost.describe() + "; the job stops so that it can be restarted from its checkpoint",
           runtime::kLostRankExitStatus);
}

void Learner::watch_progress() {
  const double now = now_s();
  double tokens = 0;
  for (const auto& [rank, snapshot] : aggregator_.latest()) {
    const auto it = snapshot.counters.find("rollout.generated_tokens");
    if (snapshot.role == "actor" && it != snapshot.counters.end()) tokens += it->second;
  }
  watch_.generated_tokens(tokens, now);
  if (coordinator_->phase() == TaskCoordinator::Phase::Train && coordinator_->all_families_paused()) {
    std::string families;
    for (const std::string& family : config_.env.families)
      families += (families.empty() ? "" : "; ") + family + ": " + coordinator_->breaker().last_error(family);
    fail_job("every task family is paused by the circuit breaker (their sessions keep failing): " + families);
    return;
  }
  const double quiet_s = 3 * config_.telemetry.metrics_interval_s;
  if (watch_.expired(now)) {
    const std::string quiet = watch_.quiet_ranks(world_.layout(), quiet_s, now);
    fail_job("no episodes arrived for " + std::to_string(static_cast<int>(watch_.idle_s(now))) +
             " s ([cluster] message_timeout_s); silent ranks: " + (quiet.empty() ? "none" : quiet) +
             "; sessions failed for good: " + coordinator_->env_failures().describe());
  } else if (watch_.warn_due(now)) {
    const std::string quiet = watch_.quiet_ranks(world_.layout(), quiet_s, now);
    spdlog::warn("learner 0: no episodes for {:.0f} s (the job stops at {:.0f} s); silent ranks: {}; sessions failed "
                 "for good: {}",
                 watch_.idle_s(now), watch_.limit_s(), quiet.empty() ? "none" : quiet,
                 coordinator_->env_failures().describe());
  }
}

void Learner::collect_metrics() {
  if (!world_.is_coordinator()) {
    reporter_->maybe_send();
    return;
  }
  for (;;) {
    std::optional<std::pair<int, telemetry::MetricsReport>> report;
    try {
      report = mailbox_.try_receive<telemetry::MetricsReport>();
    } catch (const runtime::MessageError& error) {
      drop_malformed(error, false);
      continue;
    }
    if (!report) return;
    watch_.heard_from(report->first, now_s());
    aggregator_.update(report->second.snapshot);
  }
}

void Learner::write_metrics_line() {
  if (!world_.is_coordinator()) return;
  aggregator_.update(telemetry::metrics().snapshot());
  if (!metrics_file_)
    metrics_file_ = std::make_unique<telemetry::JsonLinesFile>(config_.run_directory() + "/" + config_.telemetry.metrics_file);
  metrics_file_->append(aggregator_.json_line(step_));
}

size_t Learner::serve_once() {
  std::lock_guard<std::mutex> lock(service_mutex_);
  if (heartbeat_) {
    heartbeat_->set_job_progress(step_, version_);
    for (const runtime::LostRank& lost : heartbeat_->take_lost()) on_rank_lost(lost);
  }
  if (coordinator_) coordinator_->serve(version_);
  receive_episodes();
  collect_metrics();
  return held_episodes();
}

size_t Learner::held_episodes() const {
  size_t held = 0;
  for (const auto& [id, episodes] : groups_) held += episodes.size();
  return held;
}

void Learner::serve_while(const std::function<bool()>& busy, bool waits_for_episodes) {
  if (waits_for_episodes) {
    std::lock_guard<std::mutex> lock(service_mutex_);
    watch_.start(now_s());
  }
  while (busy()) {
    serve_once();
    if (publisher_ && publisher_->in_flight()) publisher_->progress();
    std::string failure;
    int failure_status = 0;
    double idle_s = 0;
    {
      std::lock_guard<std::mutex> lock(service_mutex_);
      if (waits_for_episodes && coordinator_) watch_progress();
      failure.swap(pending_failure_);
      failure_status = pending_failure_status_;
      idle_s = watch_.idle_s(now_s());
    }
    if (!failure.empty()) {
      job_failure_ = failure;
      job_failure_status_ = failure_status;
      spdlog::error("learner {}: stopping the job: {}", world_.role_index(), failure);
      if (stop_) stop_->request_stop(failure);
    }
    if (waits_for_episodes && !job_failure_.empty()) return;
    // Learners other than learner 0 wait for learner 0 to end a stalled job;
    // this deadline is for a learner 0 that cannot.
    if (waits_for_episodes && !coordinator_ && idle_s > 2 * config_.cluster.message_timeout_s)
      throw runtime::TimeoutError("learner " + std::to_string(world_.role_index()) + ": no episodes arrived for " +
                                  std::to_string(static_cast<int>(idle_s)) + " s and learner 0 did not stop the job");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void Learner::serve_during(const std::function<void()>& work) {
  std::atomic<bool> done{false};
  std::exception_ptr helper_failure;
  std::thread helper([&] {
    try {
      do {  // at least once, however short the work
        serve_once();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      } while (!done.load(std::memory_order_acquire));
    } catch (...) {
      helper_failure = std::current_exception();
    }
  });
  std::exception_ptr work_failure;
  try {
    work();
  } catch (...) {
    work_failure = std::current_exception();
  }
  done.store(true, std::memory_order_release);
  helper.join();
  if (work_failure) std::rethrow_exception(work_failure);
  if (helper_failure) std::rethrow_exception(helper_failure);
}

std::vector<std::uint64_t> Learner::complete_groups() {
  const auto group_size = static_cast<size_t>(config_.rollout.group_size);
  const double now = now_s();
  std::vector<std::uint64_t> complete;
  for (const auto& [id, episodes] : groups_) {
    if (episodes.size() >= group_size) {
      complete.push_back(id);
    } else if (unaccounted_members_ > 0 && now - group_last_arrival_[id] > config_.cluster.message_timeout_s / 2) {
      // Its missing members were most likely in the malformed messages
      // dropped. Half the progress watch's limit: taken before the watch would
      // stop a job that waits for nothing else.
      const auto missing = static_cast<std::int64_t>(group_size - episodes.size());
      unaccounted_members_ = std::max<std::int64_t>(0, unaccounted_members_ - missing);
      telemetry::metrics().add("learner.incomplete_groups");
      spdlog::warn("learner {}: group {} taken with {} of {} episodes (the rest were lost in malformed messages)",
                   world_.role_index(), id, episodes.size(), group_size);
      complete.push_back(id);
    }
  }
  return complete;
}

std::vector<const rollout::Trajectory*> Learner::take_ready_groups(std::int64_t& dropped, std::int64_t& taken,
                                                                   std::int64_t& failed) {
  std::lock_guard<std::mutex> lock(service_mutex_);
  const std::int64_t quota = (config_.algo.groups_per_step + learners_ - 1) / learners_;
  std::vector<std::uint64_t> complete = complete_groups();
  if (static_cast<std::int64_t>(complete.size()) < quota) return {};
  complete.resize(static_cast<size_t>(quota));
  batch_storage_.clear();
  dropped = taken = failed = 0;
  failure_records_ = 0;
  for (std::uint64_t id : complete) {
    std::vector<rollout::Trajectory> episodes = std::move(groups_[id]);
    groups_.erase(id);
    group_last_arrival_.erase(id);
    // Failure records complete the group but carry nothing to train on; the
    // group-relative statistics come from the episodes that remain.
    const auto records = std::count_if(episodes.begin(), episodes.end(), [](const auto& e) { return e.failed(); });
    failure_records_ += records;
    episodes.erase(std::remove_if(episodes.begin(), episodes.end(),
                                  [](const auto& e) { return e.failed() || e.tokens.size() < 2; }),
                   episodes.end());
    if (episodes.empty()) {
      ++failed;
      continue;
    }
    // Deterministic mode: (group, sample index) order, not arrival order (episode ids encode both there).
    if (config_.run.deterministic)
      std::sort(episodes.begin(), episodes.end(), [](const auto& a, const auto& b) { return a.episode_id < b.episode_id; });
    std::int32_t oldest = std::numeric_limits<std::int32_t>::max();
    for (const auto& e : episodes)
      if (e.min_version() >= 0) oldest = std::min(oldest, e.min_version());
    // Bounded staleness: a group sampled by weights older than allowed is not trained on.
    if (oldest != std::numeric_limits<std::int32_t>::max() && version_ - oldest > config_.sync.max_staleness) {
      ++dropped;
      ++staleness_step_.dropped_groups;
      continue;
    }
    ++taken;
    ++staleness_step_.taken_groups;
    for (auto& e : episodes) {
      for (std::int32_t v : e.versions)
        if (v >= 0) staleness_step_.add_tokens(version_ - v, 1);
      batch_storage_.push_back(std::move(e));
    }
  }
  std::vector<const rollout::Trajectory*> batch;
  for (const auto& e : batch_storage_) batch.push_back(&e);
  return batch;
}

std::vector<torch::Tensor> Learner::trainable_parameters() const {
  std::vector<torch::Tensor> parameters = policy_->parameters();
  if (value_head_)
    for (const auto& p : value_head_->parameters()) parameters.push_back(p);
  return parameters;
}

void Learner::allreduce_gradients() {
  // One flat buffer of every gradient (zeros where a parameter got none, e.g.
  // an expert no token reached), averaged over the learners in one all-reduce.
  if (learners_ == 1) return;
  std::vector<torch::Tensor> pieces;
  for (auto& p : trainable_parameters())
    pieces.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  torch::Tensor flat = torch::cat(pieces).contiguous();
  auto request = learner_comm_.allreduce_sum_async(flat.data_ptr(), static_cast<size_t>(flat.numel()), comm::DataType::Float32);
  serve_while([&] { return !request->test(); });
  flat.div_(static_cast<double>(learners_));
  std::int64_t at = 0;
  for (auto& p : trainable_parameters()) {
    torch::Tensor slice = flat.narrow(0, at, p.numel()).view_as(p);
    if (p.grad().defined()) {
      p.mutable_grad().copy_(slice);
    } else {
      p.mutable_grad() = slice.clone();
    }
    at += p.numel();
  }
}

// Episode-level inputs of the loss: rewards (with the overlong penalty),
// group-relative advantages and which episodes dynamic sampling keeps.
struct Learner::EpisodeTargets {
  torch::Tensor advantages;  // [N]; undefined for PPO (per turn, from the value head)
  std::vector<float> final_bonus;  // [N] overlong penalty (PPO adds it to the last turn)
  torch::Tensor kept;        // [N] float 0/1
  double kept_sequences = 0;
};

Learner::EpisodeTargets Learner::episode_targets(const std::vector<const rollout::Trajectory*>& episodes, StepStats& st) {
  const auto n = static_cast<std::int64_t>(episodes.size());
  std::vector<float> reward_values, generated_lengths;
  std::vector<std::int64_t> group_values;
  for (const auto* e : episodes) {
    reward_values.push_back(static_cast<float>(e->reward));
    group_values.push_back(static_cast<std::int64_t>(e->group_id));
    float generated = 0;
    for (std::uint8_t g : e->generated) generated += g;
    generated_lengths.push_back(generated);
    FamilyScore& family = st.by_family[e->task.family];
    ++family.episodes;
    family.successes += e->success;
    family.reward += e->reward;
    st.reward_mean += e->reward / static_cast<double>(n);
  }
  torch::Tensor rewards = torch::tensor(reward_values);
  EpisodeTargets targets;
  targets.final_bonus.assign(static_cast<size_t>(n), 0.f);
  if (config_.algo.overlong_cache_tokens > 0) {
    algo::OverlongOptions overlong;
    overlong.max_length = config_.rollout.max_tokens_per_episode;
    overlong.cache_length = std::min(config_.algo.overlong_cache_tokens, config_.rollout.max_tokens_per_episode);
    overlong.factor = config_.algo.overlong_factor;
    const torch::Tensor penalty = algo::overlong_penalty(torch::tensor(generated_lengths), overlong).to(torch::kFloat32);
    rewards = rewards + penalty;
    targets.final_bonus.assign(penalty.data_ptr<float>(), penalty.data_ptr<float>() + n);
  }
  const torch::Tensor groups = torch::tensor(group_values);
  targets.kept = torch::ones({n}, torch::kFloat32);
  const bool ppo = config_.algo.advantage == config::AdvantageEstimator::Ppo;
  // PPO's baseline is the value head, not the group: equal rewards still teach the critic.
  if (config_.algo.drop_zero_variance_groups && !ppo) {
    const algo::GroupFilter filter = algo::filter_zero_variance_groups(rewards, groups);
    targets.kept = filter.kept.to(torch::kFloat32);
    st.zero_variance_groups = filter.dropped_groups;
  }
  switch (config_.algo.advantage) {
    case config::AdvantageEstimator::Grpo: targets.advantages = algo::grpo_advantages(rewards, groups); break;
    case config::AdvantageEstimator::DrGrpo: targets.advantages = algo::dr_grpo_advantages(rewards, groups); break;
    case config::AdvantageEstimator::Rloo: targets.advantages = algo::rloo_advantages(rewards, groups); break;
    case config::AdvantageEstimator::Ppo: break;  // per turn, in ppo_targets()
  }
  targets.kept_sequences = targets.kept.sum().item<double>();
  return targets;
}

Learner::EpisodeTargets Learner::kept_targets(const std::vector<const rollout::Trajectory*>& episodes,
                                              const EpisodeTargets& all, std::vector<const rollout::Trajectory*>& kept,
                                              std::vector<const rollout::Trajectory*>& dropped) {
  const torch::Tensor flags = all.kept.contiguous();
  const float* keep = flags.data_ptr<float>();
  std::vector<std::int64_t> index;
  for (size_t i = 0; i < episodes.size(); ++i)
    if (keep[i] > 0) {
      kept.push_back(episodes[i]);
      index.push_back(static_cast<std::int64_t>(i));
    } else {
      dropped.push_back(episodes[i]);
    }
  if (kept.size() == episodes.size()) return all;
  const torch::Tensor rows = torch::tensor(index, torch::kInt64);
  EpisodeTargets out;
  if (all.advantages.defined()) out.advantages = all.advantages.index_select(0, rows);
  out.kept = torch::ones({static_cast<std::int64_t>(index.size())}, torch::kFloat32);
  for (std::int64_t i : index) out.final_bonus.push_back(all.final_bonus[static_cast<size_t>(i)]);
  out.kept_sequences = all.kept_sequences;
  return out;
}

// How often the learner's own router would have picked other experts than the
// replayed ones (fraction of token-layer pairs whose top-k sets differ).
std::pair<double, double> Learner::router_disagreement(const EpisodeBatch& batch) {
  torch::NoGradGuard no_grad;
  const model::PolicyOutput own = policy_->forward(batch.inputs, batch.lengths);
  const torch::Tensor mine = std::get<0>(own.expert_indices.sort(-1));
  const torch::Tensor replayed = std::get<0>(batch.forced_experts.sort(-1));
  const torch::Tensor differs = (mine != replayed).any(-1);
  return {differs.sum().item<double>(), static_cast<double>(differs.numel())};
}

void Learner::record_episode_statistics(const std::vector<const EpisodeBatch*>& batches, bool replay,
                                        StepStats& st) {
  bool routed = replay && config_.algo.routing_check_interval > 0 && step_ % config_.algo.routing_check_interval == 0;
  for (const EpisodeBatch* b : batches) {
    st.generated_tokens += b->generated_tokens;
    st.tokens += b->targets.size(0);
    record_staleness(*b, st);
    routed = routed && b->forced_experts.defined();
  }
  if (!routed) return;
  double differing = 0, pairs = 0;
  for (const EpisodeBatch* b : batches) {
    const auto [d, n] = router_disagreement(*b);
    differing += d;
    pairs += n;
  }
  st.router_disagreement = pairs > 0 ? differing / pairs : 0.0;
  telemetry::metrics().set("learner.router_disagreement", st.router_disagreement);
}

StepStats Learner::update(const std::vector<const rollout::Trajectory*>& episodes) {
  const double started = now_s();
  StepStats st;
  st.step = step_;
  st.version = version_;
  st.episodes = static_cast<int>(episodes.size());
  optimizer_->zero_grad();
  double local_tokens = 0;
  if (!episodes.empty()) {
    const EpisodeTargets all_targets = episode_targets(episodes, st);
    const bool replay = config_.algo.routing_replay && config_.moe.enabled;
    // Groups that dynamic sampling dropped carry no loss: they stay out of
    // the forward and backward passes (the loss normalises over kept tokens
    // and sequences only, so its value is the same).
    std::vector<const rollout::Trajectory*> trained, dropped;
    const EpisodeTargets targets = kept_targets(episodes, all_targets, trained, dropped);
    // Micro-batches ([optim] grad_accumulation) split the episodes; each
    // chunk's loss is weighted by its share of the batch so the summed
    // gradient equals that of one full-batch loss.
    const auto n = static_cast<std::int64_t>(trained.size());
    const std::int64_t chunks = std::min<std::int64_t>(config_.optim.grad_accumulation, n);
    const algo::PolicyLossOptions options = loss_options(config_.algo, config_.rollout.max_tokens_per_episode);
    double total_counted = 0;
    std::vector<EpisodeBatch> batches;
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
      std::vector<const rollout::Trajectory*> part(trained.begin() + begin, trained.begin() + end);
      batches.push_back(make_episode_batch(part, replay));
      ranges.emplace_back(begin, end);
      const EpisodeBatch& b = batches.back();
      total_counted += (b.loss_mask * algo::broadcast_to_tokens(targets.kept.narrow(0, begin, end - begin), b.sequence_index))
                           .sum()
                           .item<double>();
    }
    local_tokens = total_counted;
    {
      // The step's token counts, staleness and router check cover every
      // episode taken: the micro-batches, and the dropped groups apart.
      std::vector<const EpisodeBatch*> all_batches;
      for (const EpisodeBatch& b : batches) all_batches.push_back(&b);
      const EpisodeBatch dropped_batch = dropped.empty() ? EpisodeBatch() : make_episode_batch(dropped, replay);
      if (!dropped.empty()) all_batches.push_back(&dropped_batch);
      record_episode_statistics(all_batches, replay, st);
    }
    // The chunk's share: of the counted tokens (token mean) or of the kept sequences.
    auto chunk_share = [&](double counted, const torch::Tensor& kept) {
      return options.aggregation == algo::LossAggregation::TokenMean
                 ? counted / total_counted
                 : kept.sum().item<double>() / std::max(1.0, targets.kept_sequences);
    };
    policy_->train();
    for (std::int64_t c = 0; c < chunks; ++c) {
      const EpisodeBatch& batch = batches[static_cast<size_t>(c)];
      const auto [begin, end] = ranges[static_cast<size_t>(c)];
      const torch::Tensor kept = targets.kept.narrow(0, begin, end - begin);
      const torch::Tensor token_mask = batch.loss_mask * algo::broadcast_to_tokens(kept, batch.sequence_index);
      const double counted = token_mask.sum().item<double>();
      if (counted == 0) continue;
      model::PolicyOutput out = policy_->forward(batch.inputs, batch.lengths, batch.forced_experts);
      algo::PolicyLossInputs inputs;
      inputs.logp_new = target_logprobs(out.logits, batch.targets);
      inputs.logp_behaviour = batch.behaviour_logprobs;
      const double share = chunk_share(counted, kept);
      torch::Tensor value_loss;
      if (value_head_) {
        std::vector<const rollout::Trajectory*> part(trained.begin() + begin, trained.begin() + end);
        std::vector<float> bonus(targets.final_bonus.begin() + begin, targets.final_bonus.begin() + end);
        const PpoTargets ppo = ppo_targets(batch, out.hidden, *value_head_, part, bonus, ppo_options(config_.algo));
        inputs.advantages = ppo.token_advantages;
        value_loss = ppo.value_loss;
        st.value_loss += ppo.value_loss.item<double>() * share;
        st.value_mean += ppo.value_mean * share;
        st.explained_variance += ppo.explained_variance * share;
      } else {
        inputs.advantages =
            algo::broadcast_to_tokens(targets.advantages.narrow(0, begin, end - begin), batch.sequence_index);
      }
      inputs.loss_mask = token_mask;
      inputs.sequence_index = batch.sequence_index;
      inputs.num_sequences = end - begin;
      if (config_.algo.entropy_coef > 0) inputs.entropy = algo::token_entropy_from_logits(out.logits);
      if (reference_) {
        torch::NoGradGuard no_grad;
        inputs.logp_reference =
            target_logprobs(reference_->forward(batch.inputs, batch.lengths, batch.forced_experts).logits, batch.targets);
      }
      const algo::LossResult result = algo::policy_loss(inputs, options);
      torch::Tensor loss = result.loss * share;
      if (value_loss.defined()) loss = loss + config_.algo.value_coef * share * value_loss;
      if (out.aux_loss.defined()) loss = loss + out.aux_loss / static_cast<double>(chunks);
      loss.backward();
      st.loss += result.policy_loss * share;
      st.importance_weight_mean += (result.importance_weight_mean - 1.0) * share;
      st.behaviour_gap += result.behaviour_proximal_gap * share;
      st.clip_fraction += (result.clip_fraction_low + result.clip_fraction_high) * share;
      st.kl += result.kl * share;
      st.entropy += result.entropy * share;
    }
  }
  // Every learner joins the all-reduce, with or without data.
  double all_tokens = local_tokens;
  if (learners_ > 1) learner_comm_.allreduce_sum(&all_tokens, 1, comm::DataType::Float64, config_.cluster.message_timeout_s);
  allreduce_gradients();
  if (all_tokens > 0) {
    if (config_.optim.grad_clip > 0) torch::nn::utils::clip_grad_norm_(policy_->parameters(), config_.optim.grad_clip);
    if (value_head_ && config_.optim.grad_clip > 0)
      torch::nn::utils::clip_grad_norm_(value_head_->parameters(), config_.optim.grad_clip);
    auto& groups = optimizer_->param_groups();
    for (size_t g = 0; g < groups.size(); ++g)  // group 1, when present, is the value head
      static_cast<torch::optim::AdamWOptions&>(groups[g].options())
          .lr(learning_rate(step_) * (g == 0 ? 1.0 : config_.algo.value_lr_scale));
    optimizer_->step();
    st.updated = true;
  }
  st.update_s = now_s() - started;
  return st;
}

void Learner::record_staleness(const EpisodeBatch& batch, StepStats& st) const {
  const torch::Tensor generated = batch.loss_mask > 0;
  if (!generated.any().item<bool>()) return;
  const torch::Tensor lag = (version_ - batch.versions.masked_select(generated)).to(torch::kFloat64);
  // A running mean over the micro-batches' generated tokens.
  const auto count = static_cast<double>(lag.numel());
  st.staleness_mean = (st.staleness_mean * static_cast<double>(st.staleness_tokens) + lag.sum().item<double>()) /
                      (static_cast<double>(st.staleness_tokens) + count);
  st.staleness_tokens += lag.numel();
  st.staleness_max = std::max(st.staleness_max, lag.max().item<std::int64_t>());
  const torch::Tensor versions_behind = lag.to(torch::kInt64).contiguous();
  const std::int64_t* behind = versions_behind.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < versions_behind.numel(); ++i)
    telemetry::metrics().record("learner.staleness_versions", static_cast<double>(behind[i]));
}

void Learner::check_learners_agree() {
  // Data parallelism is only correct while every learner holds the same
  // weights; every learner puts the CRC of its parameter bytes in its own
  // slot, one all-reduce gathers them, and a divergence is caught the step
  // it happens.
  if (learners_ == 1) return;
  std::uint32_t crc = 0;
  for (const auto& view : sync::module_weight_views(*policy_)) crc = storage::crc32c(view.data, view.bytes, crc);
  if (value_head_)
    for (const auto& view : sync::module_weight_views(*value_head_)) crc = storage::crc32c(view.data, view.bytes, crc);
  std::vector<double> slots(static_cast<size_t>(learners_), 0.0);
  slots[static_cast<size_t>(learner_comm_.rank())] = static_cast<double>(crc);
  learner_comm_.allreduce_sum(slots.data(), slots.size(), comm::DataType::Float64, config_.cluster.message_timeout_s);
  for (int r = 1; r < learners_; ++r)
    if (slots[static_cast<size_t>(r)] != slots[0])
      throw Error("learners diverged after step " + std::to_string(step_) + ": learner " + std::to_string(r) +
                  " holds other weights than learner 0 (weights CRC " +
                  std::to_string(static_cast<std::uint32_t>(slots[static_cast<size_t>(r)])) + " vs " +
                  std::to_string(static_cast<std::uint32_t>(slots[0])) + ")");
  telemetry::metrics().set("learner.weights_crc", slots[0]);
}

void Learner::save_checkpoint_now(double reward_mean) {
  if (!world_.is_coordinator()) return;
  LearnerState state;
  state.step = step_;
  state.version = version_;
  state.next_group = static_cast<std::int64_t>(coordinator_->next_group());
  state.next_seed = static_cast<std::int64_t>(coordinator_->next_seed());
  state.reward_mean = reward_mean;
  state.staleness = staleness_;
  state.rng_states = rng_states_;
  state.coordinator_books = coordinator_->books_json();
  checkpoints_->save(*policy_, *optimizer_, state, value_head_module());
}

void Learner::checkpoint_step(bool done, double reward_mean) {
  // [save now, rollback target + 1, taken, dropped, tokens by lag..., RNG state bytes of every learner...]
  const std::vector<std::uint8_t> rng = cpu_generator_state();
  constexpr size_t kHead = 4 + StalenessAccount::kLagBuckets;
  std::vector<double> shared(kHead + rng.size() * static_cast<size_t>(learners_), 0.0);
  if (checkpoints_) {
    shared[0] = !done && checkpoints_->due(step_) ? 1.0 : 0.0;
    if (const auto target = checkpoints_->rollback_request()) shared[1] = static_cast<double>(*target + 1);
  }
  shared[2] = static_cast<double>(staleness_step_.taken_groups);
  shared[3] = static_cast<double>(staleness_step_.dropped_groups);
  for (size_t lag = 0; lag < staleness_step_.tokens_by_lag.size(); ++lag)
    shared[4 + lag] = static_cast<double>(staleness_step_.tokens_by_lag[lag]);
  const size_t mine = kHead + rng.size() * static_cast<size_t>(learner_comm_.rank());
  for (size_t i = 0; i < rng.size(); ++i) shared[mine + i] = rng[i];
  if (learners_ > 1)
    learner_comm_.allreduce_sum(shared.data(), shared.size(), comm::DataType::Float64, config_.cluster.message_timeout_s);
  StalenessAccount step;
  step.taken_groups = static_cast<std::int64_t>(shared[2]);
  step.dropped_groups = static_cast<std::int64_t>(shared[3]);
  for (int lag = 0; lag < StalenessAccount::kLagBuckets; ++lag) step.add_tokens(lag, static_cast<std::int64_t>(shared[4 + lag]));
  staleness_.add(step);
  staleness_step_ = StalenessAccount{};
  for (int r = 0; r < learners_; ++r) {
    const double* slot = shared.data() + kHead + rng.size() * static_cast<size_t>(r);
    rng_states_[static_cast<size_t>(r)].assign(slot, slot + rng.size());
  }
  // A rollback replaces this step's weights: saving them first would move `latest` back.
  if (shared[1] > 0) {
    roll_back_to(static_cast<std::int64_t>(shared[1]) - 1);
  } else if (shared[0] > 0) {
    save_checkpoint_now(reward_mean);
  }
}

void Learner::roll_back_to(std::int64_t version) {
  const std::int64_t from = version_;
  const LearnerState loaded = load_checkpoint_version(config_, version, *policy_, optimizer_.get(), value_head_module());
  // A new policy version carries the rolled-back weights, so that every
  // trajectory's versions stay monotonic and staleness keeps its meaning.
  ++version_;
  if (checkpoints_) checkpoints_->accept_latest();
  telemetry::metrics().add("learner.rollbacks");
  telemetry::metrics().set("learner.rolled_back_to", static_cast<double>(version));
  if (world_.is_coordinator())
    spdlog::warn("rollback: `latest` was moved to v{} (learner step {}); loaded its weights and optimizer state "
                 "in place of v{}; publishing them as policy version {}",
                 loaded.version, loaded.step, from, version_);
  publish_weights();
}

void Learner::publish_weights() {
  if (!publisher_) return;
  const double started = now_s();
  serve_while([&] { return publisher_->in_flight() && !publisher_->progress(); });
  publisher_->publish(version_);
  last_sync_s_ = now_s() - started;
  telemetry::metrics().record("sync.publish_s", last_sync_s_);
  telemetry::metrics().add("sync.bytes", static_cast<double>(publisher_->last().bytes));
  // Policy versions live at once: this one down to the oldest an actor still
  // generates with (as the actors last reported it).
  double oldest = static_cast<double>(version_);
  for (const auto& [rank, snapshot] : aggregator_.latest()) {
    const auto it = snapshot.gauges.find("actor.policy_version");
    if (snapshot.role == "actor" && it != snapshot.gauges.end()) oldest = std::min(oldest, it->second);
  }
  telemetry::metrics().set("sync.versions_in_flight", static_cast<double>(version_) - oldest + 1);
}

std::int64_t Learner::episodes_to_drain() {
  // Learner 0 knows what it handed out for every learner; one all-reduce tells each its number.
  std::vector<double> expected(static_cast<size_t>(learners_), 0.0);
  if (coordinator_)
    for (size_t l = 0; l < expected.size(); ++l) expected[l] = static_cast<double>(coordinator_->assigned_episodes()[l]);
  if (learners_ > 1)
    learner_comm_.allreduce_sum(expected.data(), expected.size(), comm::DataType::Float64, config_.cluster.message_timeout_s);
  return static_cast<std::int64_t>(expected[static_cast<size_t>(learner_comm_.rank())]);
}

void Learner::drain_episodes(std::int64_t expected, runtime::StopCoordinator& stop) {
  const double limit_s = 10 * config_.cluster.message_timeout_s;
  const double deadline = now_s() + limit_s;
  serve_while([&] {
    if (received_episodes_ >= expected || stop.should_stop()) return false;
    if (now_s() > deadline)
      throw runtime::TimeoutError("learner " + std::to_string(world_.role_index()) + ": after the last step, " +
                                  std::to_string(expected - received_episodes_) + " of the " + std::to_string(expected) +
                                  " training episodes handed out for it did not arrive within " +
                                  std::to_string(static_cast<int>(limit_s)) + " s");
    return true;
  });
  spdlog::debug("learner {}: {} episodes generated past the last step were not trained on", world_.role_index(),
                held_episodes());
  groups_.clear();
}

void Learner::report(const StepStats& st, double elapsed_s, std::int64_t first_step) {
  if (!world_.is_coordinator()) return;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "step " << st.step + 1 << "/" << config_.optim.total_steps << " v"
       << version_ << " | reward " << st.reward_mean << " | success";
  for (const auto& [family, score] : st.by_family)
    line << " " << family << " " << std::setprecision(0) << 100 * score.success_rate() << "%";
  const double per_step = elapsed_s / static_cast<double>(st.step + 1 - first_step);
  line << std::setprecision(0) << " | " << st.generated_tokens / std::max(1e-9, per_step) << " gen tok/s"
       << std::setprecision(2) << " | staleness " << st.staleness_mean << " (max " << st.staleness_max << ")"
       << " | sync " << std::setprecision(1) << 1e3 * last_sync_s_ << " ms | loss " << std::setprecision(4) << st.loss
       << " | |logp gap| " << std::setprecision(3) << st.behaviour_gap << " iw " << 1.0 + st.importance_weight_mean
       << " | eta " << format_duration(per_step * static_cast<double>(config_.optim.total_steps - st.step - 1));
  if (st.dropped_groups) line << " | dropped " << st.dropped_groups << " stale groups";
  if (st.env_failures)
    line << " | env failures " << st.env_failures << " (" << st.failed_groups << " groups left with nothing to train on)";
  if (value_head_)
    line << std::setprecision(3) << " | value loss " << st.value_loss << " ev " << std::setprecision(2)
         << st.explained_variance;
  if (st.router_disagreement >= 0) line << " | router disagrees " << std::setprecision(1) << 100 * st.router_disagreement << "%";
  std::printf("%s\n", line.str().c_str());
  std::fflush(stdout);
  auto& m = telemetry::metrics();
  m.set("learner.reward_mean", st.reward_mean);
  m.set("learner.staleness_mean", st.staleness_mean);
  m.add("learner.dropped_groups", static_cast<double>(st.dropped_groups));
  m.add("learner.failed_groups", static_cast<double>(st.failed_groups));
  m.add("learner.step_env_failures", static_cast<double>(st.env_failures));
  m.add("learner.generated_tokens", static_cast<double>(st.generated_tokens));
  m.record("learner.update_s", st.update_s);
  m.set("learner.kl", st.kl);
  m.set("learner.entropy", st.entropy);
  if (value_head_) {
    m.set("learner.value_loss", st.value_loss);
    m.set("learner.value_mean", st.value_mean);
    m.set("learner.explained_variance", st.explained_variance);
  }
}

void Learner::run(runtime::StopCoordinator& stop) {
  const double started = now_s();
  stop_ = &stop;
  if (coordinator_) {
    std::printf("evaluating the base policy on %lld held-out episodes per family...\n",
                static_cast<long long>(config_.rollout.eval_episodes));
    std::fflush(stdout);
    serve_while([&] { return coordinator_->phase() == TaskCoordinator::Phase::EvalBefore && !stop.should_stop(); },
                true);
  }
  // A resumed run's actors still hold the starting weights: send them ours first.
  if (version_ > 0) publish_weights();
  const double training_started = now_s();
  const std::int64_t first_step = step_;
  double last_reward = 0;
  while (step_ < config_.optim.total_steps && !stop.should_stop()) {
    std::int64_t dropped = 0, taken = 0, failed = 0;
    std::vector<const rollout::Trajectory*> batch;
    serve_while(
        [&] {
          if (stop.should_stop()) return false;
          batch = take_ready_groups(dropped, taken, failed);
          return batch.empty() && taken + dropped + failed == 0;
        },
        true);
    if (stop.should_stop()) break;
    // [taken, stale, failed, trainable episodes, failure records] over every
    // learner: all of them step, or none does (a round of only failed or stale groups).
    double counts[5] = {static_cast<double>(taken), static_cast<double>(dropped), static_cast<double>(failed),
                        static_cast<double>(batch.size()), static_cast<double>(failure_records_)};
    if (learners_ > 1) learner_comm_.allreduce_sum(counts, 5, comm::DataType::Float64, config_.cluster.message_timeout_s);
    if (counts[3] == 0) {
      // No step from zero episodes: new groups replace these (nothing is published or saved).
      telemetry::metrics().add("learner.empty_rounds");
      if (coordinator_)
        coordinator_->on_empty_round(static_cast<std::int64_t>(counts[0]),
                                     static_cast<std::int64_t>(counts[1] + counts[2]));
      continue;
    }
    // While this learner computes, its actors' work requests and
    // trajectories keep being answered and taken in (asynchronous mode
    // overlaps generation with the update only if the actors are fed).
    StepStats stats;
    serve_during([&] { stats = update(batch); });
    stats.dropped_groups = static_cast<std::int64_t>(counts[1]);
    stats.failed_groups = static_cast<std::int64_t>(counts[2]);
    stats.env_failures = static_cast<std::int64_t>(counts[4]);
    ++step_;
    ++version_;
    check_learners_agree();
    const bool done = step_ >= config_.optim.total_steps;
    if (coordinator_)
      coordinator_->on_step(static_cast<std::int64_t>(counts[0]), static_cast<std::int64_t>(counts[1] + counts[2]),
                            version_, done);
    if (step_ % config_.sync.interval == 0 || done) publish_weights();
    report(stats, now_s() - training_started, first_step);
    write_metrics_line();
    last_reward = stats.reward_mean;
    checkpoint_step(done, last_reward);
    if (step_observer_) step_observer_(stats);
  }
  // Every learner ends the loop at the same step unless a stop interrupted it
  // (then the actors stop at once and nothing is drained).
  const bool completed = step_ >= config_.optim.total_steps;
  const std::int64_t to_drain = completed ? episodes_to_drain() : 0;
  if (completed && !coordinator_) drain_episodes(to_drain, stop);
  // The final weights, or the state at a stop signal (Slurm's SIGTERM before
  // its time limit): a later --resume auto continues from here.
  if (step_ > first_step && (!stop.should_stop() || config_.checkpoint.save_on_stop)) save_checkpoint_now(last_reward);
  if (!coordinator_) return;
  checkpoints_->finish();  // the archive copies, with a deadline
  if (stop.should_stop()) {
    std::printf("stopping after step %lld: %s (checkpoint %s)\n", static_cast<long long>(step_), stop.reason().c_str(),
                config_.checkpoint.save_on_stop ? "saved" : "not saved: [checkpoint] save_on_stop = false");
  } else {
    std::printf("evaluating the trained policy (version %lld)...\n", static_cast<long long>(version_));
  }
  std::fflush(stdout);
  serve_while([&] { return coordinator_->phase() != TaskCoordinator::Phase::Done && !stop.should_stop(); }, true);
  coordinator_->finish_actors();
  // The actors finish what they started after `finished`; learner 0 is the
  // last to let go of the world, so it waits for its episodes last.
  if (completed) drain_episodes(to_drain, stop);
  serve_while([&] { return publisher_->in_flight() && !publisher_->progress(); });
  publisher_->close();
  const double wall = now_s() - started;
  if (stop.should_stop()) return;
  std::printf("\n%s", coordinator_->evaluation_table().c_str());
  const std::string summary_path = config_.run_directory() + "/summary.json";
  std::ofstream(summary_path) << coordinator_->summary_json(step_, wall, launcher_restarts()) << "\n";
  std::printf("steps %lld, wall %.0f s; summary: %s\n", static_cast<long long>(step_), wall, summary_path.c_str());
  std::fflush(stdout);
}

}  // namespace moerl::learner
