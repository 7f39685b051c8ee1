// moerl ctl: operations on a running job from outside it.
//
// release-env RUN_DIR RANK: scale the environment tier down by one worker.
// It finds the env worker's process from its rank record
// (<run dir>/ranks/rank-N.json) and sends it SIGTERM, which an env worker
// answers by asking learner 0 to release it (env/env_release.h); then it
// waits for the process to leave and says whether the job went on. A signal
// needs the process's host: on another host send SIGTERM there (what a
// scheduler does when it takes a node back).
//
// add-env RUN_DIR RANK: scale it back up. It leaves a request in
// <run dir>/control/ for learner 0 (learner/coordinator_join.cpp), which
// answers there; on "joined" it waits for the new process's rank record.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>

#include "commands.h"
#include "moerl/core/json_value.h"
#include "moerl/runtime/placement.h"
#include "moerl/storage/atomic_file.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::app {
namespace {

constexpr int kUsageError = 2;

struct RankRecord {
  std::string role;
  int role_index = -1;
  std::string host;
  pid_t pid = 0;
};

// The rank record, or nullopt after printing why it cannot be read.
std::optional<RankRecord> read_rank_record(const std::string& run_dir, int rank) {
  const std::string path = run_dir + "/ranks/rank-" + std::to_string(rank) + ".json";
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "moerl ctl: %s: no such rank record (is %s a run directory of a job with rank %d?)\n",
                 path.c_str(), run_dir.c_str(), rank);
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    const JsonValue json = JsonValue::parse(text.str());
    return RankRecord{json.at("role").as_string(), static_cast<int>(json.at("role_index").as_number()),
                      json.at("host").as_string(), static_cast<pid_t>(json.at("pid").as_number())};
  } catch (const std::exception& error) {
    std::fprintf(stderr, "moerl ctl: %s: not a rank record: %s\n", path.c_str(), error.what());
    return std::nullopt;
  }
}

bool running(pid_t pid) { return kill(pid, 0) == 0; }

// The process's command line has "moerl" in it: the record's pid was not reused by another program.
bool is_moerl(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return cmdline.find("moerl") != std::string::npos;
}

bool wait_until_gone(pid_t pid, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (running(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// Learner 0's answer to an add-env request, or "" when none came in time.
std::string wait_for_answer(const std::string& path, double deadline) {
  while (telemetry::unix_time_seconds() < deadline) {
    std::ifstream in(path);
    std::string answer;
    if (in && std::getline(in, answer) && !answer.empty()) return answer;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

}  // namespace

int run_ctl_add_env(const CtlOptions& options) {
  const std::optional<RankRecord> worker = read_rank_record(options.run_dir, options.rank);
  if (!worker) return kUsageError;
  const std::string who =
      worker->role + " " + std::to_string(worker->role_index) + " (rank " + std::to_string(options.rank) + ")";
  if (worker->role != "env_worker") {
    std::fprintf(stderr, "moerl ctl: rank %d is %s %d, not an env worker: only env workers can be added back\n",
                 options.rank, worker->role.c_str(), worker->role_index);
    return kUsageError;
  }
  const std::optional<RankRecord> learner0 = read_rank_record(options.run_dir, 0);
  if (learner0 && learner0->host == runtime::machine_hostname() && !running(learner0->pid)) {
    std::fprintf(stderr, "moerl ctl: the job of %s is not running (learner 0, pid %d, has ended)\n",
                 options.run_dir.c_str(), static_cast<int>(learner0->pid));
    return 1;
  }
  const std::string control = options.run_dir + "/control";
  const std::string stem = control + "/add-env-" + std::to_string(options.rank);
  std::filesystem::create_directories(control);
  std::filesystem::remove(stem + ".result");
  const double asked_at = telemetry::unix_time_seconds();
  storage::write_file_atomically(stem + ".request", "add-env " + std::to_string(options.rank) + "\n");
  std::printf("moerl ctl: asked learner 0 to bring %s back into the job\n", who.c_str());
  std::fflush(stdout);
  const double deadline = asked_at + options.timeout_s;
  const std::string answer = wait_for_answer(stem + ".result", deadline);
  if (answer.empty()) {
    std::fprintf(stderr, "moerl ctl: learner 0 did not answer within %.0f s (is the job running? see its log)\n",
                 options.timeout_s);
    return 1;
  }
  if (answer != "joined") {
    std::fprintf(stderr, "moerl ctl: %s was not added back: %s\n", who.c_str(), answer.c_str());
    return answer.rfind("refused", 0) == 0 ? kUsageError : 1;
  }
  // The new process writes its rank record (with its own pid) once it reaches its peers.
  while (telemetry::unix_time_seconds() < deadline) {
    const std::optional<RankRecord> joined = read_rank_record(options.run_dir, options.rank);
    if (joined && joined->pid != worker->pid) {
      std::printf("moerl ctl: %s joined the job again: pid %d on %s\n", who.c_str(), static_cast<int>(joined->pid),
                  joined->host.c_str());
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "moerl ctl: learner 0 spawned %s, but the new process wrote no rank record within %.0f s\n",
               who.c_str(), options.timeout_s);
  return 1;
}

int run_ctl_release_env(const CtlOptions& options) {
  const std::optional<RankRecord> worker = read_rank_record(options.run_dir, options.rank);
  if (!worker) return kUsageError;
  const std::string who = worker->role + " " + std::to_string(worker->role_index) + " (rank " +
                          std::to_string(options.rank) + ", pid " + std::to_string(worker->pid) + " on " +
                          worker->host + ")";
  if (worker->role != "env_worker") {
    std::fprintf(stderr, "moerl ctl: rank %d is %s %d, not an env worker: only env workers can be released\n",
                 options.rank, worker->role.c_str(), worker->role_index);
    return kUsageError;
  }
  if (worker->host != runtime::machine_hostname()) {
    std::fprintf(stderr,
                 "moerl ctl: %s runs on another host than this one (%s): run moerl ctl there, or send "
                 "SIGTERM to pid %d on %s\n",
                 who.c_str(), runtime::machine_hostname().c_str(), static_cast<int>(worker->pid), worker->host.c_str());
    return kUsageError;
  }
  if (!running(worker->pid) || !is_moerl(worker->pid)) {
    std::fprintf(stderr, "moerl ctl: %s is not running (the job ended, or the rank left it already)\n", who.c_str());
    return 1;
  }
  if (kill(worker->pid, SIGTERM) != 0) {
    std::perror("moerl ctl: kill");
    return 1;
  }
  std::printf("moerl ctl: asked %s to leave the job (SIGTERM)\n", who.c_str());
  std::fflush(stdout);
  if (!wait_until_gone(worker->pid, options.timeout_s)) {
    std::fprintf(stderr, "moerl ctl: %s is still running after %.0f s (see the job's log: learner 0 says why)\n",
                 who.c_str(), options.timeout_s);
    return 1;
  }
  // Whether the job went on without it: learner 0 still runs (when it runs here).
  const std::optional<RankRecord> learner0 = read_rank_record(options.run_dir, 0);
  if (learner0 && learner0->host == runtime::machine_hostname() && !running(learner0->pid)) {
    std::fprintf(stderr,
                 "moerl ctl: %s left, and the job ended too: it was not released (the last env worker, "
                 "or an MPI without fault tolerance; see the job's log)\n",
                 who.c_str());
    return 1;
  }
  std::printf("moerl ctl: %s released; the job goes on, its sessions moved to the other env workers\n", who.c_str());
  return 0;
}

}  // namespace moerl::app
