#pragma once
// Carrying out [faults] plan (config/fault_plan.h): each rank arms the
// faults aimed at it; its heartbeat thread fires them when their time comes
// (kill, freeze, exit and slow at once; the rest through FaultHooks, which
// the roles consume). From the job's point of view these are the real
// thing: a SIGKILL is a SIGKILL.

#include <atomic>
#include <cstdint>
#include <vector>

#include "moerl/config/fault_plan.h"
#include "moerl/runtime/rank_layout.h"

namespace moerl::runtime {

// What the heartbeat thread arms and the roles carry out (process-wide).
struct FaultHooks {
  std::atomic<double> slow_ms{0};                     // added to every turn of a role's main loop
  std::atomic<bool> kill_while_receiving{false};      // the weight receiver SIGKILLs this rank mid-publication
  std::atomic<bool> corrupt_next_message{false};      // the actor's next episode goes out with a bad CRC
  std::atomic<bool> corrupt_next_publication{false};  // learner 0's next publication has a corrupt bucket
};
FaultHooks& fault_hooks();

class FaultInjector {
 public:
  FaultInjector(const std::vector<config::FaultAction>& plan, const RankLayout& layout, int rank, double started_s);
  // Fires the faults whose time has come (kill, freeze and exit do not return).
  void check(std::int64_t job_step, double now);
  bool empty() const { return mine_.empty(); }

 private:
  struct Armed {
    config::FaultAction action;
    bool fired = false;
  };
  std::vector<Armed> mine_;
  double started_s_;
  int rank_;
};

}  // namespace moerl::runtime
