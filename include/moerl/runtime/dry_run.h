#pragma once
// `moerl train --dry-run`: proves a launch is sound before any compute is
// spent. Every rank checks in with learner 0 (same configuration, its host,
// pid and threads), every pair of ranks exchanges a ping, every rank reports
// its metrics, and learner 0 prints the plan: which rank does what, where.

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/config/config.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/world.h"
#include "moerl/telemetry/histogram.h"

namespace moerl::runtime {

struct RankReport {
  int rank = -1;
  std::string role;
  int role_index = -1;
  std::string hostname;
  std::int64_t pid = 0;
  int threads = 0;
};

struct DryRunResult {
  std::vector<RankReport> ranks;           // coordinator only: every rank, in rank order
  telemetry::Histogram ping_round_trip_s;  // coordinator only: merged over all ranks
  std::int64_t messages_sent = 0;          // coordinator only: over all ranks
  double wall_s = 0;
  std::string metrics_path;  // coordinator only
};

DryRunResult run_dry_run(const config::Config& config, const World& world, Mailbox& mailbox);

// The plan learner 0 prints.
std::string format_plan(const config::Config& config, const RankLayout& layout, const DryRunResult& result);

}  // namespace moerl::runtime
