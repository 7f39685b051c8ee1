#pragma once
// [algo] credit = "turn": the learner's per-turn advantages (process-reward
// GRPO, algo::turn_group_advantages) for the episodes of one step, and their
// spread onto one micro-batch's tokens. Turns are those episode_turns() finds
// in an episode's tokens: runs of generated targets, each followed by its
// environment reward.

#include <torch/torch.h>

#include <vector>

#include "moerl/learner/episode_batch.h"
#include "moerl/rollout/trajectory.h"

namespace moerl::learner {

// One [turns] tensor per episode. final_bonus (the overlong penalty) joins
// each episode's last turn; group_ids [N]; normalize_by_std: GRPO (true) or
// Dr.GRPO (false). Groups are normalised over every turn of the step's
// episodes, so pass all of them, not one micro-batch.
std::vector<torch::Tensor> turn_credit_advantages(const std::vector<const rollout::Trajectory*>& episodes,
                                                  const std::vector<float>& final_bonus, const torch::Tensor& group_ids,
                                                  bool normalize_by_std);

// [T] over the batch's packed targets (batch made of `episodes`, in order):
// every target gets the advantage of the turn it belongs to.
torch::Tensor turn_credit_token_advantages(const EpisodeBatch& batch,
                                           const std::vector<const rollout::Trajectory*>& episodes,
                                           const std::vector<torch::Tensor>& advantages);

}  // namespace moerl::learner
