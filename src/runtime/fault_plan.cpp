#include "moerl/runtime/fault_plan.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace moerl::runtime {

FaultHooks& fault_hooks() {
  static FaultHooks hooks;
  return hooks;
}

FaultInjector::FaultInjector(const std::vector<config::FaultAction>& plan, const RankLayout& layout, int rank,
                             double started_s)
    : started_s_(started_s), rank_(rank) {
  const RankAssignment self = layout.assignment(rank);
  for (const config::FaultAction& action : plan)
    if (action.role == role_name(self.role) && action.index == self.index) mine_.push_back({action});
}

void FaultInjector::check(std::int64_t job_step, double now) {
  for (Armed& armed : mine_) {
    if (armed.fired) continue;
    const config::FaultAction& a = armed.action;
    const bool due = a.trigger == config::FaultTrigger::TriggerReceiving ||
                     (a.trigger == config::FaultTrigger::TriggerStep && static_cast<double>(job_step) >= a.when) ||
                     (a.trigger == config::FaultTrigger::TriggerSeconds && now - started_s_ >= a.when);
    if (!due) continue;
    armed.fired = true;
    std::fprintf(stderr, "moerl: rank %d: [faults] plan: %s\n", rank_, a.text.c_str());
    std::fflush(stderr);
    switch (a.kind) {
      case config::FaultKind::FaultKill:
        if (a.trigger == config::FaultTrigger::TriggerReceiving) {
          fault_hooks().kill_while_receiving = true;
        } else {
          ::raise(SIGKILL);
        }
        break;
      case config::FaultKind::FaultFreeze: ::raise(SIGSTOP); break;
      case config::FaultKind::FaultExit: std::_Exit(1);
      case config::FaultKind::FaultSlow: fault_hooks().slow_ms = a.slow_ms; break;
      case config::FaultKind::FaultCorruptBucket: fault_hooks().corrupt_next_publication = true; break;
      case config::FaultKind::FaultCorruptMessage: fault_hooks().corrupt_next_message = true; break;
    }
  }
}

}  // namespace moerl::runtime
