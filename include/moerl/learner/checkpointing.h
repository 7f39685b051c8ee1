#pragma once
// Saving and resuming the learner through the HDF5 checkpoint store.
//
// One version holds: model parameters (one dataset each, by name), AdamW's
// state per parameter by name (learner/sharded_weights.h), the torch CPU
// generator state of every learner rank (rng/learnerN), staleness accounting
// (state/staleness/tokens_by_lag plus counters), learner step, policy
// version, the data cursor of learner 0's task coordinator, the resolved
// config, the program version (written by the store) and the step's metrics.
// Actors and env workers hold no generator state: their sampling streams are
// pure functions of (seed, task, sample, position) (rollout/sampling.h), so
// the checkpoint records the scheme instead (attribute rng.actors).
//
// Shards. Without expert parallelism every learner holds the same weights,
// so learner 0 writes one shard. With it, the P members of one expert group
// (the learners of the other groups hold the same shares and write nothing)
// save a version together: member m writes shard m with its rows of every
// expert tensor and their moments, member 0 also everything replicated;
// after a barrier member 0 writes the index and moves `latest`
// (storage/expert_shards.h has the layout). Every learner reads a version
// in whatever layout it was saved: its expert rows from the shards that hold
// them, so a version saved at P resumes at any Q (and by a learner holding
// every expert).

#include <torch/torch.h>

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/model/policy.h"
#include "moerl/storage/archive.h"
#include "moerl/storage/checkpoint_file.h"

namespace moerl::comm {
class Communicator;
}  // namespace moerl::comm

namespace moerl::config {
struct Config;
}  // namespace moerl::config

namespace moerl::learner {

// What saving, resuming and archiving take from the run configuration.
struct CheckpointSettings {
  config::CheckpointSection checkpoint;   // when to save, retention, the archive
  std::string directory = "checkpoints";  // the run's store: [checkpoint] directory, or <run dir>/checkpoints
  std::string config_toml;                // the resolved configuration, saved in every version
  bool deterministic = false;             // [run]: which sampling scheme of the actors every version names
  std::string metrics_path;               // <run dir>/[telemetry] metrics_file, archived with each version
  std::string env_archive_dir;            // the env workers' session snapshots, archived with each version
  config::CheckpointCrashPoint crash_point = config::CheckpointCrashPoint::None;  // [faults] checkpoint_crash_*
  std::int64_t crash_version = -1;
};

CheckpointSettings checkpoint_settings(const config::Config& config);

// How stale the trained-on data was, over the whole run (restarts included).
struct StalenessAccount {
  static constexpr int kLagBuckets = 32;  // the last bucket counts every lag >= 31
  std::int64_t taken_groups = 0;
  std::int64_t dropped_groups = 0;          // older than [sync] max_staleness: not trained on
  std::vector<std::int64_t> tokens_by_lag;  // [lag] generated tokens trained on, `lag` versions behind
  void add_tokens(std::int64_t lag, std::int64_t count);
  void add(const StalenessAccount& other);
  bool operator==(const StalenessAccount& other) const;
};

struct LearnerState {
  std::int64_t step = 0;
  std::int64_t version = 0;
  std::int64_t next_group = 0;  // task coordinator cursor: training resumes on new seeds
  std::int64_t next_seed = 0;
  double reward_mean = 0;
  StalenessAccount staleness;
  std::vector<std::vector<std::uint8_t>> rng_states;  // [learner rank] torch CPU generator state
  std::string coordinator_books;  // JSON: the first evaluation and the failure counts (TaskCoordinator::books_json)
  std::string program_version;    // on load: the program that wrote the checkpoint
};

// The torch CPU generator's state (what rng/learnerN holds), and its restore.
std::vector<std::uint8_t> cpu_generator_state();
void set_cpu_generator_state(const std::vector<std::uint8_t>& state);

// The learners that save one version together. Default: this learner
// alone writes the version's one shard (a policy holding every expert).
// With expert parallelism: the policy's expert group, `members` being a
// communicator over the same learners in the same order (rank = member);
// every member calls save with it, and only one group of a job saves.
struct ShardGroup {
  comm::Communicator* members = nullptr;
  double timeout_s = 300;  // the barrier before member 0 completes the version
};

// Writes this learner's shard of version `state.version`; member 0 of the
// group then (after every member's shard is committed) writes the index,
// moves `latest` (unless `latest_expected` is given and `latest` names
// another version by then: a rollback made during the save wins) and
// applies retention. Returns the bytes this learner wrote. `value_head`
// (PPO's critic; null otherwise) is saved and loaded with the policy, under
// "value_head/". Throws when the policy's expert layout is not the group's,
// and when a member does not reach the barrier within group.timeout_s.
std::uint64_t save_checkpoint(const CheckpointSettings& settings, model::PolicyImpl& policy,
                              torch::optim::Optimizer& optimizer, const LearnerState& state,
                              const storage::FaultInjection& faults = {},
                              std::optional<std::int64_t> latest_expected = std::nullopt,
                              torch::nn::Module* value_head = nullptr, const ShardGroup& group = {});

// `spec` is "auto" (the latest valid version in `run_store`, the run's own
// store, falling back past corrupt versions and saying so) or a path to a
// store directory's version ("DIR" = its latest, "DIR:VERSION|TAG").
// Returns nothing when "auto" finds no checkpoint. The policy's expert
// layout decides which rows of the expert tensors it reads (any version
// layout fits); every learner calls it on its own, no collective.
std::optional<LearnerState> load_checkpoint(const std::string& run_store, const std::string& spec,
                                            model::PolicyImpl& policy, torch::optim::Optimizer* optimizer,
                                            torch::nn::Module* value_head = nullptr);

// One version of the run's own store `directory` (a rollback while the job runs); quiet.
LearnerState load_checkpoint_version(const std::string& directory, std::int64_t version, model::PolicyImpl& policy,
                                     torch::optim::Optimizer* optimizer, torch::nn::Module* value_head = nullptr);

// The checkpoint schedule of a training run, on learner 0 (with expert
// parallelism, on each member of the group that saves): when to save
// ([checkpoint] every_steps, every_minutes), the save itself (with the crash
// injection of [faults] checkpoint_crash_point), background copies into
// [checkpoint] archive_directory, and noticing a rollback (someone moved
// `latest` away from the version this run last wrote).
class CheckpointSchedule {
 public:
  explicit CheckpointSchedule(CheckpointSettings settings);
  ~CheckpointSchedule();
  CheckpointSchedule(const CheckpointSchedule&) = delete;
  CheckpointSchedule& operator=(const CheckpointSchedule&) = delete;

  // A periodic save is due after `step` (every_steps, or every_minutes since the last save).
  bool due(std::int64_t step) const;
  // Saves (this member's shard, see save_checkpoint), then queues the
  // archive copies (they never block the caller).
  void save(model::PolicyImpl& policy, torch::optim::Optimizer& optimizer, const LearnerState& state,
            torch::nn::Module* value_head = nullptr, const ShardGroup& group = {});
  // The version `latest` now names when someone moved it since this run last
  // wrote a version or accepted the pointer (a `moerl checkpoint rollback`
  // while the job runs).
  std::optional<std::int64_t> rollback_request() const;
  // Accepts where `latest` points now (after a resume or a rollback): later
  // rollback checks compare against it.
  void accept_latest();
  // End of the run: waits up to [checkpoint] archive_wait_s for the archive
  // copies; throws moerl::Error when they time out or failed.
  void finish();

 private:
  void archive_after_save(std::int64_t version);
  void collect_archive_results(bool wait);

  CheckpointSettings settings_;
  double last_save_s_ = 0;
  int saves_ = 0;
  std::optional<std::int64_t> expected_latest_;  // what `latest` should name; unset = not watched yet
  std::unique_ptr<storage::Archiver> archiver_;
  std::vector<std::future<storage::ArchiveResult>> archive_jobs_;
  std::vector<std::string> archive_errors_;
  std::map<std::string, std::uintmax_t> archived_env_files_;  // name -> size already copied
};

}  // namespace moerl::learner
