#include "moerl/learner/task_coordinator.h"

#include "moerl/learner/step_metrics.h"

#include <spdlog/spdlog.h>

#include <iomanip>
#include <sstream>
#include <utility>

#include "moerl/config/config.h"
#include "moerl/core/hash.h"
#include "moerl/core/json_writer.h"
#include "moerl/env/task_mix.h"
#include "moerl/learner/step_metrics.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

// Held-out seeds live far from the training seeds (which count up from the run seed).
constexpr std::uint64_t kEvalSeedBase = 1ull << 40;

}  // namespace

TaskCoordinatorSettings task_coordinator_settings(const config::Config& config) {
  TaskCoordinatorSettings settings;
  settings.rollout = config.rollout;
  settings.eval = config.eval;
  settings.env = config.env;
  settings.env_families = config.env_families;
  settings.sync = config.sync;
  settings.groups_per_step = config.algo.groups_per_step;
  settings.seed = config.run.seed;
  return settings;
}

TaskCoordinator::TaskCoordinator(TaskCoordinatorSettings settings, runtime::Mailbox& mailbox, int learners,
                                 std::vector<int> actor_ranks)
    : settings_(std::move(settings)),
      mailbox_(mailbox),
      learners_(learners),
      actors_(std::move(actor_ranks)),
      assigned_episodes_(static_cast<size_t>(learners), 0),
      breaker_(settings_.env.breaker_failures, settings_.env.breaker_cooldown_s),
      curriculum_(settings_.env, settings_.env_families),
      periodic_(settings_.eval.every_steps, settings_.rollout.eval_temperature) {
  next_seed_ = static_cast<std::uint64_t>(settings_.seed) * 1000003ull;
  start_evaluation(0);
}

bool TaskCoordinator::greedy_plays() const {
  return settings_.rollout.eval_greedy && settings_.rollout.eval_temperature > 0;
}

std::vector<rollout::TaskGroup> TaskCoordinator::evaluation_groups(std::int64_t min_version, std::int64_t per_family) {
  std::vector<rollout::TaskGroup> groups;
  for (const std::string& family : settings_.env.families) {
    for (std::int64_t i = 0; i < per_family; ++i) {
      rollout::TaskGroup g;
      g.group_id = next_group_++;
      g.task = env::make_task(
          settings_.env, settings_.env_families, family,
          kEvalSeedBase + static_cast<std::uint64_t>(i) * 7919 + std::hash<std::string>{}(family) % 1000);
      g.size = 1;
      g.evaluation = true;
      g.min_version = min_version;
      groups.push_back(g);
      if (!greedy_plays()) continue;
      g.group_id = next_group_++;
      g.greedy = true;
      greedy_groups_.insert(g.group_id);
      groups.push_back(g);
    }
  }
  return groups;
}

void TaskCoordinator::start_evaluation(std::int64_t min_version) {
  eval_queue_.clear();
  for (const rollout::TaskGroup& g : evaluation_groups(min_version, settings_.rollout.eval_episodes))
    eval_queue_.push_back(g);
  eval_outstanding_ = static_cast<int>(eval_queue_.size());
  if (eval_outstanding_ == 0) phase_ = phase_ == Phase::EvalBefore ? Phase::Train : Phase::Done;
}

void TaskCoordinator::resume(std::uint64_t next_group, std::uint64_t next_seed, std::int64_t version) {
  next_group_ = cursor_group_ = next_group;
  next_seed_ = cursor_seed_ = next_seed;
  min_version_floor_ = version;
  eval_queue_.clear();
  eval_outstanding_ = 0;
  phase_ = Phase::Train;
}

std::int64_t TaskCoordinator::train_groups_allowed() const {
  const std::int64_t per_step = settings_.groups_per_step;
  if (!settings_.sync.asynchronous) return assigned_this_step_ < per_step ? per_step - assigned_this_step_ : 0;
  // Bounded staleness: at most (1 + max_staleness) steps' worth of groups out at once.
  return std::max<std::int64_t>(0, per_step * (1 + settings_.sync.max_staleness) - in_flight_);
}

std::vector<rollout::TaskGroup> TaskCoordinator::next_groups(int free_slots, std::int64_t policy_version) {
  std::vector<rollout::TaskGroup> groups;
  if (phase_ == Phase::EvalBefore || phase_ == Phase::EvalAfter) {
    while (!eval_queue_.empty() && free_slots >= 1) {
      groups.push_back(eval_queue_.front());
      eval_queue_.pop_front();
      --free_slots;
    }
    return groups;
  }
  if (phase_ != Phase::Train) return groups;
  // A periodic evaluation's groups (the only ones queued while training) go first.
  while (!eval_queue_.empty() && free_slots >= 1) {
    groups.push_back(eval_queue_.front());
    eval_queue_.pop_front();
    --free_slots;
  }
  const int group_size = static_cast<int>(settings_.rollout.group_size);
  std::int64_t allowed = train_groups_allowed();
  const std::set<std::string> paused = breaker_.paused(runtime::monotonic_seconds());
  if (paused.size() >= settings_.env.families.size()) return groups;
  const std::map<std::string, double> scales = curriculum_.weight_scales();  // unchanged within one call
  while (allowed > 0 && free_slots >= group_size) {
    rollout::TaskGroup g;
    g.group_id = next_group_++;
    const std::uint64_t seed = next_seed_++;
    g.task = env::make_task(settings_.env, settings_.env_families,
                            env::pick_family(settings_.env, settings_.env_families, mix64(seed), paused, scales), seed);
    if (settings_.env.curriculum) g.task.difficulty = curriculum_.start_group(g.task.family, g.group_id, group_size);
    g.size = group_size;
    g.min_version = std::max(min_version_floor_, settings_.sync.asynchronous ? std::int64_t{0} : policy_version);
    groups.push_back(g);
    free_slots -= group_size;
    --allowed;
    ++in_flight_;
    ++assigned_this_step_;
    assigned_episodes_[g.group_id % static_cast<std::uint64_t>(learners_)] += group_size;
  }
  return groups;
}

void TaskCoordinator::serve(std::int64_t policy_version) {
  while (auto request = mailbox_.try_receive<rollout::WorkRequest>()) {
    const int actor = request->first;
    if (lost_actors_.count(actor)) continue;
    for (std::uint64_t id : request->second.delivered) undelivered_[actor].erase(id);
    if (request->second.done_sending) {
      done_sending_.insert(actor);
      continue;
    }
    pending_.emplace_back(actor, request->second.free_slots);
  }
  while (!pending_.empty()) {
    auto [actor, free_slots] = pending_.front();
    if (phase_ == Phase::Done) {
      send_to_actor(actor, rollout::TaskAssignment{{}, true});
      pending_.pop_front();
      continue;
    }
    std::vector<rollout::TaskGroup> groups = next_groups(free_slots, policy_version);
    if (groups.empty()) break;  // answer later, when work is allowed
    for (const rollout::TaskGroup& g : groups) undelivered_[actor][g.group_id] = g;
    send_to_actor(actor, rollout::TaskAssignment{std::move(groups), false});
    pending_.pop_front();
  }
}

void TaskCoordinator::send_to_actor(int actor, const rollout::TaskAssignment& assignment) {
  try {
    mailbox_.send(actor, assignment);
  } catch (const runtime::PeerLostError& error) {
    // Its loss is being handled (heartbeats): what it was given comes back through take_undelivered().
    spdlog::warn("learner 0: an assignment of {} groups to actor rank {} was not delivered: {}",
                 assignment.groups.size(), actor, error.what());
  }
}

std::vector<rollout::TaskGroup> TaskCoordinator::take_undelivered(int actor_rank) {
  lost_actors_.insert(actor_rank);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.first == actor_rank; }),
                 pending_.end());
  std::vector<rollout::TaskGroup> groups;
  for (const auto& [id, group] : undelivered_[actor_rank]) {
    if (group.evaluation) {
      if (recorded_evaluations_.count(id)) continue;
      eval_queue_.push_front(group);  // run again by another actor; still outstanding
    }
    groups.push_back(group);
  }
  undelivered_.erase(actor_rank);
  return groups;
}

bool TaskCoordinator::all_actors_done_sending() const {
  for (int actor : actors_)
    if (!lost_actors_.count(actor) && !done_sending_.count(actor)) return false;
  return finished_sent_;
}

std::string TaskCoordinator::undelivered_groups() const {
  std::string listed;
  for (const auto& [actor, groups] : undelivered_) {
    if (groups.empty()) continue;
    listed += (listed.empty() ? "rank " : "; rank ") + std::to_string(actor) + ":";
    for (const auto& [id, group] : groups) listed += " " + std::to_string(id);
  }
  return listed.empty() ? "none" : listed;
}

void TaskCoordinator::cancelled_training_group(const rollout::TaskGroup& group) {
  --in_flight_;
  assigned_episodes_[group.group_id % static_cast<std::uint64_t>(learners_)] -= group.size;
  if (!settings_.sync.asynchronous) --assigned_this_step_;
}

void TaskCoordinator::add_actor(int rank) {
  if (std::find(actors_.begin(), actors_.end(), rank) == actors_.end()) actors_.push_back(rank);
}

void TaskCoordinator::record_evaluation(const rollout::Trajectory& episode) {
  // An evaluation group runs again when its actor was lost; a late result of it counts once.
  if (!recorded_evaluations_.insert(episode.group_id).second) return;
  if (periodic_.owns(episode.group_id)) {
    if (episode.failed()) record_failure(episode);
    periodic_.record(episode);
    return;
  }
  const bool greedy = greedy_groups_.count(episode.group_id) > 0;
  ScoreTable& table =
      phase_ == Phase::EvalBefore ? (greedy ? before_greedy_ : before_) : (greedy ? after_greedy_ : after_);
  FamilyScore& score = table[episode.task.family];
  if (episode.failed()) {
    ++score.env_failures;
    record_failure(episode);
  } else {
    ++score.episodes;
    score.successes += episode.success;
    score.reward += episode.reward;
  }
  if (--eval_outstanding_ <= 0) {
    publish_evaluation_metrics(phase_ == Phase::EvalBefore);
    phase_ = phase_ == Phase::EvalBefore ? Phase::Train : Phase::Done;
  }
}

std::optional<EvaluationRecord> TaskCoordinator::take_periodic_evaluation() {
  std::optional<EvaluationRecord> record = periodic_.take_finished();
  if (!record) return record;
  const std::string mode = settings_.rollout.eval_temperature > 0 ? "sampled" : "greedy";
  record_evaluation_metrics(record->sampled, mode, false);
  if (!record->greedy.empty()) record_evaluation_metrics(record->greedy, "greedy", false);
  return record;
}

EvaluationRecord TaskCoordinator::base_evaluation() const {
  EvaluationRecord base;
  base.temperature = settings_.rollout.eval_temperature;
  base.sampled = before_;
  if (greedy_plays()) base.greedy = before_greedy_;
  return base;
}

void TaskCoordinator::publish_evaluation_metrics(bool before) const {
  // Until a version is accepted as stable, the base's evaluation is the reference.
  const std::string mode = settings_.rollout.eval_temperature > 0 ? "sampled" : "greedy";
  record_evaluation_metrics(before ? before_ : after_, mode, false);
  if (before) record_evaluation_metrics(before_, mode, true);
  if (!greedy_plays()) return;
  record_evaluation_metrics(before ? before_greedy_ : after_greedy_, "greedy", false);
  if (before) record_evaluation_metrics(before_greedy_, "greedy", true);
}

void TaskCoordinator::record_training_failure(const rollout::Trajectory& record) { record_failure(record); }

void TaskCoordinator::record_failure(const rollout::Trajectory& record) {
  const std::string& family = record.task.family;
  failures_.add(family, env::failure_reason_name(record.failure));
  telemetry::metrics().add("learner.env_failures." + family + "." + env::failure_reason_name(record.failure));
  if (!breaker_.on_failure(family, record.failure_streak, record.error, runtime::monotonic_seconds())) return;
  telemetry::metrics().add("learner.family_pauses." + family);
  spdlog::warn(
      "env: family '{}' paused for {} s ([env] breaker_cooldown_s): actor {} saw {} sessions in a row fail "
      "for good ([env] breaker_failures); the last: {}",
      family, settings_.env.breaker_cooldown_s, record.actor, record.failure_streak, record.error);
}

bool TaskCoordinator::all_families_paused() const {
  return breaker_.paused(runtime::monotonic_seconds()).size() >= settings_.env.families.size();
}

void TaskCoordinator::on_step(std::int64_t groups_consumed, std::int64_t groups_dropped, std::int64_t policy_version,
                              bool training_done) {
  in_flight_ -= groups_consumed + groups_dropped;
  // The step took its quota of groups, trained or dropped: the next step gets
  // a whole quota again (replacing only the dropped ones would leave the
  // learners one group short of their quota for ever).
  assigned_this_step_ = 0;
  step_version_ = policy_version;
  const double now = runtime::monotonic_seconds();
  for (const std::string& family : settings_.env.families)
    telemetry::metrics().set("learner.family_paused." + family, breaker_.is_paused(family, now) ? 1.0 : 0.0);
  // Before the cursor: a resumed run then draws the same training groups as one that was not interrupted.
  if (phase_ == Phase::Train && periodic_.due(policy_version, training_done)) {
    const std::int64_t per_family =
        settings_.eval.episodes > 0 ? settings_.eval.episodes : settings_.rollout.eval_episodes;
    const std::vector<rollout::TaskGroup> groups = evaluation_groups(policy_version, per_family);
    periodic_.begin(policy_version, groups, greedy_groups_);
    for (const rollout::TaskGroup& g : groups) eval_queue_.push_back(g);
  }
  cursor_group_ = next_group_;
  cursor_seed_ = next_seed_;
  if (training_done && phase_ == Phase::Train) {
    periodic_.abandon();
    phase_ = Phase::EvalAfter;
    start_evaluation(policy_version);
  }
}

void TaskCoordinator::record_training_outcomes(const std::vector<EpisodeOutcome>& outcomes) {
  for (const EpisodeOutcome& outcome : outcomes) curriculum_.record(outcome);
  curriculum_.publish_metrics();
}

void TaskCoordinator::on_empty_round(std::int64_t groups_consumed, std::int64_t groups_dropped) {
  in_flight_ -= groups_consumed + groups_dropped;
  if (!settings_.sync.asynchronous) assigned_this_step_ -= groups_consumed + groups_dropped;
}

void TaskCoordinator::finish_actors() {
  if (finished_sent_) return;
  // Actors with a request pending get the answer now; the others get it unasked.
  std::vector<int> answered;
  for (const auto& [actor, free] : pending_) {
    send_to_actor(actor, rollout::TaskAssignment{{}, true});
    answered.push_back(actor);
  }
  pending_.clear();
  for (int actor : actors_)
    if (std::find(answered.begin(), answered.end(), actor) == answered.end() && !lost_actors_.count(actor))
      send_to_actor(actor, rollout::TaskAssignment{{}, true});
  finished_sent_ = true;
}

namespace {

std::string percent(double rate) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(0) << 100 * rate << "%";
  return out.str();
}

std::string signed_points(double rate) {
  std::ostringstream out;
  out << std::showpos << std::fixed << std::setprecision(0) << 100 * rate;
  return out.str();
}

// "62% (40/64) [50, 73]": the rate, its counts and its 95% interval in points.
std::string score_cell(const FamilyScore& score) {
  const Interval ci = score.success_interval();
  std::ostringstream out;
  out << percent(score.success_rate()) << " (" << score.successes << "/" << score.episodes << ") [" << std::fixed
      << std::setprecision(0) << 100 * ci.low << ", " << 100 * ci.high << "]";
  return out.str();
}

std::string gain_cell(const FamilyScore& before, const FamilyScore& after) {
  const Gain gain = success_gain(before, after);
  return signed_points(gain.value) + " [" + signed_points(gain.interval.low) + ", " +
         signed_points(gain.interval.high) + "]";
}

FamilyScore score_of(const ScoreTable& table, const std::string& family) {
  const auto found = table.find(family);
  return found == table.end() ? FamilyScore{} : found->second;
}

}  // namespace

std::string TaskCoordinator::evaluation_table() const {
  std::ostringstream out;
  int env_failures = 0;
  for (const ScoreTable* table : {&before_, &after_})
    for (const auto& [family, score] : *table) env_failures += score.env_failures;
  const bool greedy = greedy_plays();
  out << "held-out success at temperature " << settings_.rollout.eval_temperature
      << ", with 95% intervals (Wilson; gains: Newcombe), in points\n";
  out << std::left << std::setw(12) << "family" << std::setw(24) << "before" << std::setw(24) << "after"
      << std::setw(18) << "gain";
  if (greedy) out << std::setw(26) << "greedy before -> after";
  out << "reward before -> after" << (env_failures ? "   env failures before/after" : "") << "\n";
  for (const std::string& family : settings_.env.families) {
    const FamilyScore b = score_of(before_, family), a = score_of(after_, family);
    out << std::left << std::setw(12) << family << std::setw(24) << score_cell(b) << std::setw(24) << score_cell(a)
        << std::setw(18) << gain_cell(b, a);
    if (greedy) {
      const FamilyScore gb = score_of(before_greedy_, family), ga = score_of(after_greedy_, family);
      out << std::setw(26)
          << (percent(gb.success_rate()) + " -> " + percent(ga.success_rate()) + " (" +
              signed_points(ga.success_rate() - gb.success_rate()) + ")");
    }
    std::ostringstream reward;
    reward << std::fixed << std::setprecision(3) << b.mean_reward() << " -> " << a.mean_reward();
    out << (env_failures ? std::setw(25) : std::setw(0)) << reward.str();
    if (env_failures) out << "   " << b.env_failures << "/" << a.env_failures;
    out << "\n";
  }
  if (failures_.total() > 0)
    out << "sessions whose environment failed for good (training and evaluation): " << failures_.describe() << "\n";
  return out.str();
}

namespace {

void write_rank_failures(JsonWriter& json, const std::vector<RankFailure>& failures) {
  json.begin_array();
  for (const RankFailure& f : failures)
    json.begin_object()
        .key("rank")
        .value(f.rank)
        .key("role")
        .value(f.role)
        .key("role_index")
        .value(f.role_index)
        .key("host")
        .value(f.host)
        .key("kind")
        .value(f.kind)
        .key("detected_after_s")
        .value(f.detected_after_s)
        .key("recovered_after_s")
        .value(f.recovered_after_s)
        .key("sessions_migrated")
        .value(f.sessions_migrated)
        .key("episodes_restarted")
        .value(f.episodes_restarted)
        .key("step")
        .value(f.step)
        .key("steps_lost")
        .value(f.steps_lost)
        .end_object();
  json.end_array();
}

std::vector<RankFailure> read_rank_failures(const JsonValue& value) {
  std::vector<RankFailure> failures;
  for (const JsonValue& entry : value.as_array()) {
    RankFailure f;
    f.rank = static_cast<int>(entry.at("rank").as_number());
    f.role = entry.at("role").as_string();
    f.role_index = static_cast<int>(entry.at("role_index").as_number());
    f.host = entry.at("host").as_string();
    f.kind = entry.at("kind").as_string();
    f.detected_after_s = entry.at("detected_after_s").as_number();
    f.recovered_after_s = entry.at("recovered_after_s").is_null() ? -1 : entry.at("recovered_after_s").as_number();
    f.sessions_migrated = static_cast<int>(entry.at("sessions_migrated").as_number());
    f.episodes_restarted = static_cast<int>(entry.at("episodes_restarted").as_number());
    f.step = static_cast<std::int64_t>(entry.at("step").as_number());
    if (const std::optional<JsonValue> lost = entry.find("steps_lost"))
      f.steps_lost = static_cast<std::int64_t>(lost->as_number());
    failures.push_back(std::move(f));
  }
  return failures;
}

}  // namespace

std::string TaskCoordinator::books_json() const {
  JsonWriter json;
  json.begin_object().key("before");
  write_scores(json, before_);
  json.key("before_greedy");
  write_scores(json, before_greedy_);
  json.key("curriculum");
  curriculum_.write_json(json);
  json.key("env_failures");
  failures_.write_json(json);
  json.key("rank_failures");
  write_rank_failures(json, rank_failures_);
  json.end_object();
  return json.str();
}

void TaskCoordinator::restore_books(const std::string& text) {
  const JsonValue books = JsonValue::parse(text);
  before_ = read_scores(books.at("before"));
  if (const std::optional<JsonValue> greedy = books.find("before_greedy")) before_greedy_ = read_scores(*greedy);
  if (const std::optional<JsonValue> curriculum = books.find("curriculum")) curriculum_.restore(*curriculum);
  failures_ = FailureTally::from_json(books.at("env_failures"));
  if (const std::optional<JsonValue> ranks = books.find("rank_failures")) rank_failures_ = read_rank_failures(*ranks);
}

std::string TaskCoordinator::summary_json(std::int64_t steps, double wall_s, int restarts) const {
  JsonWriter json;
  json.begin_object().key("eval_temperature").value(settings_.rollout.eval_temperature).key("before");
  write_scores(json, before_);
  json.key("after");
  write_scores(json, after_);
  json.key("gain");
  write_gains(json, before_, after_);
  json.key("before_greedy");
  write_scores(json, before_greedy());
  json.key("after_greedy");
  write_scores(json, after_greedy());
  json.key("gain_greedy");
  write_gains(json, before_greedy(), after_greedy());
  json.key("curriculum");
  curriculum_.write_json(json);
  json.key("env_failures");
  failures_.write_json(json);
  json.key("family_pauses").value(breaker_.pauses());
  json.key("failures");
  write_rank_failures(json, rank_failures_);
  json.key("rejoins").begin_array();
  for (const RankRejoin& r : rank_rejoins_)
    json.begin_object()
        .key("rank")
        .value(r.rank)
        .key("role")
        .value("env_worker")
        .key("role_index")
        .value(r.role_index)
        .key("step")
        .value(r.step)
        .key("joined_after_s")
        .value(r.joined_after_s)
        .end_object();
  json.end_array();
  json.key("restarts").value(restarts);
  json.key("steps").value(steps).key("steps_completed").value(steps).key("wall_s").value(wall_s).end_object();
  return json.str();
}

}  // namespace moerl::learner
