#include "moerl/runtime/env_join.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "moerl/runtime/backoff.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/rank_layout.h"

namespace moerl::runtime {
namespace {

// The tag of a parent's "I am job rank N" on the spawn's intercommunicator;
// above every message type (those are the Mailbox's tags there).
constexpr int kJoinHelloTag = 1000;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

}  // namespace

void EnvJoinStart::encode(ByteWriter& w) const {
  w.put(rank);
  w.put_string(config_path);
  w.put(threads);
}

EnvJoinStart EnvJoinStart::decode(ByteReader& r) {
  EnvJoinStart m;
  m.rank = r.get<std::int32_t>();
  m.config_path = r.get_string();
  m.threads = r.get<std::int32_t>();
  return m;
}

void RankRejoined::encode(ByteWriter& w) const { w.put(rank); }

RankRejoined RankRejoined::decode(ByteReader& r) { return RankRejoined{r.get<std::int32_t>()}; }

std::vector<std::string> join_env_arguments(const EnvJoinStart& start, int world_size) {
  return {"join-env",
          "--config",
          start.config_path,
          "--rank",
          std::to_string(start.rank),
          "--world-size",
          std::to_string(world_size),
          "--threads",
          std::to_string(start.threads)};
}

EnvJoinService::EnvJoinService(Mailbox& mailbox, MPI_Comm join_comm, int world_size)
    : mailbox_(mailbox), join_comm_(join_comm), world_size_(world_size) {
  thread_ = std::thread([this] { run(); });
}

EnvJoinService::~EnvJoinService() {
  stop_ = true;
  if (state_ == State::Spawning) {
    // A collective spawn cannot be cancelled; one that a peer never joined
    // (it ended first) would hold this destructor for ever. MPI_Finalize's
    // own deadline (MpiSession::finalize_within) bounds what follows.
    spdlog::warn("rank {}: an env worker's join was still spawning at the end of the job; left behind",
                 mailbox_.rank());
    thread_.detach();
    return;
  }
  if (thread_.joinable()) thread_.join();
}

void EnvJoinService::request(const EnvJoinStart& start) {
  std::lock_guard<std::mutex> lock(mutex_);
  error_.clear();
  pending_ = start;
  state_ = State::Spawning;
}

std::string EnvJoinService::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void EnvJoinService::reset() {
  if (state_ != State::Spawning) state_ = State::Idle;
}

void EnvJoinService::failed(const std::string& why) {
  spdlog::error("rank {}: an env worker could not join: {}", mailbox_.rank(), why);
  std::lock_guard<std::mutex> lock(mutex_);
  error_ = why;
  state_ = State::Failed;
}

void EnvJoinService::run() {
  while (!stop_) {
    std::optional<EnvJoinStart> start;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      start.swap(pending_);
    }
    try {
      if (!start && mailbox_.rank() != RankLayout::kCoordinatorRank)
        if (auto message = mailbox_.try_receive<EnvJoinStart>(RankLayout::kCoordinatorRank)) start = message->second;
      if (start) spawn(*start);
    } catch (const std::exception& error) {
      failed(error.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void EnvJoinService::spawn(const EnvJoinStart& start) {
  state_ = State::Spawning;
  // Over the living members only: a lost actor would fail the collective.
  const bool shrunk = fault_tolerant_mpi();
  MPI_Comm group = shrunk ? shrink(join_comm_) : join_comm_;
  const std::vector<std::string> arguments = join_env_arguments(start, world_size_);
  std::vector<char*> argv;
  for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);
  const std::string program = std::filesystem::read_symlink("/proc/self/exe").string();
  MPI_Comm child = MPI_COMM_NULL;
  int spawned = MPI_SUCCESS;
  const int rc = MPI_Comm_spawn(program.c_str(), argv.data(), 1, MPI_INFO_NULL, RankLayout::kCoordinatorRank, group,
                                &child, &spawned);
  if (shrunk) MPI_Comm_free(&group);
  if (rc != MPI_SUCCESS || spawned != MPI_SUCCESS)
    return failed("MPI_Comm_spawn of '" + program + " join-env' for rank " + std::to_string(start.rank) + ": " +
                  mpi_error_text(rc != MPI_SUCCESS ? rc : spawned));
  MPI_Comm_set_errhandler(child, MPI_ERRORS_RETURN);
  const int me = mailbox_.rank();
  const int said = MPI_Send(&me, 1, MPI_INT, 0, kJoinHelloTag, child);
  if (said != MPI_SUCCESS)
    return failed("the new env worker of rank " + std::to_string(start.rank) +
                  " died at once: " + mpi_error_text(said));
  mailbox_.route_peer(start.rank, child, 0);
  spdlog::info("rank {}: reaches rank {} (a new env worker) through the spawn's intercommunicator", me, start.rank);
  state_ = State::Joined;
}

JoinParents join_parents(double timeout_s) {
  JoinParents parents;
  MPI_Comm_get_parent(&parents.intercomm);
  if (parents.intercomm == MPI_COMM_NULL)
    throw Error("moerl join-env: not spawned by a running job (learner 0 starts it for `moerl ctl add-env`)");
  MPI_Comm_set_errhandler(parents.intercomm, MPI_ERRORS_RETURN);
  int count = 0;
  MPI_Comm_remote_size(parents.intercomm, &count);
  parents.job_ranks.assign(static_cast<size_t>(count), -1);
  const double deadline = monotonic_seconds() + timeout_s;
  Backoff backoff;
  for (int heard = 0; heard < count;) {
    int arrived = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kJoinHelloTag, parents.intercomm, &arrived, &status);
    if (!arrived) {
      if (monotonic_seconds() > deadline)
        throw TimeoutError("moerl join-env: " + std::to_string(count - heard) + " of the " + std::to_string(count) +
                           " ranks that spawned this env worker did not say who they are within " +
                           std::to_string(static_cast<int>(timeout_s)) + " s");
      backoff.pause();
      continue;
    }
    int job_rank = -1;
    MPI_Recv(&job_rank, 1, MPI_INT, status.MPI_SOURCE, kJoinHelloTag, parents.intercomm, MPI_STATUS_IGNORE);
    parents.job_ranks[static_cast<size_t>(status.MPI_SOURCE)] = job_rank;
    ++heard;
  }
  return parents;
}

}  // namespace moerl::runtime
