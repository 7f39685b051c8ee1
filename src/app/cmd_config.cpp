// `moerl config check|show|reference`: no MPI, no LibTorch; safe on a login node.

#include <iostream>

#include "commands.h"
#include "moerl/config/config.h"

namespace moerl::app {

int run_config(const ConfigOptions& options) {
  if (options.action == "reference") {
    std::cout << config::reference_markdown();
    return 0;
  }
  try {
    const config::Config loaded = config::load_config_file(options.config_path, options.overrides);
    if (options.action == "show") {
      std::cout << config::to_toml(loaded);
      return 0;
    }
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
