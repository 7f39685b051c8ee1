// `moerl train`: MPI bootstrap, configuration agreement, roles, then the run.

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cmath>
#include <iostream>
#include <optional>

#include <spdlog/spdlog.h>

#include "commands.h"
#include "moerl/config/config.h"
#include "moerl/learner/roles.h"
#include "moerl/runtime/dry_run.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/heartbeat.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/logging.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/mpi_session.h"
#include "moerl/runtime/rank_record.h"
#include "moerl/runtime/world.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::app {
namespace {

// Every rank loads and validates the configuration on its own (same file,
// same result), then all agree through one all-reduce: if any rank failed,
// the lowest such rank prints its errors and every rank exits with status 2.
// The collective is reached by every rank whatever happened, so a rank that
// could not read the file (a missing mount on one node) cannot leave the
// others waiting.
std::optional<config::Config> load_agreed_config(const TrainOptions& options, int rank, int size) {
  std::vector<std::string> overrides = options.overrides;
  if (!options.log_level.empty()) overrides.push_back("telemetry.log_level=" + options.log_level);
  std::optional<config::Config> loaded;
  std::string error;
  try {
    loaded = config::load_config_file(options.config_path, overrides);
    config::check_world_size(*loaded, size);
    config::check_episode_format(*loaded);
  } catch (const config::ConfigError& e) {
    error = e.what();
    loaded.reset();
  }
  const int mine = error.empty() ? INT_MAX : rank;
  int first_failed = INT_MAX;
  MOERL_MPI_CHECK(MPI_Allreduce(&mine, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first_failed == INT_MAX) return loaded;
  if (rank == first_failed) {
    std::cerr << "moerl: " << error << "\n";
    if (size > 1) std::cerr << "moerl: (reported by rank " << rank << "; every rank stops with status 2)\n";
  }
  return std::nullopt;
}

// Which attempt of the job this is (scripts/launch.sh counts restarts in MOERL_RESTARTS).
int restart_number() {
  const char* restarts = std::getenv("MOERL_RESTARTS");
  return restarts ? std::max(0, std::atoi(restarts)) : 0;
}

runtime::Heartbeat identity(const runtime::World& world) {
  runtime::Heartbeat h;
  h.rank = world.rank();
  h.role = runtime::role_name(world.role());
  h.role_index = world.role_index();
  h.host = world.hostname();
  h.pid = static_cast<std::int64_t>(getpid());
  return h;
}

int run_roles(const config::Config& config, const TrainOptions& options) {
  runtime::World world(config, MPI_COMM_WORLD);
  std::string per_rank_file;
  if (config.telemetry.per_rank_log_files)
    per_rank_file = config.run_directory() + "/logs/rank-" + std::to_string(world.rank()) + ".log";
  runtime::init_logging({config.telemetry.log_level, world.rank(), world.role_label(), per_rank_file});
  telemetry::metrics().set_identity(world.rank(), runtime::role_name(world.role()));
  // Deterministic runs: one thread, so no result depends on the host's core count.
  set_compute_threads(config.run.deterministic ? 1 : world.compute_threads());
  runtime::Mailbox mailbox(world.message_comm(), config.cluster.message_timeout_s);
  if (world.is_coordinator()) spdlog::info("MPI: {}", runtime::mpi_description());
  const int restart = restart_number();
  if (!options.dry_run) runtime::write_rank_record(config.run_directory(), world, restart);
  using Mode = runtime::HeartbeatThread::Mode;
  const Mode mode = options.dry_run ? Mode::ModeQuiet : world.is_coordinator() ? Mode::ModeCoordinator : Mode::ModeMember;
  runtime::HeartbeatThread heartbeat(mailbox, world.layout(), identity(world),
                                     {config.cluster.heartbeat_interval_s, config.cluster.heartbeat_timeout_s, mode});

  if (!options.dry_run) {
    runtime::StopCoordinator stop(mailbox);
    const int status =
        learner::run_role(config, world, mailbox, stop, options.init_path, options.resume, &heartbeat);
    heartbeat.stop_watching();
    // Learner 0 gives up first, so that its status is the job's.
    const double shutdown_s = config.cluster.shutdown_timeout_s * (world.is_coordinator() ? 1 : 2);
    if (!runtime::every_rank_arrives(world.world_comm(), shutdown_s))
      runtime::abort_job(world.role_label(),
                         "not every rank reached the end of the job within " +
                             std::to_string(static_cast<int>(std::ceil(shutdown_s))) +
                             " s ([cluster] shutdown_timeout_s): a rank is frozen or lost; ending the job" +
                             (status == 0 ? std::string() : " (its status: " + std::to_string(status) + ")"),
                         status == 0 ? runtime::kFatalErrorExitStatus : status);
    return status;
  }
  const runtime::DryRunResult result = runtime::run_dry_run(config, world, mailbox);
  if (world.is_coordinator()) std::cout << runtime::format_plan(config, world.layout(), result) << std::flush;
  return 0;
}

}  // namespace

int run_train(const TrainOptions& options) {
  runtime::MpiSession mpi(nullptr, nullptr);
  runtime::install_stop_signal_handlers();
  runtime::init_logging({config::LogLevel::Info, mpi.world_rank(), "", ""});
  const std::optional<config::Config> config =
      load_agreed_config(options, mpi.world_rank(), mpi.world_size());
  if (!config) return config::kConfigErrorExitStatus;
  std::string role_label;
  try {
    role_label = runtime::role_name(runtime::RankLayout(config->cluster).assignment(mpi.world_rank()).role);
    return run_roles(*config, options);
  } catch (const std::exception& error) {
    runtime::abort_job(role_label, error.what());
  }
}

}  // namespace moerl::app
