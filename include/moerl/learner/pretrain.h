#pragma once
// `moerl pretrain`: the supervised warm-up that stands in for "the fixed
// pre-trained base" on machines without real model weights. The task
// families' scripted experts play episodes with [pretrain] expert_error_rate
// (so the base is imperfect and RL has room to improve it); the policy learns
// to predict the experts' actions (cross-entropy on assistant tokens only) in
// exactly the chat layout the actors use.

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/model/policy.h"

namespace moerl::config {
struct Config;
}  // namespace moerl::config

namespace moerl::learner {

// What pretraining takes from the run configuration.
struct PretrainSettings {
  config::PretrainSection pretrain;
  config::EnvSection env;  // the task mix the demonstrations are drawn from
  config::EnvFamilySections env_families;
  std::int64_t max_tokens_per_episode = 768;  // [rollout]: longer demonstrations are left out
  std::string output = "base.pt";             // the base policy's file: [pretrain] output, or <run dir>/base.pt
};

PretrainSettings pretrain_settings(const config::Config& config);

// The stages `moerl pretrain` runs, in order, each from the weights the one
// before left: with [pretrain] first_stage_families, those families alone
// for first_stage_steps (saved next to the output as <stem>.stage1<ext>, so
// that a later stage can be rerun with --init), then the whole mix for
// `steps`; without, the whole mix alone.
std::vector<PretrainSettings> pretrain_stages(const PretrainSettings& settings);

// The difficulty demonstration `index` is played at: `difficulty` or up to
// `easier_levels` below it, never below 1, uniformly over the demonstrations.
int demonstration_difficulty(int difficulty, std::int64_t easier_levels, std::uint64_t index);

struct PretrainReport {
  int episodes = 0;
  std::int64_t tokens = 0;
  std::int64_t steps = 0;
  double first_loss = 0;
  double final_loss = 0;
  double final_accuracy = 0;  // next-token accuracy on assistant tokens of the last steps
  double wall_s = 0;
  std::string path;
};

// Trains `policy` in place and saves it; prints progress every `log_every` steps.
PretrainReport pretrain(const PretrainSettings& settings, model::Policy policy, int log_every = 25);

// Loads policy weights saved by pretrain() (torch::save format). Every tensor
// is checked before any is copied; throws moerl::Error naming the file when
// it is missing, unreadable or does not fit the model: the first tensor
// whose shape differs (both shapes), and the missing and unexpected names.
// A policy with split experts (an expert group) takes its rows of the file's
// whole expert tensors.
void load_policy(model::Policy policy, const std::string& path);

}  // namespace moerl::learner
