#include "moerl/learner/checkpointing.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <sstream>

#include "moerl/config/config.h"
#include "moerl/storage/checkpoint_store.h"

namespace moerl::learner {
namespace {

constexpr const char* kOptimizerArray = "optimizer/torch_state";

std::vector<std::uint8_t> optimizer_bytes(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  const std::string text = out.str();
  return std::vector<std::uint8_t>(text.begin(), text.end());
}

void load_optimizer_bytes(torch::optim::Optimizer& optimizer, const std::vector<std::uint8_t>& bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

}  // namespace

std::string checkpoint_directory(const config::Config& config) {
  return config.checkpoint.directory.empty() ? config.run_directory() + "/checkpoints" : config.checkpoint.directory;
}

void save_checkpoint(const config::Config& config, model::PolicyImpl& policy, torch::optim::Optimizer& optimizer,
                     const LearnerState& state) {
  storage::CheckpointStore store(checkpoint_directory(config));
  std::filesystem::create_directories(store.directory());
  auto writer = store.shard_writer(state.version, 0, 1);
  for (const auto& item : policy.named_parameters()) {
    const torch::Tensor p = item.value().detach().to(torch::kFloat32).contiguous();
    writer->add_array("model/" + item.key(), storage::DType::Float32,
                      storage::Shape(p.sizes().begin(), p.sizes().end()), p.data_ptr(),
                      static_cast<size_t>(p.numel()) * sizeof(float));
  }
  const std::vector<std::uint8_t> optimizer_state = optimizer_bytes(optimizer);
  writer->add_array(kOptimizerArray, storage::DType::UInt8, {static_cast<std::int64_t>(optimizer_state.size())},
                    optimizer_state.data(), optimizer_state.size());
  writer->set_attribute(storage::attribute_key::kLearnerStep, state.step);
  writer->set_attribute(storage::attribute_key::kPolicyVersion, state.version);
  writer->set_attribute("coordinator.next_group", state.next_group);
  writer->set_attribute("coordinator.next_seed", state.next_seed);
  writer->set_attribute(storage::attribute_key::kConfigToml, config::to_toml(config));
  writer->set_attribute(std::string(storage::attribute_key::kMetricPrefix) + "reward_mean", state.reward_mean);
  writer->commit();
  store.complete_version(state.version, 1);
  store.apply_retention(static_cast<int>(config.checkpoint.keep_last));
}

std::optional<LearnerState> load_checkpoint(const config::Config& config, const std::string& spec,
                                            model::PolicyImpl& policy, torch::optim::Optimizer* optimizer) {
  std::string directory = checkpoint_directory(config);
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
    if (!choice.skipped.empty()) spdlog::warn("resume: {}", choice.describe());
    version = *choice.version;
  } else {
    version = store.resolve(which);
  }
  const storage::CheckpointReader reader = store.open_shard(version, 0);
  // Check the whole model against the checkpoint first: nothing is half-loaded.
  std::vector<storage::ArraySpec> expected;
  for (const auto& item : policy.named_parameters())
    expected.push_back({"model/" + item.key(), storage::DType::Float32,
                        storage::Shape(item.value().sizes().begin(), item.value().sizes().end())});
  reader.check_arrays(expected);
  torch::NoGradGuard no_grad;
  for (const auto& item : policy.named_parameters()) {
    torch::Tensor p = item.value();
    reader.read_into("model/" + item.key(), p.data_ptr(), static_cast<size_t>(p.numel()) * sizeof(float));
  }
  if (optimizer) load_optimizer_bytes(*optimizer, reader.read(kOptimizerArray));
  LearnerState state;
  state.step = reader.int_attribute(storage::attribute_key::kLearnerStep);
  state.version = reader.int_attribute(storage::attribute_key::kPolicyVersion);
  state.next_group = reader.int_attribute("coordinator.next_group");
  state.next_seed = reader.int_attribute("coordinator.next_seed");
  spdlog::info("resumed from {} version {} (learner step {})", directory, state.version, state.step);
  return state;
}

}  // namespace moerl::learner
