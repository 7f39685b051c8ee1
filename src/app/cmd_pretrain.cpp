// `moerl pretrain`: the supervised warm-up of the base policy (one process).

#include <iostream>
#include <thread>

#include "commands.h"
#include "moerl/config/config.h"
#include "moerl/app/roles.h"
#include "moerl/setup/config_loading.h"

namespace moerl::app {

int run_pretrain(const PretrainOptions& options) {
  try {
    const config::Config config = setup::load_config_file(options.config_path, options.overrides);
    set_compute_threads(single_process_threads(options.threads));
    return run_pretrain_command(config, options.init_path);
  } catch (const config::ConfigError& error) {
    std::cerr << error.what() << "\n";
    return config::kConfigErrorExitStatus;
  } catch (const std::exception& error) {
    std::cerr << "moerl pretrain: " << error.what() << "\n";
    return 1;
  }
}

}  // namespace moerl::app
