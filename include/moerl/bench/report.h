#pragma once
// The one result format of every `moerl bench NAME`:
//   {"bench": NAME, "host": {...}, "cases": [{"name": ..., "params": {...},
//    "metrics": {...}, "baseline": {...}, "ratio": ...}]}
// A case measures something against a baseline run side by side in the same
// process (timings on shared machines are noisy; ratios are what we compare).
// `ratio` is metrics[ratio_metric] / baseline[ratio_metric], oriented so that
// larger is better for the case (see BenchCase::higher_is_better).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace moerl::bench {

using ParamValue = std::variant<std::int64_t, double, std::string, bool>;

struct BenchCase {
  std::string name;
  std::map<std::string, ParamValue> params;
  std::map<std::string, double> metrics;   // the thing measured
  std::map<std::string, double> baseline;  // the reference, measured in the same run
  std::string ratio_metric;                // key present in both maps; empty = no ratio
  bool higher_is_better = true;            // false for latencies: ratio = baseline / metric

  std::optional<double> ratio() const;
};

struct BenchReport {
  std::string bench;
  std::map<std::string, ParamValue> host;  // filled by describe_host()
  std::vector<BenchCase> cases;
  bool quiet = false;  // multi-rank benchmarks: only rank 0 reports

  std::string to_json() const;
  // A fixed-width table: case, params, metrics, baseline, ratio.
  std::string to_table() const;
  void write_json(const std::string& path) const;  // throws moerl::Error naming the path
};

// hostname, cpu model, cores, threads in use, compiler, moerl version.
std::map<std::string, ParamValue> describe_host();

}  // namespace moerl::bench
