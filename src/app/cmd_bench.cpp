// `moerl bench NAME`: runs one registered benchmark, prints its table and
// optionally writes the shared JSON result format (include/moerl/bench/report.h).

#include <iostream>
#include <string>

#include "commands.h"
#include "moerl/bench/registry.h"
#include "moerl/config/config_error.h"

namespace moerl::app {

namespace {

// Benchmarks name themselves in their errors ("bench topk: --k ..."), which
// are read elsewhere too; here the line already starts with the name.
std::string without_own_name(const std::string& message, const std::string& name) {
  const std::string own = "bench " + name + ": ";
  return message.rfind(own, 0) == 0 ? message.substr(own.size()) : message;
}

}  // namespace

int run_bench(const BenchOptionsCli& options) {
  if (options.list || options.name.empty()) {
    std::cout << "benchmarks:\n";
    for (const bench::BenchEntry& entry : bench::registered_benchmarks())
      std::cout << "  " << entry.name << "  " << entry.description << "\n";
    return options.list ? 0 : 1;
  }
  const bench::BenchEntry* entry = bench::find_benchmark(options.name);
  if (entry == nullptr) {
    std::cerr << "moerl bench: unknown benchmark '" << options.name << "' (moerl bench --list)\n";
    return 2;
  }
  try {
    set_compute_threads(options.threads);
    bench::BenchOptions bench_options;
    bench_options.quick = options.quick;
    bench_options.threads = options.threads;
    bench_options.args = options.args;
    bench::BenchReport report = entry->run(bench_options);
    if (report.quiet) return 0;
    report.bench = entry->name;
    if (report.host.empty()) report.host = bench::describe_host();
    std::cout << report.to_table();
    if (!options.out_path.empty()) {
      report.write_json(options.out_path);
      std::cout << "wrote " << options.out_path << "\n";
    }
    return 0;
  } catch (const config::ConfigError& error) {  // bench e2e --config F
    std::cerr << "moerl bench " << options.name << ": " << without_own_name(error.what(), options.name) << "\n";
    return config::kConfigErrorExitStatus;
  } catch (const std::exception& error) {
    std::cerr << "moerl bench " << options.name << ": " << without_own_name(error.what(), options.name) << "\n";
    return 1;
  }
}

}  // namespace moerl::app
