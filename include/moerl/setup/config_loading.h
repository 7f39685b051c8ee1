#pragma once
// Loading the configuration a job runs with: config::load_config_* (TOML,
// schema, cross-field checks) plus what needs the modules above config:
//   - [model] source = "hf:DIR": DIR/config.json sets the architecture keys
//     (hf/hf_config.h) before the cross-field checks judge them;
//   - [chat]: the episode format is built once, which loads the tokenizer
//     and checks the layout against it and the model's vocabulary
//     (text/episode_format.h).
// Their faults join the same issue list, located at the key that set them.
// config stays the ground floor: it includes neither hf nor text.

#include <string>
#include <vector>

#include "moerl/config/config.h"

namespace moerl::setup {

const config::ConfigResolvers& config_resolvers();

config::Config load_config_file(const std::string& path, const std::vector<std::string>& overrides = {});
config::Config load_config_text(const std::string& text, const std::string& source_name,
                                const std::vector<std::string>& overrides = {});

// What `moerl train` needs beyond a valid file: a layout for its episodes.
// Layout "auto" on an hf: directory without tokenizer.json loads (`moerl
// eval --tokens` renders no episode), but RL cannot start with it; throws
// ConfigError naming chat.layout.
void check_episode_format(const config::Config& config);

}  // namespace moerl::setup
