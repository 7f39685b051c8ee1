#pragma once
// Heartbeats: every rank tells learner 0 every [cluster] heartbeat_interval_s
// that it is alive, who it is and how loaded, from a thread of its own that
// keeps beating while the rank computes (a SIGSTOPped rank stops beating: that
// is how a frozen rank is found). Learner 0 beats back to every rank with the
// job's step and policy version; a rank that hears nothing from learner 0 for
// [cluster] heartbeat_timeout_s (once it has heard from it at all) ends itself
// with kLostRankExitStatus, so that a lost coordinator ends the job (and the
// launcher restarts it) instead of leaving the others waiting.
//
// On learner 0 the same kind of thread is the coordinator's side: it takes
// every rank's beats into a RankHealth, declares silent or dead ranks lost
// (the learner asks take_lost() and decides), warns about actors behind the
// published weights, and beats to every rank.
//
// Every mode takes JobAbort notices: under a fault-tolerant MPI, MPI_Abort
// ends only the caller, so abort_job() first tells every rank and each ends
// itself with the same status.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "moerl/runtime/fault_plan.h"
#include "moerl/runtime/heartbeat_messages.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/rank_health.h"
#include "moerl/runtime/rank_layout.h"

namespace moerl::runtime {

// What a role reports about its load; written by the role, read by the heartbeat thread.
struct RankLoad {
  std::atomic<std::int64_t> weight_version{-1};
  std::atomic<std::int32_t> live_sessions{0};
  std::atomic<std::int32_t> queue_depth{0};
};

class HeartbeatThread {
 public:
  enum class Mode {
    ModeMember,       // beats to learner 0 and watches learner 0's beats
    ModeCoordinator,  // learner 0: takes every rank's beats (RankHealth), beats to every rank
    ModeQuiet,        // only takes JobAbort (a dry run)
  };
  struct Options {
    double interval_s = 1.0;
    double timeout_s = 10.0;
    Mode mode = Mode::ModeMember;
    std::vector<config::FaultAction> faults;  // [faults] plan: this thread fires the ones aimed at this rank
  };
  // `identity` names this rank in its beats; `coordinator_lost` runs on the
  // heartbeat thread when learner 0 fell silent (the default ends the process).
  HeartbeatThread(Mailbox& mailbox, const RankLayout& layout, Heartbeat identity, Options options,
                  std::function<void(const std::string&)> coordinator_lost = {});
  ~HeartbeatThread();
  HeartbeatThread(const HeartbeatThread&) = delete;
  HeartbeatThread& operator=(const HeartbeatThread&) = delete;

  RankLoad& load() { return load_; }
  // Members: the job's step and version as learner 0 last said (0 before its first beat).
  std::int64_t job_step() const { return step_.load(); }
  std::int64_t job_version() const { return version_.load(); }
  // The end of the job: learner 0 stops beating, which is no longer a loss.
  void stop_watching() { watching_ = false; }

  // Learner 0: what its beats carry (and which version actors should hold).
  void set_job_progress(std::int64_t step, std::int64_t published_version);
  // Learner 0: ranks declared lost since the last call (each once).
  std::vector<LostRank> take_lost();
  // Learner 0: a lost rank lives again (an env worker joined in its place, runtime/env_join.h).
  void revive(int rank);
  // Learner 0: the latest heartbeat of `rank` (its identity, load), if any.
  std::optional<Heartbeat> last_heartbeat(int rank) const;
  // Learner 0: every other rank, how long since it last beat (since the
  // start if never) and whether it was declared lost. Empty elsewhere.
  struct RankAge {
    int rank = -1;
    Role role = Role::Actor;
    double silent_s = 0;
    bool lost = false;
  };
  std::vector<RankAge> rank_ages() const;

 private:
  void run();
  void tick(double now);
  void tick_member(double now);
  void tick_coordinator(double now);

  Mailbox& mailbox_;
  RankLayout layout_;
  Heartbeat identity_;
  Options options_;
  std::function<void(const std::string&)> coordinator_lost_;
  RankLoad load_;
  std::atomic<std::int64_t> step_{0};
  std::atomic<std::int64_t> version_{0};
  std::atomic<bool> watching_{true};
  std::atomic<bool> stop_{false};
  double next_beat_ = 0;
  double last_coordinator_beat_ = -1;   // < 0: not heard from yet (not armed)
  std::unique_ptr<RankHealth> health_;  // learner 0
  std::unique_ptr<FaultInjector> faults_;
  mutable std::mutex mutex_;  // health_, lost_
  std::vector<LostRank> lost_;
  std::thread thread_;
};

}  // namespace moerl::runtime
