// `moerl bench algos [--config F] [--steps N] [--init base.pt] [--seeds 1,2] [--only a,b] [--dir D]
//                    [--set k=v ...]`: the six objectives of [algo] on one base, the same budget and the
// same seeds. Each (objective, seed) is its own `scripts/launch.sh -n 4 ... moerl train` (1 learner,
// 2 actors, 1 env worker) of N steps from the same --init base; the objectives differ only in
//   grpo     algo.advantage = "grpo"
//   dr_grpo  algo.advantage = "dr_grpo"  (the config's normalization stays: set
//            algo.normalization = "constant" for the paper's constant normaliser too)
//   rloo     algo.advantage = "rloo"
//   ppo      algo.advantage = "ppo"      (value head and GAE over turns)
//   gspo     algo.advantage = "grpo", algo.gspo = true
//   grpo_turn algo.advantage = "grpo", algo.credit = "turn" (each turn's own reward, normalised
//            in its group, and the later turns'; meant for shaped rewards)
// so every other key (and the user's --set) is shared. Without --init the bench first pretrains one
// base with `moerl pretrain` (the config's [pretrain]) into D/base.pt and trains every run from it.
//
// Per run it reads summary.json (held-out success per family before and after training, with the
// 95% interval and the gain's interval where summary.json has them: ci_low/ci_high, gain) and
// metrics.jsonl (training reward per step; generated tokens of the episodes the learner took per
// second, from the first step's line to the last), and its wall time. It writes D/algos.json (everything) and
// D/algos.md (the tables, also printed), and calls scripts/plot_curves.py for the learning curves (D/curves.png, one
// line per objective, and D/curve_<objective>.png); without matplotlib it says so and the tables
// are still written. A run that fails or passes its deadline (3 minutes plus 8 s per step) is named
// in the table, and the bench then exits with status 1 once everything is written.
//
// This bench runs jobs as child processes (launch.sh and mpirun), so it is started on its own,
// not under mpirun. --quick: 4 steps, seed 1 (the CI test adds a tiny model with --set).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "bench_args.h"
#include "child_jobs.h"
#include "moerl/bench/registry.h"
#include "moerl/core/error.h"
#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"

namespace {

namespace fs = std::filesystem;
using moerl::JsonValue;
using moerl::JsonWriter;

struct Objective {
  std::string name;
  std::string advantage;     // [algo] advantage
  bool gspo = false;         // [algo] gspo
  bool turn_credit = false;  // [algo] credit = "turn"
};

const std::vector<Objective>& objectives() {
  static const std::vector<Objective> list = {
      {"grpo", "grpo", false}, {"dr_grpo", "dr_grpo", false}, {"rloo", "rloo", false},
      {"ppo", "ppo", false},   {"gspo", "grpo", true},        {"grpo_turn", "grpo", false, true},
  };
  return list;
}

struct AlgosArgs {
  moerl::bench::PolicyBenchArgs run;  // --config, --set, --init
  std::int64_t steps = 200;
  std::vector<std::int64_t> seeds = {1};
  std::vector<std::string> only;
  std::string dir = "runs/bench-algos";
};

AlgosArgs parse_args(const std::vector<std::string>& args, bool quick) {
  AlgosArgs out;
  if (quick) out.steps = 4;
  const std::string who = "bench algos";
  out.run = moerl::bench::parse_policy_bench_args(
      args, who, "--config F, --steps N, --init FILE, --seeds 1,2, --only grpo,ppo, --dir D, --set section.key=value",
      [&](const std::string& option, const auto& value) {
        if (option == "--steps") {
          out.steps = moerl::bench::whole_number(value(), who, option);
        } else if (option == "--seeds") {
          out.seeds.clear();
          for (const std::string& s : moerl::bench::split_commas(value()))
            out.seeds.push_back(moerl::bench::whole_number(s, who, option));
        } else if (option == "--only") {
          out.only = moerl::bench::split_commas(value());
        } else if (option == "--dir") {
          out.dir = value();
        } else {
          return false;
        }
        return true;
      });
  if (out.steps < 2) throw moerl::Error("bench algos: --steps must be at least 2, got " + std::to_string(out.steps));
  if (out.seeds.empty()) throw moerl::Error("bench algos: --seeds names no seed");
  for (const std::string& name : out.only)
    if (std::none_of(objectives().begin(), objectives().end(), [&](const Objective& o) { return o.name == name; }))
      throw moerl::Error("bench algos: --only: unknown objective '" + name +
                         "' (objectives: grpo, dr_grpo, rloo, ppo, gspo, grpo_turn)");
  if (!out.run.init_path.empty() && !fs::is_regular_file(out.run.init_path))
    throw moerl::Error("bench algos: --init " + out.run.init_path + " is not a file");
  out.dir = fs::absolute(out.dir).lexically_normal().string();
  return out;
}

// Held-out success of one family at one evaluation; NaN where summary.json has no interval.
struct Score {
  double success = NAN, ci_low = NAN, ci_high = NAN;
  double successes = 0, episodes = 0;
};
struct Gain {
  double value = NAN, ci_low = NAN, ci_high = NAN;
};

struct RunResult {
  std::string objective;
  std::int64_t seed = 0;
  std::string run_dir, log;
  int exit_status = 0;
  std::map<std::string, Score> before, after;
  std::map<std::string, Gain> gain;  // from summary.json, or after - before without an interval
  double gen_tokens_per_s = NAN;     // generated tokens of the episodes trained on, per second of training
  double wall_s = NAN;               // summary.json wall_s: the job, evaluations included
  double job_wall_s = 0;             // the child process, start-up and shut-down included
  double steps_completed = 0;
  std::vector<double> rewards;  // training reward per step
  bool ok() const { return exit_status == 0; }
};

double number_or_nan(const JsonValue& object, const std::string& key) {
  const std::optional<JsonValue> v = object.find(key);
  return v && !v->is_null() ? v->as_number() : NAN;
}

std::map<std::string, Score> read_scores(const JsonValue& table) {
  std::map<std::string, Score> out;
  for (const auto& [family, entry] : table.as_object()) {
    Score& s = out[family];
    s.success = number_or_nan(entry, "success");
    s.ci_low = number_or_nan(entry, "ci_low");
    s.ci_high = number_or_nan(entry, "ci_high");
    s.successes = number_or_nan(entry, "successes");
    s.episodes = number_or_nan(entry, "episodes");
  }
  return out;
}

// Mean of the first (or last) tenth of the rewards, at least one step.
double reward_mean(const std::vector<double>& rewards, bool last) {
  if (rewards.empty()) return NAN;
  const size_t n = std::max<size_t>(1, rewards.size() / 10);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += rewards[last ? rewards.size() - 1 - i : i];
  return sum / static_cast<double>(n);
}

void read_outcome(RunResult& r) {
  const JsonValue summary = moerl::bench::read_json_file(r.run_dir + "/summary.json");
  r.before = read_scores(summary.at("before"));
  r.after = read_scores(summary.at("after"));
  r.wall_s = number_or_nan(summary, "wall_s");
  r.steps_completed = number_or_nan(summary, "steps_completed");
  const std::optional<JsonValue> gain = summary.find("gain");
  for (const auto& [family, after] : r.after) {
    Gain& g = r.gain[family];
    const std::optional<JsonValue> entry = gain ? gain->find(family) : std::nullopt;
    if (entry) {
      g.value = number_or_nan(*entry, "value");
      g.ci_low = number_or_nan(*entry, "ci_low");
      g.ci_high = number_or_nan(*entry, "ci_high");
    } else if (r.before.count(family)) {
      g.value = after.success - r.before.at(family).success;
    }
  }
  const std::string metrics = r.run_dir + "/metrics.jsonl";
  for (const auto& p : moerl::bench::metrics_series(metrics, "learner", "gauges", "learner.reward_mean"))
    r.rewards.push_back(p.value);
  // The learner's count moves with the step lines (the actors' reach learner 0 with their heartbeats, late).
  const auto generated = moerl::bench::metrics_series(metrics, "learner", "counters", "learner.generated_tokens");
  if (generated.size() >= 2 && generated.back().time_s > generated.front().time_s)
    r.gen_tokens_per_s =
        (generated.back().value - generated.front().value) / (generated.back().time_s - generated.front().time_s);
}

std::vector<std::string> train_argv(const AlgosArgs& args, const Objective& objective, std::int64_t seed,
                                    const std::string& launcher, const std::string& init) {
  // No restarts: a restarted run would mix two runs' wall time and curves.
  std::vector<std::string> argv = {launcher, "--max-restarts", "0",        "-n",
                                   "4",      "train",          "--config", args.run.config_path};
  // The user's overrides first: the bench's own (where runs go, the budget, the layout of -n 4, the
  // objective) win.
  std::vector<std::string> sets = args.run.overrides;
  for (const std::string& s :
       {"run.output_dir=" + args.dir, "run.name=algos-" + objective.name + "-s" + std::to_string(seed),
        "run.seed=" + std::to_string(seed), "optim.total_steps=" + std::to_string(args.steps),
        std::string("cluster.learners=1"), std::string("cluster.actors=2"), std::string("cluster.env_workers=1"),
        std::string("cluster.standby_actors=0"), "algo.advantage=\"" + objective.advantage + "\"",
        std::string("algo.gspo=") + (objective.gspo ? "true" : "false"),
        std::string("algo.credit=") + (objective.turn_credit ? "\"turn\"" : "\"episode\"")})
    sets.push_back(s);
  for (const std::string& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  argv.push_back("--init");
  argv.push_back(init);
  return argv;
}

// The base every run starts from: --init, or one pretrained here with the config's [pretrain].
std::string base_weights(const AlgosArgs& args) {
  if (!args.run.init_path.empty()) return fs::absolute(args.run.init_path).string();
  const std::string base = args.dir + "/base.pt", log = args.dir + "/pretrain.log";
  std::vector<std::string> argv = {moerl::bench::self_binary(), "pretrain", "--config", args.run.config_path};
  for (const std::string& s : args.run.overrides) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  for (const std::string& s : {"run.output_dir=" + args.dir, "pretrain.output=" + base}) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  std::cout << "bench algos: no --init, pretraining a base into " << base << "... " << std::flush;
  const int status = moerl::bench::run_job(argv, log, 1800, "bench algos");
  std::cout << "exit status " << status << "\n" << std::flush;
  if (status != 0)
    throw moerl::Error(
        "bench algos: pretraining the base failed (" +
        (status < 0 ? std::string("past its 30-minute deadline") : "exit status " + std::to_string(status)) + "; see " +
        log + ")");
  return base;
}

std::string fixed(double x, int digits) {
  if (!std::isfinite(x)) return "n/a";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, x);
  return text;
}

// "41% [29, 53]" with an interval, "41% (26/64)" without.
std::string score_text(const Score& s) {
  if (!std::isfinite(s.success)) return "n/a";
  std::string out = fixed(100 * s.success, 0) + "%";
  if (std::isfinite(s.ci_low) && std::isfinite(s.ci_high))
    return out + " [" + fixed(100 * s.ci_low, 0) + ", " + fixed(100 * s.ci_high, 0) + "]";
  return out + " (" + fixed(s.successes, 0) + "/" + fixed(s.episodes, 0) + ")";
}

// In points of success: "+12 [-3, 27]", or "+12" without an interval.
std::string gain_text(const Gain& g) {
  if (!std::isfinite(g.value)) return "n/a";
  auto signed_points = [](double x) { return (x >= 0 ? "+" : "") + fixed(100 * x, 0); };
  std::string out = signed_points(g.value);
  if (std::isfinite(g.ci_low) && std::isfinite(g.ci_high))
    out += " [" + signed_points(g.ci_low) + ", " + signed_points(g.ci_high) + "]";
  return out;
}

std::string status_text(const RunResult& r) {
  return r.exit_status < 0 ? "past its deadline" : "exit status " + std::to_string(r.exit_status);
}

std::string markdown(const AlgosArgs& args, const std::string& init, const std::vector<RunResult>& runs) {
  std::ostringstream md;
  md << "## moerl bench algos\n\nconfig " << args.run.config_path << ", " << args.steps << " steps, seeds";
  for (std::int64_t s : args.seeds) md << " " << s;
  md << ", base " << init << "\n\nHeld-out success per family (sampled evaluation; [95% interval] where summary.json "
     << "has one, else successes/episodes); gain in points of success.\n\n"
     << "| objective | seed | family | before | after | gain | gen tok/s | wall s |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  for (const RunResult& r : runs) {
    if (!r.ok()) {
      md << "| " << r.objective << " | " << r.seed << " | (failed: " << status_text(r) << ", log " << r.log
         << ") | | | | | " << fixed(r.job_wall_s, 0) << " |\n";
      continue;
    }
    for (const auto& [family, after] : r.after) {
      const auto before = r.before.find(family);
      md << "| " << r.objective << " | " << r.seed << " | " << family << " | "
         << (before == r.before.end() ? "n/a" : score_text(before->second)) << " | " << score_text(after) << " | "
         << gain_text(r.gain.at(family)) << " | " << fixed(r.gen_tokens_per_s, 0) << " | " << fixed(r.wall_s, 0)
         << " |\n";
    }
  }
  md << "\nPer objective, over its seeds: mean gain over families and seeds (points), training reward of the "
     << "first and last tenth of the steps, gen tok/s and wall time (means).\n\n"
     << "| objective | runs | mean gain | reward first -> last | gen tok/s | wall s |\n|---|---|---|---|---|---|\n";
  for (const Objective& o : objectives()) {
    double gain = 0, first = 0, last = 0, tokens = 0, wall = 0;
    int n = 0, gains = 0, tried = 0;
    for (const RunResult& r : runs) {
      if (r.objective != o.name) continue;
      ++tried;
      if (!r.ok()) continue;
      ++n;
      for (const auto& [family, g] : r.gain)
        if (std::isfinite(g.value)) {
          gain += g.value;
          ++gains;
        }
      first += reward_mean(r.rewards, false);
      last += reward_mean(r.rewards, true);
      tokens += r.gen_tokens_per_s;
      wall += r.wall_s;
    }
    if (tried == 0) continue;
    if (n == 0) {
      md << "| " << o.name << " | 0 of " << tried << " | | | | |\n";
      continue;
    }
    md << "| " << o.name << " | " << n << " of " << tried << " | "
       << (gains ? gain_text({gain / gains, NAN, NAN}) : "n/a") << " | " << fixed(first / n, 3) << " -> "
       << fixed(last / n, 3) << " | " << fixed(tokens / n, 0) << " | " << fixed(wall / n, 0) << " |\n";
  }
  return md.str();
}

void write_score(JsonWriter& json, const Score& s) {
  json.begin_object()
      .key("success")
      .value(s.success)
      .key("ci_low")
      .value(s.ci_low)
      .key("ci_high")
      .value(s.ci_high)
      .key("successes")
      .value(s.successes)
      .key("episodes")
      .value(s.episodes)
      .end_object();
}

std::string results_json(const AlgosArgs& args, const std::string& init, const std::vector<RunResult>& runs,
                         const std::vector<std::string>& plots, const std::string& plot_problem) {
  JsonWriter json;
  json.begin_object().key("bench").value("algos").key("config").value(args.run.config_path);
  json.key("steps").value(args.steps).key("init").value(init).key("seeds").begin_array();
  for (std::int64_t s : args.seeds) json.value(s);
  json.end_array().key("overrides").begin_array();
  for (const std::string& s : args.run.overrides) json.value(s);
  json.end_array().key("runs").begin_array();
  for (const RunResult& r : runs) {
    const auto objective = std::find_if(objectives().begin(), objectives().end(),
                                        [&](const Objective& o) { return o.name == r.objective; });
    json.begin_object().key("objective").value(r.objective).key("advantage").value(objective->advantage);
    json.key("gspo").value(objective->gspo).key("credit").value(objective->turn_credit ? "turn" : "episode");
    json.key("seed").value(r.seed).key("run_dir").value(r.run_dir);
    json.key("log").value(r.log).key("exit_status").value(r.exit_status).key("job_wall_s").value(r.job_wall_s);
    if (r.ok()) {
      json.key("wall_s").value(r.wall_s).key("steps_completed").value(r.steps_completed);
      json.key("gen_tokens_per_s").value(r.gen_tokens_per_s);
      json.key("before").begin_object();
      for (const auto& [family, s] : r.before) write_score(json.key(family), s);
      json.end_object().key("after").begin_object();
      for (const auto& [family, s] : r.after) write_score(json.key(family), s);
      json.end_object().key("gain").begin_object();
      for (const auto& [family, g] : r.gain)
        json.key(family)
            .begin_object()
            .key("value")
            .value(g.value)
            .key("ci_low")
            .value(g.ci_low)
            .key("ci_high")
            .value(g.ci_high)
            .end_object();
      json.end_object().key("rewards").begin_array();
      for (double x : r.rewards) json.value(x);
      json.end_array();
    }
    json.end_object();
  }
  json.end_array().key("plots").begin_array();
  for (const std::string& p : plots) json.value(p);
  json.end_array().key("plot_problem").value(plot_problem).end_object();
  return json.str();
}

// Learning curves through scripts/plot_curves.py. Returns the PNGs written;
// `problem` says why there are none (matplotlib missing, no python3, ...).
std::vector<std::string> plot_curves(const AlgosArgs& args, const std::vector<RunResult>& runs, std::string& problem) {
  // Debian's python3-matplotlib belongs to Debian's interpreter; a python3
  // that comes first in PATH (pyenv, a virtual environment) may not see it.
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  std::vector<std::string> argv = {python,    std::string(MOERL_SOURCE_DIR) + "/scripts/plot_curves.py",
                                   "--out",   args.dir,
                                   "--title", "training reward per step, " + std::to_string(args.steps) + " steps"};
  std::vector<std::string> labels;
  for (const Objective& o : objectives()) {
    std::string dirs;
    for (const RunResult& r : runs)
      if (r.objective == o.name && r.ok()) dirs += (dirs.empty() ? "" : ",") + r.run_dir;
    if (dirs.empty()) continue;
    argv.push_back(o.name + "=" + dirs);
    labels.push_back(o.name);
  }
  if (labels.empty()) {
    problem = "no run finished, nothing to plot";
    return {};
  }
  const std::string log = args.dir + "/plot.log";
  const int status = moerl::bench::run_job(argv, log, 300, "bench algos");
  if (status == 3) {
    problem = "matplotlib is not installed for " + python +
              " (Debian: apt-get install python3-matplotlib; scripts/setup.sh installs it)";
  } else if (status == 127) {
    problem = python + " was not found";
  } else if (status != 0) {
    problem = "scripts/plot_curves.py failed (" +
              (status < 0 ? std::string("past its deadline") : "exit status " + std::to_string(status)) + "; see " +
              log + ")";
  }
  if (!problem.empty()) return {};
  std::vector<std::string> plots = {args.dir + "/curves.png"};
  for (const std::string& label : labels) plots.push_back(args.dir + "/curve_" + label + ".png");
  return plots;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw moerl::Error("bench algos: cannot write " + path);
}

moerl::bench::BenchReport run_algos_bench(const moerl::bench::BenchOptions& options) {
  const AlgosArgs args = parse_args(options.args, options.quick);
  const std::string launcher = moerl::bench::launcher_path("bench algos");
  fs::create_directories(args.dir);
  const std::string init = base_weights(args);
  const double deadline_s = 180.0 + 8.0 * static_cast<double>(args.steps);
  std::vector<RunResult> runs;
  for (const Objective& objective : objectives()) {
    if (!args.only.empty() && std::find(args.only.begin(), args.only.end(), objective.name) == args.only.end())
      continue;
    for (std::int64_t seed : args.seeds) {
      RunResult r;
      r.objective = objective.name;
      r.seed = seed;
      const std::string name = "algos-" + objective.name + "-s" + std::to_string(seed);
      r.run_dir = args.dir + "/" + name;
      r.log = args.dir + "/" + name + ".log";
      // A run directory left from before would be resumed and its metrics appended to.
      fs::remove_all(r.run_dir);
      std::cout << "bench algos: " << objective.name << " seed " << seed << ", " << args.steps << " steps... "
                << std::flush;
      const auto started = std::chrono::steady_clock::now();
      r.exit_status =
          moerl::bench::run_job(train_argv(args, objective, seed, launcher, init), r.log, deadline_s, "bench algos");
      r.job_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::cout << status_text(r) << " after " << fixed(r.job_wall_s, 0) << " s (log: " << r.log << ")\n" << std::flush;
      if (r.ok()) {
        try {
          read_outcome(r);
        } catch (const moerl::Error& error) {
          std::cout << "bench algos: " << name << " finished but its results are unreadable: " << error.what() << "\n";
          r.exit_status = 1;
        }
      }
      runs.push_back(std::move(r));
    }
  }
  std::string plot_problem;
  const std::vector<std::string> plots = plot_curves(args, runs, plot_problem);
  const std::string table = markdown(args, init, runs);
  write_file(args.dir + "/algos.md", table);
  write_file(args.dir + "/algos.json", results_json(args, init, runs, plots, plot_problem) + "\n");
  std::cout << "\n" << table << "\n";
  if (plot_problem.empty()) {
    std::cout << "bench algos: learning curves:";
    for (const std::string& p : plots) std::cout << " " << p;
    std::cout << "\n";
  } else {
    std::cout << "bench algos: no learning-curve plot: " << plot_problem << "; the tables are written\n";
  }
  std::cout << "bench algos: wrote " << args.dir << "/algos.md and " << args.dir << "/algos.json\n\n" << std::flush;

  moerl::bench::BenchReport report;
  std::vector<std::string> failed;
  for (const RunResult& r : runs) {
    moerl::bench::BenchCase c;
    c.name = r.objective + "/seed" + std::to_string(r.seed);
    c.params["objective"] = r.objective;
    c.params["seed"] = r.seed;
    c.params["steps"] = args.steps;
    if (!r.ok()) {
      c.metrics["exit_status"] = r.exit_status;
      failed.push_back(r.objective + " seed " + std::to_string(r.seed) + " (" + status_text(r) + ", log " + r.log +
                       ")");
    } else {
      for (const auto& [family, s] : r.before) c.metrics["before." + family] = s.success;
      for (const auto& [family, s] : r.after) c.metrics["after." + family] = s.success;
      c.metrics["gen_tokens_per_s"] = r.gen_tokens_per_s;
      c.metrics["wall_s"] = r.wall_s;
      c.metrics["reward_first"] = reward_mean(r.rewards, false);
      c.metrics["reward_last"] = reward_mean(r.rewards, true);
    }
    report.cases.push_back(std::move(c));
  }
  if (!failed.empty()) {
    std::string text;
    for (const std::string& f : failed) text += (text.empty() ? "" : "; ") + f;
    throw moerl::Error(std::to_string(failed.size()) + " of " + std::to_string(runs.size()) + " runs failed: " + text);
  }
  return report;
}

}  // namespace

MOERL_BENCHMARK("algos", "GRPO, Dr.GRPO, RLOO, PPO and GSPO on one base: held-out success, tokens/s, wall, curves",
                run_algos_bench);
