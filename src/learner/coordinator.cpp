#include "moerl/learner/coordinator.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "moerl/config/config.h"
#include "moerl/core/json_value.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/metrics_report.h"
#include "moerl/telemetry/metrics.h"
#include "moerl/telemetry/resident_memory.h"

namespace moerl::learner {
namespace {

double now_s() { return runtime::monotonic_seconds(); }

}  // namespace

CoordinatorSettings coordinator_settings(const config::Config& config) {
  CoordinatorSettings settings;
  settings.tasks = task_coordinator_settings(config);
  settings.telemetry = config.telemetry;
  settings.metrics_path = config.metrics_path();
  settings.message_timeout_s = config.cluster.message_timeout_s;
  settings.malformed_message_limit = config.cluster.malformed_message_limit;
  settings.run_directory = config.run_directory();
  settings.config_toml = config::to_toml(config);
  return settings;
}

Coordinator::Coordinator(const CoordinatorSettings& settings, const runtime::World& world, runtime::Mailbox& mailbox,
                         int learners, EpisodeInbox& own_inbox, runtime::HeartbeatThread* heartbeat)
    : settings_(settings),
      world_(world),
      mailbox_(mailbox),
      learners_(learners),
      own_inbox_(own_inbox),
      heartbeat_(heartbeat),
      tasks_(settings.tasks, mailbox, learners, world.layout().ranks_of(runtime::Role::Actor)),
      watch_(settings.message_timeout_s),
      malformed_(world.layout(), settings.malformed_message_limit, "learner 0"),
      metric_warnings_({settings.telemetry.imbalance_warn_ratio, settings.telemetry.env_p99_warn_s}) {
  if (world.join_comm() != MPI_COMM_NULL)
    join_service_ = std::make_unique<runtime::EnvJoinService>(mailbox, world.join_comm(), world.size());
}

Coordinator::~Coordinator() { stop(); }

void Coordinator::start() {
  if (thread_.joinable()) return;
  if (settings_.telemetry.prometheus_port > 0 && !metrics_server_) {
    metrics_server_ = std::make_unique<telemetry::MetricsServer>(settings_.telemetry.prometheus_bind,
                                                                 static_cast<int>(settings_.telemetry.prometheus_port),
                                                                 [this] { return prometheus_page(); });
    spdlog::info("metrics: Prometheus can scrape {}", metrics_server_->url());
  }
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Coordinator::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void Coordinator::loop() {
  while (!stopping_) {
    try {
      serve_once();
    } catch (const std::exception& error) {
      // The service must not die quietly: the job stops, saying why.
      std::lock_guard<std::mutex> lock(mutex_);
      fail(std::string("learner 0's coordinator failed: ") + error.what(), runtime::kFatalErrorExitStatus);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Coordinator::serve_once() {
  std::vector<runtime::LostRank> lost;
  if (heartbeat_) {
    heartbeat_->set_job_progress(step_, version_);
    lost = heartbeat_->take_lost();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // One clock reading for the whole pass: a recovery declared here and found
  // complete in the same pass then takes 0 s, never a negative time.
  const double now = now_s();
  for (const runtime::LostRank& rank : lost) on_rank_lost(rank, now);
  tasks_.serve(version_);
  take_messages(now);
  // After take_messages: an actor's episodes were sent before its last word,
  // so those that came before it have been taken in this pass.
  if (tasks_.all_actors_done_sending()) actors_done_sending_ = true;
  take_failover_messages(now);
  take_release_requests(now);
  decide_releases(now);
  take_join_requests(now);
  watch_join(now);
  finish_recoveries(now);
  if (watching_) watch_progress(now);
}

void Coordinator::take_messages(double now) {
  for (;;) {
    std::optional<std::pair<int, rollout::Trajectory>> message;
    try {
      message = mailbox_.try_receive<rollout::Trajectory>();
    } catch (const runtime::MessageError& error) {
      drop_malformed(error, true);
      continue;
    }
    if (!message) break;
    take_episode(message->first, std::move(message->second), now);
  }
  for (;;) {
    std::optional<std::pair<int, runtime::MetricsReport>> report;
    try {
      report = mailbox_.try_receive<runtime::MetricsReport>();
    } catch (const runtime::MessageError& error) {
      drop_malformed(error, false);
      continue;
    }
    if (!report) break;
    watch_.heard_from(report->first, now);
    aggregator_.update(report->second.snapshot);
  }
}

void Coordinator::take_episode(int source, rollout::Trajectory episode, double now) {
  watch_.heard_from(source, now);
  // Failure records are not progress: a job whose every session fails must not look alive.
  if (!episode.failed()) watch_.progressed(now);
  if (episode.evaluation) {
    tasks_.record_evaluation(episode);
    return;
  }
  // Failure records of every group reach learner 0 for its books; the group's
  // own learner also needs them to complete the group.
  if (episode.failed()) tasks_.record_training_failure(episode);
  if (episode.group_id % static_cast<std::uint64_t>(learners_) != 0) {
    if (!episode.failed())
      drop_malformed(runtime::MessageError("an episode of group " + std::to_string(episode.group_id) + " from rank " +
                                               std::to_string(source) + " reached learner 0 (not its learner)",
                                           source),
                     false);
    return;
  }
  own_inbox_.add(std::move(episode), now);
}

void Coordinator::drop_malformed(const runtime::MessageError& error, bool lost_episode) {
  telemetry::metrics().add("learner.malformed_messages");
  if (lost_episode) own_inbox_.lost_in_malformed_message();
  if (const auto stop = malformed_.drop(error)) fail(*stop, runtime::kJobFailedExitStatus);
}

void Coordinator::watch_progress(double now) {
  if (tasks_.phase() == TaskCoordinator::Phase::Train && tasks_.all_families_paused()) {
    std::string families;
    for (const std::string& family : settings_.tasks.env.families)
      families += (families.empty() ? "" : "; ") + family + ": " + tasks_.breaker().last_error(family);
    fail("every task family is paused by the circuit breaker (their sessions keep failing): " + families,
         runtime::kJobFailedExitStatus);
    return;
  }
  const double quiet_s = 3 * settings_.telemetry.metrics_interval_s;
  if (watch_.expired(now)) {
    const std::string quiet = watch_.quiet_ranks(world_.layout(), quiet_s, now);
    fail("no episodes arrived for " + std::to_string(static_cast<int>(watch_.idle_s(now))) +
             " s ([cluster] message_timeout_s); silent ranks: " + (quiet.empty() ? "none" : quiet) +
             "; sessions failed for good: " + tasks_.env_failures().describe(),
         runtime::kJobFailedExitStatus);
  } else if (watch_.warn_due(now)) {
    const std::string quiet = watch_.quiet_ranks(world_.layout(), quiet_s, now);
    spdlog::warn(
        "learner 0: no episodes for {:.0f} s (the job stops at {:.0f} s); silent ranks: {}; sessions failed "
        "for good: {}",
        watch_.idle_s(now), watch_.limit_s(), quiet.empty() ? "none" : quiet, tasks_.env_failures().describe());
  }
}

void Coordinator::fail(const std::string& reason, int status) {
  if (failure_) return;  // the first failure is the one that stops the job
  failure_ = JobFailure{reason, status};
  own_inbox_.notify();  // a training thread waiting for episodes looks up
}

bool Coordinator::failing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_.has_value();
}

std::optional<JobFailure> Coordinator::take_failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_ || failure_taken_) return std::nullopt;
  failure_taken_ = true;
  return failure_;
}

void Coordinator::resume(std::uint64_t next_group, std::uint64_t next_seed, std::int64_t version,
                         const std::string& books, std::int64_t step, int restarts, const std::string& restart_cause) {
  std::lock_guard<std::mutex> lock(mutex_);
  tasks_.resume(next_group, next_seed, version);
  step_ = step;
  version_ = version;
  // A resumed run keeps the first run's books: its `before` evaluation,
  // failure counts and lost ranks (checkpoints written before they were
  // kept have none), and each step once in the metrics file.
  if (!books.empty()) {
    try {
      tasks_.restore_books(books);
    } catch (const JsonError& error) {
      spdlog::warn("resume: the checkpoint's coordinator books are unreadable ({}); summary.json starts them afresh",
                   error.what());
    }
  }
  note_restart(step, restarts, restart_cause);
}

void Coordinator::record_restart(std::int64_t step, int restarts, const std::string& restart_cause) {
  std::lock_guard<std::mutex> lock(mutex_);
  note_restart(step, restarts, restart_cause);
}

void Coordinator::note_restart(std::int64_t step, int restarts, const std::string& restart_cause) {
  telemetry::metrics().set("job.restarts", restarts);
  // Steps logged past the checkpoint were done by the attempt that failed: they run again.
  const std::string& metrics_path = settings_.metrics_path;
  const std::int64_t dropped = telemetry::keep_lines_through_step(metrics_path, step);
  if (dropped > 0)
    spdlog::info("resume: dropped {} lines past step {} from {} (those steps run again)", dropped, step, metrics_path);
  if (restarts > 0) {
    RankFailure restart;
    restart.kind = "restart " + std::to_string(restarts) + " by scripts/launch.sh: " + restart_cause;
    restart.step = step;
    restart.steps_lost = dropped;
    tasks_.record_rank_failure(restart);
  }
}

void Coordinator::set_progress(std::int64_t step, std::int64_t version) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  version_ = version;
}

void Coordinator::watch_episodes(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (on && !watching_) watch_.start(now_s());
  watching_ = on;
}

TaskCoordinator::Phase Coordinator::phase() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.phase();
}

void Coordinator::on_step(std::int64_t consumed, std::int64_t dropped, std::int64_t version, bool done) {
  std::lock_guard<std::mutex> lock(mutex_);
  version_ = version;
  tasks_.on_step(consumed, dropped, version, done);
}

void Coordinator::record_training_outcomes(const std::vector<EpisodeOutcome>& outcomes) {
  std::lock_guard<std::mutex> lock(mutex_);
  tasks_.record_training_outcomes(outcomes);
}

void Coordinator::on_empty_round(std::int64_t consumed, std::int64_t dropped) {
  std::lock_guard<std::mutex> lock(mutex_);
  tasks_.on_empty_round(consumed, dropped);
}

void Coordinator::finish_actors() {
  std::lock_guard<std::mutex> lock(mutex_);
  tasks_.finish_actors();
}

void Coordinator::write_metrics_line(std::int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  telemetry::record_resident_memory();  // learner 0 sends no report of its own
  aggregator_.update(telemetry::metrics().snapshot());
  if (!metrics_file_) metrics_file_ = std::make_unique<telemetry::JsonLinesFile>(settings_.metrics_path);
  metrics_file_->append(aggregator_.json_line(step));
  log_metric_warnings();
}

std::string Coordinator::undelivered_groups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.undelivered_groups();
}

std::vector<std::int64_t> Coordinator::assigned_episodes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.assigned_episodes();
}

std::uint64_t Coordinator::next_group() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.next_group();
}

std::uint64_t Coordinator::next_seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.next_seed();
}

std::string Coordinator::books_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.books_json();
}

std::optional<EvaluationRecord> Coordinator::take_periodic_evaluation() {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.take_periodic_evaluation();
}

EvaluationRecord Coordinator::base_evaluation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.base_evaluation();
}

std::string Coordinator::evaluation_table() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.evaluation_table();
}

std::string Coordinator::summary_json(std::int64_t steps, double wall_s, int restarts) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.summary_json(steps, wall_s, restarts);
}

double Coordinator::oldest_actor_version(double newest) const {
  std::lock_guard<std::mutex> lock(mutex_);
  double oldest = newest;
  for (const auto& [rank, snapshot] : aggregator_.latest()) {
    const auto it = snapshot.gauges.find("actor.policy_version");
    if (snapshot.role == "actor" && it != snapshot.gauges.end()) oldest = std::min(oldest, it->second);
  }
  return oldest;
}

}  // namespace moerl::learner
