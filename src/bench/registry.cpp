#include "moerl/bench/registry.h"

#include "moerl/core/check.h"

namespace moerl::bench {
namespace {

// A function-local static: registrations run during static initialisation of
// other translation units, in an order the language leaves unspecified.
std::vector<BenchEntry>& entries() {
  static std::vector<BenchEntry> all;
  return all;
}

}  // namespace

bool register_benchmark(BenchEntry entry) {
  MOERL_CHECK(find_benchmark(entry.name) == nullptr, "benchmark '" + entry.name + "' registered twice");
  entries().push_back(std::move(entry));
  return true;
}

const std::vector<BenchEntry>& registered_benchmarks() { return entries(); }

const BenchEntry* find_benchmark(const std::string& name) {
  for (const BenchEntry& entry : entries())
    if (entry.name == name) return &entry;
  return nullptr;
}

}  // namespace moerl::bench
