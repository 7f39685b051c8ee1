// `moerl config check|show|reference`: no MPI, no LibTorch; safe on a login node.

#include <iostream>

#include "commands.h"
#include "moerl/config/config.h"
#include "moerl/config/schema.h"
#include "moerl/setup/config_loading.h"

namespace moerl::app {
namespace {

// `config get`: the value of one key as scripts want it (strings unquoted).
int print_value(const config::Config& loaded, const std::string& key) {
  if (key == "run.directory") {
    std::cout << loaded.run_directory() << "\n";
    return 0;
  }
  if (key == "cluster.ranks") {
    const auto& c = loaded.cluster;
    std::cout << c.learners + c.actors + c.env_workers + c.standby_actors << "\n";
    return 0;
  }
  const auto dot = key.rfind('.');
  const config::SectionSpec* section = dot == std::string::npos ? nullptr : config::find_section(key.substr(0, dot));
  const config::FieldSpec* field = section ? section->find(key.substr(dot + 1)) : nullptr;
  if (field == nullptr) {
    std::cerr << "moerl config get: unknown key '" << key << "'\n";
    return config::kConfigErrorExitStatus;
  }
  std::string text = field->literal(section->locate_const(loaded));
  if (field->type_name == "string" && text.size() >= 2) {
    // Re-read the literal through TOML to undo its quoting and escapes.
    text = toml::parse("v = " + text)["v"].value_or(std::string());
  }
  std::cout << text << "\n";
  return 0;
}

}  // namespace

int run_config(const ConfigOptions& options) {
  if (options.action == "reference") {
    std::cout << config::reference_markdown();
    return 0;
  }
  try {
    const config::Config loaded = setup::load_config_file(options.config_path, options.overrides);
    if (options.action == "show") {
      std::cout << config::to_toml(loaded);
      return 0;
    }
    if (options.action == "get") return print_value(loaded, options.key);
    if (options.ranks > 0) config::check_world_size(loaded, options.ranks);
    const auto& c = loaded.cluster;
    std::cout << options.config_path << ": valid (" << c.learners + c.actors + c.env_workers + c.standby_actors
              << " ranks: " << c.learners << " learners, " << c.actors << " actors, " << c.env_workers
              << " env workers, " << c.standby_actors << " standby actors)\n";
    return 0;
  } catch (const config::ConfigError& error) {
    std::cerr << error.what() << "\n";
    return config::kConfigErrorExitStatus;
  }
}

}  // namespace moerl::app
