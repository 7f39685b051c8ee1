// `moerl bench faults [--config F] [--set k=v ...] [--init base.pt] [--steps K] [--only a,b] [--dir D]`:
// what each kind of fault costs a real job. Every case is its own
// `scripts/launch.sh -n 5 ... moerl train` (1 learner, 2 actors, 2 env
// workers) of K steps with one [faults] plan entry (docs/reliability.md),
// fired at step K/4; the baseline is the same job without faults, run first.
// A case reads its run's summary.json and metrics.jsonl:
//   detected_after_s   silence before the rank was declared lost (failures[])
//   recovered_after_s  in-job failover time; -1: the job stopped and was restarted
//   steps_lost         steps run again after a restart (failures[].steps_lost)
//   sessions_migrated / episodes_restarted / sessions_lost (env failures)
//   restarts, steps_completed, wall_s
//   reward             mean training reward of the last K/2 steps
// The ratio is reward against the baseline's (1.0: the fault cost no reward).
// With a tiny model the rewards are near zero and the ratio means little:
// pass --init with a pretrained base (scripts/quickstart.sh leaves one at
// runs/quickstart/base.pt) for a meaningful one.
//
// This bench runs jobs as child processes (launch.sh and mpirun), so it is
// started on its own, not under mpirun. Each job has a deadline (10 minutes);
// one past it is killed and the case reports it.

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>

#include "bench_args.h"
#include "child_jobs.h"
#include "moerl/bench/registry.h"
#include "moerl/core/error.h"
#include "moerl/core/json_value.h"

namespace {

namespace fs = std::filesystem;
using moerl::JsonValue;

struct FaultCase {
  std::string name;
  std::string plan;                      // one [faults] plan entry ("" = the baseline)
  std::vector<std::string> launch_args;  // extra scripts/launch.sh options
};

struct FaultArgs {
  moerl::bench::PolicyBenchArgs run;  // --config, --set, --init
  std::int64_t steps = 40;
  std::vector<std::string> only;
  std::string dir = "runs/bench-faults";
};

FaultArgs parse_args(const std::vector<std::string>& args, bool quick) {
  FaultArgs out;
  if (quick) out.steps = 16;
  const std::string who = "bench faults";
  out.run = moerl::bench::parse_policy_bench_args(
      args, who, "--config F, --set section.key=value, --init FILE, --steps K, --only a,b, --dir D",
      [&](const std::string& option, const auto& value) {
        if (option == "--steps") {
          out.steps = moerl::bench::whole_number(value(), who, option);
        } else if (option == "--only") {
          out.only = moerl::bench::split_commas(value());
        } else if (option == "--dir") {
          out.dir = value();
        } else {
          return false;
        }
        return true;
      });
  if (out.steps < 8) throw moerl::Error("bench faults: --steps must be at least 8");
  return out;
}

std::vector<FaultCase> fault_cases(std::int64_t at_step) {
  const std::string at = " at step " + std::to_string(at_step);
  return {
      {"none", "", {}},
      {"kill_actor", "kill actor 0" + at, {}},
      {"freeze_actor", "freeze actor 1" + at, {}},
      {"kill_actor_receiving", "kill actor 0 while receiving", {}},
      {"kill_env_worker", "kill env_worker 0" + at, {}},
      {"freeze_env_worker", "freeze env_worker 1" + at, {}},
      {"slow_actor", "slow actor 0 by 200 ms" + at, {}},
      {"corrupt_bucket", "corrupt bucket" + at, {}},
      {"corrupt_message", "corrupt message actor 0" + at, {}},
      {"kill_learner", "kill learner 0" + at, {}},
      {"kill_actor_no_ft", "kill actor 0" + at, {"--no-ft"}},
  };
}

// Mean of learner.reward_mean over the steps after from_step.
double late_reward(const std::string& metrics_path, std::int64_t from_step) {
  double sum = 0;
  int count = 0;
  for (const auto& point : moerl::bench::metrics_series(metrics_path, "learner", "gauges", "learner.reward_mean")) {
    if (point.step <= from_step) continue;
    sum += point.value;
    ++count;
  }
  return count ? sum / count : 0.0;
}

std::map<std::string, double> read_outcome(const std::string& run_dir, std::int64_t steps) {
  std::map<std::string, double> m;
  const JsonValue summary = moerl::bench::read_json_file(run_dir + "/summary.json");
  m["steps_completed"] = summary.at("steps_completed").as_number();
  m["restarts"] = summary.at("restarts").as_number();
  m["wall_s"] = summary.at("wall_s").as_number();
  double detected = -1, recovered = -1, migrated = 0, restarted = 0, steps_lost = 0;
  for (const JsonValue& f : summary.at("failures").as_array()) {
    if (f.at("rank").as_number() >= 0) {
      detected = std::max(detected, f.at("detected_after_s").as_number());
      if (!f.at("recovered_after_s").is_null()) recovered = std::max(recovered, f.at("recovered_after_s").as_number());
    }
    migrated += f.at("sessions_migrated").as_number();
    restarted += f.at("episodes_restarted").as_number();
    if (const std::optional<JsonValue> lost = f.find("steps_lost")) steps_lost += lost->as_number();
  }
  double sessions_lost = 0;
  for (const auto& [family, reasons] : summary.at("env_failures").as_object())
    for (const auto& [reason, n] : reasons.as_object()) sessions_lost += n.as_number();
  m["detected_after_s"] = detected;
  m["recovered_after_s"] = recovered;
  m["steps_lost"] = steps_lost;
  m["sessions_migrated"] = migrated;
  m["episodes_restarted"] = restarted;
  m["sessions_lost"] = sessions_lost;
  m["reward"] = late_reward(run_dir + "/metrics.jsonl", steps / 2);
  return m;
}

std::vector<std::string> job_argv(const FaultArgs& args, const FaultCase& fault, const std::string& launcher) {
  std::vector<std::string> argv = {launcher, "--max-restarts", "2", "--min-uptime", "5"};
  argv.insert(argv.end(), fault.launch_args.begin(), fault.launch_args.end());
  for (const char* a : {"-n", "5", "train", "--config"}) argv.emplace_back(a);
  argv.push_back(args.run.config_path);
  // The user's overrides first: the bench's own (where runs go, the layout of -n 5) win.
  std::vector<std::string> sets = args.run.overrides;
  for (const std::string& s :
       {"run.output_dir=" + args.dir, "run.name=faults-" + fault.name,
        "optim.total_steps=" + std::to_string(args.steps), std::string("cluster.learners=1"),
        std::string("cluster.actors=2"), std::string("cluster.env_workers=2"), std::string("cluster.standby_actors=0"),
        std::string("checkpoint.every_steps=5"), std::string("rollout.eval_episodes=4")})
    sets.push_back(s);
  if (!fault.plan.empty()) sets.push_back("faults.plan=[\"" + fault.plan + "\"]");
  for (const std::string& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  if (!args.run.init_path.empty()) {
    argv.push_back("--init");
    argv.push_back(args.run.init_path);
  }
  return argv;
}

moerl::bench::BenchReport run_faults_bench(const moerl::bench::BenchOptions& options) {
  const FaultArgs args = parse_args(options.args, options.quick);
  const std::string launcher = moerl::bench::launcher_path("bench faults");
  fs::create_directories(args.dir);
  moerl::bench::BenchReport report;
  std::map<std::string, double> baseline;
  for (const FaultCase& fault : fault_cases(std::max<std::int64_t>(2, args.steps / 4))) {
    const bool wanted = args.only.empty() || fault.name == "none" ||
                        std::find(args.only.begin(), args.only.end(), fault.name) != args.only.end();
    if (!wanted) continue;
    const std::string run_dir = args.dir + "/faults-" + fault.name;
    fs::remove_all(run_dir);
    const std::string log = args.dir + "/faults-" + fault.name + ".log";
    std::cout << "bench faults: " << fault.name << (fault.plan.empty() ? "" : " (" + fault.plan + ")") << "... "
              << std::flush;
    const int status = moerl::bench::run_job(job_argv(args, fault, launcher), log, 600, "bench faults");
    std::cout << "exit status " << status << " (log: " << log << ")\n" << std::flush;
    moerl::bench::BenchCase c;
    c.name = fault.name;
    c.params["plan"] = fault.plan.empty() ? std::string("(none)") : fault.plan;
    for (const std::string& a : fault.launch_args) c.params["launch"] = a;
    c.params["steps"] = args.steps;
    if (status != 0) {
      c.metrics["exit_status"] = status;
    } else {
      c.metrics = read_outcome(run_dir, args.steps);
    }
    if (fault.name == "none") {
      if (status != 0)
        throw moerl::Error("bench faults: the run without faults failed (exit status " + std::to_string(status) +
                           "; see " + log + ")");
      baseline = c.metrics;
    } else if (status == 0) {
      c.baseline = {{"reward", baseline["reward"]}, {"wall_s", baseline["wall_s"]}};
      if (baseline["reward"] != 0.0) c.ratio_metric = "reward";
    }
    report.cases.push_back(std::move(c));
  }
  return report;
}

}  // namespace

MOERL_BENCHMARK("faults", "a matrix of injected rank faults on a real job: detection, recovery, steps lost, reward",
                run_faults_bench);
