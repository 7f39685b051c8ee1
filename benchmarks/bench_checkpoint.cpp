// `moerl bench checkpoint`: saving and loading a learner checkpoint (model
// parameters + AdamW state + RNG and staleness state, HDF5 with per-array
// CRC-32C, temporary file, fsync, rename, index, `latest`) against a plain
// write(2) + fsync and read(2) of the same number of bytes, side by side in
// the same process. Two models: the quickstart's and a larger one (~70 MB of
// float32 weights). Loads read from the page cache in both columns (the
// benchmark does not drop caches), so they compare the software paths.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "moerl/bench/registry.h"
#include "moerl/config/config.h"
#include "moerl/core/error.h"
#include "moerl/learner/checkpointing.h"
#include "moerl/model/policy.h"
#include "moerl/storage/checkpoint_store.h"

namespace moerl::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The baseline: the same bytes through write(2), fsync, close.
double plain_write(const std::string& path, const std::vector<char>& bytes) {
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("bench checkpoint: cannot create '" + path + "'");
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, std::min<std::size_t>(bytes.size() - at, 1 << 26));
    if (n <= 0) throw Error("bench checkpoint: write to '" + path + "' failed");
    at += static_cast<std::size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  return seconds_since(t0);
}

double plain_read(const std::string& path, std::vector<char>& bytes) {
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("bench checkpoint: cannot open '" + path + "'");
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::read(fd, bytes.data() + at, std::min<std::size_t>(bytes.size() - at, 1 << 26));
    if (n <= 0) throw Error("bench checkpoint: read of '" + path + "' failed");
    at += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return seconds_since(t0);
}

struct ModelCase {
  std::string name;
  std::int64_t d_model, layers, experts, d_expert;
};

void run_case(const ModelCase& mc, int repetitions, const std::string& scratch, BenchReport& report) {
  config::Config config;
  config.model.d_model = mc.d_model;
  config.model.num_layers = mc.layers;
  config.model.d_ff = 2 * mc.d_model;
  config.moe.num_experts = mc.experts;
  config.moe.d_expert = mc.d_expert;
  config.checkpoint.directory = scratch + "/" + mc.name;
  config.checkpoint.keep_last = 1000;
  model::Policy policy(config.model, config.moe);
  torch::optim::AdamW optimizer(policy->parameters(), torch::optim::AdamWOptions(1e-4));
  // One optimizer step, so that the AdamW moments exist and are saved.
  for (auto& p : policy->parameters()) p.mutable_grad() = torch::full_like(p, 1e-3);
  optimizer.step();
  std::int64_t weight_bytes = 0;
  for (const auto& p : policy->parameters()) weight_bytes += p.numel() * 4;

  const learner::CheckpointSettings settings = learner::checkpoint_settings(config);
  learner::LearnerState state;
  state.rng_states = {learner::cpu_generator_state()};
  double best_save = 1e30, best_load = 1e30, best_write = 1e30, best_read = 1e30;
  std::uint64_t file_bytes = 0;
  for (int r = 0; r < repetitions; ++r) {
    state.version = state.step = r + 1;
    const auto t0 = Clock::now();
    learner::save_checkpoint(settings, *policy, optimizer, state);
    best_save = std::min(best_save, seconds_since(t0));
    const storage::CheckpointStore store(config.checkpoint.directory);
    file_bytes = static_cast<std::uint64_t>(fs::file_size(store.shard_path(state.version, 0)));
    const auto t1 = Clock::now();
    learner::load_checkpoint_version(settings.directory, state.version, *policy, &optimizer);
    best_load = std::min(best_load, seconds_since(t1));

    std::vector<char> bytes(file_bytes, static_cast<char>(r + 1));
    const std::string plain = scratch + "/" + mc.name + ".plain";
    best_write = std::min(best_write, plain_write(plain, bytes));
    best_read = std::min(best_read, plain_read(plain, bytes));
  }
  const double gb = static_cast<double>(file_bytes) / 1e9;
  const std::map<std::string, ParamValue> params = {
      {"model", mc.name}, {"weight_bytes", weight_bytes}, {"file_bytes", static_cast<std::int64_t>(file_bytes)}};
  BenchCase save{"save",
                 params,
                 {{"GB_per_s", gb / best_save}, {"seconds", best_save}},
                 {{"GB_per_s", gb / best_write}, {"seconds", best_write}},
                 "GB_per_s",
                 true};
  BenchCase load{"load",
                 params,
                 {{"GB_per_s", gb / best_load}, {"seconds", best_load}},
                 {{"GB_per_s", gb / best_read}, {"seconds", best_read}},
                 "GB_per_s",
                 true};
  report.cases.push_back(save);
  report.cases.push_back(load);
}

BenchReport run(const BenchOptions& options) {
  BenchReport report;
  report.bench = "checkpoint";
  const std::string scratch =
      (fs::temp_directory_path() / ("moerl-bench-checkpoint-" + std::to_string(::getpid()))).string();
  fs::create_directories(scratch);
  std::vector<ModelCase> cases = {{"quickstart", 128, 2, 8, 128}};
  if (!options.quick) cases.push_back({"larger", 384, 4, 8, 384});
  try {
    for (const ModelCase& mc : cases) run_case(mc, options.quick ? 1 : 3, scratch, report);
  } catch (...) {
    fs::remove_all(scratch);
    throw;
  }
  fs::remove_all(scratch);
  return report;
}

}  // namespace
}  // namespace moerl::bench

MOERL_BENCHMARK("checkpoint",
                "learner checkpoint save/load GB/s (HDF5, checksums, fsync, rename) vs plain write+fsync/read of the "
                "same bytes",
                moerl::bench::run);
