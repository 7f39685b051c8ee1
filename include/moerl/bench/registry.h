#pragma once
// Benchmarks register themselves with MOERL_BENCHMARK at static-initialisation
// time; `moerl bench NAME` looks them up. benchmarks/ is linked into the
// binary as an object library so that no registration is dropped by the linker.

#include <functional>
#include <string>
#include <vector>

#include "moerl/bench/report.h"

namespace moerl::bench {

struct BenchOptions {
  bool quick = false;             // smaller sizes, fewer repetitions (used by the test suite)
  int threads = 0;                // 0 = leave the thread count as it is
  std::vector<std::string> args;  // extra NAME-specific arguments after `--`
};

using BenchFunction = std::function<BenchReport(const BenchOptions&)>;

struct BenchEntry {
  std::string name;
  std::string description;
  BenchFunction run;
};

// Returns true so that it can initialise a namespace-scope constant.
bool register_benchmark(BenchEntry entry);
const std::vector<BenchEntry>& registered_benchmarks();
const BenchEntry* find_benchmark(const std::string& name);

}  // namespace moerl::bench

#define MOERL_BENCH_CONCAT_(a, b) a##b
#define MOERL_BENCH_CONCAT(a, b) MOERL_BENCH_CONCAT_(a, b)
// MOERL_BENCHMARK("moe", "MoE layer forward+backward tokens/s", run_moe_bench);
#define MOERL_BENCHMARK(name, description, function)                        \
  static const bool MOERL_BENCH_CONCAT(moerl_bench_registered_, __LINE__) = \
      ::moerl::bench::register_benchmark({name, description, function})
