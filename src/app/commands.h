#pragma once
// The subcommands of the moerl binary. main.cpp declares the command line
// (CLI11); each run_* function does the work and returns the exit status.

#include <cstdint>
#include <string>
#include <vector>

namespace moerl::app {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set section.key=value
  std::string log_level;               // --log-level, shortcut for telemetry.log_level
  bool dry_run = false;
  std::string init_path;  // --init: starting weights
  std::string resume;     // --resume auto|PATH
};

struct PretrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int threads = 0;
  std::string init_path;  // continue from these weights (pretraining in stages)
};

struct ConfigOptions {
  std::string action;  // check | show | reference
  std::string config_path;
  std::vector<std::string> overrides;
  int ranks = 0;    // check: also check [cluster] against this world size
  std::string key;  // get: section.key
};

struct BenchOptionsCli {
  std::string name;
  std::string out_path;
  bool quick = false;
  bool list = false;
  int threads = 0;
  std::vector<std::string> args;  // the benchmark's own options (e.g. bench e2e --config F)
};

struct EnvPlayOptions {
  std::string family = "maze";
  std::uint64_t seed = 1;
  int difficulty = 0;  // 0 = from the config ([env] difficulty)
  bool shaped = false;
  bool expert = false;      // let the scripted expert play
  double error_rate = 0.0;  // the expert's error rate
  std::string config_path;  // optional: for [env.external] command and defaults
  std::vector<std::string> overrides;
};

struct EvalOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string prompt;  // --prompt TEXT
  std::string tokens;  // --tokens ID,ID,...: token ids instead of text
  std::int64_t max_new_tokens = 32;
  double temperature = 0.0;  // 0 = greedy
  bool ignore_eos = false;   // keep generating past the end-of-sequence token
  std::string init_path;     // --init: weights of the built-in model (moerl pretrain's output)
  std::uint64_t seed = 1;
  int threads = 0;
};

struct CtlOptions {
  std::string run_dir;  // the job's run directory (its ranks/ records)
  int rank = -1;
  double timeout_s = 60;  // how long to wait for the rank to leave (release-env) or join (add-env)
};

// `moerl join-env` (hidden): the process that learner 0 and the actors
// spawn to fill a gone env worker's rank (runtime/env_join.h).
struct JoinEnvOptions {
  std::string config_path;  // the job's resolved configuration, written by learner 0
  int rank = -1;
  int world_size = 0;
  int threads = 1;
};

struct ReportOptions {
  std::string run_dir;  // the run directory (holds metrics.jsonl)
  std::string out_dir;  // --out: default <run_dir>/report
};

int run_train(const TrainOptions& options);
int run_report(const ReportOptions& options);
int run_ctl_release_env(const CtlOptions& options);
int run_ctl_add_env(const CtlOptions& options);
int run_join_env(const JoinEnvOptions& options);
int run_eval(const EvalOptions& options);
int run_env_play(const EnvPlayOptions& options);
int run_pretrain(const PretrainOptions& options);
int run_config(const ConfigOptions& options);
int run_bench(const BenchOptionsCli& options);

// "moerl 0.1.0 (LibTorch 1.13.1, Open MPI v4.1.4, CUDA kernels: built)".
std::string version_text();
std::string mpiexec_path();  // the launcher of the MPI moerl was built against
// Sets LibTorch's intra-op threads (the only place the app touches ATen).
void set_compute_threads(int threads);
// The threads of a one-process command (pretrain, eval) when --threads is not
// given: MOERL_THREADS_PER_RANK, else OMP_NUM_THREADS, else every usable core.
// Two such commands side by side on a 2-core machine, each with 2 threads,
// ran 20x slower than with one thread each (libgomp's waiting threads spin),
// so a thread count the user set in the environment is respected.
int single_process_threads(int requested);

}  // namespace moerl::app
