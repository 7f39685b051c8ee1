#pragma once
// `moerl checkpoint list|verify|tag|rollback|export|prune|diff` over a
// checkpoint directory, plus the hidden `write-sample` (writes a small sample version:
// a tool for testing the store and these commands, not for training).
// No MPI, no LibTorch: safe on a login node.
//
// Wiring in main.cpp:
//   moerl::app::CheckpointOptions checkpoint;
//   moerl::app::add_checkpoint_subcommands(*checkpoint_cmd, checkpoint);
//   ...
//   if (*checkpoint_cmd) return moerl::app::run_checkpoint(checkpoint);

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace moerl::storage {
class CheckpointStore;
}

namespace moerl::app {

struct CheckpointOptions {
  std::string action;               // list | verify | tag | rollback | export | prune | write-sample
  std::string dir;                  // the checkpoint directory (RUN_DIR/checkpoints)
  std::string version;              // verify (optional), tag, export, write-sample: a version or tag
  std::string name;                 // tag: the new tag
  std::string to;                   // rollback --to VERSION|TAG
  bool previous = false;            // rollback --previous
  std::string out_path;             // export OUT.h5
  int keep_last = 0;                // prune --keep K
  int shards = 1;                   // write-sample --shards N
  bool no_latest = false;           // write-sample --no-latest: leave `latest` where it is
  double shard_mb = 2048;           // export-hf --shard-mb: largest safetensors shard (MiB of tensor data)
  std::string config_path;          // import-hf --config: a run config with an hf: model source
  std::string other;                // diff: the second DIR[:VERSION|TAG] (dir is the first)
  std::vector<std::string> ignore;  // diff --ignore: attribute names or array-name prefixes not compared
  double tolerance = 0;             // diff --tolerance: float arrays this close (max |a - b|) count as equal
  // accept RUN_DIR VERSION (dir is the run directory there)
  std::string checkpoints;     // --checkpoints DIR: the store, when not RUN_DIR/checkpoints
  double max_env_p99_s = 0.5;  // --max-env-p99-s
  double max_imbalance = 2.0;  // --max-imbalance
};

// `moerl checkpoint accept RUN_DIR VERSION` (cmd_checkpoint_accept.cpp): the
// pre-release checks of one version; on success it is tagged `stable`.
// Exit status 0 accepted, 1 a check failed, 2 usage errors.
int run_accept(const CheckpointOptions& options);
void add_accept_subcommand(CLI::App& checkpoint_cmd, CheckpointOptions& options);

// Exit status: 0 success; 1 a checkpoint is invalid (verify) or an operation
// was refused (rollback to a corrupt version); 2 usage errors (unknown
// directory, version or tag).
int run_checkpoint(const CheckpointOptions& options);

// Declares the subcommands and their options under `checkpoint_cmd`; the
// chosen one's name lands in options.action.
void add_checkpoint_subcommands(CLI::App& checkpoint_cmd, CheckpointOptions& options);

// export-hf and the hidden import-hf (cmd_checkpoint_hf.cpp).
void add_hf_checkpoint_subcommands(CLI::App& checkpoint_cmd, CheckpointOptions& options);
int run_export_hf(const storage::CheckpointStore& store, const CheckpointOptions& options);
int run_import_hf(storage::CheckpointStore& store, const CheckpointOptions& options);

}  // namespace moerl::app
