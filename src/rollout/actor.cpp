#include "moerl/rollout/actor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>

#include "moerl/config/config.h"
#include "moerl/core/check.h"
#include "moerl/core/hash.h"
#include "moerl/model/precision.h"
#include "moerl/runtime/end_of_job.h"
#include "moerl/runtime/fault_plan.h"
#include "moerl/sync/module_weights.h"
#include "moerl/sync/policy_sync_views.h"
#include "moerl/sync/sharded_weight_sync.h"
#include "moerl/telemetry/metrics.h"
#include "moerl/runtime/metrics_report.h"

namespace moerl::rollout {
namespace {

EngineOptions engine_options(const ActorSettings& settings, const text::EpisodeFormat& format) {
  EngineOptions options;
  options.format = format;
  options.context_budget = settings.rollout.max_tokens_per_episode;
  // The learner recomputes log-probs over exactly the tokens the actor fed,
  // so the engine never cuts a context by itself: a full context ends the
  // episode (flagged). With rollout.context_policy = drop_oldest_turns the
  // actor rebuilds the context between turns instead (actor_context.cpp)
  // and the trajectory records each window it fed.
  options.context_policy = ContextPolicy::ContextEndEpisode;
  options.isolate_sessions = settings.deterministic;
  options.moe_top_k = settings.rollout.moe_top_k;
  options.kv_cache_dtype = settings.rollout.kv_cache_dtype == config::KvCacheStorage::Int8 ? model::KVCacheDtype::Int8
                                                                                           : model::KVCacheDtype::Float;
  return options;
}

std::vector<int> env_worker_ranks(const runtime::World& world) {
  return world.layout().ranks_of(runtime::Role::EnvWorker);
}

// Sessions of different actors never share an id: the actor's rank in the high bits.
std::uint64_t episode_id(int rank, std::uint64_t counter) { return (static_cast<std::uint64_t>(rank) << 40) | counter; }

// Deterministic mode: the id names (group, sample index) whichever actor runs
// it, so that learners can order episodes canonically (group ids are unique
// over the run, group_size <= 1024 < 2^16).
std::uint64_t canonical_episode_id(std::uint64_t group_id, int sample) {
  return (group_id << 16) | static_cast<std::uint64_t>(sample);
}

// Deterministic mode: the sampling stream of one episode depends only on the
// run seed, the task seed and the sample index (the engine adds the token
// position), not on which actor runs it or in which order.
std::uint64_t canonical_session_seed(std::int64_t run_seed, std::uint64_t task_seed, std::uint64_t sample) {
  return mix64(mix64(static_cast<std::uint64_t>(run_seed)) ^ mix64(task_seed ^ mix64(sample)));
}

}  // namespace

ActorSettings actor_settings(const config::Config& config) {
  ActorSettings settings;
  settings.rollout = config.rollout;
  settings.model = config.model;
  settings.chat = config.chat;
  settings.env = config.env;
  settings.env_external = config.env_external;
  settings.seed = config.run.seed;
  settings.deterministic = config.run.deterministic;
  settings.dtype = config.run.dtype;
  settings.message_timeout_s = config.cluster.message_timeout_s;
  settings.metrics_interval_s = config.telemetry.metrics_interval_s;
  settings.sync = sync::sync_options(config.sync, config.cluster.message_timeout_s);
  return settings;
}

double env_reply_deadline_s(const config::EnvSection& env, const config::ExternalEnvSection& external,
                            double message_timeout_s, int turns) {
  const bool has_external = std::find(env.families.begin(), env.families.end(), "external") != env.families.end();
  const double startup = has_external ? external.startup_timeout_s : 0.0;
  const double attempt = env.timeout_s * (1.0 + turns) + startup;
  double backoffs = 0;
  for (std::int64_t retry = 0; retry < env.max_retries; ++retry) backoffs += env.retry_backoff_s * std::pow(2.0, retry);
  return static_cast<double>(env.max_retries + 1) * attempt + backoffs + message_timeout_s;
}

Actor::Actor(ActorSettings settings, const runtime::World& world, runtime::Mailbox& mailbox, model::Policy policy,
             comm::Communicator& sync_comm, runtime::RankLoad* load, bool standby)
    : settings_(std::move(settings)),
      world_(world),
      mailbox_(mailbox),
      format_(text::make_episode_format(settings_.model, settings_.chat)),
      engine_(policy, engine_options(settings_, format_)),
      env_(mailbox, env_worker_ranks(world)),
      sync_comm_(&sync_comm),
      host_weights_(std::make_unique<sync::HostWeights>(*engine_.policy(), model::compute_dtype(settings_.dtype))),
      receiver_(make_receiver(sync_comm)) {
  moe_layers_ = policy->num_moe_layers();
  // Trajectories carry the routing the engine recorded: rollout.moe_top_k
  // experts per token when set, else moe.top_k.
  top_k_ = engine_.routing_top_k();
  engine_.set_policy_version(0);
  load_ = load;
  if (load_) load_->weight_version = 0;
  standby_ = standby;
}

// A CPU float32 policy: versions land beside the live weights and apply()
// swaps the two (no copy between decode steps): the engine's parameters live
// in the receiver's buffers. A policy on a device or in bfloat16: versions
// are copied into the host copies, then pushed into the parameters
// (apply_new_weights).
std::unique_ptr<sync::VersionReceiver> Actor::make_receiver(comm::Communicator& sync_comm) {
  const sync::SyncOptions& options = settings_.sync;
  if (world_.sharded_weight_sync()) {
    // Every learner member's share of what this actor holds lands in place (copied: no swap mode for slices).
    model::Policy& policy = engine_.policy();
    std::vector<sync::WeightView> views =
        host_weights_->staged() ? host_weights_->views() : sync::module_weight_views(*policy);
    const int members = world_.actor_expert_parallel();
    const sync::ExpertSyncLayout layout{policy->moe_config().num_experts, world_.learner_expert_parallel(), members};
    return std::make_unique<sync::ShardedWeightReceiver>(world_.expert_sync_comm(), layout,
                                                         world_.role_index() % members,
                                                         sync::policy_sync_views(*policy, std::move(views)), options);
  }
  if (host_weights_->staged())
    return std::make_unique<sync::WeightReceiver>(sync_comm, host_weights_->views(), options);
  model::Policy& policy = engine_.policy();
  return std::make_unique<sync::WeightReceiver>(sync_comm, sync::module_weight_views(*policy), options,
                                                sync::module_rebind(*policy));
}

double Actor::reply_deadline_s(const Episode& episode) const {
  return env_reply_deadline_s(settings_.env, settings_.env_external, settings_.message_timeout_s, episode.turns);
}

int Actor::free_slots() const {
  int waiting = 0;
  for (const TaskGroup& g : waiting_groups_) waiting += g.size;
  return static_cast<int>(settings_.rollout.sessions_per_actor) - static_cast<int>(episodes_.size()) - waiting;
}

void Actor::request_work() {
  if (standby_ || finished_ || work_requested_ || free_slots() < settings_.rollout.group_size) return;
  WorkRequest request;
  request.free_slots = free_slots();
  request.delivered.swap(delivered_groups_);
  mailbox_.send(runtime::RankLayout::kCoordinatorRank, request);
  work_requested_ = true;
}

void Actor::report_done_sending() {
  WorkRequest last;
  last.delivered.swap(delivered_groups_);
  last.done_sending = true;
  try {
    mailbox_.send(runtime::RankLayout::kCoordinatorRank, last);
  } catch (const runtime::PeerLostError&) {
    // Learner 0 gone: the heartbeats end this rank.
  }
}

void Actor::group_member_done(const Trajectory& t) {
  const auto size = group_sizes_.find(t.group_id);
  const int expected = size == group_sizes_.end() ? 1 : size->second;
  if (++group_members_done_[t.group_id] < expected) return;
  group_sizes_.erase(t.group_id);
  group_members_done_.erase(t.group_id);
  delivered_groups_.push_back(t.group_id);
}

void Actor::take_assignment(const TaskAssignment& assignment) {
  work_requested_ = false;
  if (assignment.finished) finished_ = true;
  for (const TaskGroup& group : assignment.groups) waiting_groups_.push_back(group);
  start_waiting_groups();
}

void Actor::start_waiting_groups() {
  // Groups that need newer weights (synchronous mode, final evaluation) wait
  // for them; the rest start at once, in order.
  while (!waiting_groups_.empty() && waiting_groups_.front().min_version <= engine_.policy_version()) {
    const TaskGroup group = waiting_groups_.front();
    waiting_groups_.pop_front();
    group_sizes_[group.group_id] = group.size;
    for (int k = 0; k < group.size; ++k) {
      Episode episode;
      episode.group = group;
      episode.id = settings_.deterministic ? canonical_episode_id(group.group_id, k)
                                           : episode_id(world_.rank(), next_episode_++);
      episode.sample = k;
      episode.started = std::chrono::steady_clock::now();
      Trajectory& t = episode.trajectory;
      t.episode_id = episode.id;
      t.group_id = group.group_id;
      t.actor = world_.role_index();
      t.task = group.task;
      t.evaluation = group.evaluation;
      t.moe_layers = static_cast<std::int32_t>(moe_layers_);
      t.top_k = static_cast<std::int32_t>(top_k_);
      Episode& started = episodes_.emplace(episode.id, std::move(episode)).first->second;
      started.env_worker = env_.worker_of(started.id);
      started.awaited_request = env_.open(started.id, group.task);
      started.awaited_kind = env::RequestKind::Open;
      expect_env_reply(started);
    }
  }
}

void Actor::prompt_turn(Episode& episode, const std::string& observation, bool first) {
  // A turn cut off by max_tokens_per_turn is closed here, as a fed token.
  const std::vector<std::int64_t> prompt = format_.prompt_turn(observation, first, episode.needs_end_of_turn);
  episode.needs_end_of_turn = false;
  Trajectory& t = episode.trajectory;
  if (!first) {
    if (settings_.rollout.context_policy == config::ContextBudgetPolicy::DropOldestTurns)
      make_room(episode, prompt.size());
    episode.turn_starts.push_back(t.tokens.size());
  }
  for (std::int64_t token : prompt) {
    t.tokens.push_back(static_cast<std::int32_t>(token));
    t.generated.push_back(0);
    t.behaviour_logprobs.push_back(0.f);
    t.versions.push_back(-1);
  }
  if (first) {
    const std::uint64_t seed = settings_.deterministic
                                   ? canonical_session_seed(settings_.seed, episode.group.task.seed,
                                                            static_cast<std::uint64_t>(episode.sample))
                                   : episode.id ^ static_cast<std::uint64_t>(settings_.seed) * 0x9E3779B97F4A7C15ull;
    engine_.add_session(episode.id, seed);
  }
  engine_.append_prompt(episode.id, prompt);
  SamplingParams sampling;
  const double temperature = episode.group.greedy       ? 0.0
                             : episode.group.evaluation ? settings_.rollout.eval_temperature
                                                        : settings_.rollout.temperature;
  sampling.greedy = temperature == 0;
  sampling.temperature = temperature > 0 ? temperature : 1.0;
  sampling.top_p = settings_.rollout.top_p;
  sampling.top_k = settings_.rollout.top_k;
  StopParams stop;
  stop.max_turn_tokens = settings_.rollout.max_tokens_per_turn;
  engine_.start_turn(episode.id, sampling, stop);
  episode.waiting_env = false;
  episode.last_progress_s = runtime::monotonic_seconds();
}

void Actor::on_env_reply(const env::EnvReply& reply) {
  if (reply.kind == env::RequestKind::Close) return;
  auto it = episodes_.find(reply.session);
  if (it == episodes_.end()) return;  // an episode already finished (e.g. its env failed)
  Episode& episode = it->second;
  // A reply from before a restore on another env worker (or to a request given up on) is stale.
  if (reply.request_id != episode.awaited_request) return;
  if (!reply.ok) {
    fail(episode, reply.failure, reply.error, reply.attempts);
    return;
  }
  if (reply.kind == env::RequestKind::Restore) {
    on_restored(episode);
    return;
  }
  if (reply.kind == env::RequestKind::Step) {
    episode.env_actions.push_back(episode.pending_action);
    episode.pending_action.clear();
    ++episode.turns;
    if (!reply.archive_path.empty()) {
      episode.snapshot_path = reply.archive_path;
      episode.snapshot_turn = episode.env_actions.size();
    }
    episode.trajectory.turn_rewards.push_back(static_cast<float>(reply.reward));
    episode.trajectory.reward += reply.reward;
    episode.trajectory.success = reply.success;
    if (reply.done) {
      finish(episode);
      return;
    }
  }
  prompt_turn(episode, reply.observation, reply.kind == env::RequestKind::Open);
}

void Actor::on_turn(std::uint64_t id) {
  Episode& episode = episodes_.at(id);
  GeneratedTurn turn = engine_.take_turn(id);
  episode.last_progress_s = runtime::monotonic_seconds();
  Trajectory& t = episode.trajectory;
  for (size_t i = 0; i < turn.tokens.size(); ++i) {
    t.tokens.push_back(static_cast<std::int32_t>(turn.tokens[i]));
    t.generated.push_back(1);
    t.behaviour_logprobs.push_back(turn.logprobs[i]);
    t.versions.push_back(static_cast<std::int32_t>(turn.policy_versions[i]));
  }
  // The environment sees the action's text, without special tokens (the end-of-turn one included).
  const std::string action = format_.action_text(turn.tokens);
  telemetry::metrics().add("rollout.generated_tokens", static_cast<double>(turn.tokens.size()));
  if (turn.episode_over) {
    t.truncated = true;
    telemetry::metrics().add("actor.truncated_episodes");
    finish(episode);
    return;
  }
  episode.needs_end_of_turn = turn.tokens.empty() || turn.tokens.back() != format_.end_of_turn_id();
  episode.pending_action = action;
  episode.awaited_request = env_.step(id, action);
  episode.awaited_kind = env::RequestKind::Step;
  expect_env_reply(episode);
}

void Actor::expect_env_reply(Episode& episode) {
  episode.waiting_env = true;
  episode.last_progress_s = runtime::monotonic_seconds();
  episode.reply_due_s = episode.last_progress_s + reply_deadline_s(episode);
}

std::string Actor::episode_state(const Episode& episode) const {
  const bool in_engine = engine_.has_session(episode.id);
  return "episode " + std::to_string(episode.id) + " (group " + std::to_string(episode.group.group_id) + ", " +
         episode.group.task.family + ", turn " + std::to_string(episode.turns) + "): " +
         (episode.waiting_env
              ? "waiting for env worker rank " + std::to_string(episode.env_worker) + " to answer " +
                    env::request_kind_name(episode.awaited_kind) + " request " + std::to_string(episode.awaited_request)
              : std::string("not waiting for its env worker (rank ") + std::to_string(episode.env_worker) + ")") +
         (episode.restoring ? ", restoring" : "") + (episode.pending_action.empty() ? "" : ", a step in flight") +
         (!in_engine                          ? ", not in the engine"
          : engine_.is_generating(episode.id) ? ", generating"
          : engine_.turn_ready(episode.id)    ? ", its turn ready"
                                              : ", idle in the engine");
}

void Actor::check_stalled_episodes(double now) {
  const double pause_s = settings_.message_timeout_s / 2;
  std::vector<std::uint64_t> orphaned;
  for (auto& [id, episode] : episodes_) {
    if (now - episode.last_progress_s < pause_s) continue;
    const bool in_engine = engine_.has_session(id) && (engine_.is_generating(id) || engine_.turn_ready(id));
    if (!episode.waiting_env && !in_engine) {
      orphaned.push_back(id);
    } else if (episode.waiting_env && !episode.stall_reported) {
      episode.stall_reported = true;
      spdlog::warn("actor {}: no progress for {:.0f} s on {}", world_.role_index(), now - episode.last_progress_s,
                   episode_state(episode));
    }
  }
  for (std::uint64_t id : orphaned) {
    Episode& episode = episodes_.at(id);
    const std::string state = episode_state(episode);
    spdlog::error("actor {}: nothing would move {} on; failing it", world_.role_index(), state);
    telemetry::metrics().add("actor.orphaned_episodes");
    fail(episode, env::FailureReason::FailureNoReply, "stalled: " + state, 0);
  }
}

void Actor::fail_overdue_sessions() {
  // Checked a few times a second: deadlines are seconds long.
  const double now = runtime::monotonic_seconds();
  if (now < next_overdue_check_s_) return;
  next_overdue_check_s_ = now + 0.25;
  std::vector<std::uint64_t> overdue;
  for (const auto& [id, episode] : episodes_)
    if (episode.waiting_env && now > episode.reply_due_s) overdue.push_back(id);
  for (std::uint64_t id : overdue) {
    Episode& episode = episodes_.at(id);
    const double waited = reply_deadline_s(episode);
    fail(episode, env::FailureReason::FailureNoReply,
         "session " + std::to_string(id) + ": env worker rank " + std::to_string(env_.worker_of(id)) +
             " did not answer within " + std::to_string(static_cast<int>(waited)) + " s (turn " +
             std::to_string(episode.turns) + ")",
         0);
  }
  check_stalled_episodes(now);
}

void Actor::fail(Episode& episode, env::FailureReason reason, const std::string& error, int attempts) {
  Trajectory& t = episode.trajectory;
  const std::string family = t.task.family;
  t.failure = reason == env::FailureReason::FailureNone ? env::FailureReason::FailureCrashed : reason;
  t.error = error;
  t.failure_turn = episode.turns;
  t.failure_attempts = attempts;
  t.failure_streak = ++failure_streaks_[family];
  t.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - episode.started).count();
  // A failure record carries nothing to train on.
  t.tokens.clear();
  t.generated.clear();
  t.behaviour_logprobs.clear();
  t.versions.clear();
  t.routing.clear();
  t.window_starts.clear();
  t.turn_rewards.clear();
  t.moe_layers = t.top_k = 0;
  t.reward = 0;
  t.success = t.truncated = false;
  if (engine_.has_session(episode.id)) engine_.remove_session(episode.id);
  telemetry::metrics().add("actor.env_failures");
  telemetry::metrics().add("actor.env_failures." + family + "." + env::failure_reason_name(t.failure));
  spdlog::warn("actor {}: a {} session (seed {}) failed for good after {} turns: {}", world_.role_index(), family,
               t.task.seed, t.failure_turn, error);
  env_.close(episode.id);
  send_episode(t);
  episodes_.erase(episode.id);
}

void Actor::send_episode(Trajectory& t) {
  const int learner =
      static_cast<int>(t.group_id % static_cast<std::uint64_t>(world_.layout().count(runtime::Role::Learner)));
  // Evaluation episodes go to learner 0, which keeps the before/after table;
  // so do failure records, for the run's failure books.
  const int destination = t.evaluation ? runtime::RankLayout::kCoordinatorRank : learner;
  if (runtime::fault_hooks().corrupt_next_message.exchange(false)) {
    // [faults] plan "corrupt message": a byte flipped after framing, so the receiver's CRC check fails.
    runtime::ByteWriter w;
    t.encode(w);
    std::vector<std::uint8_t> frame = runtime::frame_message(Trajectory::kType, world_.rank(), w.bytes());
    frame.back() ^= 0x5A;
    mailbox_.send_frame(destination, Trajectory::kType, frame);
  } else {
    mailbox_.send(destination, t);
  }
  if (t.failed() && destination != runtime::RankLayout::kCoordinatorRank)
    mailbox_.send(runtime::RankLayout::kCoordinatorRank, t);
  group_member_done(t);
  ++episodes_sent_;
  telemetry::metrics().add(t.evaluation ? "actor.eval_episodes" : "actor.episodes");
}

void Actor::finish(Episode& episode) {
  Trajectory& t = episode.trajectory;
  failure_streaks_[t.task.family] = 0;
  t.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - episode.started).count();
  if (engine_.has_session(episode.id)) {
    // The context budget can end an episode with a prompt the engine never
    // fed: the learner must see exactly the fed tokens (+ the last sampled one).
    // (In the current context window: earlier ones were fed whole.)
    const auto fed = static_cast<size_t>(engine_.fed_length(episode.id));
    const size_t keep = episode.window_start + fed + 1;
    if (t.tokens.size() > keep && (fed > 0 || t.window_starts.empty())) {
      t.tokens.resize(keep);
      t.generated.resize(keep);
      t.behaviour_logprobs.resize(keep);
      t.versions.resize(keep);
    }
    if (moe_layers_ > 0) collect_routing(episode);
    engine_.remove_session(episode.id);
  } else {
    t.moe_layers = t.top_k = 0;
  }
  if (spdlog::should_log(spdlog::level::debug)) {
    spdlog::debug("episode {} ({} seed {}, reward {}): {}", t.episode_id, t.task.family, t.task.seed, t.reward,
                  format_.debug_text(t.tokens));
  }
  env_.close(episode.id);
  send_episode(t);
  episodes_.erase(episode.id);
}

// A version damaged on its way (its checksum failed): keep generating with
// the weights held and take the next publication. Versions that keep
// arriving damaged are not a passing fault: the job stops.
void Actor::refuse_corrupt_version(const sync::CorruptVersionError& error) {
  constexpr int kCorruptVersionLimit = 3;
  telemetry::metrics().add("sync.refused_versions");
  if (++corrupt_versions_in_a_row_ >= kCorruptVersionLimit)
    throw sync::SyncError(error.what() + std::string(" (") + std::to_string(corrupt_versions_in_a_row_) +
                          " versions in a row failed their checksums)");
  spdlog::warn("actor {}: {}; keeps generating with version {} until the next one", world_.role_index(), error.what(),
               receiver_->current_version());
}

void Actor::apply_new_weights() {
  if (poll_new_weights()) apply_ready_weights();
}

bool Actor::poll_new_weights() {
  try {
    return receiver_->poll();
  } catch (const comm::PeerFailure& failure) {
    spdlog::warn("actor {}: the weight-sync group lost a member ({}); rebuilding it", world_.role_index(),
                 failure.what());
    recover_sync_group();
  } catch (const sync::CorruptVersionError& error) {
    refuse_corrupt_version(error);
  }
  return false;
}

void Actor::use_expert_group(comm::Communicator& group) {
  expert_group_ = &group;
  engine_.set_expert_lockstep(&group, settings_.message_timeout_s);
}

Actor::GroupRound Actor::agree_round(bool has_work, bool done, bool weights_ready) {
  // [has work, done, ready version + 1] per member, in its own slots; one sum gathers them.
  const auto members = static_cast<size_t>(expert_group_->size());
  std::vector<double> slots(3 * members, 0.0);
  const auto me = 3 * static_cast<size_t>(expert_group_->rank());
  slots[me] = has_work ? 1 : 0;
  slots[me + 1] = done ? 1 : 0;
  slots[me + 2] = weights_ready ? static_cast<double>(receiver_->ready_version() + 1) : 0;
  expert_group_->allreduce_sum(slots.data(), slots.size(), comm::DataType::Float64, settings_.message_timeout_s);
  GroupRound round;
  round.leave = true;
  round.apply = true;
  for (size_t m = 0; m < members; ++m) {
    round.step |= slots[3 * m] > 0;
    round.leave &= slots[3 * m + 1] > 0;
    round.apply &= slots[3 * m + 2] > 0 && slots[3 * m + 2] == slots[2];
  }
  round.leave &= !round.step;
  return round;
}

void Actor::apply_ready_weights() {
  corrupt_versions_in_a_row_ = 0;
  const std::int64_t version = receiver_->apply();
  host_weights_->push();  // into device / bf16 parameters (nothing to do in swap mode)
  engine_.set_policy_version(version);
  if (load_) load_->weight_version = version;
  start_waiting_groups();
  telemetry::metrics().set("actor.policy_version", static_cast<double>(version));
  telemetry::metrics().record("sync.receive_s", receiver_->last().seconds);
}

std::string Actor::expert_share_text() {
  if (!expert_group_) return "";
  const std::int64_t experts = engine_.policy()->moe_config().num_experts, members = expert_group_->size();
  const std::int64_t first = experts / members * expert_group_->rank();
  return ", experts [" + std::to_string(first) + ", " + std::to_string(first + experts / members) + ") of " +
         std::to_string(experts) + " (expert group of " + std::to_string(members) + " actors)";
}

void Actor::run(runtime::StopCoordinator& stop) {
  if (standby_) {
    spdlog::info("actor (standby {}): keeps the weights current; takes a lost actor's place", world_.role_index());
  } else {
    spdlog::info("actor {}: up to {} episodes at once, episodes in the {}, KV cache {}{}", world_.role_index(),
                 settings_.rollout.sessions_per_actor, format_.description(),
                 model::kv_cache_dtype_name(engine_.kv_cache_dtype()), expert_share_text());
  }
  runtime::MetricsReporter reporter(mailbox_, settings_.metrics_interval_s);
  while (!stop.should_stop()) {
    reporter.maybe_send();
    if (const double slow = runtime::fault_hooks().slow_ms.load(); slow > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(slow));
    act_on_lost_ranks();
    // An expert group applies a version together (agree_round), others at once.
    const bool weights_ready = poll_new_weights();
    if (weights_ready && !expert_group_) apply_ready_weights();
    request_work();
    if (auto assignment = mailbox_.try_receive<TaskAssignment>(runtime::RankLayout::kCoordinatorRank))
      take_assignment(assignment->second);
    while (auto reply = env_.poll()) on_env_reply(*reply);
    fail_overdue_sessions();
    const bool done = (finished_ && episodes_.empty() && waiting_groups_.empty()) || (standby_ && receiver_->closed());
    GroupRound round{engine_.has_work(), done && !engine_.has_work(), false};
    if (expert_group_) round = agree_round(engine_.has_work(), done, weights_ready);
    if (round.apply) apply_ready_weights();
    if (round.step) {
      for (std::uint64_t id : engine_.step()) on_turn(id);
      if (episodes_sent_ > 0) reporter.send_first_news();
    } else if (round.leave) {
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const auto waiting =
        std::count_if(episodes_.begin(), episodes_.end(), [](const auto& e) { return e.second.waiting_env; });
    telemetry::metrics().set("rollout.sessions_waiting_env", static_cast<double>(waiting));
    if (load_) {
      load_->live_sessions = static_cast<std::int32_t>(episodes_.size());
      load_->queue_depth = static_cast<std::int32_t>(waiting);
    }
  }
  // Learner 0's end-of-run drain may stop waiting once every actor said this
  // (a standby that was never promoted had nothing to send).
  if (finished_ && !standby_) report_done_sending();
  // Keep the weight-sync collectives matched until learner 0 closes them
  // (it does, also after a stop signal, once its drain is over), with a
  // deadline in case it cannot.
  const double close_wait_s = runtime::publication_close_wait_s(settings_.message_timeout_s);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(close_wait_s);
  while (!receiver_->closed()) {
    if (std::chrono::steady_clock::now() > deadline)
      throw runtime::TimeoutError("actor " + std::to_string(world_.role_index()) +
                                  ": learner 0 did not close the weight publication within " +
                                  std::to_string(static_cast<int>(close_wait_s)) + " s of this actor's last episode");
    try {
      receiver_->poll();
      if (receiver_->ready_version() > receiver_->current_version()) receiver_->apply();
    } catch (const comm::PeerFailure&) {
      recover_sync_group();
    } catch (const sync::CorruptVersionError& error) {
      refuse_corrupt_version(error);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  spdlog::info("actor {}: done at policy version {}", world_.role_index(), receiver_->current_version());
}

}  // namespace moerl::rollout
