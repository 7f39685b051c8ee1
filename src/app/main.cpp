// moerl: one binary, every role. `mpirun -np N moerl train --config F` starts
// a job; the other subcommands inspect configs, checkpoints and benchmarks.

#include <CLI/CLI.hpp>
#include <malloc.h>

#include <cstdio>

#include <iostream>
#include <stdexcept>

#include "checkpoint_command.h"
#include "commands.h"
#include "moerl/core/blas_kernels.h"
#include "moerl/runtime/exit_record.h"
#include "moerl/setup/config_loading.h"

namespace {

constexpr const char* kEvalHelp =
    "Load the configured policy ([model] source = \"hf:DIR\" or the built-in model with --init) "
    "and continue a prompt; prints the prompt's NLL, the continuation and the load time.";
constexpr const char* kCheckpointHelp =
    "List, verify, tag, roll back and export versioned HDF5 checkpoints (a store directory).";

}  // namespace

static int run_moerl(int argc, char** argv) {
  // Keep large tensor buffers in the heap instead of fresh mmaps: otherwise
  // every MoE dispatch buffer is page-faulted in anew on each call (measured:
  // 21% of a CPU MoE layer's time; dispatch+combine 4 -> 22 GB/s with this).
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"moerl: reinforcement-learning post-training of Mixture-of-Experts language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", moerl::app::version_text());
  // For scripts/launch.sh: the launcher of the MPI this binary links (hidden).
  app.add_flag_callback("--mpiexec",
                        [] {
                          std::printf("%s\n", moerl::app::mpiexec_path().c_str());
                          throw CLI::Success();
                        })
      ->group("");

  // Config paths are checked by config::load_config_file, not by CLI11's
  // ExistingFile: that gives a directory or a missing file the documented
  // configuration error (status 2, agreed across ranks under mpirun) instead
  // of CLI11's exit code 105.
  moerl::app::TrainOptions train;
  auto* train_cmd =
      app.add_subcommand("train",
                         "Launch a job under mpirun/srun: every rank takes its role from [cluster] (learners, actors, "
                         "env workers) and RL post-training runs; --dry-run only checks the launch.");
  train_cmd->add_option("-c,--config", train.config_path, "TOML run configuration")->required();
  train_cmd->add_option("--set", train.overrides, "Override a key: --set section.key=value (repeatable)");
  train_cmd->add_option("--log-level", train.log_level, "trace|debug|info|warn|error (telemetry.log_level)");
  train_cmd->add_flag("--dry-run", train.dry_run,
                      "Assign roles, exchange a round of messages between all ranks, print the plan, exit 0");
  train_cmd->add_option("--init", train.init_path, "Start from these policy weights (moerl pretrain's output)");
  train_cmd->add_option(
      "--resume", train.resume,
      "Continue from a checkpoint: auto (newest valid in [checkpoint] directory) or DIR[:VERSION|TAG]");

  moerl::app::ConfigOptions config;
  auto* config_cmd = app.add_subcommand("config", "Check, show or document run configurations");
  config_cmd->require_subcommand(1);
  auto* check_cmd = config_cmd->add_subcommand("check", "Validate FILE; exit 2 with every error on failure");
  auto* show_cmd = config_cmd->add_subcommand("show", "Print the resolved configuration (defaults included) as TOML");
  config_cmd->add_subcommand("reference", "Print every section and key as a Markdown table");
  auto* get_cmd = config_cmd->add_subcommand(
      "get", "Print one resolved value (strings unquoted); also run.directory and cluster.ranks (for scripts)");
  get_cmd->add_option("file", config.config_path, "TOML run configuration")->required();
  get_cmd->add_option("key", config.key, "section.key")->required();
  get_cmd->add_option("--set", config.overrides, "Override a key: --set section.key=value (repeatable)");
  for (auto* cmd : {check_cmd, show_cmd}) {
    cmd->add_option("file", config.config_path, "TOML run configuration")->required();
    cmd->add_option("--set", config.overrides, "Override a key: --set section.key=value (repeatable)");
  }
  check_cmd->add_option("--ranks", config.ranks, "Also check [cluster] against this MPI world size");

  moerl::app::BenchOptionsCli bench;
  auto* bench_cmd = app.add_subcommand("bench", "Run a benchmark NAME; prints a table, --out writes JSON");
  bench_cmd->add_option("name", bench.name, "Benchmark name (see --list)");
  bench_cmd->add_option("--out", bench.out_path, "Write the result as JSON to this file");
  bench_cmd->add_flag("--quick", bench.quick, "Small sizes and one repetition (smoke test)");
  bench_cmd->add_option("--threads", bench.threads, "Compute threads (default: as configured by the environment)");
  bench_cmd->add_flag("--list", bench.list, "List the benchmarks");
  bench_cmd->allow_extras();  // the benchmark's own options, e.g. bench e2e --config F --set k=v

  moerl::app::EnvPlayOptions play;
  auto* env_cmd = app.add_subcommand("env", "Environments: play a session, benchmark the task families");
  env_cmd->require_subcommand(1);
  auto* play_cmd = env_cmd->add_subcommand("play", "Play one session in the terminal (one action per line)");
  play_cmd->add_option("--family", play.family, "arithmetic | maze | guess | sort | lookup | external");
  play_cmd->add_option("--seed", play.seed, "Task seed");
  play_cmd->add_option("--difficulty", play.difficulty, "Difficulty (default: [env] difficulty)");
  play_cmd->add_flag("--shaped", play.shaped, "Shaped rewards instead of sparse");
  play_cmd->add_flag("--expert", play.expert, "Let the scripted expert play");
  play_cmd->add_option("--error-rate", play.error_rate, "The expert's error rate");
  play_cmd->add_option("-c,--config", play.config_path, "Run config (for [env] defaults and [env.external])");
  play_cmd->add_option("--set", play.overrides, "Override a config key");
  moerl::app::BenchOptionsCli env_bench;
  auto* env_bench_cmd =
      env_cmd->add_subcommand("bench", "Env steps/s per family with many sessions on one worker (= moerl bench env)");
  env_bench_cmd->add_option("--out", env_bench.out_path, "Write the result as JSON to this file");
  env_bench_cmd->add_flag("--quick", env_bench.quick, "Fewer sessions and steps");

  auto* eval_cmd = app.add_subcommand("eval", kEvalHelp);
  moerl::app::EvalOptions eval;
  eval_cmd->add_option("-c,--config", eval.config_path, "TOML run configuration")->required();
  eval_cmd->add_option("--set", eval.overrides, "Override a key: --set section.key=value (repeatable)");
  eval_cmd->add_option("--prompt", eval.prompt, "Prompt text");
  eval_cmd->add_option("--tokens", eval.tokens, "Prompt as token ids, comma-separated (instead of --prompt)");
  eval_cmd->add_option("--max-new-tokens", eval.max_new_tokens, "Tokens to generate at most (default 32)");
  eval_cmd->add_option("--temperature", eval.temperature, "Sampling temperature; 0 = greedy (default)");
  eval_cmd->add_flag("--ignore-eos", eval.ignore_eos, "Do not stop at the end-of-sequence token");
  eval_cmd->add_option("--init", eval.init_path, "Weights of the built-in model (moerl pretrain's output)");
  eval_cmd->add_option("--seed", eval.seed, "Sampling seed");
  eval_cmd->add_option("--threads", eval.threads,
                       "Compute threads (default: $MOERL_THREADS_PER_RANK, else $OMP_NUM_THREADS, else all cores)");
  auto* checkpoint_cmd = app.add_subcommand("checkpoint", kCheckpointHelp);
  moerl::app::CheckpointOptions checkpoint;
  moerl::app::add_checkpoint_subcommands(*checkpoint_cmd, checkpoint);

  moerl::app::PretrainOptions pretrain;
  auto* pretrain_cmd = app.add_subcommand(
      "pretrain", "Train the base policy on scripted-expert demonstrations ([pretrain]); one process, no mpirun");
  pretrain_cmd->add_option("-c,--config", pretrain.config_path, "TOML run configuration")->required();
  pretrain_cmd->add_option("--set", pretrain.overrides, "Override a key: --set section.key=value (repeatable)");
  pretrain_cmd->add_option("--init", pretrain.init_path,
                           "Start from these weights (a checkpoint or an earlier base.pt) instead of random ones: "
                           "pretraining in stages, e.g. one family first, then all");
  pretrain_cmd->add_option("--threads", pretrain.threads,
                           "Compute threads (default: $MOERL_THREADS_PER_RANK, else $OMP_NUM_THREADS, else all cores)");

  moerl::app::CtlOptions ctl;
  auto* ctl_cmd = app.add_subcommand("ctl", "Operate on a running job from outside it");
  ctl_cmd->require_subcommand(1);
  auto* release_cmd = ctl_cmd->add_subcommand(
      "release-env",
      "Take env worker RANK out of a running job (scale-down): it is sent SIGTERM, learner 0 releases it, its "
      "sessions move to the other env workers; waits until it has left");
  release_cmd->add_option("run_dir", ctl.run_dir, "The job's run directory (holds ranks/rank-N.json)")->required();
  release_cmd->add_option("rank", ctl.rank, "The env worker's rank")->required();
  release_cmd->add_option("--timeout", ctl.timeout_s, "Seconds to wait for it to leave (default 60)");
  auto* add_cmd = ctl_cmd->add_subcommand(
      "add-env",
      "Bring env worker RANK back into a running job (scale-up after release-env or a loss): learner 0 and the "
      "actors spawn a new process in its rank (MPI_Comm_spawn; needs the fault-tolerant MPI); waits until it joined");
  add_cmd->add_option("run_dir", ctl.run_dir, "The job's run directory (holds ranks/rank-N.json)")->required();
  add_cmd->add_option("rank", ctl.rank, "The gone env worker's rank")->required();
  add_cmd->add_option("--timeout", ctl.timeout_s, "Seconds to wait for it to join (default 60)");
  moerl::app::JoinEnvOptions join;
  auto* join_cmd = app.add_subcommand("join-env", "Started by a running job for `moerl ctl add-env`");
  join_cmd->group("");
  join_cmd->add_option("--config", join.config_path)->required();
  join_cmd->add_option("--rank", join.rank)->required();
  join_cmd->add_option("--world-size", join.world_size)->required();
  join_cmd->add_option("--threads", join.threads);

  moerl::app::ReportOptions report;
  auto* report_cmd = app.add_subcommand(
      "report",
      "Write RUN_DIR/report/index.html with PNG plots of a run (learning curves, throughput, staleness, weight "
      "sync, env latency, expert load, failures, memory) and the before/after table; also while the job runs");
  report_cmd->add_option("run_dir", report.run_dir, "The run directory (holds metrics.jsonl)")->required();
  report_cmd->add_option("--out", report.out_dir, "Write the report here instead (default RUN_DIR/report)");

  CLI11_PARSE(app, argc, argv);

  if (*train_cmd) return moerl::app::run_train(train);
  if (*config_cmd) {
    config.action = *check_cmd ? "check" : *show_cmd ? "show" : *get_cmd ? "get" : "reference";
    return moerl::app::run_config(config);
  }
  if (*bench_cmd) {
    bench.args = bench_cmd->remaining();
    return moerl::app::run_bench(bench);
  }
  if (*play_cmd) return moerl::app::run_env_play(play);
  if (*env_bench_cmd) {
    env_bench.name = "env";
    return moerl::app::run_bench(env_bench);
  }
  if (*eval_cmd) return moerl::app::run_eval(eval);
  if (*checkpoint_cmd) return moerl::app::run_checkpoint(checkpoint);
  if (*pretrain_cmd) return moerl::app::run_pretrain(pretrain);
  if (*release_cmd) return moerl::app::run_ctl_release_env(ctl);
  if (*add_cmd) return moerl::app::run_ctl_add_env(ctl);
  if (*join_cmd) return moerl::app::run_join_env(join);
  if (*report_cmd) return moerl::app::run_report(report);
  return 1;
}

int main(int argc, char** argv) {
  // First, before MPI or any thread: the right BLAS kernels for this CPU
  // (may start the binary afresh with OPENBLAS_CORETYPE set).
  moerl::blas::select_kernels(argv);
  try {
    moerl::blas::select_cpu_gemm();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "moerl: %s\n", e.what());
    return 2;
  }
  moerl::runtime::prepare_exit_record();
  const int status = run_moerl(argc, argv);
  moerl::runtime::record_exit_status(status);
  return status;
}
