#pragma once
// <run dir>/ranks/rank-N.json, written by every rank of `moerl train` when it
// starts: {"rank", "role", "role_index", "host", "placement_host", "pid",
// "started_at", "restart"} (placement_host: the name [cluster] placement
// matched, placement.h). An operator (or a test) finds a role's process from it without
// knowing how the launcher placed the ranks.

#include <string>

#include "moerl/runtime/world.h"

namespace moerl::runtime {

// Writes this rank's record (atomically: a temporary name, then a rename); returns its path.
std::string write_rank_record(const std::string& run_directory, const World& world, int restart);

}  // namespace moerl::runtime
