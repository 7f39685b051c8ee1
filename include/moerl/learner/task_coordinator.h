#pragma once
// Learner 0's coordination of the actors' work: which task groups go to
// which actor, when, and the held-out evaluation before and after training.
//
// Phases: EvalBefore (held-out seeds with the base weights, at
// rollout.eval_temperature and, with rollout.eval_greedy, once more
// greedily) -> Train (GRPO groups; in asynchronous mode as many in flight as
// bounded staleness allows, in synchronous mode one step's worth at a time)
// -> EvalAfter (the same held-out seeds with the final weights) -> Done.
//
// It also keeps the run's books on sessions that failed for good (every
// failure record reaches learner 0) and the per-family circuit breaker
// (session_failures.h): training groups are not drawn from a paused family.
// An evaluation episode whose environment failed counts as an environment
// failure of its family, apart from the policy's successes and failures.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/learner/curriculum.h"
#include "moerl/learner/evaluation_scores.h"
#include "moerl/learner/periodic_evaluation.h"
#include "moerl/learner/session_failures.h"
#include "moerl/rollout/trajectory.h"
#include "moerl/runtime/mailbox.h"

namespace moerl::config {
struct Config;
}  // namespace moerl::config

namespace moerl::learner {

// What the task coordinator takes from the run configuration.
struct TaskCoordinatorSettings {
  config::RolloutSection rollout;  // group size, the held-out evaluation's episodes and temperature
  config::EvalSection eval;        // periodic evaluations
  config::EnvSection env;          // the task mix, circuit breaker and curriculum
  config::EnvFamilySections env_families;
  config::SyncSection sync;          // asynchronous or synchronous, bounded staleness
  std::int64_t groups_per_step = 8;  // [algo]
  std::int64_t seed = 1;             // [run]: the training seeds count up from it
};

TaskCoordinatorSettings task_coordinator_settings(const config::Config& config);

// One lost rank or restart of the job, for summary.json's `failures`.
struct RankFailure {
  int rank = -1;  // -1: the whole job (a restart)
  std::string role;
  int role_index = -1;
  std::string host;
  std::string kind;               // "lost: no heartbeat for 10.2 s ...", "restart: ..."
  double detected_after_s = 0;    // silent this long when declared lost
  double recovered_after_s = -1;  // failover took this long; -1: the job stopped for a restart
  int sessions_migrated = 0;
  int episodes_restarted = 0;
  std::int64_t step = 0;        // learner steps completed when it happened
  std::int64_t steps_lost = 0;  // a restart: steps done after the checkpoint it resumed from, run again
};

// An env worker's rank filled again by a new process (runtime/env_join.h).
struct RankRejoin {
  int rank = -1;
  int role_index = -1;
  std::int64_t step = 0;      // learner steps completed when it joined
  double joined_after_s = 0;  // from the request to the spawn's return
};

class TaskCoordinator {
 public:
  enum class Phase { EvalBefore, Train, EvalAfter, Done };

  TaskCoordinator(TaskCoordinatorSettings settings, runtime::Mailbox& mailbox, int learners,
                  std::vector<int> actor_ranks);

  // Takes work requests and answers those it can now.
  void serve(std::int64_t policy_version);
  // A finished evaluation episode (they all come to learner 0), or its failure record.
  void record_evaluation(const rollout::Trajectory& episode);
  // The failure record of a training session (every one reaches learner 0).
  void record_training_failure(const rollout::Trajectory& record);
  // Every configured family is paused by the breaker: no training group can be handed out.
  bool all_families_paused() const;
  const FailureTally& env_failures() const { return failures_; }
  // A lost rank or a restart of the job (summary.json `failures`, kept across resumes).
  void record_rank_failure(const RankFailure& failure) { rank_failures_.push_back(failure); }
  const std::vector<RankFailure>& rank_failures() const { return rank_failures_; }
  void record_rank_rejoin(const RankRejoin& rejoin) { rank_rejoins_.push_back(rejoin); }
  RankFailure& rank_failure(size_t index) { return rank_failures_.at(index); }
  const FamilyBreaker& breaker() const { return breaker_; }
  // After every learner step: how many groups all learners consumed and dropped.
  void on_step(std::int64_t groups_consumed, std::int64_t groups_dropped, std::int64_t policy_version,
               bool training_done);
  // Finished training episodes (learner 0's share): the curriculum's evidence.
  void record_training_outcomes(const std::vector<EpisodeOutcome>& outcomes);
  const Curriculum& curriculum() const { return curriculum_; }
  // A round in which every learner's groups were failed or stale: nothing
  // was trained and no version made; in-flight counts drop and, in
  // synchronous mode, new groups replace the consumed ones.
  void on_empty_round(std::int64_t groups_consumed, std::int64_t groups_dropped);
  // Tells every actor there is no more work (answers their requests with `finished`).
  void finish_actors();

  // Failover of a lost actor (or standby): stops answering it, and returns the
  // groups handed to it that it had not delivered. Evaluation groups among
  // them go back into the queue (a late result of one is counted once).
  std::vector<rollout::TaskGroup> take_undelivered(int actor_rank);
  // A training group of a lost actor that its learner cancelled: it no
  // longer counts as in flight or as handed out, and a new one takes its place.
  void cancelled_training_group(const rollout::TaskGroup& group);
  // A standby actor that took a lost actor's place asks for work from now on.
  void add_actor(int rank);

  Phase phase() const { return phase_; }
  // The data cursor as of the last on_step, saved with checkpoints so a
  // resumed run draws new seeds. Taken at the step boundary: in synchronous
  // mode the next step's groups are not handed out yet, so a resumed run
  // draws exactly the groups the uninterrupted run would have (exact
  // resume); the final evaluation's groups are not counted either.
  std::uint64_t next_group() const { return cursor_group_; }
  // Training episodes handed out so far for each learner (group g goes to
  // learner g mod learners), in this process's lifetime: once training ends,
  // what every learner must still receive before the job may end.
  const std::vector<std::int64_t>& assigned_episodes() const { return assigned_episodes_; }
  // After finish_actors(): every living actor has said that it sent its last episode.
  bool all_actors_done_sending() const;
  // The groups each actor was given and has not reported delivered: "rank R: id, id; ...".
  std::string undelivered_groups() const;
  std::uint64_t next_seed() const { return cursor_seed_; }
  // Continues a run from a checkpoint: no "before" evaluation (the base is
  // not what is loaded), and no episode generated by older weights.
  void resume(std::uint64_t next_group, std::uint64_t next_seed, std::int64_t version);
  // The books a resumed run continues (the first evaluation, the failure
  // counts), as JSON for the checkpoint; restore_books() reads them back
  // (throws JsonError on a malformed text).
  std::string books_json() const;
  void restore_books(const std::string& json);
  // At rollout.eval_temperature; the greedy tables (rollout.eval_greedy) apart.
  const ScoreTable& before() const { return before_; }
  const ScoreTable& after() const { return after_; }
  const ScoreTable& before_greedy() const { return greedy_plays() ? before_greedy_ : before_; }
  const ScoreTable& after_greedy() const { return greedy_plays() ? after_greedy_ : after_; }
  // `restarts`: how often the launcher restarted this job (MOERL_RESTARTS).
  std::string summary_json(std::int64_t steps, double wall_s, int restarts) const;
  // A periodic evaluation ([eval] every_steps) whose every episode is back
  // (its eval.* gauges are set), oldest first.
  std::optional<EvaluationRecord> take_periodic_evaluation();
  // The evaluation before training, as a record of the base (version -1).
  EvaluationRecord base_evaluation() const;
  std::string evaluation_table() const;

 private:
  std::vector<rollout::TaskGroup> next_groups(int free_slots, std::int64_t policy_version);
  void record_failure(const rollout::Trajectory& record);
  void send_to_actor(int actor, const rollout::TaskAssignment& assignment);
  void start_evaluation(std::int64_t min_version);
  // Groups of every held-out seed (and their greedy twins), in group-id order; the greedy ones are also in
  // greedy_groups_.
  std::vector<rollout::TaskGroup> evaluation_groups(std::int64_t min_version, std::int64_t per_family);
  // Evaluation plays each held-out seed once more at temperature 0 (the
  // sampled evaluation is not greedy itself and rollout.eval_greedy is set).
  bool greedy_plays() const;
  // eval.* gauges of the evaluation just finished (and the reference ones after the first).
  void publish_evaluation_metrics(bool before) const;
  std::int64_t train_groups_allowed() const;

  TaskCoordinatorSettings settings_;
  runtime::Mailbox& mailbox_;
  int learners_;
  std::vector<int> actors_;
  std::deque<std::pair<int, int>> pending_;                                 // (actor rank, free slots)
  std::map<int, std::map<std::uint64_t, rollout::TaskGroup>> undelivered_;  // actor rank -> its groups in flight
  std::set<int> lost_actors_;
  std::set<int> done_sending_;                    // actors whose last message (WorkRequest::done_sending) came
  std::set<std::uint64_t> recorded_evaluations_;  // evaluation groups whose result arrived
  Phase phase_ = Phase::EvalBefore;
  std::deque<rollout::TaskGroup> eval_queue_;
  int eval_outstanding_ = 0;
  ScoreTable before_, after_;                // at rollout.eval_temperature
  ScoreTable before_greedy_, after_greedy_;  // temperature 0, when greedy_plays()
  std::set<std::uint64_t> greedy_groups_;    // evaluation groups played greedily
  std::uint64_t next_group_ = 0;
  std::uint64_t next_seed_ = 0;
  std::uint64_t cursor_group_ = 0;  // next_group_ and next_seed_ at the last step boundary
  std::uint64_t cursor_seed_ = 0;
  std::int64_t in_flight_ = 0;                   // training groups assigned and not yet consumed or dropped
  std::vector<std::int64_t> assigned_episodes_;  // [learner]
  std::int64_t assigned_this_step_ = 0;
  std::int64_t step_version_ = 0;  // synchronous mode: groups of this version are out
  bool finished_sent_ = false;
  std::int64_t min_version_floor_ = 0;      // resumed runs: episodes need at least the resumed weights
  FailureTally failures_;                   // the whole run's (resumes included), training and evaluation
  std::vector<RankFailure> rank_failures_;  // the whole run's
  std::vector<RankRejoin> rank_rejoins_;    // this attempt's
  FamilyBreaker breaker_;
  Curriculum curriculum_;
  PeriodicEvaluation periodic_;
};

}  // namespace moerl::learner
