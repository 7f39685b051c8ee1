// `moerl checkpoint accept RUN_DIR VERSION`: the acceptance check before a
// version goes live (docs/observability.md). It passes when
//   - the version is a valid checkpoint with a held-out evaluation of its own
//     ([eval] every_steps writes vNNNNNN.eval.json beside it),
//   - no family's success is below the reference's beyond the 95% interval
//     of the difference (the reference: the version tagged `stable`, else the
//     base the run started from),
//   - the run's environment step P99 up to that version is under the limit,
//   - no weight publication was refused by a receiver (a version mismatch),
//   - no MoE layer's expert load was more imbalanced than the limit,
// and then tags the version `stable`. The table says why either way.
#include <spdlog/fmt/fmt.h>

#include <CLI/CLI.hpp>
#include <algorithm>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "checkpoint_command.h"
#include "moerl/core/error.h"
#include "moerl/core/string_affixes.h"
#include "moerl/learner/evaluation_record.h"
#include "moerl/storage/checkpoint_store.h"
#include "moerl/telemetry/metrics_file.h"

namespace moerl::app {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using storage::CheckpointStore;

struct Check {
  std::string name;
  std::string measured;
  std::string limit;
  bool passed = false;
};

// The last metrics line at or before `step` (a resumed run writes the steps after its checkpoint again).
std::optional<json> metrics_at(const std::string& path, std::int64_t step) {
  const std::optional<std::string> line = telemetry::last_metrics_line_through(path, step);
  if (!line) return std::nullopt;
  return json::parse(*line);
}

Check success_check(const std::string& store_dir, std::int64_t version,
                    const std::map<std::string, std::int64_t>& tags) {
  Check c{"held-out success", "", "", false};
  const std::optional<learner::EvaluationRecord> candidate = learner::read_evaluation(store_dir, version);
  std::optional<learner::EvaluationRecord> reference;
  std::string against = "the base";
  if (const auto stable = tags.find("stable"); stable != tags.end()) {
    reference = learner::read_evaluation(store_dir, stable->second);
    against = "stable " + CheckpointStore::version_label(stable->second);
  }
  if (!reference) reference = learner::read_evaluation(store_dir, -1);
  c.limit = "not below " + against + " beyond the 95% interval";
  if (!candidate) {
    c.measured = "no evaluation of " + CheckpointStore::version_label(version) +
                 " (run with [eval] every_steps a multiple of checkpoint.every_steps)";
    return c;
  }
  if (!reference) {
    c.measured = "no evaluation of " + against + " to compare with";
    return c;
  }
  const std::vector<std::string> worse = learner::regressions(reference->sampled, candidate->sampled);
  for (const auto& [family, score] : candidate->sampled)
    c.measured += fmt::format("{}{} {:.0f}%", c.measured.empty() ? "" : ", ", family, 100 * score.success_rate());
  for (const std::string& w : worse) c.measured += "; below: " + w;
  c.passed = worse.empty();
  return c;
}

Check latency_check(const json& line, double limit_s) {
  Check c{"environment step P99", "", fmt::format("under {:.0f} ms", 1e3 * limit_s), false};
  double worst = -1;
  std::string worst_family;
  const json ranks = line.value("ranks", json::array());
  for (const json& rank : ranks) {
    // A named copy: items() of the temporary value() returns would dangle.
    const json histograms = rank.value("histograms", json::object());
    for (const auto& [name, h] : histograms.items())
      if (starts_with(name, "env.step_latency_s") && h.value("p99", 0.0) > worst) {
        worst = h.value("p99", 0.0);
        worst_family = name.size() > 19 ? name.substr(19) : "all";
      }
  }
  if (worst < 0) {
    c.measured = "no environment step latencies in metrics.jsonl";
    return c;
  }
  c.measured = fmt::format("{:.1f} ms ({})", 1e3 * worst, worst_family);
  c.passed = worst < limit_s;
  return c;
}

Check mismatch_check(const json& line) {
  double refused = 0;
  const json ranks = line.value("ranks", json::array());
  for (const json& rank : ranks) refused += rank.value("counters", json::object()).value("sync.refused_versions", 0.0);
  return {"weight-version mismatches", fmt::format("{:.0f} publications refused", refused), "none", refused == 0};
}

Check imbalance_check(const json& line, double limit) {
  Check c{"expert load imbalance (max/mean)", "", fmt::format("under {:.2f}", limit), true};
  double worst = 0;
  std::string where;
  const json ranks = line.value("ranks", json::array());
  for (const json& rank : ranks) {
    if (rank.value("role", "") != "learner") continue;
    const json gauges = rank.value("gauges", json::object());
    for (const auto& [name, value] : gauges.items())
      if (starts_with(name, "moe.layer.") && ends_with(name, ".imbalance") && value.get<double>() > worst) {
        worst = value.get<double>();
        where = name.substr(10, name.size() - 20);
      }
  }
  if (worst == 0) {
    c.measured = "no MoE layer load recorded";
    return c;
  }
  c.measured = fmt::format("{:.2f} (layer {})", worst, where);
  c.passed = worst < limit;
  return c;
}

void print_table(const std::vector<Check>& checks) {
  std::size_t name_w = 5, measured_w = 8;
  for (const Check& c : checks) {
    name_w = std::max(name_w, c.name.size());
    measured_w = std::max(measured_w, c.measured.size());
  }
  std::cout << fmt::format("{:<{}}  {:<{}}  {:<6}  {}\n", "check", name_w, "measured", measured_w, "result", "limit");
  for (const Check& c : checks)
    std::cout << fmt::format("{:<{}}  {:<{}}  {:<6}  {}\n", c.name, name_w, c.measured, measured_w,
                             c.passed ? "pass" : "FAIL", c.limit);
}

}  // namespace

int run_accept(const CheckpointOptions& options) {
  const std::string run_dir = options.dir;
  const std::string store_dir =
      options.checkpoints.empty() ? (fs::path(run_dir) / "checkpoints").string() : options.checkpoints;
  const std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  std::error_code ec;
  if (!fs::is_directory(store_dir, ec) || !fs::is_regular_file(metrics_path, ec)) {
    std::cerr << "moerl checkpoint accept: " << run_dir << " is not a run directory (it needs metrics.jsonl and "
              << store_dir << "; --checkpoints DIR names another store)\n";
    return 2;
  }
  CheckpointStore store(store_dir);
  std::int64_t version = 0;
  try {
    version = store.resolve(options.version);
  } catch (const storage::CheckpointError& error) {
    std::cerr << "moerl checkpoint accept: " << error.what() << "\n";
    return 2;
  }
  const std::string label = CheckpointStore::version_label(version);
  std::vector<Check> checks;
  const storage::VerifyResult verified = store.verify(version);
  checks.push_back({"checkpoint", verified.valid ? "valid" : verified.problem, "valid", verified.valid});
  std::int64_t step = -1;
  for (const storage::VersionInfo& info : store.list())
    if (info.version == version) step = info.learner_step;
  const std::map<std::string, std::int64_t> tags = store.tags();
  checks.push_back(success_check(store_dir, version, tags));
  const std::optional<json> line = metrics_at(metrics_path, step < 0 ? version : step);
  if (!line) {
    checks.push_back(
        {"run metrics", "no line of metrics.jsonl at or before step " + std::to_string(step), "present", false});
  } else {
    checks.push_back(latency_check(*line, options.max_env_p99_s));
    checks.push_back(mismatch_check(*line));
    checks.push_back(imbalance_check(*line, options.max_imbalance));
  }
  std::cout << "acceptance of " << label << " (learner step " << step << ") in " << store_dir << ":\n";
  print_table(checks);
  const auto failed = std::count_if(checks.begin(), checks.end(), [](const Check& c) { return !c.passed; });
  if (failed > 0) {
    std::cout << "not accepted: " << failed << " check(s) failed; `stable` stays "
              << (tags.count("stable") ? CheckpointStore::version_label(tags.at("stable")) : std::string("unset"))
              << "\n";
    return 1;
  }
  store.tag(version, "stable");
  std::cout << "accepted: " << label << " is tagged stable"
            << (tags.count("stable") ? " (was " + CheckpointStore::version_label(tags.at("stable")) + ")"
                                     : std::string())
            << "\n";
  return 0;
}

void add_accept_subcommand(CLI::App& checkpoint_cmd, CheckpointOptions& options) {
  CLI::App* accept = checkpoint_cmd.add_subcommand(
      "accept",
      "Acceptance check of one version before it goes live: held-out success not below `stable` (else the base) "
      "beyond its interval, environment step P99, no weight-version mismatch, expert imbalance; on success tag "
      "it `stable` (exit 0 accepted, 1 a check failed)");
  accept->add_option("run_dir", options.dir, "The run directory (holds metrics.jsonl and checkpoints/)")->required();
  accept->add_option("version", options.version, "Version (12, v000012) or tag")->required();
  accept->add_option("--checkpoints", options.checkpoints, "The checkpoint store, when not RUN_DIR/checkpoints");
  accept->add_option("--max-env-p99-s", options.max_env_p99_s, "Environment step P99 limit in seconds (default 0.5)")
      ->check(CLI::PositiveNumber);
  accept->add_option("--max-imbalance", options.max_imbalance, "Max/mean expert load limit (default 2)")
      ->check(CLI::Range(1.0, 1e9));
  accept->callback([&options] { options.action = "accept"; });
}

}  // namespace moerl::app
