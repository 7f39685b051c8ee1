// The learner's checkpoints: everything a resume needs comes back bitwise
// (weights, AdamW moments, RNG states, staleness account, cursor, program
// version); a model that does not match is refused naming the dataset; the
// schedule saves by steps and by minutes, injects crashes, notices rollbacks
// and archives in the background.

#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../unit/temp_dir.h"
#include "moerl/config/config.h"
#include "moerl/learner/checkpointing.h"
#include "moerl/storage/checkpoint_store.h"

using moerl::learner::checkpoint_settings;
using moerl::learner::CheckpointSchedule;
using moerl::learner::LearnerState;
using moerl::learner::StalenessAccount;

namespace {

moerl::config::Config tiny_config(const std::string& directory) {
  moerl::config::Config c;
  c.model.d_model = 16;
  c.model.num_layers = 1;
  c.model.num_heads = 2;
  c.model.num_kv_heads = 1;
  c.model.d_ff = 24;
  c.model.vocab_size = 264;
  c.moe.num_experts = 4;
  c.moe.d_expert = 8;
  c.checkpoint.directory = directory;
  c.checkpoint.keep_last = 10;
  return c;
}

// A policy and an optimizer that has taken two steps (so the moments are not zero).
struct Trained {
  moerl::model::Policy policy;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  Trained(const moerl::config::Config& c, std::uint64_t seed) : policy(nullptr) {
    torch::manual_seed(seed);
    policy = moerl::model::Policy(c.model, c.moe);
    optimizer = std::make_unique<torch::optim::AdamW>(policy->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 2; ++step) {
      for (auto& p : policy->parameters()) p.mutable_grad() = torch::randn_like(p);
      optimizer->step();
    }
  }
};

bool same_parameters(moerl::model::PolicyImpl& a, moerl::model::PolicyImpl& b) {
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    if (!torch::equal(pa[i], pb[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("a learner checkpoint restores weights, optimizer, RNG, staleness and cursor bitwise", "[checkpointing]") {
  moerl_test::TempDir dir;
  const auto config = tiny_config(dir.file("ckpt"));
  Trained saved(config, 1);
  LearnerState state;
  state.step = 7;
  state.version = 9;
  state.next_group = 123;
  state.next_seed = 456;
  state.staleness.taken_groups = 20;
  state.staleness.dropped_groups = 3;
  state.staleness.add_tokens(0, 100);
  state.staleness.add_tokens(2, 5);
  state.staleness.add_tokens(500, 1);  // lumped into the last bucket
  torch::manual_seed(77);
  torch::randn({3});  // move the generator somewhere particular
  state.rng_states = {moerl::learner::cpu_generator_state(), std::vector<std::uint8_t>(64, 7)};
  const torch::Tensor expected_draw = torch::randn({4});
  moerl::learner::save_checkpoint(checkpoint_settings(config), *saved.policy, *saved.optimizer, state);

  Trained loaded(config, 2);
  REQUIRE_FALSE(same_parameters(*saved.policy, *loaded.policy));
  // A learner that has stepped keeps its moment tensors: the load writes into them.
  const auto first_moment = [](Trained& t) {
    const auto& states = t.optimizer->state();
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*states.begin()->second);
    return state.exp_avg().data_ptr();
  };
  const void* moment_memory = first_moment(loaded);
  const LearnerState back = moerl::learner::load_checkpoint_version(checkpoint_settings(config).directory, 9,
                                                                    *loaded.policy, loaded.optimizer.get());
  CHECK(same_parameters(*saved.policy, *loaded.policy));
  CHECK(first_moment(loaded) == moment_memory);
  CHECK(back.step == 7);
  CHECK(back.version == 9);
  CHECK(back.next_group == 123);
  CHECK(back.next_seed == 456);
  CHECK(back.staleness == state.staleness);
  CHECK(back.staleness.tokens_by_lag.size() == StalenessAccount::kLagBuckets);
  CHECK(back.staleness.tokens_by_lag.back() == 1);
  CHECK(back.program_version == moerl::storage::program_version());
  REQUIRE(back.rng_states.size() == 2);
  CHECK(back.rng_states[1] == state.rng_states[1]);
  // The restored generator continues the saved stream.
  torch::manual_seed(5);
  moerl::learner::set_cpu_generator_state(back.rng_states[0]);
  CHECK(torch::equal(torch::randn({4}), expected_draw));

  // Both optimizers take the same next step: bitwise-equal results need the
  // same moments and the same step count (bias correction).
  for (auto* t : {&saved, &loaded}) {
    for (auto& p : t->policy->parameters()) p.mutable_grad() = torch::full_like(p, 0.5);
    t->optimizer->step();
  }
  CHECK(same_parameters(*saved.policy, *loaded.policy));

  // A model of another shape is refused before anything is loaded, naming the dataset.
  auto other = config;
  other.model.d_model = 32;
  Trained wrong(other, 3);
  const auto before = wrong.policy->parameters()[0].clone();
  CHECK_THROWS_WITH(
      moerl::learner::load_checkpoint_version(checkpoint_settings(other).directory, 9, *wrong.policy, nullptr),
      Catch::Contains("model/") && Catch::Contains("v000009.rank0.h5"));
  CHECK(torch::equal(before, wrong.policy->parameters()[0]));
}

TEST_CASE("the checkpoint schedule: steps, minutes, rollback requests, archive", "[checkpointing]") {
  moerl_test::TempDir dir;
  auto config = tiny_config(dir.file("ckpt"));
  config.checkpoint.every_steps = 3;
  config.checkpoint.every_minutes = 0;
  config.checkpoint.archive_directory = dir.file("archive");
  config.checkpoint.archive_keep_last = 1;
  config.telemetry.metrics_file = "metrics.jsonl";
  config.run.output_dir = dir.file("runs");
  std::filesystem::create_directories(config.run_directory());
  std::ofstream(config.run_directory() + "/metrics.jsonl") << "{\"step\": 1}\n";
  Trained t(config, 1);
  {
    CheckpointSchedule schedule(checkpoint_settings(config));
    CHECK_FALSE(schedule.due(1));
    CHECK(schedule.due(3));
    CHECK_FALSE(schedule.rollback_request());  // nothing written yet
    LearnerState state;
    for (std::int64_t v : {3, 6}) {
      state.version = state.step = v;
      schedule.save(*t.policy, *t.optimizer, state);
    }
    CHECK_FALSE(schedule.rollback_request());
    moerl::storage::CheckpointStore store(config.checkpoint.directory);
    store.rollback_to("3");
    CHECK(schedule.rollback_request() == 3);
    schedule.accept_latest();
    CHECK_FALSE(schedule.rollback_request());
    schedule.finish();
  }
  const moerl::storage::CheckpointStore archive(dir.file("archive") + "/checkpoints");
  CHECK(archive.versions() == std::vector<std::int64_t>{6});  // archive_keep_last = 1
  CHECK(archive.verify(6).valid);
  CHECK(std::filesystem::exists(dir.file("archive") + "/metrics/metrics.jsonl"));

  config.checkpoint.every_steps = 0;
  config.checkpoint.every_minutes = 0.001;  // 60 ms
  config.checkpoint.archive_directory = "";
  CheckpointSchedule by_time(checkpoint_settings(config));
  CHECK_FALSE(by_time.due(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  CHECK(by_time.due(1));
}

TEST_CASE("a crash injected into a learner save leaves the previous version latest", "[checkpointing]") {
  moerl_test::TempDir dir;
  auto config = tiny_config(dir.file("ckpt"));
  config.faults.checkpoint_crash_point = moerl::config::CheckpointCrashPoint::BeforeLatest;
  config.faults.checkpoint_crash_version = 2;
  Trained t(config, 1);
  LearnerState state;
  state.version = 1;
  moerl::learner::save_checkpoint(checkpoint_settings(config), *t.policy, *t.optimizer,
                                  state);  // no schedule: no fault
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    CheckpointSchedule schedule(checkpoint_settings(config));
    state.version = 2;
    try {
      schedule.save(*t.policy, *t.optimizer, state);
    } catch (...) {
    }
    ::_exit(1);  // only when the fault did not fire
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == moerl::storage::kFaultExitStatus);
  const moerl::storage::CheckpointStore store(config.checkpoint.directory);
  CHECK(store.latest() == 1);
  CHECK(store.verify(2).valid);  // whole, but `latest` never moved to it
  CHECK(store.resume_choice().version == 1);
}
