#pragma once
// A run configuration: one TOML file, parsed once into typed sections,
// validated before any work starts, then read-only.

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moerl/config/config_error.h"
#include "moerl/config/sections.h"

namespace moerl::config {

// Where each "section.key" was set: file and line, or the --set option.
struct KeyOrigin {
  std::string source;
  int line = 0;
};

struct Config {
  RunSection run;
  ClusterSection cluster;
  ModelSection model;
  ChatSection chat;
  MoeSection moe;
  TelemetrySection telemetry;
  RolloutSection rollout;
  AlgoSection algo;
  OptimSection optim;
  SyncSection sync;
  PretrainSection pretrain;
  CheckpointSection checkpoint;
  EvalSection eval;
  EnvSection env;
  EnvFamilySections env_families;  // one per built-in family and "external"
  ExternalEnvSection env_external;
  FaultsSection faults;

  Config();

  std::string source_path;                   // the file it was loaded from ("" for defaults)
  std::map<std::string, KeyOrigin> origins;  // only keys that were set explicitly

  // A ConfigIssue for `key` located where the key was set (or at the file).
  ConfigIssue issue(const std::string& key, const std::string& message) const;
  // The run directory: run.output_dir/run.name.
  std::string run_directory() const;
  // Learner 0's metrics lines: <run dir>/telemetry.metrics_file.
  std::string metrics_path() const;
  // Where env workers archive session snapshots: env.archive_dir, or <run dir>/archive/env.
  std::string env_archive_directory() const;
};

// The families that have an [env.<name>] section.
const std::vector<std::string>& env_family_names();

// What the modules above config add to loading a file (setup/config_loading.h
// supplies both): reading a [model] source = "hf:DIR" into the architecture
// keys before the cross-field checks judge them, and checking [chat] against
// the tokenizer after them. Each returns its issues; either may be empty.
struct ConfigResolvers {
  std::function<std::vector<ConfigIssue>(Config&)> apply_model_source;
  std::function<std::vector<ConfigIssue>(const Config&)> check_chat;
};

// Parses and validates. `overrides` are "section.key=value" strings from
// --set; values are TOML literals, and bare words are taken as strings.
// Throws ConfigError listing every problem found; a path that is missing, a
// directory or unreadable is one issue naming the path (with an empty key).
// Without resolvers an hf: source is not read and [chat] is not checked
// against a tokenizer: what a job runs with comes from setup::load_config_*.
Config load_config_file(const std::string& path, const std::vector<std::string>& overrides = {},
                        const ConfigResolvers& resolvers = {});
Config load_config_text(const std::string& text, const std::string& source_name,
                        const std::vector<std::string>& overrides = {}, const ConfigResolvers& resolvers = {});

// Checks that need the MPI world: the [cluster] rank counts must add up to it.
void check_world_size(const Config& config, int world_size);

// The resolved configuration, every key with its value (defaults included),
// as TOML that load_config_text reads back to an equal Config.
std::string to_toml(const Config& config);

// A hash of every resolved value (not of the file's text): ranks compare it
// to prove they run the same configuration.
std::uint64_t config_fingerprint(const Config& config);

// Markdown table of every section and key: type, default, range, meaning.
std::string reference_markdown();

// "actors" for "actros"; "" when nothing is close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace moerl::config
