#pragma once
// Rank- and role-tagged logging through spdlog. Every line reads
//   [13:45:02.118] [rank 3 actor 1] [info] message
// Rank 0 speaks for the job: other ranks print warnings and errors to stderr
// (their info lines go to their per-rank log file when one is enabled), so a
// 64-rank job does not print every line 64 times.

#include <string>

#include "moerl/config/sections.h"

namespace moerl::runtime {

struct LogSetup {
  config::LogLevel level = config::LogLevel::Info;
  int rank = 0;
  std::string role_label = "";     // "actor 1"; empty before roles are known
  std::string per_rank_file = "";  // empty = no file
};

// Replaces spdlog's default logger; safe to call again when roles are known.
void init_logging(const LogSetup& setup);

// Flushes every sink (before an abort, so the last lines are not lost).
void flush_logs();

}  // namespace moerl::runtime
