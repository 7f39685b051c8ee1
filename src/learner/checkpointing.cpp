#include "moerl/learner/checkpointing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <type_traits>

#include "moerl/comm/communicator.h"
#include "moerl/config/config.h"
#include "moerl/core/check.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/storage/archive.h"
#include "moerl/learner/sharded_weights.h"
#include "moerl/storage/checkpoint_store.h"
#include "moerl/storage/expert_shards.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLagArray = "state/staleness/tokens_by_lag";
constexpr const char* kTakenGroups = "staleness.taken_groups";
constexpr const char* kDroppedGroups = "staleness.dropped_groups";
constexpr const char* kLearnerRngPrefix = "rng/learner";
constexpr const char* kActorRngScheme = "rng.actors";
constexpr const char* kCoordinatorBooks = "coordinator.books";

storage::FaultPoint fault_point(config::CheckpointCrashPoint point) {
  switch (point) {
    case config::CheckpointCrashPoint::None: return storage::FaultPoint::None;
    case config::CheckpointCrashPoint::AfterArrays: return storage::FaultPoint::AfterData;
    case config::CheckpointCrashPoint::BeforeRename: return storage::FaultPoint::BeforeRename;
    case config::CheckpointCrashPoint::BeforeIndex: return storage::FaultPoint::BeforeIndex;
    case config::CheckpointCrashPoint::BeforeLatest: return storage::FaultPoint::BeforeLatest;
  }
  return storage::FaultPoint::None;
}

// The member of `group` this learner is, checked against the policy's own
// expert group: the shards must hold what the policy holds.
ExpertLayout saving_layout(const model::PolicyImpl& policy, const ShardGroup& group) {
  const ExpertLayout layout = expert_layout(policy);
  const int member = group.members ? group.members->rank() : 0;
  const int members = group.members ? group.members->size() : 1;
  if (layout.members != members || layout.member != member)
    throw Error("checkpoint save: member " + std::to_string(member) + " of a shard group of " +
                std::to_string(members) + " holds a policy that is " + layout.text() +
                "; a policy with split experts saves with its expert group (ShardGroup::members)");
  return layout;
}

// Learner 0's part of a version (the expert group's member 0): the learner
// state, RNG, staleness account, coordinator cursor, config and metrics.
void add_learner_state(storage::CheckpointWriter& writer, const CheckpointSettings& settings,
                       const LearnerState& state) {
  for (size_t rank = 0; rank < state.rng_states.size(); ++rank) {
    const auto& rng = state.rng_states[rank];
    writer.add_array(kLearnerRngPrefix + std::to_string(rank), storage::DType::UInt8,
                     {static_cast<std::int64_t>(rng.size())}, rng.data(), rng.size());
  }
  // At least one bucket, so that the array always exists.
  std::vector<std::int64_t> lags = state.staleness.tokens_by_lag;
  if (lags.empty()) lags.push_back(0);
  writer.add_array(kLagArray, storage::DType::Int64, {static_cast<std::int64_t>(lags.size())}, lags.data(),
                   lags.size() * sizeof(std::int64_t));
  writer.set_attribute(kTakenGroups, state.staleness.taken_groups);
  writer.set_attribute(kDroppedGroups, state.staleness.dropped_groups);
  writer.set_attribute(
      kActorRngScheme,
      std::string(settings.deterministic ? "counter-based: splitmix64(run seed, task seed, sample index) per episode, "
                                           "token position as the counter; no state to save"
                                         : "counter-based: splitmix64(episode id, run seed) per episode, token "
                                           "position as the counter; no state to save"));
  writer.set_attribute(storage::attribute_key::kLearnerStep, state.step);
  writer.set_attribute(storage::attribute_key::kPolicyVersion, state.version);
  writer.set_attribute("coordinator.next_group", state.next_group);
  writer.set_attribute("coordinator.next_seed", state.next_seed);
  if (!state.coordinator_books.empty()) writer.set_attribute(kCoordinatorBooks, state.coordinator_books);
  writer.set_attribute(storage::attribute_key::kConfigToml, settings.config_toml);
  writer.set_attribute(std::string(storage::attribute_key::kMetricPrefix) + "reward_mean", state.reward_mean);
}

// Reads one complete version, in whatever expert layout it was saved, into
// the policy (and value head and optimizer) in this learner's layout; checks
// every array first, so nothing is half-loaded.
LearnerState read_version(const storage::CheckpointStore& store, std::int64_t version, model::PolicyImpl& policy,
                          torch::optim::Optimizer* optimizer, torch::nn::Module* value_head) {
  const storage::ShardedVersion shards(store, version);
  const ExpertLayout layout = expert_layout(policy);
  const auto arrays = trained_arrays(policy, value_head);
  try {
    if (shards.experts() != 0 && shards.experts() != layout.experts)
      throw storage::CheckpointError("it has " + std::to_string(shards.experts()) + " experts per MoE layer");
    read_trained_arrays(shards, arrays, layout);
    if (optimizer) read_optimizer_state(shards, *optimizer, arrays, layout);
  } catch (const storage::CheckpointError& error) {
    throw storage::CheckpointError("cannot load " + shards.label() + " (saved " + shards.layout_text() + ") into " +
                                   layout.text() + ": " + error.what());
  }
  const storage::CheckpointReader& reader = shards.primary();
  LearnerState state;
  state.step = reader.int_attribute(storage::attribute_key::kLearnerStep);
  state.version = reader.int_attribute(storage::attribute_key::kPolicyVersion);
  state.next_group = reader.int_attribute("coordinator.next_group");
  state.next_seed = reader.int_attribute("coordinator.next_seed");
  if (reader.has_attribute(storage::attribute_key::kProgramVersion))
    state.program_version = reader.string_attribute(storage::attribute_key::kProgramVersion);
  // Older checkpoints lack what follows; a resume from them starts these afresh.
  if (reader.has_attribute(kCoordinatorBooks)) state.coordinator_books = reader.string_attribute(kCoordinatorBooks);
  if (reader.has_attribute(kTakenGroups)) state.staleness.taken_groups = reader.int_attribute(kTakenGroups);
  if (reader.has_attribute(kDroppedGroups)) state.staleness.dropped_groups = reader.int_attribute(kDroppedGroups);
  if (reader.find(kLagArray)) {
    const std::vector<std::uint8_t> bytes = reader.read(kLagArray);
    state.staleness.tokens_by_lag.resize(bytes.size() / sizeof(std::int64_t));
    std::memcpy(state.staleness.tokens_by_lag.data(), bytes.data(), bytes.size());
  }
  for (int rank = 0; reader.find(kLearnerRngPrefix + std::to_string(rank)); ++rank)
    state.rng_states.push_back(reader.read(kLearnerRngPrefix + std::to_string(rank)));
  return state;
}

}  // namespace

void StalenessAccount::add_tokens(std::int64_t lag, std::int64_t count) {
  if (lag < 0 || count <= 0) return;
  const auto index = static_cast<size_t>(std::min<std::int64_t>(lag, kLagBuckets - 1));
  if (tokens_by_lag.size() <= index) tokens_by_lag.resize(index + 1, 0);
  tokens_by_lag[index] += count;
}

void StalenessAccount::add(const StalenessAccount& other) {
  taken_groups += other.taken_groups;
  dropped_groups += other.dropped_groups;
  for (size_t lag = 0; lag < other.tokens_by_lag.size(); ++lag)
    add_tokens(static_cast<std::int64_t>(lag), other.tokens_by_lag[lag]);
}

bool StalenessAccount::operator==(const StalenessAccount& other) const {
  auto trimmed = [](std::vector<std::int64_t> v) {
    while (!v.empty() && v.back() == 0) v.pop_back();
    return v;
  };
  return taken_groups == other.taken_groups && dropped_groups == other.dropped_groups &&
         trimmed(tokens_by_lag) == trimmed(other.tokens_by_lag);
}

CheckpointSettings checkpoint_settings(const config::Config& config) {
  CheckpointSettings settings;
  settings.checkpoint = config.checkpoint;
  settings.directory =
      config.checkpoint.directory.empty() ? config.run_directory() + "/checkpoints" : config.checkpoint.directory;
  settings.config_toml = config::to_toml(config);
  settings.deterministic = config.run.deterministic;
  settings.metrics_path = config.metrics_path();
  settings.env_archive_dir = config.env_archive_directory();
  settings.crash_point = config.faults.checkpoint_crash_point;
  settings.crash_version = config.faults.checkpoint_crash_version;
  return settings;
}

std::vector<std::uint8_t> cpu_generator_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor state = generator.get_state().contiguous();
  const auto* data = state.data_ptr<std::uint8_t>();
  return std::vector<std::uint8_t>(data, data + state.numel());
}

void set_cpu_generator_state(const std::vector<std::uint8_t>& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  at::Tensor tensor = torch::empty({static_cast<std::int64_t>(state.size())}, torch::kUInt8);
  std::memcpy(tensor.data_ptr<std::uint8_t>(), state.data(), state.size());
  generator.set_state(tensor);
}

std::uint64_t save_checkpoint(const CheckpointSettings& settings, model::PolicyImpl& policy,
                              torch::optim::Optimizer& optimizer, const LearnerState& state,
                              const storage::FaultInjection& faults, std::optional<std::int64_t> latest_expected,
                              torch::nn::Module* value_head, const ShardGroup& group) {
  const ExpertLayout layout = saving_layout(policy, group);
  storage::StoreOptions options;
  options.faults = faults;
  storage::CheckpointStore store(settings.directory, options);
  std::filesystem::create_directories(store.directory());
  auto writer = store.shard_writer(state.version, layout.member, layout.members);
  const auto arrays = trained_arrays(policy, value_head);
  std::vector<std::string> split = add_trained_arrays(*writer, arrays, layout);
  const std::vector<std::string> split_moments = add_optimizer_state(*writer, optimizer, arrays, layout);
  split.insert(split.end(), split_moments.begin(), split_moments.end());
  if (layout.experts > 0)
    storage::write_expert_split(*writer, {layout.member, layout.members, layout.experts, layout.rows, split});
  if (layout.member == 0) add_learner_state(*writer, settings, state);
  const std::uint64_t bytes = writer->commit();
  if (group.members && group.members->size() > 1) {
    // Member 0 completes the version only once every shard is in place.
    try {
      group.members->barrier(group.timeout_s);
    } catch (const Error& error) {
      throw Error("checkpoint version " + std::to_string(state.version) + ": member " + std::to_string(layout.member) +
                  " committed its shard, but the shard group '" + group.members->name() +
                  "' did not all arrive within " + std::to_string(group.timeout_s) + " s: " + error.what());
    }
  }
  if (layout.member != 0) return bytes;
  if (!store.complete_version(state.version, layout.members, true, latest_expected)) {
    const std::optional<std::int64_t> latest = store.latest();
    spdlog::warn("checkpoint version {}: `latest` was moved to {} during the save; leaving it there", state.version,
                 latest ? storage::CheckpointStore::version_label(*latest) : std::string("nothing"));
  }
  store.apply_retention(static_cast<int>(settings.checkpoint.keep_last), state.version);
  return bytes;
}

std::optional<LearnerState> load_checkpoint(const std::string& run_store, const std::string& spec,
                                            model::PolicyImpl& policy, torch::optim::Optimizer* optimizer,
                                            torch::nn::Module* value_head) {
  std::string directory = run_store;
  std::string which = "latest";
  if (spec != "auto") {
    const auto colon = spec.rfind(':');
    directory = colon == std::string::npos ? spec : spec.substr(0, colon);
    if (colon != std::string::npos) which = spec.substr(colon + 1);
  }
  if (!std::filesystem::exists(directory)) {
    if (spec == "auto") return std::nullopt;
    throw Error("--resume " + spec + ": no checkpoint store at '" + directory + "'");
  }
  storage::CheckpointStore store(directory);
  std::int64_t version = 0;
  if (which == "latest") {
    const storage::ResumeChoice choice = store.resume_choice();
    if (!choice.version) {
      if (spec == "auto" && choice.skipped.empty()) return std::nullopt;
      throw Error("no valid checkpoint in '" + directory + "': " + choice.describe());
    }
    if (choice.noteworthy()) {
      std::istringstream lines(choice.describe());
      for (std::string line; std::getline(lines, line);) spdlog::warn("resume: {}", line);
    }
    version = *choice.version;
  } else {
    version = store.resolve(which);
  }
  const LearnerState state = read_version(store, version, policy, optimizer, value_head);
  if (!state.program_version.empty() && state.program_version != storage::program_version())
    spdlog::warn("resume: {} was written by {}, this is {}", store.shard_path(version, 0), state.program_version,
                 storage::program_version());
  spdlog::info("resumed from {} version {} (learner step {})", directory, state.version, state.step);
  return state;
}

LearnerState load_checkpoint_version(const std::string& directory, std::int64_t version, model::PolicyImpl& policy,
                                     torch::optim::Optimizer* optimizer, torch::nn::Module* value_head) {
  const storage::CheckpointStore store(directory);
  return read_version(store, version, policy, optimizer, value_head);
}

// ---------------------------------------------------------------------------
CheckpointSchedule::CheckpointSchedule(CheckpointSettings settings)
    : settings_(std::move(settings)), last_save_s_(runtime::monotonic_seconds()) {
  const config::CheckpointSection& c = settings_.checkpoint;
  if (!c.archive_directory.empty())
    archiver_ = std::make_unique<storage::Archiver>(settings_.directory, c.archive_directory,
                                                    static_cast<int>(c.archive_keep_last));
}

CheckpointSchedule::~CheckpointSchedule() = default;

bool CheckpointSchedule::due(std::int64_t step) const {
  const auto& c = settings_.checkpoint;
  if (c.every_steps > 0 && step % c.every_steps == 0) return true;
  return c.every_minutes > 0 && runtime::monotonic_seconds() - last_save_s_ >= 60 * c.every_minutes;
}

void CheckpointSchedule::save(model::PolicyImpl& policy, torch::optim::Optimizer& optimizer, const LearnerState& state,
                              torch::nn::Module* value_head, const ShardGroup& group) {
  storage::FaultInjection faults;
  const std::int64_t crash = settings_.crash_version;
  const bool this_save = crash < 0 ? saves_ == 0 : crash == state.version;
  if (settings_.crash_point != config::CheckpointCrashPoint::None && this_save) {
    faults.point = fault_point(settings_.crash_point);
    faults.action = storage::FaultAction::Exit;
    spdlog::warn("[faults] checkpoint_crash_point: the save of version {} will stop at {}", state.version,
                 storage::fault_point_name(faults.point));
  }
  const double started = runtime::monotonic_seconds();
  std::uint64_t bytes = 0;
  try {
    bytes = save_checkpoint(settings_, policy, optimizer, state, faults, expected_latest_, value_head, group);
  } catch (...) {
    telemetry::metrics().add("checkpoint.failures");  // seen by a scrape before the job stops
    throw;
  }
  const double seconds = runtime::monotonic_seconds() - started;
  ++saves_;
  // When a rollback raced with this save, `latest` stayed where it was moved
  // to; expecting this version makes the next check notice it.
  expected_latest_ = state.version;
  last_save_s_ = runtime::monotonic_seconds();
  telemetry::metrics().record("checkpoint.save_s", seconds);
  telemetry::metrics().add("checkpoint.bytes", static_cast<double>(bytes));
  telemetry::metrics().set("checkpoint.last_version", static_cast<double>(state.version));
  telemetry::metrics().set("checkpoint.last_success_time_s", telemetry::unix_time_seconds());
  spdlog::info("checkpoint version {} saved in {:.2f} s ({:.1f} MB, {:.2f} GB/s)", state.version, seconds,
               static_cast<double>(bytes) / 1e6, static_cast<double>(bytes) / 1e9 / std::max(seconds, 1e-9));
  // Member 0 completes the version, so only it knows when there is one to copy.
  const bool completes = group.members == nullptr || group.members->rank() == 0;
  if (archiver_ && completes) archive_after_save(state.version);
}

void CheckpointSchedule::archive_after_save(std::int64_t version) {
  collect_archive_results(false);
  archive_jobs_.push_back(archiver_->archive_copy(version));
  const std::string& metrics = settings_.metrics_path;
  std::error_code ec;
  if (fs::exists(metrics, ec))
    archive_jobs_.push_back(archiver_->archive_file(metrics, "metrics/" + fs::path(metrics).filename().string()));
  // Environment snapshots: copy the files that are new or grew since the last time.
  const std::string& env_dir = settings_.env_archive_dir;
  if (!fs::is_directory(env_dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(env_dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string name = entry.path().filename().string();
    const std::uintmax_t size = entry.file_size(ec);
    if (ec || archived_env_files_[name] == size) continue;
    archived_env_files_[name] = size;
    archive_jobs_.push_back(archiver_->archive_file(entry.path().string(), "env/" + name));
  }
}

void CheckpointSchedule::collect_archive_results(bool wait) {
  for (auto it = archive_jobs_.begin(); it != archive_jobs_.end();) {
    if (!wait && it->wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      ++it;
      continue;
    }
    try {
      const storage::ArchiveResult result = it->get();
      spdlog::debug("archived {} to {} ({} bytes, {:.2f} s)", result.what, result.destination, result.bytes,
                    result.seconds);
      telemetry::metrics().add("checkpoint.archived_bytes", static_cast<double>(result.bytes));
    } catch (const std::exception& error) {
      // A copy that fails (a version retention already deleted, a full
      // disk) does not stop training; finish() reports them together.
      spdlog::warn("archive: {}", error.what());
      telemetry::metrics().add("checkpoint.archive_failures");
      archive_errors_.push_back(error.what());
    }
    it = archive_jobs_.erase(it);
  }
}

std::optional<std::int64_t> CheckpointSchedule::rollback_request() const {
  std::error_code ec;
  if (!expected_latest_ || !fs::is_directory(settings_.directory, ec)) return std::nullopt;
  try {
    const std::optional<std::int64_t> latest = storage::CheckpointStore(settings_.directory).latest();
    if (latest && *latest != *expected_latest_) return latest;
  } catch (const Error& error) {
    spdlog::warn("checkpoint store {}: {}", settings_.directory, error.what());
  }
  return std::nullopt;
}

void CheckpointSchedule::accept_latest() {
  expected_latest_.reset();
  std::error_code ec;
  if (!fs::is_directory(settings_.directory, ec)) return;
  try {
    expected_latest_ = storage::CheckpointStore(settings_.directory).latest();
  } catch (const Error& error) {
    spdlog::warn("checkpoint store {}: {}", settings_.directory, error.what());
  }
}

void CheckpointSchedule::finish() {
  if (!archiver_) return;
  const double started = runtime::monotonic_seconds();
  if (!archiver_->wait_idle_for(settings_.checkpoint.archive_wait_s))
    throw Error("archive: " + std::to_string(archiver_->pending()) + " copies into '" +
                settings_.checkpoint.archive_directory + "' still unfinished after [checkpoint] archive_wait_s = " +
                std::to_string(settings_.checkpoint.archive_wait_s) + " s");
  collect_archive_results(true);
  spdlog::info("archive: copies in {} complete (waited {:.1f} s at the end; {} failed)",
               settings_.checkpoint.archive_directory, runtime::monotonic_seconds() - started, archive_errors_.size());
}

}  // namespace moerl::learner
