// `moerl bench blas`: fp32 GEMM GFLOP/s of every OpenBLAS core this CPU can
// run, side by side, against the SSE3 fallback ("Prescott") that Debian's
// OpenBLAS 0.3.21 loads on CPUs it does not know. The core is fixed when the
// library loads, so each core is measured in a child process started with
// OPENBLAS_CORETYPE set; rounds alternate the cores (A B C, A B C, ...) and
// each keeps its best round, so that a busy moment of the machine does not
// fall on one core only. Shapes: a square GEMM (the ceiling) and the expert
// GEMMs of a learner micro-batch and of a decode step.
//
// `moerl bench blas --child` is one child: it measures the kernels its
// process loaded and writes them with --out.

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "child_jobs.h"
#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/core/blas_kernels.h"
#include "moerl/core/error.h"

namespace moerl::bench {
namespace {

struct GemmShape {
  const char* what;
  int m, n, k;
};

std::vector<GemmShape> shapes(bool quick) {
  if (quick) return {{"square", 128, 128, 128}};
  // Experts of d_model 1024, d_expert 1024: 1024 tokens x top-2 / 8 experts
  // = 256 rows per expert in a learner micro-batch; 16 rows in a decode step.
  return {{"square", 1024, 1024, 1024}, {"expert_learner", 256, 1024, 1024}, {"expert_decode", 16, 1024, 1024}};
}

double gflops_of(const GemmShape& s, bool quick) {
  std::vector<float> a(static_cast<size_t>(s.m) * s.k, 0.5f), b(static_cast<size_t>(s.k) * s.n, 0.25f),
      c(static_cast<size_t>(s.m) * s.n);
  const double flops = 2.0 * s.m * s.n * s.k;
  // Enough calls per timing for ~0.1 s of work at 100 GFLOP/s.
  const int calls = std::max(1, static_cast<int>(1e10 / flops));
  if (!blas::sgemm(s.m, s.n, s.k, a.data(), b.data(), c.data()))
    throw Error("moerl bench blas: this process has no cblas_sgemm (not OpenBLAS?)");
  const double seconds = best_seconds(quick ? 1 : 3, [&] {
    for (int i = 0; i < calls; ++i) blas::sgemm(s.m, s.n, s.k, a.data(), b.data(), c.data());
  });
  return flops * calls / seconds / 1e9;
}

BenchReport run_child(const BenchOptions& options) {
  BenchReport report;
  for (const GemmShape& s : shapes(options.quick)) {
    BenchCase c;
    c.name = s.what;
    c.params = {{"m", std::int64_t{s.m}}, {"n", std::int64_t{s.n}}, {"k", std::int64_t{s.k}}};
    c.metrics = {{"GFLOP_per_s", gflops_of(s, options.quick)}};
    report.cases.push_back(c);
  }
  return report;
}

// GFLOP/s by case name, from one child run under OPENBLAS_CORETYPE=core.
std::map<std::string, double> measure_core(const std::string& core, int threads, bool quick, const std::string& dir) {
  const std::string out = dir + "/" + core + "-" + std::to_string(threads) + ".json";
  std::vector<std::string> argv = {self_binary(), "bench", "blas", "--threads", std::to_string(threads), "--out", out};
  if (quick) argv.push_back("--quick");
  argv.push_back("--child");
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  const int status = run_job(argv, dir + "/" + core + ".log", 300, "moerl bench blas");
  unsetenv("OPENBLAS_CORETYPE");
  if (status != 0)
    throw Error("moerl bench blas: the child for core " + core + " ended with status " + std::to_string(status) +
                " (log: " + dir + "/" + core + ".log)");
  const JsonValue result = read_json_file(out);
  const std::string loaded = result.at("host").at("blas_core").as_string();
  if (loaded != core)
    throw Error("moerl bench blas: OPENBLAS_CORETYPE=" + core + " loaded core " + loaded + " instead");
  std::map<std::string, double> gflops;
  for (const JsonValue& c : result.at("cases").as_array())
    gflops[c.at("name").as_string()] = c.at("metrics").at("GFLOP_per_s").as_number();
  return gflops;
}

BenchReport run_parent(const BenchOptions& options) {
  const blas::BlasInfo mine = blas::blas_info();
  if (mine.core.empty()) throw Error("moerl bench blas: this build's BLAS is not OpenBLAS: " + mine.library);
  std::vector<std::string> cores = blas::forcible_cores(blas::detect_vector_level());
  // The core moerl runs by default is measured too, in case it is none of these (Cooperlake).
  bool listed = false;
  for (const std::string& core : cores) listed = listed || core == mine.core;
  if (!listed) cores.push_back(mine.core);
  const std::vector<int> thread_counts =
      options.threads > 0 ? std::vector<int>{options.threads} : std::vector<int>{1, 2};
  char dir_template[] = "/tmp/moerl-bench-blas-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (!dir) throw Error("moerl bench blas: cannot make a directory under /tmp");
  const int rounds = options.quick ? 1 : 3;
  BenchReport report;
  for (int threads : thread_counts) {
    std::map<std::string, std::map<std::string, double>> best;  // core -> case -> GFLOP/s
    for (int round = 0; round < rounds; ++round)
      for (const std::string& core : cores)
        for (const auto& [name, gflops] : measure_core(core, threads, options.quick, dir))
          best[core][name] = std::max(best[core][name], gflops);
    for (const GemmShape& s : shapes(options.quick)) {
      BenchCase c;
      c.name = std::string("sgemm_") + s.what;
      c.params = {{"m", std::int64_t{s.m}},
                  {"n", std::int64_t{s.n}},
                  {"k", std::int64_t{s.k}},
                  {"threads", std::int64_t{threads}},
                  {"core", mine.core}};
      c.metrics = {{"GFLOP_per_s", best[mine.core][s.what]}};
      for (const std::string& core : cores) c.metrics["GFLOP_per_s_" + core] = best[core][s.what];
      c.baseline = {{"GFLOP_per_s", best["Prescott"][s.what]}};  // what users got on an unknown CPU
      c.ratio_metric = "GFLOP_per_s";
      report.cases.push_back(c);
    }
  }
  return report;
}

BenchReport run(const BenchOptions& options) {
  for (const std::string& arg : options.args)
    if (arg == "--child") return run_child(options);
  if (!options.args.empty()) throw Error("moerl bench blas: unknown argument '" + options.args.front() + "'");
  return run_parent(options);
}

MOERL_BENCHMARK("blas",
                "fp32 GEMM GFLOP/s of moerl's BLAS core vs every other OpenBLAS core this CPU runs, "
                "against the SSE3 fallback (Prescott), in child processes, alternating",
                run);

}  // namespace
}  // namespace moerl::bench
