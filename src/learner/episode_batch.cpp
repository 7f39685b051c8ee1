#include "moerl/learner/episode_batch.h"

#include "moerl/core/check.h"

namespace moerl::learner {

EpisodeBatch make_episode_batch(const std::vector<const rollout::Trajectory*>& episodes, bool replay_routing) {
  MOERL_CHECK(!episodes.empty(), "make_episode_batch: no episodes");
  // One row per context window (an episode whose context the actor rebuilt
  // has several); every target of an episode's rows has its sequence index.
  std::int64_t rows = 0, longest = 1, total = 0;
  bool all_routed = replay_routing;
  for (const rollout::Trajectory* t : episodes) {
    MOERL_CHECK(t->tokens.size() >= 2, "episode " + std::to_string(t->episode_id) + " has fewer than 2 tokens");
    for (std::int32_t w = 0; w < t->windows(); ++w) {
      const auto [begin, end] = t->window(w);
      MOERL_CHECK(end >= begin + 2,
                  "episode " + std::to_string(t->episode_id) + " has a window of fewer than 2 tokens");
      const auto fed = static_cast<std::int64_t>(end - begin) - 1;
      longest = std::max(longest, fed);
      total += fed;
      ++rows;
    }
    all_routed = all_routed && t->moe_layers > 0 && !t->routing.empty();
  }
  EpisodeBatch batch;
  // The padding is never read: the policy packs each row's first `lengths`
  // tokens (AttentionBatch::token_index) before the embedding. Id 0 exists
  // in every vocabulary, whichever tokenizer the episodes were made with.
  batch.inputs = torch::zeros({rows, longest}, torch::kInt64);
  batch.lengths = torch::empty({rows}, torch::kInt64);
  batch.targets = torch::empty({total}, torch::kInt64);
  batch.loss_mask = torch::empty({total}, torch::kFloat32);
  batch.behaviour_logprobs = torch::empty({total}, torch::kFloat32);
  batch.versions = torch::empty({total}, torch::kInt64);
  batch.sequence_index = torch::empty({total}, torch::kInt64);
  const std::int64_t layers = all_routed ? episodes.front()->moe_layers : 0;
  const std::int64_t k = all_routed ? episodes.front()->top_k : 0;
  if (all_routed) batch.forced_experts = torch::empty({total, layers, k}, torch::kInt64);

  auto inputs = batch.inputs.accessor<std::int64_t, 2>();
  auto targets = batch.targets.data_ptr<std::int64_t>();
  auto mask = batch.loss_mask.data_ptr<float>();
  auto behaviour = batch.behaviour_logprobs.data_ptr<float>();
  auto versions = batch.versions.data_ptr<std::int64_t>();
  auto sequence = batch.sequence_index.data_ptr<std::int64_t>();
  std::int64_t at = 0, row = 0;
  for (std::int64_t e = 0; e < static_cast<std::int64_t>(episodes.size()); ++e) {
    const rollout::Trajectory& t = *episodes[static_cast<size_t>(e)];
    const std::int64_t episode_start = at;
    for (std::int32_t w = 0; w < t.windows(); ++w, ++row) {
      const auto [begin, end] = t.window(w);
      const auto fed = static_cast<std::int64_t>(end - begin) - 1;
      batch.lengths[row] = fed;
      for (std::int64_t i = 0; i < fed; ++i, ++at) {
        inputs[row][i] = t.tokens[begin + static_cast<size_t>(i)];
        const size_t next = begin + static_cast<size_t>(i) + 1;
        targets[at] = t.tokens[next];
        mask[at] = t.generated[next] ? 1.f : 0.f;
        behaviour[at] = t.behaviour_logprobs[next];
        versions[at] = t.versions[next];
        sequence[at] = e;
        batch.generated_tokens += t.generated[next];
      }
    }
    if (all_routed) {
      MOERL_CHECK(t.moe_layers == layers && t.top_k == k, "episodes disagree on the routing shape");
      // The routing covers every fed position of every window, in order: the packed targets' order.
      const auto count = (at - episode_start) * layers * k;
      MOERL_CHECK(static_cast<std::int64_t>(t.routing.size()) == count,
                  "episode " + std::to_string(t.episode_id) + ": routing does not cover its fed positions");
      auto forced = batch.forced_experts.data_ptr<std::int64_t>() + episode_start * layers * k;
      for (std::int64_t j = 0; j < count; ++j) forced[j] = t.routing[static_cast<size_t>(j)];
    }
  }
  return batch;
}

EpisodeTurns episode_turns(const std::vector<const rollout::Trajectory*>& episodes,
                           const std::vector<float>& final_bonus) {
  MOERL_CHECK(final_bonus.size() == episodes.size(), "episode_turns: one final bonus per episode");
  std::vector<std::int64_t> turn_index;
  std::vector<float> turn_rewards;
  std::vector<std::int64_t> turn_counts;
  for (size_t e = 0; e < episodes.size(); ++e) {
    const rollout::Trajectory& t = *episodes[e];
    // The targets, in make_episode_batch's order: every token but the first
    // of each context window. Runs of generated targets are the actions (a
    // window boundary ends one too).
    std::vector<bool> target_generated;
    for (std::int32_t w = 0; w < t.windows(); ++w) {
      const auto [begin, end] = t.window(w);
      for (size_t i = begin + 1; i < end; ++i) target_generated.push_back(t.generated[i] != 0);
    }
    std::int64_t actions = 0;
    for (size_t i = 0; i < target_generated.size(); ++i)
      if (target_generated[i] && (i == 0 || !target_generated[i - 1])) ++actions;
    MOERL_CHECK(actions > 0, "episode " + std::to_string(t.episode_id) + " has no generated token to train on");
    std::int64_t finished = 0;  // actions completed before the current target
    for (size_t i = 0; i < target_generated.size(); ++i) {
      const bool generated = target_generated[i];
      if (!generated && i > 0 && target_generated[i - 1]) ++finished;
      turn_index.push_back(generated ? finished : std::min(finished, actions - 1));
    }
    for (std::int64_t k = 0; k < actions; ++k)
      turn_rewards.push_back(static_cast<size_t>(k) < t.turn_rewards.size() ? t.turn_rewards[static_cast<size_t>(k)]
                                                                            : 0.f);
    for (size_t k = static_cast<size_t>(actions); k < t.turn_rewards.size(); ++k)
      turn_rewards.back() += t.turn_rewards[k];
    turn_rewards.back() += final_bonus[e];
    turn_counts.push_back(actions);
  }
  EpisodeTurns turns;
  turns.turn_counts = std::move(turn_counts);
  turns.turn_index = torch::tensor(turn_index, torch::kInt64);
  turns.turn_rewards = torch::tensor(turn_rewards, torch::kFloat32);
  return turns;
}

EpisodeBatch batch_on_device(const EpisodeBatch& batch, const torch::Device& device) {
  auto move = [&](const torch::Tensor& t) { return t.defined() ? t.to(device) : t; };
  EpisodeBatch out;
  out.inputs = move(batch.inputs);
  out.lengths = batch.lengths;  // Policy reads the row lengths on the host: no round trip
  out.targets = move(batch.targets);
  out.loss_mask = move(batch.loss_mask);
  out.behaviour_logprobs = move(batch.behaviour_logprobs);
  out.versions = move(batch.versions);
  out.sequence_index = move(batch.sequence_index);
  out.forced_experts = move(batch.forced_experts);
  out.generated_tokens = batch.generated_tokens;
  return out;
}

torch::Tensor target_logprobs(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::log_softmax(logits.to(torch::kFloat32), -1).gather(1, targets.unsqueeze(1)).squeeze(1);
}

}  // namespace moerl::learner
