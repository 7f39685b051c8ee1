#pragma once
// What each rank does in `moerl train`: the entry point from the app into the
// roles (learner, actor, env worker, standby actor). Kept free of LibTorch
// headers so the app's translation units stay light.

#include <string>

#include "moerl/config/config.h"
#include "moerl/runtime/compute_device.h"
#include "moerl/runtime/heartbeat.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/world.h"

namespace moerl::app {

// Runs this rank's role until the job ends; `device` is where its policy
// computes (resolve_rank_device, app/rank_device.h, checked before any work);
// `init_path` (may be empty) holds
// the starting policy weights; `resume` ("", "auto" or a checkpoint store
// path) continues a run. Returns the process exit status.
// `heartbeat` (may be null, e.g. in benchmarks): learner 0 learns of lost
// ranks from it, the other roles report their load into it.
int run_role(const config::Config& config, const runtime::World& world, runtime::Mailbox& mailbox,
             runtime::StopCoordinator& stop, const runtime::DeviceChoice& device, const std::string& init_path,
             const std::string& resume, runtime::HeartbeatThread* heartbeat = nullptr);

// `moerl pretrain` (one process); `init_path`, when set, holds the starting weights.
int run_pretrain_command(const config::Config& config, const std::string& init_path = "");

}  // namespace moerl::app
