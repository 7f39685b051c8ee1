#pragma once
// Faults injected into a real run ([faults] plan), parsed and checked with the
// rest of the configuration; runtime/fault_plan.h carries them out. One
// entry per fault, in words:
//
//   "kill actor 0 at step 3"          SIGKILL (no cleanup at all)
//   "freeze env_worker 1 at 12 s"     SIGSTOP (a frozen rank: alive to the OS, silent to the job)
//   "exit learner 1 at step 5"        _exit(1): a crash that skips every destructor
//   "slow actor 1 by 50 ms at step 2" every turn of its main loop takes 50 ms longer
//   "kill actor 0 while receiving"    SIGKILL in the middle of a weight publication to it
//   "corrupt bucket at step 4"        learner 0 flips a byte of one bucket of the next publication
//   "corrupt message actor 0 at step 3"  the next episode it sends fails its frame's CRC
//
// Roles: learner, actor, env_worker, standby_actor, with the index within the
// role; steps are learner steps completed, seconds count from the rank's start.
// A fault strikes the first attempt of a job only (a restart by
// scripts/launch.sh resumes past it), unless the entry ends with
// "on every attempt" (a fault that comes back: a crash loop).

#include <string>
#include <vector>

namespace moerl::config {

enum class FaultKind { FaultKill, FaultFreeze, FaultExit, FaultSlow, FaultCorruptBucket, FaultCorruptMessage };
enum class FaultTrigger { TriggerStep, TriggerSeconds, TriggerReceiving };

struct FaultAction {
  FaultKind kind = FaultKind::FaultKill;
  std::string role = "actor";  // learner, actor, env_worker, standby_actor
  int index = 0;
  FaultTrigger trigger = FaultTrigger::TriggerStep;
  double when = 0;             // step or seconds
  double slow_ms = 0;          // FaultSlow
  bool every_attempt = false;  // "... on every attempt": also after restarts
  std::string text;            // as written
};

// Throws moerl::Error naming the entry and what is wrong with it.
FaultAction parse_fault(const std::string& text);
std::vector<FaultAction> parse_fault_plan(const std::vector<std::string>& entries);

}  // namespace moerl::config
