#pragma once
// Learner 0's job service, on one long-lived thread of its own (as Horovod
// gives coordination its controller loop): whatever learner 0's training
// thread is doing (an update, a publication, a checkpoint), this thread keeps
//   - answering the actors' work requests (TaskCoordinator: placement,
//     evaluation phases, the run's books and circuit breaker),
//   - taking in every message for rank 0: learner 0's own training episodes
//     (into its EpisodeInbox), evaluation episodes, every failure record,
//     metrics reports (the aggregator behind metrics.jsonl),
//   - acting on lost ranks that the heartbeats declare (runtime/heartbeat.h):
//     under a fault-tolerant MPI a lost actor, standby actor or env worker
//     fails over (coordinator_failover.cpp: the living ranks are told, a
//     frozen one is fenced, a lost actor's undelivered groups are cancelled
//     and replaced, a standby takes its place, the weight-sync group is
//     rebuilt); any other loss stops the job for a restart (status 4),
//   - watching the flow of episodes (ProgressWatch) while the job waits for it.
// Failures the job cannot work around become one JobFailure that the
// training thread takes and turns into a clean stop.
//
// Threading: every public method may be called from learner 0's training
// thread while the service thread runs; one mutex guards the state. The
// service thread never blocks on MPI beyond a send's own timeout.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/learner/episode_inbox.h"
#include "moerl/learner/progress_watch.h"
#include "moerl/learner/task_coordinator.h"
#include "moerl/runtime/env_join.h"
#include "moerl/runtime/failover_messages.h"
#include "moerl/runtime/heartbeat.h"
#include "moerl/telemetry/metric_warnings.h"
#include "moerl/telemetry/metrics_server.h"
#include "moerl/runtime/malformed_messages.h"
#include "moerl/runtime/world.h"
#include "moerl/telemetry/metrics_aggregator.h"
#include "moerl/telemetry/metrics_file.h"

namespace moerl::config {
struct Config;
}  // namespace moerl::config

namespace moerl::learner {

// What learner 0's job service takes from the run configuration.
struct CoordinatorSettings {
  TaskCoordinatorSettings tasks;
  config::TelemetrySection telemetry;          // the Prometheus endpoint, report interval, warning thresholds
  std::string metrics_path = "metrics.jsonl";  // <run dir>/[telemetry] metrics_file
  double message_timeout_s = 60.0;             // [cluster]: how long the progress watch waits for episodes
  std::int64_t malformed_message_limit = 5;    // [cluster]: from one rank, before the job stops
  std::string run_directory;                   // where `moerl ctl add-env` leaves its requests (control/)
  std::string config_toml;                     // the resolved configuration, for env workers that join
};

CoordinatorSettings coordinator_settings(const config::Config& config);

// A failure that ends the job cleanly: why, and the exit status it asks for.
struct JobFailure {
  std::string reason;
  int status = 3;
};

class Coordinator {
 public:
  // `own_inbox`: learner 0's training episodes go there. `heartbeat` (may be
  // null): where lost ranks are declared.
  Coordinator(const CoordinatorSettings& settings, const runtime::World& world, runtime::Mailbox& mailbox, int learners,
              EpisodeInbox& own_inbox, runtime::HeartbeatThread* heartbeat);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  void start();  // the service thread starts (and the /metrics endpoint, with [telemetry] prometheus_port)
  void stop();   // and ends (joined); safe to call twice

  // A resumed run: the data cursor, the version new groups need, the books.
  void resume(std::uint64_t next_group, std::uint64_t next_seed, std::int64_t version, const std::string& books,
              std::int64_t step, int restarts, const std::string& restart_cause);
  // Restart `restarts` of scripts/launch.sh, continuing from `step` (0: no
  // checkpoint yet): the failures entry, and the metrics lines of steps that run again.
  void record_restart(std::int64_t step, int restarts, const std::string& restart_cause);
  // What work requests get and heartbeats carry: the step done and the newest version.
  void set_progress(std::int64_t step, std::int64_t version);
  // While the training thread waits for episodes, the progress watch runs.
  void watch_episodes(bool on);

  TaskCoordinator::Phase phase() const;
  void on_step(std::int64_t consumed, std::int64_t dropped, std::int64_t version, bool done);
  // Learner 0's training episodes of the step, for the curriculum (curriculum.h).
  void record_training_outcomes(const std::vector<EpisodeOutcome>& outcomes);
  void on_empty_round(std::int64_t consumed, std::int64_t dropped);
  void finish_actors();
  std::optional<JobFailure> take_failure();
  // A failure stops the job (taken or not).
  bool failing() const;

  // metrics.jsonl: one line after each step (every rank's latest snapshot).
  void write_metrics_line(std::int64_t step);
  std::vector<std::int64_t> assigned_episodes() const;
  std::string undelivered_groups() const;  // TaskCoordinator::undelivered_groups, under the lock
  // Every living actor said it sent its last episode, and what it sent before
  // that has been taken: nothing more can reach learner 0's inbox.
  bool actors_done_sending() const { return actors_done_sending_; }
  std::uint64_t next_group() const;
  std::uint64_t next_seed() const;
  std::string books_json() const;
  std::string evaluation_table() const;
  // Periodic evaluations that finished ([eval] every_steps), oldest first; the base's evaluation.
  std::optional<EvaluationRecord> take_periodic_evaluation();
  EvaluationRecord base_evaluation() const;
  std::string summary_json(std::int64_t steps, double wall_s, int restarts) const;
  // The oldest weight version an actor still generates with (as reported), for sync metrics.
  double oldest_actor_version(double newest) const;

  // Failover of the weight-sync group, on learner 0's training thread: the
  // group lost a member (an actor or standby was declared lost) and must be
  // rebuilt; then sync_group_rebuilt() says it was.
  bool sync_group_broken() const { return sync_broken_.load(); }
  void sync_group_rebuilt();

 private:
  void note_restart(std::int64_t step, int restarts, const std::string& restart_cause);  // mutex_ held
  // A failover in progress: what it waits for before it counts as recovered.
  struct Recovery {
    int rank = -1;
    size_t failure = 0;  // its entry in tasks_.rank_failures()
    double declared_at = 0;
    std::set<int> learners;  // GroupsCancelledReply still to come
    std::set<int> actors;    // FailoverReport still to come
    bool sync = false;       // the weight-sync group still to rebuild
  };

  void loop();
  void serve_once();
  void take_messages(double now);
  void take_episode(int source, rollout::Trajectory episode, double now);
  void drop_malformed(const runtime::MessageError& error, bool lost_episode);
  void on_rank_lost(const runtime::LostRank& lost, double now);
  // Why the job cannot go on without `lost` ("" when it can).
  std::string failover_impossible(const runtime::LostRank& lost) const;
  void tell_living_ranks(const runtime::RankLost& notice);
  void fail_over_actor(const runtime::LostRank& lost, Recovery& recovery);
  void take_failover_messages(double now);
  void finish_recoveries(double now);
  void watch_progress(double now);
  void fail(const std::string& reason, int status);
  // Releases of env workers (coordinator_release.cpp).
  void take_release_requests(double now);
  void decide_releases(double now);
  std::string release_refusal(int rank) const;
  // Env workers joining again (coordinator_join.cpp).
  void take_join_requests(double now);
  void start_join(int rank, double now);
  void watch_join(double now);
  std::string join_refusal(int rank) const;
  // The Prometheus page (coordinator_metrics.cpp): every rank's latest
  // metrics, learner 0's own as of now, and the heartbeat age of every rank.
  std::string prometheus_page() const;
  void log_metric_warnings();  // mutex_ held

  CoordinatorSettings settings_;
  const runtime::World& world_;
  runtime::Mailbox& mailbox_;
  int learners_;
  EpisodeInbox& own_inbox_;
  runtime::HeartbeatThread* heartbeat_;
  mutable std::mutex mutex_;
  TaskCoordinator tasks_;
  telemetry::MetricsAggregator aggregator_;
  std::unique_ptr<telemetry::JsonLinesFile> metrics_file_;
  ProgressWatch watch_;
  runtime::MalformedMessages malformed_;
  std::optional<JobFailure> failure_;
  bool failure_taken_ = false;
  bool watching_ = false;
  std::int64_t step_ = 0;
  std::int64_t version_ = 0;
  std::vector<Recovery> recoveries_;
  struct PendingRelease {
    double decide_at = 0;
    std::string reason;
  };
  std::map<int, PendingRelease> releases_pending_;          // env workers that asked to leave, by rank
  std::map<int, std::string> released_;                     // granted, not yet seen gone: rank -> reason
  std::map<std::uint64_t, rollout::TaskGroup> cancelling_;  // training groups of lost actors, asked to cancel
  std::set<int> gone_by_release_;                           // released env workers, seen gone (no heartbeat to watch)
  std::unique_ptr<runtime::EnvJoinService> join_service_;   // with the actors: spawns env workers that join
  struct Joining {
    int rank = -1;
    double started_at = 0;
  };
  std::optional<Joining> joining_;  // one join at a time
  double next_join_scan_ = 0;
  bool join_stuck_ = false;  // a join's spawn never returned: no other can start
  telemetry::MetricWarnings metric_warnings_;
  std::atomic<bool> sync_broken_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> actors_done_sending_{false};
  std::thread thread_;
  // Last: it calls prometheus_page(), so it goes first.
  std::unique_ptr<telemetry::MetricsServer> metrics_server_;
};

}  // namespace moerl::learner
