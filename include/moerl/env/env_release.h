#pragma once
// An env worker's answer to a SIGTERM of its own: instead of stopping the
// whole job (what a signal does on every other rank), it asks learner 0 to
// release it (scale-down: a scheduler takes its node back, or an operator ran
// `moerl ctl release-env`). Learner 0 grants it when another env worker is
// left and the MPI is fault tolerant, and the worker leaves the job at once
// (its sessions move to the other env workers as after a loss); otherwise,
// or when learner 0 does not answer, the worker stops the job as any signal
// does. A job-wide SIGTERM reaches learner 0 too, which then ignores the
// request and stops the job (coordinator_release.cpp).

#include <string>

#include "moerl/runtime/job_control.h"
#include "moerl/runtime/mailbox.h"

namespace moerl::env {

class ReleaseOnSignal {
 public:
  // `answer_timeout_s`: how long to wait for learner 0's answer before stopping the job instead.
  ReleaseOnSignal(runtime::Mailbox& mailbox, runtime::StopCoordinator& stop, double answer_timeout_s,
                  int coordinator_rank = 0);

  // Non-blocking; called every turn of the worker's loop. True once learner
  // 0 granted the release: the caller leaves the job now.
  bool released();

 private:
  void fall_back_to_stop(const std::string& why);

  runtime::Mailbox& mailbox_;
  runtime::StopCoordinator& stop_;
  double answer_timeout_s_;
  int coordinator_;
  int signal_ = 0;  // the signal that asked for the release, once it came
  double asked_at_ = 0;
  bool settled_ = false;  // answered (or given up on): nothing more to do
};

// Ends this process after a granted release, without MPI_Finalize (under a
// fault-tolerant MPI the others see it leave as a failed process and go on;
// finalizing would wait for every rank). Flushes the logs first.
[[noreturn]] void leave_job_released(const std::string& role_label);

}  // namespace moerl::env
