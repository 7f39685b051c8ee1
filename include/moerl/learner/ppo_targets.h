#pragma once
// PPO's targets for one micro-batch: per-turn advantages from GAE over the
// value head's estimates, spread onto each turn's tokens, and the value loss
// toward the lambda-returns.
//
// The rollout records no values (actors run no critic), so the "old" values
// are this forward's own, detached: with one update per batch they are the
// values before the update, as PPO defines them.

#include <torch/torch.h>

#include <vector>

#include "moerl/learner/episode_batch.h"
#include "moerl/learner/value_head.h"
#include "moerl/rollout/trajectory.h"

namespace moerl::learner {

struct PpoOptions {
  double gamma = 1.0;
  double lambda = 0.95;
  double value_clip = 0.2;
  bool whiten_advantages = true;
};

struct PpoTargets {
  torch::Tensor token_advantages;  // [T] detached
  torch::Tensor value_loss;        // scalar, differentiable in the value head
  double value_mean = 0;
  double explained_variance = 0;
};

// hidden: the policy's final hidden state over the batch's packed targets
// [T, d]; final_bonus: one per episode, added to its last turn's reward.
PpoTargets ppo_targets(const EpisodeBatch& batch, const torch::Tensor& hidden, ValueHeadImpl& value_head,
                       const std::vector<const rollout::Trajectory*>& episodes, const std::vector<float>& final_bonus,
                       const PpoOptions& options);

}  // namespace moerl::learner
