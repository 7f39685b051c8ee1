#pragma once
// The actor role: drives many episodes at once through env workers with one
// GenerationEngine, and streams finished episodes to the learners.
//
// Per episode: open the task on its env worker; put the observation into the
// context as a user turn followed by the assistant header; generate until
// end-of-turn; send the decoded action to the env worker; repeat until the
// episode is done (or the context budget ends it, flagged). The tokens of
// every turn follow the run's episode format ([chat], text/episode_format.h):
// the byte tokenizer's layout, or the model's tokenizer with a chat layout. The whole context
// with its generated-token mask, behaviour log-probs, token versions and the
// routing of every fed position becomes one Trajectory for learner
// (group_id mod learners).
//
// New weights arrive through a WeightReceiver polled between decode steps;
// they are applied only between steps, so every token has exactly one version.
//
// Device and dtype: the policy comes on this rank's device in [run] dtype
// (app/roles.cpp); the engine's KV cache follows it. Versions arrive as
// float32 host bytes and are copied into the parameters (cast to their
// dtype); trajectories (tokens, float32 behaviour log-probs, routing) are
// built on the host.
//
// A session whose environment fails for good (the env worker used up its
// retries) or whose env worker does not answer within env_reply_deadline_s()
// becomes a failure record instead of an episode: a Trajectory with empty
// arrays, the FailureReason, turn, attempts and last error, sent to the
// group's learner (which must see every member of the group) and to learner
// 0 (which keeps the run's failure books and the per-family circuit breaker).
//
// Failover (a fault-tolerant MPI, actor_failover.cpp): when learner 0 says a
// rank was lost (runtime/lost_ranks.h) the actor
//   - restores its sessions of a lost env worker on a living one: the env
//     worker replays the session's actions (environments are deterministic),
//     so the episode goes on where it was, tokens and log-probs untouched;
//   - rebuilds the weight-sync group without a lost actor (survivors()),
//   - and, as a standby actor, takes a lost actor's place (the i-th actor
//     lost promotes standby actor i): from then on it asks for work.
// It tells learner 0 what it moved (FailoverReport).

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "moerl/comm/communicator.h"
#include "moerl/config/sections.h"
#include "moerl/env/env_worker.h"
#include "moerl/text/episode_format.h"
#include "moerl/model/policy.h"
#include "moerl/rollout/generation_engine.h"
#include "moerl/rollout/trajectory.h"
#include "moerl/runtime/failover_messages.h"
#include "moerl/runtime/heartbeat.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/world.h"
#include "moerl/sync/module_weights.h"
#include "moerl/sync/weight_sync.h"

namespace moerl::config {
struct Config;
}  // namespace moerl::config

namespace moerl::rollout {

// What an actor takes from the run configuration.
struct ActorSettings {
  config::RolloutSection rollout;  // sessions, sampling, the context budget
  config::ModelSection model;      // with chat: the episode format
  config::ChatSection chat;
  config::EnvSection env;  // with env_external: how long an env worker may take to answer
  config::ExternalEnvSection env_external;
  std::int64_t seed = 1;                               // [run]: every episode's sampling stream derives from it
  bool deterministic = false;                          // [run]: canonical episode ids and streams, isolated sessions
  config::RunDtype dtype = config::RunDtype::Float32;  // [run]: the dtype the weights arrive in
  double message_timeout_s = 60.0;                     // [cluster]
  double metrics_interval_s = 5.0;                     // [telemetry]
  sync::SyncOptions sync;                              // receiving weight versions
};

ActorSettings actor_settings(const config::Config& config);

// How long an actor waits for the env worker's answer to one request on a
// session that has taken `turns` steps: the env worker's own worst case
// (every attempt of [env] max_retries + 1 replays the session and may use
// its whole deadline, plus the backoffs, plus [env.external]
// startup_timeout_s when the external family is in the mix) and [cluster]
// message_timeout_s for the messages. Past it the session fails with reason
// no_reply.
double env_reply_deadline_s(const config::EnvSection& env, const config::ExternalEnvSection& external,
                            double message_timeout_s, int turns);

class Actor {
 public:
  // `load` (may be null): where the actor reports its weight version and
  // sessions for its heartbeats.
  // `standby`: a standby actor, which only keeps its weights current until
  // it takes a lost actor's place.
  Actor(ActorSettings settings, const runtime::World& world, runtime::Mailbox& mailbox, model::Policy policy,
        comm::Communicator& sync_comm, runtime::RankLoad* load = nullptr, bool standby = false);
  // Runs until learner 0 says the work is finished (then drains) or a stop.
  void run(runtime::StopCoordinator& stop);
  // [rollout] expert_parallel: the policy's experts are split over `group`
  // (its expert group, as a communicator). The members then go round their
  // loops together: each round they agree whether any has rows to decode
  // (all step), whether all may leave, and whether all hold the same new
  // weight version (all apply it), so every member computes every step with
  // the same weights. Set before run().
  void use_expert_group(comm::Communicator& group);

 private:
  struct Episode {
    TaskGroup group;
    std::uint64_t id = 0;
    int sample = 0;  // index within its group
    Trajectory trajectory;
    bool waiting_env = true;
    bool needs_end_of_turn = false;  // the last turn hit max tokens before its end-of-turn token
    int turns = 0;                   // environment steps answered
    std::chrono::steady_clock::time_point started;
    double reply_due_s = 0;             // monotonic time by which the env worker must answer (waiting_env)
    std::uint64_t awaited_request = 0;  // the env request whose reply counts (older ones are stale)
    env::RequestKind awaited_kind = env::RequestKind::Open;
    std::vector<std::string> env_actions;  // actions the env worker acknowledged, in order
    std::string pending_action;            // the step in flight (awaited_kind == Step)
    bool restoring = false;                // a Restore on a new env worker is in flight
    int env_worker = -1;                   // the rank hosting its session
    std::string snapshot_path;             // its latest archived snapshot ([env] snapshot_every_turns) ...
    size_t snapshot_turn = 0;              // ... taken after this many actions
    // The context window being fed (rollout.context_policy, actor_context.cpp).
    size_t window_start = 0;                   // token index where it starts in the trajectory
    std::vector<size_t> turn_starts;           // token indices of its prompts after the first: where turns begin
    std::vector<std::uint8_t> window_routing;  // routing of the finished windows, in order
    bool window_routing_lost = false;          // a finished window's routing did not cover it
    double last_progress_s = 0;                // monotonic time of its last env reply, turn or request
    bool stall_reported = false;               // its state was logged once for a long pause
  };

  void request_work();
  // After the last episode: tells learner 0 that nothing more will come from this actor.
  void report_done_sending();
  void take_assignment(const TaskAssignment& assignment);
  void start_waiting_groups();
  void on_env_reply(const env::EnvReply& reply);
  void on_turn(std::uint64_t id);
  void prompt_turn(Episode& episode, const std::string& observation, bool first);
  // drop_oldest_turns (actor_context.cpp): before a prompt of `prompt_tokens`,
  // rebuilds the context as head + newest whole turns when the next turn
  // would not fit; false when even the head alone leaves no room.
  bool make_room(Episode& episode, size_t prompt_tokens);
  // At the end: the routing of every window, or nothing when one is incomplete.
  void collect_routing(Episode& episode);
  void finish(Episode& episode);
  void fail(Episode& episode, env::FailureReason reason, const std::string& error, int attempts);
  void send_episode(Trajectory& t);
  void expect_env_reply(Episode& episode);
  void fail_overdue_sessions();
  // Every live episode waits for its env worker (with a deadline) or is in the
  // engine. One that has waited for its env worker for half the message
  // timeout gets its state logged once (its deadline may be minutes away);
  // one that is in neither place has nothing that would move it on, and is
  // failed so that the job goes on (its state in the error).
  void check_stalled_episodes(double now);
  std::string episode_state(const Episode& episode) const;
  void apply_new_weights();
  bool poll_new_weights();     // true when a verified version is ready
  void apply_ready_weights();  // makes it the engine's weights
  // One round of an expert group's members (use_expert_group).
  struct GroupRound {
    bool step = false;   // some member has rows to decode
    bool leave = false;  // every member is done
    bool apply = false;  // every member holds the same new version
  };
  GroupRound agree_round(bool has_work, bool done, bool weights_ready);
  std::string expert_share_text();  // ", experts [a, b) of E (...)" in an expert group, else ""
  void refuse_corrupt_version(const sync::CorruptVersionError& error);
  // Failover (actor_failover.cpp).
  void act_on_lost_ranks();
  int restore_sessions_of(int env_worker_rank);  // returns the sessions moved
  // Env workers whose rank a new process filled (runtime/env_join.h): used
  // again once this actor reaches them (its own spawn has returned).
  void take_rejoined_env_workers();
  void on_restored(Episode& episode);
  void recover_sync_group();
  // Learner 0's broadcast on sync_comm, or, with expert-parallel learners
  // ([cluster] expert_parallel > 1), every member's share on the World's
  // expert sync communicator (sync/sharded_weight_sync.h).
  std::unique_ptr<sync::VersionReceiver> make_receiver(comm::Communicator& sync_comm);
  bool promoted_by(const std::vector<runtime::RankLost>& lost) const;
  void group_member_done(const Trajectory& t);
  int free_slots() const;

  // Reply deadline of `episode`'s pending env request (env_reply_deadline_s).
  double reply_deadline_s(const Episode& episode) const;

  const ActorSettings settings_;
  const runtime::World& world_;
  runtime::Mailbox& mailbox_;
  text::EpisodeFormat format_;  // before engine_, which takes a copy
  GenerationEngine engine_;
  env::EnvClient env_;
  std::unique_ptr<comm::Communicator> sync_survivors_;  // the sync group after a loss (owned)
  comm::Communicator* sync_comm_;                       // the group in use
  // The float32 host bytes versions arrive in. For a CPU float32 policy they
  // are its parameters (swap mode, no copy); for one on a device or in
  // bfloat16 ([run] device, dtype) host copies that each version is pushed from.
  std::unique_ptr<sync::HostWeights> host_weights_;
  std::unique_ptr<sync::VersionReceiver> receiver_;
  comm::Communicator* expert_group_ = nullptr;  // [rollout] expert_parallel > 1
  std::map<std::uint64_t, Episode> episodes_;
  std::deque<TaskGroup> waiting_groups_;
  std::uint64_t next_episode_ = 0;
  bool work_requested_ = false;
  bool finished_ = false;
  std::uint64_t episodes_sent_ = 0;             // its first one is reported to learner 0 at once
  std::map<std::string, int> failure_streaks_;  // family -> consecutive failed sessions
  runtime::RankLoad* load_ = nullptr;
  bool standby_ = false;                             // a standby actor not (yet) promoted
  std::uint64_t lost_epoch_ = 0;                     // lost-rank notices acted on
  std::uint64_t rejoins_taken_ = 0;                  // rejoins acted on (LostRanks::rejoined_since)
  std::set<int> rejoined_unreached_;                 // rejoined env workers this actor has no route to yet
  int corrupt_versions_in_a_row_ = 0;                // weights versions refused by their checksums
  std::map<std::uint64_t, int> group_members_done_;  // group id -> members sent
  std::map<std::uint64_t, int> group_sizes_;         // group id -> members it has
  std::vector<std::uint64_t> delivered_groups_;      // reported with the next work request
  double next_overdue_check_s_ = 0;
  std::int64_t moe_layers_ = 0;
  std::int64_t top_k_ = 0;
};

}  // namespace moerl::rollout
