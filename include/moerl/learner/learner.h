#pragma once
// The learner role. Every learner collects the GRPO groups routed to it
// (group_id mod learners), and when each has its share of
// [algo] groups_per_step it takes one step: recompute log-probs (replaying the
// actors' routing), group-relative advantages, the clipped policy loss with
// truncated importance weights against the behaviour log-probs, gradient
// all-reduce over the learners, AdamW. Episodes older than
// [sync] max_staleness versions are dropped (counted). Learner 0 also
// coordinates the actors (TaskCoordinator) and publishes the weights every
// [sync] interval steps.
//
// Failure records (sessions whose environment failed for good) complete
// their group but are never trained on; a group left with no episode to
// train on is dropped and replaced. A step never runs, publishes or saves
// from zero trained tokens: the learners wait for data instead, and learner
// 0's ProgressWatch stops the job cleanly (naming the silent ranks and the
// failure counts) when nothing arrives for [cluster] message_timeout_s, as it
// does when every task family is paused by the circuit breaker. A malformed
// message is dropped with a warning; [cluster] malformed_message_limit of
// them from one rank stop the job naming that rank.

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "moerl/comm/communicator.h"
#include "moerl/config/sections.h"
#include "moerl/learner/checkpointing.h"
#include "moerl/learner/episode_batch.h"
#include "moerl/learner/coordinator.h"
#include "moerl/learner/episode_inbox.h"
#include "moerl/learner/episode_receiver.h"
#include "moerl/learner/evaluation_watch.h"
#include "moerl/learner/mixed_precision.h"
#include "moerl/learner/step_metrics.h"
#include "moerl/learner/value_head.h"
#include "moerl/model/policy.h"
#include "moerl/rollout/trajectory.h"
#include "moerl/runtime/heartbeat.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/world.h"
#include "moerl/sync/module_weights.h"
#include "moerl/sync/weight_sync.h"

namespace moerl::config {
struct Config;
}  // namespace moerl::config

namespace moerl::sync {
class ShardedWeightPublisher;
}  // namespace moerl::sync

namespace moerl::learner {

class OverlappedGradients;

// What a learner takes from the run configuration, its parts' settings included.
struct LearnerSettings {
  config::ModelSection model;  // with moe: the bf16 compute copy and the KL reference
  config::MoeSection moe;
  config::AlgoSection algo;
  config::OptimSection optim;
  config::SyncSection sync;
  config::RolloutSection rollout;  // group size, the context budget, the evaluation's printout
  config::RunDtype dtype = config::RunDtype::Float32;
  bool deterministic = false;        // [run]: episodes in canonical order
  double message_timeout_s = 60.0;   // [cluster]
  std::string run_directory;         // summary.json goes there
  CoordinatorSettings coordinator;   // learner 0
  CheckpointSettings checkpoints;    // learner 0 saves; every learner loads
  config::EvalSection eval;          // learner 0's EvaluationWatch
  EpisodeReceiverSettings receiver;  // the other learners
};

LearnerSettings learner_settings(const config::Config& config);

struct StepStats {
  std::int64_t step = 0;
  std::int64_t version = 0;
  int episodes = 0;
  double reward_mean = 0;
  std::map<std::string, FamilyScore> by_family;
  std::vector<EpisodeOutcome> outcomes;  // one per training episode of this learner's step
  std::int64_t generated_tokens = 0;
  std::int64_t tokens = 0;
  double staleness_mean = 0;
  std::int64_t staleness_max = 0;
  std::int64_t staleness_tokens = 0;  // generated tokens behind staleness_mean
  std::int64_t dropped_groups = 0;    // too stale
  std::int64_t failed_groups = 0;     // every episode a failure record: nothing to train on
  std::int64_t env_failures = 0;      // failure records among the step's groups
  std::int64_t zero_variance_groups = 0;
  double loss = 0;
  double importance_weight_mean = 0;  // minus 1 (accumulated over micro-batches)
  double behaviour_gap = 0;
  double clip_fraction = 0;
  double kl = 0;
  double entropy = 0;
  double grad_norm = 0;   // the policy's gradient norm before clipping (0 when nothing was updated)
  double value_loss = 0;  // PPO only
  double value_mean = 0;
  double explained_variance = 0;
  // Share of the step's reward variance that the task explains: 1 - (variance
  // around each group's mean) / (variance around the batch mean). The
  // baseline quality of GRPO-family advantages, next to PPO's critic's
  // explained_variance.
  double group_explained_variance = 0;
  double router_disagreement = -1;    // measured every [algo] routing_check_interval steps; -1 = not this step
  telemetry::ExpertLoad expert_load;  // over the step's micro-batches (the routing trained on)
  double update_s = 0;
  double sync_s = 0;
  bool updated = false;  // false when every group was filtered out
};

class Learner {
 public:
  // `policy`: the float32 master weights, already on this rank's device
  // ([run] device; app/roles.cpp moves it): the optimizer state, value head,
  // reference policy and every batch follow it there. With [run] dtype =
  // "bfloat16" forward and backward run on a bf16 copy (mixed_precision.h).
  // `resume`: "" (start fresh), "auto" (latest valid checkpoint if any) or a store path (see checkpointing.h).
  // `heartbeat` (learner 0; may be null in tests): where its Coordinator learns of lost ranks.
  Learner(LearnerSettings settings, const runtime::World& world, runtime::Mailbox& mailbox, model::Policy policy,
          comm::Communicator& learner_comm, comm::Communicator* sync_comm, const std::string& resume = "",
          runtime::HeartbeatThread* heartbeat = nullptr);
  ~Learner();
  // Trains for [optim] total_steps; learner 0 then runs the final evaluation,
  // writes <run dir>/summary.json and releases the actors.
  void run(runtime::StopCoordinator& stop);

  // One update on the given episodes (all learners call it together).
  StepStats update(const std::vector<const rollout::Trajectory*>& episodes);

  // The group the gradient all-reduce runs on, when not learner_comm (NCCL
  // between learners on GPUs of their own; comm/group_backend.h). Set before run().
  // It carries nothing else, so the all-reduce can overlap the backward
  // ([optim] gradient_bucket_mb, learner/overlapped_gradients.h).
  void use_gradient_communicator(comm::Communicator& comm);
  // [cluster] expert_parallel: the policy's experts are split over `group`
  // (the policy's own expert group, as a communicator for the counts of
  // passes every member joins), and `replicas` holds the learners with the
  // same share (expert gradients average over them). Set before run(). The
  // gradient all-reduce then runs after the backward (not overlapped).
  void use_expert_groups(comm::Communicator& group, comm::Communicator& replicas);

  // Called with every step's statistics, after the step (tests, benchmarks).
  void set_step_observer(std::function<void(const StepStats&)> observer) { step_observer_ = std::move(observer); }

  // Why the job stopped on a failure it could not work around ("" when it
  // did not): no progress, every family paused, repeated malformed messages.
  const std::string& job_failure() const { return job_failure_; }
  // The exit status that failure asks for (runtime::kJobFailedExitStatus or kLostRankExitStatus).
  int job_failure_status() const { return job_failure_status_; }

 private:
  struct EpisodeTargets;
  EpisodeTargets episode_targets(const std::vector<const rollout::Trajectory*>& episodes, StepStats& st);
  // The targets of the episodes `all.kept` keeps, which are appended to
  // `kept`; the others are appended to `dropped`.
  static EpisodeTargets kept_targets(const std::vector<const rollout::Trajectory*>& episodes, const EpisodeTargets& all,
                                     std::vector<const rollout::Trajectory*>& kept,
                                     std::vector<const rollout::Trajectory*>& dropped);
  std::vector<torch::Tensor> trainable_parameters() const;  // policy, then the value head (PPO)
  torch::nn::Module* value_head_module() { return value_head_ ? value_head_.get() : nullptr; }
  // Token-layer pairs of `batch` whose top-k experts the learner's own router
  // would choose differently from the replayed ones, and all its pairs.
  std::pair<double, double> router_disagreement(const EpisodeBatch& batch);
  void record_staleness(const EpisodeBatch& batch, StepStats& st) const;
  // Adds what `batches` (together: every episode of the step) contribute to
  // the step's token counts, staleness and router check.
  void record_episode_statistics(const std::vector<const EpisodeBatch*>& batches, bool check_router, StepStats& st);
  // The router check runs this step on these batches (every [algo] routing_check_interval steps, with replay).
  bool router_check_due(const std::vector<const EpisodeBatch*>& batches, bool replay) const;
  // Passes through the MoE layers in one step: router checks (no gradient),
  // then micro-batches with a backward. With split experts every member of
  // the group runs as many as the busiest (agree_expert_passes, one
  // all-reduce) and joins the ones it has no data for with idle passes
  // (Policy::idle_expert_pass), in the same order.
  struct ExpertPasses {
    std::int64_t router_checks = 0;
    std::int64_t backward = 0;
  };
  ExpertPasses agree_expert_passes(ExpertPasses mine);
  void idle_router_checks(std::int64_t count);
  void idle_backward_passes(std::int64_t count);
  // This step's groups from the inbox: the trainable episodes (stale groups,
  // failure records and groups left empty are counted, not returned).
  std::vector<const rollout::Trajectory*> take_ready_groups(std::int64_t& dropped, std::int64_t& taken,
                                                            std::int64_t& failed);
  // Waits for `ready()`, polling failures and the stop; false when the job stops first.
  bool wait_for_episodes(const std::function<bool()>& ready);
  // A failure the job cannot work around (from the coordinator or the receiver): stop cleanly.
  bool take_job_failure();
  void allreduce_gradients();
  // Waits for the publication in flight; false (and no publisher any more) when the job stops meanwhile.
  bool wait_for_publication();
  void publish_weights();
  // [cluster] expert_parallel: each member of the first expert group publishes its share.
  void publish_shards();
  void close_shards();  // at the end, after the last publication completed
  // Learner 0, after the weight-sync group lost a member: the survivors'
  // group, a new publisher on it, the newest weights published again.
  void recover_sync_group();
  // Runs a publisher operation; a lost member of the group (comm::PeerFailure)
  // is recovered from and the operation tried once more.
  void with_sync_recovery(const std::function<void()>& operation);
  void save_checkpoint_now(double reward_mean);
  // After every step: learner 0 decides whether to save and whether `latest`
  // was rolled back; every learner learns the decision (one all-reduce, which
  // also gathers every learner's staleness counts and RNG state), then acts.
  void checkpoint_step(bool done, double reward_mean);
  void roll_back_to(std::int64_t version);
  void check_learners_agree();
  // After the last step every learner takes in the rest of the training
  // episodes handed out for it: the actors finish what they started, and a
  // send to a learner that stopped receiving would never complete (the next
  // job phase or MPI_Finalize would find the actor stuck in it).
  // episodes_to_drain() is collective over the learners.
  std::int64_t episodes_to_drain();
  void drain_episodes(std::int64_t expected, runtime::StopCoordinator& stop);
  std::string drain_stall(std::int64_t expected) const;  // what the drain still waits for, for its messages
  double learning_rate(std::int64_t step) const;
  void report(const StepStats& stats, double elapsed_s, std::int64_t first_step);

  const LearnerSettings settings_;
  const runtime::World& world_;
  runtime::Mailbox& mailbox_;
  model::Policy policy_;                   // the float32 master weights (optimizer, checkpoints, weight sync)
  model::Policy compute_{nullptr};         // forward and backward: policy_ itself, or its bf16 copy ([run] dtype)
  std::unique_ptr<MixedPrecision> mixed_;  // policy_ <-> compute_ when they differ
  torch::Device device_ = torch::kCPU;     // where policy_ lives ([run] device)
  model::Policy reference_{nullptr};       // frozen starting weights in the compute dtype, when [algo] kl is not "none"
  ValueHead value_head_{nullptr};          // PPO's critic; null for the group-relative estimators
  comm::Communicator& learner_comm_;
  comm::Communicator* gradient_comm_ = nullptr;      // the gradient all-reduce's group; null: learner_comm_
  std::unique_ptr<OverlappedGradients> overlapped_;  // buckets on gradient_comm_ during the backward; null: flat
  comm::Communicator* expert_comm_ = nullptr;        // [cluster] expert_parallel: this learner's expert group
  comm::Communicator* expert_replicas_ = nullptr;    // and the learners holding its share
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<sync::HostWeights> host_weights_;                  // learner 0: the float32 host bytes it publishes
  std::unique_ptr<sync::WeightPublisher> publisher_;                 // learner 0, whole experts
  std::unique_ptr<sync::ShardedWeightPublisher> sharded_publisher_;  // split experts: the first group's members
  comm::Communicator* sync_comm_ = nullptr;                          // learner 0: the weight-sync group in use
  std::unique_ptr<comm::Communicator> sync_survivors_;               // it, after a failover (owned)
  std::int64_t published_version_ = -1;
  EpisodeInbox inbox_;                                 // this learner's groups, filled by a receiving thread
  std::unique_ptr<Coordinator> coordinator_;           // learner 0: the job service (its own thread)
  std::unique_ptr<EpisodeReceiver> receiver_;          // the other learners' receiving thread
  std::unique_ptr<CheckpointSchedule> checkpoints_;    // learner 0
  std::unique_ptr<EvaluationWatch> evaluations_;       // learner 0: [eval] records, regressions, auto_rollback
  StalenessAccount staleness_;                         // the whole run's, every learner's groups
  StalenessAccount staleness_step_;                    // this learner's since the last step
  std::vector<std::vector<std::uint8_t>> rng_states_;  // [learner] as of the last step boundary
  std::vector<rollout::Trajectory> batch_storage_;
  std::int64_t failure_records_ = 0;          // among the groups last taken
  runtime::StopCoordinator* stop_ = nullptr;  // during run()
  std::string job_failure_;
  int job_failure_status_ = 0;
  std::function<void(const StepStats&)> step_observer_;
  std::int64_t step_ = 0;
  std::int64_t version_ = 0;
  int learners_ = 1;
  double last_sync_s_ = 0;
};

}  // namespace moerl::learner
