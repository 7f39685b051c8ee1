#pragma once
// Learner 0's coordination of the actors' work: which task groups go to
// which actor, when, and the held-out evaluation before and after training.
//
// Phases: EvalBefore (greedy episodes on held-out seeds with the base
// weights) -> Train (GRPO groups; in asynchronous mode as many in flight as
// bounded staleness allows, in synchronous mode one step's worth at a time)
// -> EvalAfter (the same held-out seeds with the final weights) -> Done.

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "moerl/config/config.h"
#include "moerl/rollout/trajectory.h"
#include "moerl/runtime/mailbox.h"

namespace moerl::learner {

struct FamilyScore {
  int episodes = 0;
  int successes = 0;
  double reward = 0;
  double success_rate() const { return episodes ? static_cast<double>(successes) / episodes : 0.0; }
  double mean_reward() const { return episodes ? reward / episodes : 0.0; }
};

class TaskCoordinator {
 public:
  enum class Phase { EvalBefore, Train, EvalAfter, Done };

  TaskCoordinator(const config::Config& config, runtime::Mailbox& mailbox, int learners, std::vector<int> actor_ranks);

  // Takes work requests and answers those it can now.
  void serve(std::int64_t policy_version);
  // A finished evaluation episode (they all come to learner 0).
  void record_evaluation(const rollout::Trajectory& episode);
  // After every learner step: how many groups all learners consumed and dropped.
  void on_step(std::int64_t groups_consumed, std::int64_t groups_dropped, std::int64_t policy_version,
               bool training_done);
  // Tells every actor there is no more work (answers their requests with `finished`).
  void finish_actors();

  Phase phase() const { return phase_; }
  const std::map<std::string, FamilyScore>& before() const { return before_; }
  const std::map<std::string, FamilyScore>& after() const { return after_; }
  std::string summary_json(std::int64_t steps, double wall_s) const;
  std::string evaluation_table() const;

 private:
  std::vector<rollout::TaskGroup> next_groups(int free_slots, std::int64_t policy_version);
  void start_evaluation(std::int64_t min_version);
  std::int64_t train_groups_allowed() const;

  const config::Config& config_;
  runtime::Mailbox& mailbox_;
  int learners_;
  std::vector<int> actors_;
  std::deque<std::pair<int, int>> pending_;  // (actor rank, free slots)
  Phase phase_ = Phase::EvalBefore;
  std::deque<rollout::TaskGroup> eval_queue_;
  int eval_outstanding_ = 0;
  std::map<std::string, FamilyScore> before_, after_;
  std::uint64_t next_group_ = 0;
  std::uint64_t next_seed_ = 0;
  std::int64_t in_flight_ = 0;        // training groups assigned and not yet consumed or dropped
  std::int64_t assigned_this_step_ = 0;
  std::int64_t step_version_ = 0;     // synchronous mode: groups of this version are out
  bool finished_sent_ = false;
};

}  // namespace moerl::learner
