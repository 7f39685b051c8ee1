// `moerl env play`: a person plays one session in the terminal (or watches
// the scripted expert play it). `moerl env bench` is `moerl bench env`.

#include <iostream>

#include "commands.h"
#include "moerl/config/config.h"
#include "moerl/env/external_environment.h"
#include "moerl/env/task_family.h"
#include "moerl/env/task_mix.h"
#include "moerl/setup/config_loading.h"

namespace moerl::app {

int run_env_play(const EnvPlayOptions& options) {
  try {
    config::Config config;
    if (!options.config_path.empty()) config = setup::load_config_file(options.config_path, options.overrides);
    env::TaskSpec task = env::make_task(config.env, config.env_families, options.family, options.seed);
    if (options.difficulty > 0) task.difficulty = options.difficulty;
    if (options.shaped) task.shaping = env::RewardShaping::Shaped;

    std::unique_ptr<env::Environment> session;
    if (options.family == "external") {
      session = std::make_unique<env::ExternalEnvironment>(env::ExternalEnvOptions{
          config.env_external.command, config.env_external.startup_timeout_s, config.env.timeout_s});
    } else {
      session = env::make_builtin_environment(options.family);
    }
    std::cout << session->open(task) << "\n";
    double total = 0;
    std::uint64_t expert_seed = options.seed * 1000003ull;
    while (!session->done()) {
      std::string action;
      if (options.expert) {
        action = session->expert_action(options.error_rate, ++expert_seed);
        std::cout << "> " << action << "\n";
      } else {
        std::cout << "> " << std::flush;
        if (!std::getline(std::cin, action)) break;
      }
      const env::StepResult result = session->step(action);
      total += result.reward;
      std::cout << result.observation << "   [reward " << result.reward << "]\n";
    }
    std::cout << "episode over after " << session->turns_taken()
              << " turns: " << (session->succeeded() ? "success" : "no success") << ", total reward " << total << "\n";
    return session->succeeded() ? 0 : 1;
  } catch (const config::ConfigError& error) {
    std::cerr << error.what() << "\n";
    return config::kConfigErrorExitStatus;
  } catch (const std::exception& error) {
    std::cerr << "moerl env play: " << error.what() << "\n";
    return 2;
  }
}

}  // namespace moerl::app
