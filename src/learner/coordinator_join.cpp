// The Coordinator's joins of env workers (coordinator.h): scaling the
// environment tier back up while the job runs (runtime/env_join.h).
//
// `moerl ctl add-env RUN_DIR RANK` leaves <run dir>/control/add-env-RANK.request
// (a file: the run directory is the one place both sides know, on every
// launcher). Learner 0 looks for requests every kScanIntervalS and answers
// each in add-env-RANK.result: "joined", "refused: why" or "failed: why".
// A join fills the rank of an env worker that left (released, or lost):
// learner 0 and every living actor and standby actor spawn a new process
// together; once learner 0's spawn returned, the rank is alive again for
// everyone (RankRejoined), its heartbeats are watched from then on, and
// summary.json lists it under "rejoins".

#include <spdlog/spdlog.h>

#include <filesystem>
#include <regex>

#include "moerl/learner/coordinator.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/lost_ranks.h"
#include "moerl/storage/atomic_file.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

constexpr double kScanIntervalS = 0.5;

std::filesystem::path control_directory(const std::string& run_directory) {
  return std::filesystem::path(run_directory) / "control";
}

// "add-env-4.request" -> 4.
std::optional<int> requested_rank(const std::string& file_name) {
  static const std::regex pattern(R"(add-env-([0-9]{1,9})\.request)");
  std::smatch match;
  if (!std::regex_match(file_name, match, pattern)) return std::nullopt;
  return std::stoi(match[1].str());
}

// A file of the control directory (an answer the requester waits for, the
// job's configuration); one that cannot be written is logged, and the job goes on.
void write_control_file(const std::filesystem::path& path, const std::string& text) {
  try {
    storage::write_file_atomically(path.string(), text + "\n");
  } catch (const std::exception& error) {
    spdlog::error("learner 0: {}", error.what());
  }
}

}  // namespace

void Coordinator::take_join_requests(double now) {
  if (now < next_join_scan_ || settings_.run_directory.empty()) return;
  next_join_scan_ = now + kScanIntervalS;
  const std::filesystem::path directory = control_directory(settings_.run_directory);
  std::error_code error;
  std::vector<int> ranks;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::optional<int> rank = requested_rank(entry.path().filename().string());
    if (!rank) continue;
    std::filesystem::remove(entry.path(), error);
    ranks.push_back(*rank);
  }
  for (int rank : ranks) {
    const std::string refusal = join_refusal(rank);
    if (refusal.empty()) {
      start_join(rank, now);
      continue;
    }
    spdlog::warn("moerl ctl add-env {}: refused: {}", rank, refusal);
    write_control_file(directory / ("add-env-" + std::to_string(rank) + ".result"), "refused: " + refusal);
  }
}

std::string Coordinator::join_refusal(int rank) const {
  if (rank <= 0 || rank >= world_.size())
    return "the job has no env worker rank " + std::to_string(rank) + " (its ranks are 0-" +
           std::to_string(world_.size() - 1) + ")";
  const runtime::RankAssignment who = world_.layout().assignment(rank);
  if (who.role != runtime::Role::EnvWorker)
    return "rank " + std::to_string(rank) + " is " + runtime::role_name(who.role) + " " + std::to_string(who.index) +
           ", not an env worker";
  const std::string name = "env worker " + std::to_string(who.index) + " (rank " + std::to_string(rank) + ")";
  if (!runtime::fault_tolerant_mpi())
    return "this MPI is not fault tolerant, so an env worker cannot leave or join while the job runs";
  if (!join_service_) return "learner 0 has no join group";
  if (failure_ || runtime::stop_signal_received() != 0) return "the job is stopping";
  if (actors_done_sending_ || tasks_.phase() == TaskCoordinator::Phase::Done) return "the job is finishing";
  if (join_stuck_) return "an earlier join never completed, so no other can start";
  if (joining_) return "rank " + std::to_string(joining_->rank) + " is joining now (one join at a time)";
  if (released_.count(rank)) return name + " is leaving now; ask again once it has left";
  if (!runtime::lost_ranks().contains(rank))
    return name + " is in the job: only the rank of a released or lost env worker can be filled again";
  return "";
}

void Coordinator::start_join(int rank, double now) {
  const std::filesystem::path directory = control_directory(settings_.run_directory);
  const std::filesystem::path config_path = directory / "job-config.toml";
  write_control_file(config_path, settings_.config_toml);
  runtime::EnvJoinStart start;
  start.rank = rank;
  start.config_path = std::filesystem::absolute(config_path).string();
  start.threads = world_.compute_threads();
  join_service_->request(start);
  int actors = 0;
  for (runtime::Role role : {runtime::Role::Actor, runtime::Role::StandbyActor})
    for (int actor : world_.layout().ranks_of(role)) {
      if (runtime::lost_ranks().contains(actor)) continue;
      try {
        mailbox_.send(actor, start);
        ++actors;
      } catch (const runtime::PeerLostError&) {
        // Dead: the spawn's shrink leaves it out.
      }
    }
  joining_ = Joining{rank, now};
  spdlog::warn("adding env worker {} (rank {}) back: learner 0 and {} actor(s) spawn a new process in its rank",
               world_.layout().assignment(rank).index, rank, actors);
}

void Coordinator::watch_join(double now) {
  if (!joining_) return;
  const int rank = joining_->rank;
  const std::filesystem::path result =
      control_directory(settings_.run_directory) / ("add-env-" + std::to_string(rank) + ".result");
  const runtime::EnvJoinService::State state = join_service_->state();
  if (state == runtime::EnvJoinService::State::Spawning) {
    const double limit = 2 * settings_.message_timeout_s;
    if (now - joining_->started_at < limit) return;
    join_stuck_ = true;
    joining_.reset();
    spdlog::error("env worker rank {}: the join's spawn did not complete within {:.0f} s", rank, limit);
    write_control_file(result, "failed: the spawn did not complete within " + std::to_string(static_cast<int>(limit)) +
                                   " s (2 x [cluster] message_timeout_s)");
    return;
  }
  if (state == runtime::EnvJoinService::State::Failed) {
    write_control_file(result, "failed: " + join_service_->error());
    join_service_->reset();
    joining_.reset();
    return;
  }
  if (state != runtime::EnvJoinService::State::Joined) return;
  runtime::lost_ranks().rejoin(rank);
  if (heartbeat_) heartbeat_->revive(rank);
  gone_by_release_.erase(rank);
  for (int other = 1; other < world_.size(); ++other) {
    if (other == rank || runtime::lost_ranks().contains(other)) continue;
    try {
      mailbox_.send(other, runtime::RankRejoined{rank});
    } catch (const runtime::PeerLostError&) {
      // Dead: its own loss is declared next.
    }
  }
  const int index = world_.layout().assignment(rank).index;
  tasks_.record_rank_rejoin(RankRejoin{rank, index, step_, now - joining_->started_at});
  telemetry::metrics().add("coordinator.rejoined_ranks");
  spdlog::warn("env worker {} (rank {}) joined the job again after {:.1f} s; sessions go to it again", index, rank,
               now - joining_->started_at);
  write_control_file(result, "joined");
  join_service_->reset();
  joining_.reset();
}

}  // namespace moerl::learner
