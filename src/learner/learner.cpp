#include "moerl/learner/learner.h"
#include "moerl/learner/lr_schedule.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>
#include <utility>

#include "moerl/config/config.h"
#include "moerl/core/check.h"
#include "moerl/learner/checkpointing.h"
#include "moerl/learner/overlapped_gradients.h"
#include "moerl/model/precision.h"
#include "moerl/runtime/end_of_job.h"
#include "moerl/runtime/fault_plan.h"
#include "moerl/runtime/job_control.h"
#include "moerl/sync/module_weights.h"
#include "moerl/sync/policy_sync_views.h"
#include "moerl/sync/sharded_weight_sync.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

double now_s() { return runtime::monotonic_seconds(); }

std::string format_duration(double seconds) {
  std::ostringstream out;
  const auto s = static_cast<long>(std::max(0.0, seconds));
  if (s >= 60) out << s / 60 << "m";
  out << std::setw(s >= 60 ? 2 : 1) << std::setfill('0') << s % 60 << "s";
  return out.str();
}

}  // namespace

LearnerSettings learner_settings(const config::Config& config) {
  LearnerSettings settings;
  settings.model = config.model;
  settings.moe = config.moe;
  settings.algo = config.algo;
  settings.optim = config.optim;
  settings.sync = config.sync;
  settings.rollout = config.rollout;
  settings.dtype = config.run.dtype;
  settings.deterministic = config.run.deterministic;
  settings.message_timeout_s = config.cluster.message_timeout_s;
  settings.run_directory = config.run_directory();
  settings.coordinator = coordinator_settings(config);
  settings.checkpoints = checkpoint_settings(config);
  settings.eval = config.eval;
  settings.receiver = episode_receiver_settings(config);
  return settings;
}

Learner::Learner(LearnerSettings settings, const runtime::World& world, runtime::Mailbox& mailbox, model::Policy policy,
                 comm::Communicator& learner_comm, comm::Communicator* sync_comm, const std::string& resume,
                 runtime::HeartbeatThread* heartbeat)
    : settings_(std::move(settings)),
      world_(world),
      mailbox_(mailbox),
      policy_(policy),
      learner_comm_(learner_comm),
      // A group short of members lost in malformed messages is taken after half the
      // progress watch's limit: before the watch would stop a job waiting for nothing else.
      inbox_(static_cast<int>(settings_.rollout.group_size), settings_.message_timeout_s / 2) {
  learners_ = learner_comm.size();
  device_ = policy_->embed_tokens->weight.device();
  compute_ = policy_;
  if (model::is_mixed_precision(settings_.dtype)) {
    // The compute copy: same architecture, run.dtype, on the master's device.
    compute_ = model::Policy(settings_.model, settings_.moe, policy_->expert_group());
    compute_->to(device_, model::compute_dtype(settings_.dtype));
    mixed_ = std::make_unique<MixedPrecision>(*policy_, *compute_);
  }
  auto options = torch::optim::AdamWOptions(settings_.optim.lr)
                     .betas(std::make_tuple(settings_.optim.beta1, settings_.optim.beta2))
                     .weight_decay(settings_.optim.weight_decay);
  optimizer_ = std::make_unique<torch::optim::AdamW>(policy_->parameters(), options);
  if (settings_.algo.advantage == config::AdvantageEstimator::Ppo) {
    // A float32 critic beside the policy: it is small, and reads the hidden state widened to float32.
    value_head_ = ValueHead(settings_.model.d_model);
    value_head_->to(device_);
    auto value_options = std::make_unique<torch::optim::AdamWOptions>(options);
    value_options->lr(settings_.optim.lr * settings_.algo.value_lr_scale);
    optimizer_->add_param_group(torch::optim::OptimizerParamGroup(value_head_->parameters(), std::move(value_options)));
  }
  if (settings_.algo.kl != config::KlMode::None) {
    // The frozen reference: a copy of the starting weights.
    reference_ = model::Policy(settings_.model, settings_.moe, policy_->expert_group());
    // Inference only: no master copy, the compute dtype directly.
    reference_->to(device_, model::compute_dtype(settings_.dtype));
    torch::NoGradGuard no_grad;
    auto source = policy_->parameters();
    auto target = reference_->parameters();
    for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i]);
    reference_->eval();
    for (auto& p : reference_->parameters()) p.set_requires_grad(false);
  }
  if (world.is_coordinator()) {
    coordinator_ = std::make_unique<Coordinator>(settings_.coordinator, world, mailbox, learners_, inbox_, heartbeat);
    MOERL_CHECK(sync_comm != nullptr, "learner 0 needs the weight-sync communicator");
    sync_comm_ = sync_comm;
  }
  if (world.sharded_weight_sync() && world.role_index() < world.learner_expert_parallel()) {
    // Split experts (here or on the actors): the first group's members
    // publish their shares (sync/sharded_weight_sync.h); collective with the
    // actors' receivers.
    host_weights_ = std::make_unique<sync::HostWeights>(*policy_, model::compute_dtype(settings_.dtype));
    const sync::ExpertSyncLayout layout{policy_->moe_config().num_experts, world.learner_expert_parallel(),
                                        world.actor_expert_parallel()};
    sharded_publisher_ = std::make_unique<sync::ShardedWeightPublisher>(
        world.expert_sync_comm(), layout, world.role_index(), sync::policy_sync_views(*policy_, host_weights_->views()),
        sync::sync_options(settings_.sync, settings_.message_timeout_s));
  } else if (world.is_coordinator()) {
    // The actors' dtype on the wire: bf16 runs publish half the bytes.
    host_weights_ = std::make_unique<sync::HostWeights>(*policy_, model::compute_dtype(settings_.dtype));
    publisher_ = std::make_unique<sync::WeightPublisher>(
        *sync_comm, host_weights_->views(), sync::sync_options(settings_.sync, settings_.message_timeout_s));
  }
  if (world.is_coordinator()) {
    checkpoints_ = std::make_unique<CheckpointSchedule>(settings_.checkpoints);
    evaluations_ = std::make_unique<EvaluationWatch>(settings_.eval, settings_.checkpoints.directory);
  }
  if (!world.is_coordinator())
    receiver_ = std::make_unique<EpisodeReceiver>(settings_.receiver, world, mailbox, inbox_);
  rng_states_.assign(static_cast<size_t>(learners_), {});
  if (!resume.empty()) {
    if (const auto state =
            load_checkpoint(settings_.checkpoints.directory, resume, *policy_, optimizer_.get(), value_head_module())) {
      if (mixed_) mixed_->refresh();
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
        coordinator_->resume(static_cast<std::uint64_t>(state->next_group),
                             static_cast<std::uint64_t>(state->next_seed), version_, state->coordinator_books, step_,
                             runtime::launcher_restarts(), runtime::launcher_restart_cause());
        checkpoints_->accept_latest();
        telemetry::metrics().add("learner.dropped_groups", static_cast<double>(staleness_.dropped_groups));
      }
    } else if (world.is_coordinator()) {
      spdlog::info("--resume auto: no checkpoint in {}; starting fresh", settings_.checkpoints.directory);
      if (coordinator_)
        coordinator_->record_restart(0, runtime::launcher_restarts(), runtime::launcher_restart_cause());
    }
  }
}

double Learner::learning_rate(std::int64_t step) const {
  const auto& o = settings_.optim;
  return scheduled_lr({o.lr, o.warmup_steps, o.total_steps, o.cosine}, step);
}

std::vector<const rollout::Trajectory*> Learner::take_ready_groups(std::int64_t& dropped, std::int64_t& taken,
                                                                   std::int64_t& failed) {
  const auto quota = static_cast<size_t>((settings_.algo.groups_per_step + learners_ - 1) / learners_);
  std::vector<std::vector<rollout::Trajectory>> groups = inbox_.take_groups(quota, now_s());
  if (groups.empty()) return {};
  batch_storage_.clear();
  dropped = taken = failed = 0;
  failure_records_ = 0;
  for (std::vector<rollout::Trajectory>& episodes : groups) {
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
    if (settings_.deterministic)
      std::sort(episodes.begin(), episodes.end(),
                [](const auto& a, const auto& b) { return a.episode_id < b.episode_id; });
    std::int32_t oldest = std::numeric_limits<std::int32_t>::max();
    for (const auto& e : episodes) {
      if (e.min_version() >= 0) oldest = std::min(oldest, e.min_version());
      // The context budget's books: episodes it ended, and episodes that went on with old turns dropped.
      if (e.truncated) telemetry::metrics().add("learner.truncated_episodes");
      if (e.dropped_turns > 0) telemetry::metrics().add("learner.context_rebuilt_episodes");
    }
    // Bounded staleness: a group sampled by weights older than allowed is not trained on.
    if (oldest != std::numeric_limits<std::int32_t>::max() && version_ - oldest > settings_.sync.max_staleness) {
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

void Learner::save_checkpoint_now(double reward_mean) {
  // Split experts: every member of the first expert group writes its shard.
  const bool writes_shard = expert_comm_ && world_.role_index() < expert_comm_->size();
  if (!world_.is_coordinator() && !writes_shard) return;
  ShardGroup group;
  if (writes_shard) group.members = expert_comm_;
  if (!world_.is_coordinator()) {
    LearnerState state;
    state.step = step_;
    state.version = version_;
    save_checkpoint(settings_.checkpoints, *policy_, *optimizer_, state, {}, std::nullopt, value_head_module(), group);
    return;
  }
  LearnerState state;
  state.step = step_;
  state.version = version_;
  state.next_group = static_cast<std::int64_t>(coordinator_->next_group());
  state.next_seed = static_cast<std::int64_t>(coordinator_->next_seed());
  state.reward_mean = reward_mean;
  state.staleness = staleness_;
  state.rng_states = rng_states_;
  state.coordinator_books = coordinator_->books_json();
  checkpoints_->save(*policy_, *optimizer_, state, value_head_module(), group);
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
    learner_comm_.allreduce_sum(shared.data(), shared.size(), comm::DataType::Float64, settings_.message_timeout_s);
  StalenessAccount step;
  step.taken_groups = static_cast<std::int64_t>(shared[2]);
  step.dropped_groups = static_cast<std::int64_t>(shared[3]);
  for (int lag = 0; lag < StalenessAccount::kLagBuckets; ++lag)
    step.add_tokens(lag, static_cast<std::int64_t>(shared[4 + lag]));
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
  const LearnerState loaded = load_checkpoint_version(settings_.checkpoints.directory, version, *policy_,
                                                      optimizer_.get(), value_head_module());
  if (mixed_) mixed_->refresh();
  // A new policy version carries the rolled-back weights, so that every
  // trajectory's versions stay monotonic and staleness keeps its meaning.
  ++version_;
  if (checkpoints_) checkpoints_->accept_latest();
  telemetry::metrics().add("learner.rollbacks");
  telemetry::metrics().set("learner.rolled_back_to", static_cast<double>(version));
  if (world_.is_coordinator())
    spdlog::warn(
        "rollback: `latest` was moved to v{} (learner step {}); loaded its weights and optimizer state "
        "in place of v{}; publishing them as policy version {}",
        loaded.version, loaded.step, from, version_);
  publish_weights();
}

void Learner::with_sync_recovery(const std::function<void()>& operation) {
  if (sharded_publisher_ && coordinator_ && coordinator_->sync_group_broken())
    throw Error(
        "learner 0: the weight-sync group lost a member, and the sharded weight sync of expert-parallel learners "
        "([cluster] expert_parallel > 1) cannot go on without it; the job stops so that the launcher restarts it "
        "with --resume auto");
  if (coordinator_->sync_group_broken()) recover_sync_group();
  try {
    operation();
  } catch (const comm::PeerFailure& failure) {
    spdlog::warn("learner 0: the weight-sync group lost a member ({}); rebuilding it", failure.what());
    recover_sync_group();
    operation();
  }
}

void Learner::recover_sync_group() {
  publisher_->abandon();
  // Collective over the living members: every living actor joins (their pending
  // header broadcasts fail once the group is revoked, which survivors() does).
  sync_survivors_ = sync_comm_->survivors();
  sync_comm_ = sync_survivors_.get();
  publisher_ = std::make_unique<sync::WeightPublisher>(*sync_comm_, host_weights_->views(),
                                                       sync::sync_options(settings_.sync, settings_.message_timeout_s));
  telemetry::metrics().add("learner.sync_recoveries");
  spdlog::warn("learner 0: weight-sync group rebuilt with {} members; publishing version {} again", sync_comm_->size(),
               version_);
  if (version_ > 0) {
    host_weights_->pull();  // nothing is in flight: the publisher was abandoned
    publisher_->publish(version_);
    published_version_ = version_;
  }
  coordinator_->sync_group_rebuilt();
}

bool Learner::wait_for_publication() {
  while (publisher_->in_flight() && !publisher_->progress()) {
    // A job that stops does not wait for an actor that stopped receiving:
    // without fault tolerance, a lost actor's publication never completes.
    if (coordinator_->failing()) {
      publisher_->abandon(1.0);
      publisher_.reset();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

void Learner::publish_shards() {
  const double started = now_s();
  if (coordinator_) with_sync_recovery([] {});  // refuses a broken group
  // The previous publication first (learner 0's coordinator keeps serving meanwhile).
  while (sharded_publisher_->in_flight() && !sharded_publisher_->progress()) {
    if ((coordinator_ && coordinator_->failing()) || (stop_ && stop_->should_stop())) return;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  host_weights_->pull();
  sharded_publisher_->publish(version_);
  published_version_ = version_;
  last_sync_s_ = now_s() - started;
  telemetry::metrics().record("sync.publish_s", last_sync_s_);
  telemetry::metrics().add("sync.bytes", static_cast<double>(sharded_publisher_->last().bytes));
  if (!coordinator_) return;
  const double newest = static_cast<double>(version_);
  telemetry::metrics().set("sync.versions_in_flight", newest - coordinator_->oldest_actor_version(newest) + 1);
  coordinator_->set_progress(step_, version_);
}

void Learner::close_shards() {
  if (!sharded_publisher_) return;
  const double deadline = now_s() + settings_.message_timeout_s;
  while (sharded_publisher_->in_flight() && !sharded_publisher_->progress()) {
    if (now_s() > deadline || (stop_ && stop_->should_stop())) return;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  sharded_publisher_->close();
}

void Learner::publish_weights() {
  if (sharded_publisher_) {
    publish_shards();
    return;
  }
  if (!publisher_) return;
  const double started = now_s();
  with_sync_recovery([&] {
    // The previous publication first (the coordinator thread keeps serving meanwhile).
    if (!wait_for_publication()) return;
    if (published_version_ == version_) return;  // a recovery republished it already
    if (runtime::fault_hooks().corrupt_next_publication.exchange(false)) publisher_->corrupt_next_publication(0);
    // Device or bf16 weights to their float32 host bytes; the previous
    // publication no longer reads them (it completed above).
    host_weights_->pull();
    publisher_->publish(version_);
    published_version_ = version_;
  });
  if (!publisher_) return;  // abandoned: the job stops
  last_sync_s_ = now_s() - started;
  telemetry::metrics().record("sync.publish_s", last_sync_s_);
  telemetry::metrics().add("sync.bytes", static_cast<double>(publisher_->last().bytes));
  // Policy versions live at once: this one down to the oldest an actor still
  // generates with (as the actors last reported it).
  const double newest = static_cast<double>(version_);
  telemetry::metrics().set("sync.versions_in_flight", newest - coordinator_->oldest_actor_version(newest) + 1);
  coordinator_->set_progress(step_, version_);
}

std::int64_t Learner::episodes_to_drain() {
  // Learner 0 knows what it handed out for every learner; one all-reduce tells each its number.
  std::vector<double> expected(static_cast<size_t>(learners_), 0.0);
  if (coordinator_) {
    const std::vector<std::int64_t> assigned = coordinator_->assigned_episodes();
    for (size_t l = 0; l < expected.size(); ++l) expected[l] = static_cast<double>(assigned[l]);
  }
  if (learners_ > 1)
    learner_comm_.allreduce_sum(expected.data(), expected.size(), comm::DataType::Float64, settings_.message_timeout_s);
  return static_cast<std::int64_t>(expected[static_cast<size_t>(learner_comm_.rank())]);
}

void Learner::drain_episodes(std::int64_t expected, runtime::StopCoordinator& stop) {
  const double limit_s = runtime::drain_limit_s(settings_.message_timeout_s);
  const double started = now_s();
  bool reported = false;
  while (inbox_.received() < expected && !stop.should_stop()) {
    // Learner 0 knows when nothing more can come; what is missing then was
    // lost on the way (those episodes would not be trained on anyway).
    if (coordinator_ && coordinator_->actors_done_sending()) {
      telemetry::metrics().add("learner.episodes_missing_at_end", static_cast<double>(expected - inbox_.received()));
      spdlog::warn("learner 0: every actor has sent its last episode, and {} did not arrive; not waiting for them",
                   drain_stall(expected));
      break;
    }
    const double waited = now_s() - started;
    if (waited > limit_s)
      throw runtime::TimeoutError("learner " + std::to_string(world_.role_index()) + ": after the last step, " +
                                  drain_stall(expected) + " did not arrive within " +
                                  std::to_string(static_cast<int>(limit_s)) + " s");
    // Said once while there is still time: a drain this long means an episode is late or lost.
    if (!reported && waited > settings_.message_timeout_s / 2) {
      spdlog::warn("learner {}: after the last step, still waiting for {}", world_.role_index(), drain_stall(expected));
      reported = true;
    }
    inbox_.wait(0.05);
  }
  spdlog::debug("learner {}: {} episodes generated past the last step were not trained on", world_.role_index(),
                inbox_.held());
  inbox_.clear();
}

std::string Learner::drain_stall(std::int64_t expected) const {
  std::string said = std::to_string(expected - inbox_.received()) + " of the " + std::to_string(expected) +
                     " training episodes handed out for it (groups partly here: " + inbox_.partial_groups();
  if (coordinator_) said += "; groups not reported delivered by their actor: " + coordinator_->undelivered_groups();
  return said + ")";
}

bool Learner::take_job_failure() {
  if (!job_failure_.empty()) return true;
  std::optional<JobFailure> failure;
  if (coordinator_) failure = coordinator_->take_failure();
  if (receiver_)
    if (auto reason = receiver_->take_failure()) failure = JobFailure{*reason, runtime::kJobFailedExitStatus};
  if (!failure) return false;
  job_failure_ = failure->reason;
  job_failure_status_ = failure->status;
  spdlog::error("learner {}: stopping the job: {}", world_.role_index(), job_failure_);
  if (stop_) stop_->request_stop(job_failure_);
  return true;
}

bool Learner::wait_for_episodes(const std::function<bool()>& ready) {
  if (coordinator_) coordinator_->watch_episodes(true);
  // Learners other than learner 0 wait for learner 0 to end a stalled job;
  // this deadline is for a learner 0 that cannot.
  double give_up = now_s() + 2 * settings_.message_timeout_s;
  double last_received = static_cast<double>(inbox_.received());
  bool stopped = false;
  for (;;) {
    if (ready()) break;
    if (coordinator_ && coordinator_->sync_group_broken()) with_sync_recovery([] {});
    if (take_job_failure() || stop_->should_stop()) {
      stopped = true;
      break;
    }
    if (!coordinator_ && now_s() > give_up)
      throw runtime::TimeoutError("learner " + std::to_string(world_.role_index()) + ": no episodes arrived for " +
                                  std::to_string(static_cast<int>(2 * settings_.message_timeout_s)) +
                                  " s and learner 0 did not stop the job");
    inbox_.wait(0.01);
    if (static_cast<double>(inbox_.received()) != last_received) {
      last_received = static_cast<double>(inbox_.received());
      give_up = now_s() + 2 * settings_.message_timeout_s;
    }
  }
  if (coordinator_) coordinator_->watch_episodes(false);
  return !stopped;
}

void Learner::report(const StepStats& st, double elapsed_s, std::int64_t first_step) {
  if (!world_.is_coordinator()) return;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "step " << st.step + 1 << "/" << settings_.optim.total_steps << " v"
       << version_ << " | reward " << st.reward_mean << " | success";
  for (const auto& [family, score] : st.by_family)
    line << " " << family << " " << std::setprecision(0) << 100 * score.success_rate() << "%";
  const double per_step = elapsed_s / static_cast<double>(st.step + 1 - first_step);
  line << std::setprecision(0) << " | " << st.generated_tokens / std::max(1e-9, per_step) << " gen tok/s"
       << std::setprecision(2) << " | staleness " << st.staleness_mean << " (max " << st.staleness_max << ")"
       << " | sync " << std::setprecision(1) << 1e3 * last_sync_s_ << " ms | loss " << std::setprecision(4) << st.loss
       << " | |logp gap| " << std::setprecision(3) << st.behaviour_gap << " iw " << 1.0 + st.importance_weight_mean
       << " | eta " << format_duration(per_step * static_cast<double>(settings_.optim.total_steps - st.step - 1));
  if (st.dropped_groups) line << " | dropped " << st.dropped_groups << " stale groups";
  if (st.env_failures)
    line << " | env failures " << st.env_failures << " (" << st.failed_groups
         << " groups left with nothing to train on)";
  if (value_head_)
    line << std::setprecision(3) << " | value loss " << st.value_loss << " ev " << std::setprecision(2)
         << st.explained_variance << " (group means " << st.group_explained_variance << ")";
  if (st.router_disagreement >= 0)
    line << " | router disagrees " << std::setprecision(1) << 100 * st.router_disagreement << "%";
  std::printf("%s\n", line.str().c_str());
  std::fflush(stdout);
  auto& m = telemetry::metrics();
  m.set("learner.reward_mean", st.reward_mean);
  m.set("learner.staleness_mean", st.staleness_mean);
  m.add("learner.dropped_groups", static_cast<double>(st.dropped_groups));
  m.add("learner.failed_groups", static_cast<double>(st.failed_groups));
  m.add("learner.step_env_failures", static_cast<double>(st.env_failures));
  m.add("learner.generated_tokens", static_cast<double>(st.generated_tokens));
  m.add("learner.zero_variance_groups", static_cast<double>(st.zero_variance_groups));
  m.record("learner.update_s", st.update_s);
  m.set("learner.kl", st.kl);
  m.set("learner.entropy", st.entropy);
  m.set("learner.loss", st.loss);
  m.set("learner.grad_norm", st.grad_norm);
  m.set("learner.group_explained_variance", st.group_explained_variance);
  if (value_head_) {
    m.set("learner.value_loss", st.value_loss);
    m.set("learner.value_mean", st.value_mean);
    m.set("learner.explained_variance", st.explained_variance);
  }
}

Learner::~Learner() {
  // The threads first: they fill the inbox and use the mailbox.
  if (coordinator_) coordinator_->stop();
  receiver_.reset();
}

void Learner::run(runtime::StopCoordinator& stop) {
  const double started = now_s();
  stop_ = &stop;
  if (coordinator_) {
    coordinator_->set_progress(step_, version_);
    coordinator_->start();
    const bool greedy_too = settings_.rollout.eval_greedy && settings_.rollout.eval_temperature > 0;
    std::printf("evaluating the base policy on %lld held-out episodes per family at temperature %g%s...\n",
                static_cast<long long>(settings_.rollout.eval_episodes), settings_.rollout.eval_temperature,
                greedy_too ? ", and greedily" : "");
    std::fflush(stdout);
    wait_for_episodes([&] { return coordinator_->phase() != TaskCoordinator::Phase::EvalBefore; });
  }
  // A resumed run's actors still hold the starting weights: send them ours first.
  if (version_ > 0 && !stop.should_stop()) publish_weights();
  const double training_started = now_s();
  const std::int64_t first_step = step_;
  double last_reward = 0;
  while (step_ < settings_.optim.total_steps && !stop.should_stop()) {
    std::int64_t dropped = 0, taken = 0, failed = 0;
    std::vector<const rollout::Trajectory*> batch;
    const bool ready = wait_for_episodes([&] {
      batch = take_ready_groups(dropped, taken, failed);
      return !batch.empty() || taken + dropped + failed > 0;
    });
    if (!ready) break;
    // [taken, stale, failed, trainable episodes, failure records] over every
    // learner: all of them step, or none does (a round of only failed or stale groups).
    double counts[5] = {static_cast<double>(taken), static_cast<double>(dropped), static_cast<double>(failed),
                        static_cast<double>(batch.size()), static_cast<double>(failure_records_)};
    if (learners_ > 1) learner_comm_.allreduce_sum(counts, 5, comm::DataType::Float64, settings_.message_timeout_s);
    if (counts[3] == 0) {
      // No step from zero episodes: new groups replace these (nothing is published or saved).
      telemetry::metrics().add("learner.empty_rounds");
      if (coordinator_)
        coordinator_->on_empty_round(static_cast<std::int64_t>(counts[0]),
                                     static_cast<std::int64_t>(counts[1] + counts[2]));
      continue;
    }
    // Meanwhile the coordinator (learner 0) or the episode receiver keeps
    // answering work requests and taking in episodes: asynchronous mode
    // overlaps generation with the update only if the actors are fed.
    StepStats stats = update(batch);
    stats.dropped_groups = static_cast<std::int64_t>(counts[1]);
    stats.failed_groups = static_cast<std::int64_t>(counts[2]);
    stats.env_failures = static_cast<std::int64_t>(counts[4]);
    ++step_;
    ++version_;
    record_step_metrics(step_, version_, stats.tokens, stats.by_family, stats.expert_load);
    check_learners_agree();
    const bool done = step_ >= settings_.optim.total_steps;
    if (coordinator_) coordinator_->record_training_outcomes(stats.outcomes);
    if (coordinator_)
      coordinator_->on_step(static_cast<std::int64_t>(counts[0]), static_cast<std::int64_t>(counts[1] + counts[2]),
                            version_, done);
    if (step_ % settings_.sync.interval == 0 || done) publish_weights();
    report(stats, now_s() - training_started, first_step);
    if (coordinator_) coordinator_->write_metrics_line(step_);
    // Before checkpoint_step: an automatic rollback is then taken at this step.
    if (evaluations_)
      evaluations_->after_step(*coordinator_, coordinator_->phase() != TaskCoordinator::Phase::EvalBefore);
    last_reward = stats.reward_mean;
    checkpoint_step(done, last_reward);
    if (step_observer_) step_observer_(stats);
    take_job_failure();
  }
  // Every learner ends the loop at the same step unless a stop interrupted it
  // (then the actors stop at once and nothing is drained).
  const bool completed = step_ >= settings_.optim.total_steps && !stop.should_stop();
  const std::int64_t to_drain = completed ? episodes_to_drain() : 0;
  if (completed && !coordinator_) drain_episodes(to_drain, stop);
  // The final weights, or the state at a stop signal (Slurm's SIGTERM before
  // its time limit): a later --resume auto continues from here.
  if (step_ > first_step && (!stop.should_stop() || settings_.checkpoints.checkpoint.save_on_stop))
    save_checkpoint_now(last_reward);
  if (!coordinator_) {
    close_shards();
    return;
  }
  checkpoints_->finish();  // the archive copies, with a deadline
  if (stop.should_stop()) {
    std::printf(
        "stopping after step %lld: %s (checkpoint %s)\n", static_cast<long long>(step_), stop.reason().c_str(),
        settings_.checkpoints.checkpoint.save_on_stop ? "saved" : "not saved: [checkpoint] save_on_stop = false");
  } else {
    std::printf("evaluating the trained policy (version %lld)...\n", static_cast<long long>(version_));
  }
  std::fflush(stdout);
  wait_for_episodes([&] { return coordinator_->phase() == TaskCoordinator::Phase::Done; });
  coordinator_->finish_actors();
  // The actors finish what they started after `finished`; learner 0 is the
  // last to let go of the world, so it waits for its episodes last.
  if (completed) drain_episodes(to_drain, stop);
  if (publisher_)
    with_sync_recovery([&] {
      if (wait_for_publication()) publisher_->close();
    });
  close_shards();
  coordinator_->stop();
  const double wall = now_s() - started;
  if (stop.should_stop()) return;
  std::printf("\n%s", coordinator_->evaluation_table().c_str());
  const std::string summary_path = settings_.run_directory + "/summary.json";
  std::ofstream(summary_path) << coordinator_->summary_json(step_, wall, runtime::launcher_restarts()) << "\n";
  std::printf("steps %lld, wall %.0f s; summary: %s\n", static_cast<long long>(step_), wall, summary_path.c_str());
  std::fflush(stdout);
}

}  // namespace moerl::learner
