#include "moerl/learner/turn_credit.h"

#include <string>

#include "moerl/algo/advantages.h"
#include "moerl/algo/gae.h"
#include "moerl/algo/token_batch.h"
#include "moerl/core/check.h"

namespace moerl::learner {

std::vector<torch::Tensor> turn_credit_advantages(const std::vector<const rollout::Trajectory*>& episodes,
                                                  const std::vector<float>& final_bonus, const torch::Tensor& group_ids,
                                                  bool normalize_by_std) {
  const EpisodeTurns turns = episode_turns(episodes, final_bonus);
  const torch::Tensor counts = torch::tensor(turns.turn_counts, torch::kInt64);
  const torch::Tensor turn_episode =
      torch::repeat_interleave(torch::arange(static_cast<std::int64_t>(episodes.size()), torch::kInt64), counts);
  algo::GroupAdvantageOptions options;
  options.normalize_by_std = normalize_by_std;
  const torch::Tensor flat = algo::turn_group_advantages(turns.turn_rewards, turn_episode, group_ids, options);
  return flat.split_with_sizes(turns.turn_counts);
}

torch::Tensor turn_credit_token_advantages(const EpisodeBatch& batch,
                                           const std::vector<const rollout::Trajectory*>& episodes,
                                           const std::vector<torch::Tensor>& advantages) {
  MOERL_CHECK(advantages.size() == episodes.size(), "credit per turn: " + std::to_string(advantages.size()) +
                                                        " advantage lists for " + std::to_string(episodes.size()) +
                                                        " episodes");
  const EpisodeTurns turns = episode_turns(episodes, std::vector<float>(episodes.size(), 0.f));
  for (size_t e = 0; e < episodes.size(); ++e)
    MOERL_CHECK(advantages[e].dim() == 1 && advantages[e].size(0) == turns.turn_counts[e],
                "credit per turn: episode " + std::to_string(episodes[e]->episode_id) + " has " +
                    std::to_string(turns.turn_counts[e]) + " turns but " + std::to_string(advantages[e].numel()) +
                    " turn advantages");
  const algo::TurnLayout layout = algo::make_turn_layout(batch.sequence_index, turns.turn_index, batch.loss_mask,
                                                         static_cast<std::int64_t>(episodes.size()));
  const torch::Tensor flat = torch::cat(advantages).to(batch.sequence_index.device());
  return algo::broadcast_to_tokens(flat, layout.token_turn);
}

}  // namespace moerl::learner
