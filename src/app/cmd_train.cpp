// `moerl train`: MPI bootstrap, configuration agreement, roles, then the run.

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include <spdlog/spdlog.h>

#include "commands.h"
#include "moerl/app/rank_device.h"
#include "moerl/app/roles.h"
#include "moerl/config/config.h"
#include "moerl/config/fault_plan.h"
#include "moerl/core/blas_kernels.h"
#include "moerl/core/check.h"
#include "moerl/runtime/dry_run.h"
#include "moerl/runtime/env_join.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/heartbeat.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/logging.h"
#include "moerl/runtime/lost_ranks.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/mpi_session.h"
#include "moerl/runtime/mpi_transport.h"
#include "moerl/runtime/placement.h"
#include "moerl/runtime/rank_record.h"
#include "moerl/runtime/world.h"
#include "moerl/setup/config_loading.h"
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
    loaded = setup::load_config_file(options.config_path, overrides);
    config::check_world_size(*loaded, size);
    setup::check_episode_format(*loaded);
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

// [cluster] placement: the job's communicator in job-rank order. Every rank
// computes the same plan from the same gathered host names, so a layout that
// does not fit fails on all of them alike: the first prints it with the key's
// file and line, and every rank exits with status 2 before any work.
std::unique_ptr<runtime::PlacedWorld> place_ranks(const config::Config& config, int rank, int size) {
  try {
    auto placed = std::make_unique<runtime::PlacedWorld>(config.cluster, MPI_COMM_WORLD);
    if (config.cluster.placement != config::Placement::RankOrder) {
      runtime::set_abort_channel_job_ranks(placed->job_rank_of_launcher_rank());
      set_reported_rank(placed->job_rank());
    }
    return placed;
  } catch (const runtime::PlacementError& error) {
    if (rank == 0) {
      std::cerr << "moerl: " << config.issue(error.key(), error.what()).text() << "\n";
      if (size > 1) std::cerr << "moerl: (every rank stops with status 2)\n";
    }
    return nullptr;
  }
}

// [faults] plan entries for this attempt: a restart resumes past the faults
// of the first one, except those written "on every attempt".
std::vector<config::FaultAction> faults_of_this_attempt(const config::Config& config, int restart) {
  std::vector<config::FaultAction> plan = config::parse_fault_plan(config.faults.plan);
  if (restart > 0)
    plan.erase(std::remove_if(plan.begin(), plan.end(), [](const config::FaultAction& a) { return !a.every_attempt; }),
               plan.end());
  return plan;
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

// Where learner 0 last heard a rank run, for fencing it (EndOfJob::Fence).
std::optional<runtime::EndOfJob::Fence> whereabouts(const runtime::HeartbeatThread& heartbeat, int rank) {
  const std::optional<runtime::Heartbeat> last = heartbeat.last_heartbeat(rank);
  if (!last) return std::nullopt;
  return runtime::EndOfJob::Fence{rank, last->host, last->pid};
}

// "10 s ([cluster] shutdown_timeout_s)": how long the end of the job waited.
std::string within(double seconds) {
  return std::to_string(static_cast<int>(std::ceil(seconds))) + " s ([cluster] shutdown_timeout_s)";
}

// "1 rank(s) did not reach the end of the job within 10 s (...): env_worker 0 (rank 3) (pid 11232 on vm); ..."
std::string describe_missing(const runtime::World& world, const runtime::HeartbeatThread& heartbeat,
                             const std::vector<int>& ranks, double shutdown_s) {
  std::string missing;
  for (int rank : ranks) {
    const runtime::RankAssignment who = world.layout().assignment(rank);
    const std::optional<runtime::EndOfJob::Fence> where = whereabouts(heartbeat, rank);
    missing += (missing.empty() ? "" : ", ") + std::string(runtime::role_name(who.role)) + " " +
               std::to_string(who.index) + " (rank " + std::to_string(rank) + ")" +
               (where ? " (pid " + std::to_string(where->pid) + " on " + where->host + ")" : "");
  }
  return std::to_string(ranks.size()) + " rank(s) did not reach the end of the job within " + within(shutdown_s) +
         ": " + missing + "; killed as frozen or lost";
}

// Kills the lost ranks learner 0 knows of that run on this host (a frozen
// one would hold MPI_Finalize or mpirun).
void fence_lost_ranks(const runtime::World& world) {
  for (const runtime::RankLost& lost : runtime::lost_ranks().all()) runtime::fence(lost, world.hostname());
}

// The end of the job (every_rank_arrives). Ranks that did not arrive are
// frozen or lost and have been fenced. Under a fault-tolerant MPI the others
// finalize without them once MPI has seen them die, and learner 0's status is
// the job's. Without one, MPI_Finalize would wait for them for ever (and a
// killed rank ends the job anyway): learner 0 ends the job with its status.
int finish_job(const runtime::World& world, runtime::Mailbox& mailbox, runtime::HeartbeatThread& heartbeat,
               double shutdown_timeout_s, int status) {
  heartbeat.stop_watching();
  // Learner 0 gives up first, so that its status is the job's.
  const double shutdown_s = shutdown_timeout_s * (world.is_coordinator() ? 1 : 2);
  const runtime::EndOfJobResult end = runtime::every_rank_arrives(
      mailbox, shutdown_s, world.hostname(), [&heartbeat](int rank) { return whereabouts(heartbeat, rank); });
  const int failed_status = status == 0 ? runtime::kFatalErrorExitStatus : status;
  if (!world.is_coordinator() && !end.complete)
    runtime::abort_job(world.role_label(),
                       "learner 0 did not answer at the end of the job within " + within(shutdown_s), failed_status);
  if (world.is_coordinator() && !end.missing.empty())
    spdlog::error("learner 0: {}", describe_missing(world, heartbeat, end.missing, shutdown_s));
  if (world.joined()) return status;  // it shares no communicator with the job's first processes
  // Rejoined ranks too: their first processes are gone from the job's communicator.
  std::set<int> gone = runtime::lost_ranks().ever_lost();
  gone.insert(end.missing.begin(), end.missing.end());
  if (gone.empty()) return status;
  if (!runtime::fault_tolerant_mpi()) {
    if (!world.is_coordinator()) return status;  // learner 0 ends the job
    fence_lost_ranks(world);
    spdlog::error("learner 0: ending the job with status {}: this MPI cannot finalize without the lost rank(s)",
                  failed_status);
    runtime::flush_logs();
    runtime::end_this_rank(failed_status);
  }
  // MPI_Finalize hangs unless MPI has seen every fenced rank die (fault_tolerance.h).
  if (!runtime::wait_until_known_failed(world.world_comm(), std::vector<int>(gone.begin(), gone.end()),
                                        shutdown_timeout_s)) {
    spdlog::error("{}: MPI did not see the lost rank(s) die within {}; ending without MPI_Finalize", world.role_label(),
                  within(shutdown_timeout_s));
    runtime::flush_logs();
    runtime::end_this_rank(status);
  }
  return status;
}

// [run] device: every rank checks its own device (runtime/compute_device.h)
// before any work, and all agree through one all-reduce, as they do on the
// configuration: if any rank has no usable device, the lowest such rank
// prints why (naming run.device, its rank and host) and every rank stops
// with status 2. A dry run plans ranks without touching devices.
// Returns this rank's device, or nullopt when the job must stop.
std::optional<runtime::DeviceChoice> agreed_device(const config::Config& config, const runtime::World& world) {
  const RankDevice device = resolve_rank_device(config, world);
  const int mine = device.error.empty() ? INT_MAX : world.rank();
  int first_failed = INT_MAX;
  MOERL_MPI_CHECK(MPI_Allreduce(&mine, &first_failed, 1, MPI_INT, MPI_MIN, world.world_comm()));
  if (first_failed == INT_MAX) return device.device;
  if (world.rank() == first_failed) {
    std::cerr << "moerl: " << device.error << "\n";
    if (world.size() > 1)
      std::cerr << "moerl: (reported by rank " << world.rank() << "; every rank stops with status 2)\n";
  }
  return std::nullopt;
}

// Once a rank knows its place: its logging (its role on every line, [telemetry]
// per_rank_log_files), its metrics' identity and its compute threads.
void start_rank(const config::Config& config, const runtime::World& world) {
  std::string per_rank_file;
  if (config.telemetry.per_rank_log_files)
    per_rank_file = config.run_directory() + "/logs/rank-" + std::to_string(world.rank()) + ".log";
  runtime::init_logging({config.telemetry.log_level, world.rank(), world.role_label(), per_rank_file});
  telemetry::metrics().set_identity(world.rank(), runtime::role_name(world.role()));
  // Deterministic runs: one thread, so no result depends on the host's core count.
  set_compute_threads(config.run.deterministic ? 1 : world.compute_threads());
}

int run_roles(const config::Config& config, const TrainOptions& options, const runtime::PlacedWorld& placed) {
  runtime::World world(config, placed.comm());
  std::optional<runtime::DeviceChoice> device = runtime::DeviceChoice{};  // a dry run touches no device
  if (!options.dry_run) device = agreed_device(config, world);
  if (!device) return config::kConfigErrorExitStatus;
  start_rank(config, world);
  runtime::Mailbox mailbox(world.message_comm(), config.cluster.message_timeout_s);
  if (world.is_coordinator()) spdlog::info("MPI: {}", runtime::mpi_description());
  if (world.is_coordinator()) spdlog::info("BLAS: {}", blas::blas_summary());
  // Every rank says so: another node's CPU may need another core.
  if (const std::string warning = blas::blas_info().warning; !warning.empty()) spdlog::warn("BLAS: {}", warning);
  if (world.is_coordinator()) spdlog::info("GEMM (moerl's kernels): {}", blas::cpu_gemm_summary());
  if (const std::string warning = blas::blas_info().cpu_gemm_warning; !warning.empty())
    spdlog::warn("GEMM: {}", warning);
  const int restart = runtime::launcher_restarts();
  if (!options.dry_run) runtime::write_rank_record(config.run_directory(), world, restart);
  using Mode = runtime::HeartbeatThread::Mode;
  const Mode mode = options.dry_run          ? Mode::ModeQuiet
                    : world.is_coordinator() ? Mode::ModeCoordinator
                                             : Mode::ModeMember;
  runtime::HeartbeatThread heartbeat(
      mailbox, world.layout(), identity(world),
      {config.cluster.heartbeat_interval_s, config.cluster.heartbeat_timeout_s, mode,
       options.dry_run ? std::vector<config::FaultAction>{} : faults_of_this_attempt(config, restart)});

  if (!options.dry_run) {
    runtime::StopCoordinator stop(mailbox);
    const int status = run_role(config, world, mailbox, stop, *device, options.init_path, options.resume, &heartbeat);
    heartbeat.stop_watching();
    return finish_job(world, mailbox, heartbeat, config.cluster.shutdown_timeout_s, status);
  }
  const runtime::DryRunResult result = runtime::run_dry_run(config, world, mailbox);
  if (world.is_coordinator()) std::cout << runtime::format_plan(config, world.layout(), result) << std::flush;
  return 0;
}

// The joined env worker's work (run_join_env), in a scope of its own: its
// heartbeat thread and mailbox are gone before MPI_Finalize.
int serve_as_joined_env_worker(const config::Config& config, const runtime::World& world,
                               const runtime::JoinParents& parents) {
  runtime::Mailbox mailbox(std::make_unique<runtime::MpiTransport>(world.rank(), world.size()),
                           config.cluster.message_timeout_s);
  for (size_t remote = 0; remote < parents.job_ranks.size(); ++remote)
    mailbox.route_peer(parents.job_ranks[remote], parents.intercomm, static_cast<int>(remote));
  spdlog::warn("{}: joined the running job as rank {} (pid {} on {}), reaching {} ranks", world.role_label(),
               world.rank(), static_cast<long long>(getpid()), world.hostname(), parents.job_ranks.size());
  runtime::write_rank_record(config.run_directory(), world, runtime::launcher_restarts());
  runtime::HeartbeatThread heartbeat(mailbox, world.layout(), identity(world),
                                     {config.cluster.heartbeat_interval_s,
                                      config.cluster.heartbeat_timeout_s,
                                      runtime::HeartbeatThread::Mode::ModeMember,
                                      {}});
  runtime::StopCoordinator stop(mailbox);
  int status = run_role(config, world, mailbox, stop, runtime::DeviceChoice{}, "", "", &heartbeat);
  heartbeat.stop_watching();
  status = finish_job(world, mailbox, heartbeat, config.cluster.shutdown_timeout_s, status);
  return status;
}

}  // namespace

// A new env worker in a gone one's rank (runtime/env_join.h): no
// configuration agreement, placement or device checks (the job did those);
// it reaches every peer through the spawn's intercommunicator, then serves
// sessions and ends with the job as any env worker. An error ends this
// process only: learner 0 sees it lost and the job goes on without it.
int run_join_env(const JoinEnvOptions& options) {
  runtime::MpiSession mpi(nullptr, nullptr);
  runtime::end_without_mpi_abort();
  runtime::install_stop_signal_handlers();
  runtime::init_logging({config::LogLevel::Info, options.rank, "", ""});
  try {
    const config::Config config = setup::load_config_file(options.config_path, {});
    const runtime::JoinParents parents = runtime::join_parents(config.cluster.message_timeout_s);
    runtime::World world(config, runtime::World::Joined{options.rank, options.threads});
    MOERL_CHECK(world.size() == options.world_size, "moerl join-env: the configuration's layout has " +
                                                        std::to_string(world.size()) + " ranks, the job " +
                                                        std::to_string(options.world_size));
    start_rank(config, world);
    const int status = serve_as_joined_env_worker(config, world, parents);
    mpi.finalize_within(config.cluster.shutdown_timeout_s, status);
    return status;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "moerl join-env (rank %d): %s\n", options.rank, error.what());
    std::fflush(stderr);
    runtime::end_this_rank(runtime::kFatalErrorExitStatus);
  }
}

int run_train(const TrainOptions& options) {
  runtime::MpiSession mpi(nullptr, nullptr);
  runtime::install_stop_signal_handlers();
  runtime::init_logging({config::LogLevel::Info, mpi.world_rank(), "", ""});
  const std::optional<config::Config> config = load_agreed_config(options, mpi.world_rank(), mpi.world_size());
  if (!config) {
    // No configuration to read the deadline from: the default one.
    mpi.finalize_within(config::ClusterSection{}.shutdown_timeout_s, config::kConfigErrorExitStatus);
    return config::kConfigErrorExitStatus;
  }
  std::string role_label;
  try {
    const std::unique_ptr<runtime::PlacedWorld> placed = place_ranks(*config, mpi.world_rank(), mpi.world_size());
    if (!placed) {
      mpi.finalize_within(config->cluster.shutdown_timeout_s, config::kConfigErrorExitStatus);
      return config::kConfigErrorExitStatus;
    }
    role_label = runtime::role_name(runtime::RankLayout(config->cluster).assignment(placed->job_rank()).role);
    const int status = run_roles(*config, options, *placed);
    mpi.finalize_within(config->cluster.shutdown_timeout_s, status);
    return status;
  } catch (const runtime::PeerLostError& error) {
    // A peer MPI reports dead that no failover covers (learner 0 above all):
    // a lost rank, which the launcher restarts from the last checkpoint.
    runtime::abort_job(role_label, error.what(), runtime::kLostRankExitStatus);
  } catch (const std::exception& error) {
    runtime::abort_job(role_label, error.what());
  }
}

}  // namespace moerl::app
