#include "moerl/setup/config_loading.h"

#include "moerl/hf/hf_config.h"
#include "moerl/text/episode_format.h"

namespace moerl::setup {
namespace {

std::vector<config::ConfigIssue> apply_model_source(config::Config& config) {
  try {
    hf::apply_hf_source(config);
    return {};
  } catch (const hf::HfConfigError& error) {
    return {config.issue("model.source", error.what())};
  }
}

std::vector<config::ConfigIssue> check_chat(const config::Config& config) {
  if (text::episode_format_undecided(config.model, config.chat)) return {};  // see check_episode_format
  try {
    text::make_episode_format(config.model, config.chat);
    return {};
  } catch (const text::EpisodeFormatError& error) {
    return {config.issue(error.key(), error.what())};
  }
}

}  // namespace

const config::ConfigResolvers& config_resolvers() {
  static const config::ConfigResolvers resolvers{apply_model_source, check_chat};
  return resolvers;
}

config::Config load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  return config::load_config_file(path, overrides, config_resolvers());
}

config::Config load_config_text(const std::string& text, const std::string& source_name,
                                const std::vector<std::string>& overrides) {
  return config::load_config_text(text, source_name, overrides, config_resolvers());
}

void check_episode_format(const config::Config& config) {
  // Every other layout fault was found when the file loaded (check_chat);
  // only "auto" without a tokenizer is left, and it fails before any file is read.
  if (!text::episode_format_undecided(config.model, config.chat)) return;
  try {
    text::make_episode_format(config.model, config.chat);
  } catch (const text::EpisodeFormatError& error) {
    throw config::ConfigError({config.issue(error.key(), error.what())});
  }
}

}  // namespace moerl::setup
