// `moerl checkpoint export-hf DIR VERSION OUT_DIR`: one version's policy as a
// Hugging Face model directory; and the hidden `import-hf DIR VERSION
// --config F`: the weights of the config's hf: source as a version of a
// store (for testing export-hf end to end without a training run). Neither
// needs LibTorch.

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "checkpoint_command.h"
#include "moerl/config/config.h"
#include "moerl/hf/hf_weights.h"
#include "moerl/setup/config_loading.h"
#include "moerl/storage/checkpoint_store.h"
#include "moerl/storage/expert_shards.h"

namespace moerl::app {

namespace {

using storage::CheckpointStore;

constexpr const char* kModelPrefix = "model/";  // where the learner stores policy parameters

}  // namespace

int run_export_hf(const CheckpointStore& store, const CheckpointOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t version = store.resolve(options.version);
  const std::string label = CheckpointStore::version_label(version);
  // Every shard: an expert-parallel version's expert tensors are gathered
  // whole, so the export is the same whatever layout the version was saved in.
  const storage::ShardedVersion reader(store, version);
  // The run's resolved configuration decides the architecture (and, for an
  // hf: source, where the tokenizer files are).
  const config::Config config =
      setup::load_config_text(reader.primary().string_attribute(storage::attribute_key::kConfigToml),
                              store.directory() + "/" + label + " (config_toml)");
  const std::vector<hf::ParameterShape> shapes = hf::policy_parameter_shapes(config.model, config.moe);
  std::vector<storage::ArraySpec> expected;
  for (const auto& s : shapes) expected.push_back({kModelPrefix + s.name, storage::DType::Float32, s.shape});
  reader.check_arrays(expected);  // one error listing every difference, before any reading
  std::vector<std::vector<float>> values;
  std::vector<hf::ParameterView> views;
  values.reserve(shapes.size());
  for (const auto& s : shapes) {
    const std::vector<std::uint8_t> bytes = reader.read(kModelPrefix + s.name);
    values.emplace_back(bytes.size() / sizeof(float));
    std::memcpy(values.back().data(), bytes.data(), bytes.size());
    views.push_back({s.name, s.shape, values.back().data()});
  }
  const auto shard_bytes = static_cast<std::uint64_t>(options.shard_mb * 1024.0 * 1024.0);
  if (shard_bytes == 0) throw storage::CheckpointError("--shard-mb must be positive");
  const hf::ExportResult result = hf::export_hf_model(views, config.model, config.moe, options.out_path, shard_bytes);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("exported %s as %s to %s: %zu tensors, %.1f MiB in %zu shard(s), %.2f s", label.c_str(),
              hf::architecture_class(result.architecture), options.out_path.c_str(), result.tensors,
              static_cast<double>(result.tensor_bytes) / (1024.0 * 1024.0), result.shards.size(), seconds);
  if (!result.copied.empty()) {
    std::printf("; copied");
    for (const auto& f : result.copied) std::printf(" %s", f.c_str());
  }
  std::printf("\n");
  return 0;
}

int run_import_hf(CheckpointStore& store, const CheckpointOptions& options) {
  const config::Config config = setup::load_config_file(options.config_path);
  const std::string dir = hf::hf_directory(config.model.source);
  if (dir.empty()) throw storage::CheckpointError(options.config_path + ": [model] source is not an hf: directory");
  const std::int64_t version = std::stoll(options.version);
  const std::vector<hf::OwnedParameter> parameters = hf::read_hf_parameters(dir, config.model, config.moe);
  std::filesystem::create_directories(store.directory());
  auto writer = store.shard_writer(version, 0, 1);
  for (const auto& p : parameters) {
    writer->add_array(kModelPrefix + p.name, storage::DType::Float32, p.shape, p.values.data(),
                      p.values.size() * sizeof(float));
  }
  writer->set_attribute(storage::attribute_key::kLearnerStep, std::int64_t{0});
  writer->set_attribute(storage::attribute_key::kPolicyVersion, version);
  writer->set_attribute(storage::attribute_key::kConfigToml, config::to_toml(config));
  writer->commit();
  store.complete_version(version, 1, true);
  std::cout << "imported " << dir << " as " << CheckpointStore::version_label(version) << " of " << store.directory()
            << " (" << parameters.size() << " parameters)\n";
  return 0;
}

void add_hf_checkpoint_subcommands(CLI::App& checkpoint_cmd, CheckpointOptions& options) {
  auto* exported = checkpoint_cmd.add_subcommand(
      "export-hf",
      "Write one version's policy as a Hugging Face model directory (config.json, sharded "
      "safetensors + index, the hf: source's tokenizer files)");
  exported->add_option("dir", options.dir, "Checkpoint directory (RUN_DIR/checkpoints)")->required();
  exported->add_option("version", options.version, "Version or tag")->required();
  exported->add_option("out", options.out_path, "Output directory")->required();
  exported->add_option("--shard-mb", options.shard_mb, "Largest shard, in MiB of tensor data (default 2048)");
  exported->callback([&options] { options.action = "export-hf"; });

  auto* imported = checkpoint_cmd.add_subcommand(
      "import-hf", "Write the weights of the config's hf: source as VERSION (a tool for testing export-hf)");
  imported->add_option("dir", options.dir, "Checkpoint directory")->required();
  imported->add_option("version", options.version, "Version number")->required()->check(CLI::NonNegativeNumber);
  imported->add_option("-c,--config", options.config_path, "Run configuration with [model] source = \"hf:DIR\"")
      ->required();  // load_config_file refuses a missing file (status 2)
  imported->callback([&options] { options.action = "import-hf"; });
  imported->group("");  // hidden from --help
}

}  // namespace moerl::app
