#include "moerl/learner/checkpointing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <type_traits>

#include "moerl/config/config.h"
#include "moerl/core/check.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/storage/archive.h"
#include "moerl/storage/checkpoint_store.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLegacyOptimizerArray = "optimizer/torch_state";
constexpr const char* kLagArray = "state/staleness/tokens_by_lag";
constexpr const char* kTakenGroups = "staleness.taken_groups";
constexpr const char* kDroppedGroups = "staleness.dropped_groups";
constexpr const char* kLearnerRngPrefix = "rng/learner";
constexpr const char* kActorRngScheme = "rng.actors";
constexpr const char* kCoordinatorBooks = "coordinator.books";

// The optimizer's per-parameter state key: a string in LibTorch 1.x, the
// TensorImpl pointer in 2.x. The 1.x string is the pointer streamed to an
// ostream (what 1.x's c10::guts::to_string did; 2.x removed that helper).
template <typename Map>
typename Map::key_type state_key(const Map&, const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

std::string optimizer_prefix(size_t group, size_t index) {
  return "optimizer/group" + std::to_string(group) + "/param" + std::to_string(index) + "/";
}

void add_tensor(storage::CheckpointWriter& writer, const std::string& name, const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  writer.add_array(name, storage::DType::Float32, storage::Shape(c.sizes().begin(), c.sizes().end()), c.data_ptr(),
                   static_cast<size_t>(c.numel()) * sizeof(float));
}

// AdamW's state as plain arrays, one set per parameter (by param group and
// position, so the value head of PPO is covered too): step, exp_avg,
// exp_avg_sq. Plain arrays, unlike LibTorch's own serialisation (a
// TorchScript archive with per-save unique names), are bitwise reproducible,
// comparable by `moerl checkpoint diff`, and independent of the LibTorch version.
void add_optimizer_state(storage::CheckpointWriter& writer, torch::optim::Optimizer& optimizer) {
  auto& states = optimizer.state();
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto it = states.find(state_key(states, params[i]));
      if (it == states.end()) continue;  // never stepped
      const auto* adam = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
      MOERL_CHECK(adam != nullptr, "checkpoints hold AdamW optimizer state only");
      const std::string prefix = optimizer_prefix(g, i);
      const std::int64_t step = adam->step();
      writer.add_array(prefix + "step", storage::DType::Int64, {}, &step, sizeof step);
      add_tensor(writer, prefix + "exp_avg", adam->exp_avg());
      add_tensor(writer, prefix + "exp_avg_sq", adam->exp_avg_sq());
      if (adam->max_exp_avg_sq().defined()) add_tensor(writer, prefix + "max_exp_avg_sq", adam->max_exp_avg_sq());
    }
  }
}

torch::Tensor read_like(const storage::CheckpointReader& reader, const std::string& name, const torch::Tensor& like) {
  // check_arrays names file and dataset when dtype or shape differ from the
  // parameter's; the data then goes straight into the tensor (no staging
  // buffer to zero and copy: 2 of every 3 arrays of a checkpoint are these).
  reader.check_arrays(
      {storage::ArraySpec{name, storage::DType::Float32, storage::Shape(like.sizes().begin(), like.sizes().end())}});
  torch::Tensor t = torch::empty(like.sizes(), torch::kFloat32);
  reader.read_into(name, t.data_ptr(), static_cast<size_t>(t.numel()) * sizeof(float));
  return t.to(like.options());
}

void read_optimizer_state(const storage::CheckpointReader& reader, torch::optim::Optimizer& optimizer) {
  auto& states = optimizer.state();
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string prefix = optimizer_prefix(g, i);
      const auto key = state_key(states, params[i]);
      if (!reader.find(prefix + "step")) {
        states.erase(key);
        continue;
      }
      std::int64_t step = 0;
      reader.read_into(prefix + "step", &step, sizeof step);
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(step);
      state->exp_avg(read_like(reader, prefix + "exp_avg", params[i]));
      state->exp_avg_sq(read_like(reader, prefix + "exp_avg_sq", params[i]));
      if (reader.find(prefix + "max_exp_avg_sq"))
        state->max_exp_avg_sq(read_like(reader, prefix + "max_exp_avg_sq", params[i]));
      states[key] = std::move(state);
    }
  }
}

// Checkpoints written before the array layout: LibTorch's serialisation as bytes.
void load_optimizer_bytes(torch::optim::Optimizer& optimizer, const std::vector<std::uint8_t>& bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

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

// Every trained tensor under its array name: the policy's under "model/",
// PPO's value head (when there is one) under "value_head/".
std::vector<std::pair<std::string, torch::Tensor>> trained_arrays(model::PolicyImpl& policy,
                                                                  torch::nn::Module* value_head) {
  std::vector<std::pair<std::string, torch::Tensor>> arrays;
  for (const auto& item : policy.named_parameters()) arrays.emplace_back("model/" + item.key(), item.value());
  if (value_head)
    for (const auto& item : value_head->named_parameters())
      arrays.emplace_back("value_head/" + item.key(), item.value());
  return arrays;
}

// Reads one complete version into the policy (and value head and optimizer);
// checks every array against it first, so nothing is half-loaded.
LearnerState read_version(const storage::CheckpointStore& store, std::int64_t version, model::PolicyImpl& policy,
                          torch::optim::Optimizer* optimizer, torch::nn::Module* value_head) {
  const storage::CheckpointReader reader = store.open_shard(version, 0);
  const auto arrays = trained_arrays(policy, value_head);
  std::vector<storage::ArraySpec> expected;
  for (const auto& [name, tensor] : arrays)
    expected.push_back({name, storage::DType::Float32, storage::Shape(tensor.sizes().begin(), tensor.sizes().end())});
  reader.check_arrays(expected);
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : arrays) {
      torch::Tensor p = tensor;
      const size_t bytes = static_cast<size_t>(p.numel()) * sizeof(float);
      if (p.device().is_cpu() && p.scalar_type() == torch::kFloat32 && p.is_contiguous()) {
        reader.read_into(name, p.data_ptr(), bytes);
      } else {
        // A parameter on a device (or in another dtype): through a host buffer.
        torch::Tensor host = torch::empty(p.sizes(), torch::kFloat32);
        reader.read_into(name, host.data_ptr(), bytes);
        p.copy_(host);
      }
    }
  }
  if (optimizer) {
    if (reader.find(kLegacyOptimizerArray)) {
      load_optimizer_bytes(*optimizer, reader.read(kLegacyOptimizerArray));
    } else {
      read_optimizer_state(reader, *optimizer);
    }
  }
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
                              torch::nn::Module* value_head) {
  storage::StoreOptions options;
  options.faults = faults;
  storage::CheckpointStore store(settings.directory, options);
  std::filesystem::create_directories(store.directory());
  auto writer = store.shard_writer(state.version, 0, 1);
  for (const auto& [name, tensor] : trained_arrays(policy, value_head)) {
    // Host float32 bytes whatever the device: a CPU float32 parameter as it
    // is, a device one copied to the host one tensor at a time.
    const torch::Tensor p = tensor.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    writer->add_array(name, storage::DType::Float32, storage::Shape(p.sizes().begin(), p.sizes().end()), p.data_ptr(),
                      static_cast<size_t>(p.numel()) * sizeof(float));
  }
  add_optimizer_state(*writer, optimizer);
  for (size_t rank = 0; rank < state.rng_states.size(); ++rank) {
    const auto& rng = state.rng_states[rank];
    writer->add_array(kLearnerRngPrefix + std::to_string(rank), storage::DType::UInt8,
                      {static_cast<std::int64_t>(rng.size())}, rng.data(), rng.size());
  }
  // At least one bucket, so that the array always exists.
  std::vector<std::int64_t> lags = state.staleness.tokens_by_lag;
  if (lags.empty()) lags.push_back(0);
  writer->add_array(kLagArray, storage::DType::Int64, {static_cast<std::int64_t>(lags.size())}, lags.data(),
                    lags.size() * sizeof(std::int64_t));
  writer->set_attribute(kTakenGroups, state.staleness.taken_groups);
  writer->set_attribute(kDroppedGroups, state.staleness.dropped_groups);
  writer->set_attribute(
      kActorRngScheme,
      std::string(settings.deterministic ? "counter-based: splitmix64(run seed, task seed, sample index) per episode, "
                                           "token position as the counter; no state to save"
                                         : "counter-based: splitmix64(episode id, run seed) per episode, token "
                                           "position as the counter; no state to save"));
  writer->set_attribute(storage::attribute_key::kLearnerStep, state.step);
  writer->set_attribute(storage::attribute_key::kPolicyVersion, state.version);
  writer->set_attribute("coordinator.next_group", state.next_group);
  writer->set_attribute("coordinator.next_seed", state.next_seed);
  if (!state.coordinator_books.empty()) writer->set_attribute(kCoordinatorBooks, state.coordinator_books);
  writer->set_attribute(storage::attribute_key::kConfigToml, settings.config_toml);
  writer->set_attribute(std::string(storage::attribute_key::kMetricPrefix) + "reward_mean", state.reward_mean);
  const std::uint64_t bytes = writer->commit();
  if (!store.complete_version(state.version, 1, true, latest_expected)) {
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
                              torch::nn::Module* value_head) {
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
    bytes = save_checkpoint(settings_, policy, optimizer, state, faults, expected_latest_, value_head);
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
  if (archiver_) archive_after_save(state.version);
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
