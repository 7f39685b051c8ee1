#include "moerl/learner/ppo_targets.h"

#include "moerl/algo/gae.h"
#include "moerl/algo/token_batch.h"
#include "moerl/algo/value_loss.h"

namespace moerl::learner {

PpoTargets ppo_targets(const EpisodeBatch& batch, const torch::Tensor& hidden, ValueHeadImpl& value_head,
                       const std::vector<const rollout::Trajectory*>& episodes, const std::vector<float>& final_bonus,
                       const PpoOptions& options) {
  const EpisodeTurns turns = episode_turns(episodes, final_bonus);
  const algo::TurnLayout layout = algo::make_turn_layout(batch.sequence_index, turns.turn_index, batch.loss_mask,
                                                         static_cast<std::int64_t>(episodes.size()));
  const torch::Tensor values = algo::gather_turn_values(value_head.forward(hidden), layout);
  algo::GaeOptions gae_options;
  gae_options.gamma = options.gamma;
  gae_options.lambda = options.lambda;
  const algo::GaeResult gae =
      algo::gae_over_turns(turns.turn_rewards, values.detach(), layout.turn_episode, gae_options);
  torch::Tensor advantages = gae.advantages;
  if (options.whiten_advantages && advantages.numel() > 1)
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-6);
  algo::ValueLossOptions value_options;
  value_options.clip = options.value_clip;
  const algo::ValueLossResult value = algo::value_loss(values, values.detach(), gae.returns, value_options);
  PpoTargets targets;
  targets.token_advantages = algo::broadcast_to_tokens(advantages, layout.token_turn);
  targets.value_loss = value.loss;
  targets.value_mean = value.value_mean;
  targets.explained_variance = value.explained_variance;
  return targets;
}

}  // namespace moerl::learner
