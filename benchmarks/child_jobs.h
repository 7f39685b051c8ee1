#pragma once
// What the benchmarks that run real jobs as child processes share (bench
// faults, bench algos): starting `scripts/launch.sh ... moerl train` with a
// deadline, and reading what a run leaves behind (summary.json,
// metrics.jsonl). Such a benchmark is started on its own, not under mpirun.

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/core/json_value.h"

namespace moerl::bench {

// The running moerl binary (/proc/self/exe): the child jobs run this build.
std::string self_binary();

// The project's launcher, scripts/launch.sh of the source tree; throws
// moerl::Error naming `who` and the path when it is missing.
std::string launcher_path(const std::string& who);

// Runs argv (argv[0] looked up in PATH) in a process group of its own, stdout
// and stderr into log_path, MOERL_BIN = self_binary(). Returns its exit status
// (128 + signal when a signal ended it), or -1 when it ran past deadline_s:
// then the whole process group is killed first. Throws moerl::Error naming
// `who` when fork fails.
int run_job(const std::vector<std::string>& argv, const std::string& log_path, double deadline_s,
            const std::string& who);

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_commas(const std::string& text);

// A whole JSON file; throws moerl::Error naming the path when it is missing
// or not JSON.
JsonValue read_json_file(const std::string& path);

// One metric per metrics line of a run's metrics.jsonl, in file order:
// roles.<role>.<group>.<name> with group "gauges" or "counters" (counters are
// running totals over the role's ranks). Lines without it are skipped; a value
// written as null (non-finite) comes back as NaN. Throws moerl::Error naming
// the path when it is missing or a line is not JSON.
struct MetricsPoint {
  std::int64_t step = 0;
  double time_s = 0;  // unix time of the line (time_ms / 1000)
  double value = 0;
};
std::vector<MetricsPoint> metrics_series(const std::string& metrics_path, const std::string& role,
                                         const std::string& group, const std::string& name);

}  // namespace moerl::bench
