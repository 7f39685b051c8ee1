#pragma once
// PPO with a value head over multi-turn episodes: generalised advantage
// estimation with one step per turn (the environment rewards a turn, not a
// token). Include after the LibTorch precompiled header.
//
// Per-turn tensors are [M] in (episode, turn) order: episode 0's turns 0..K0-1,
// then episode 1's, and so on; flat id of (n, k) = offsets[n] + k where
// offsets is the exclusive cumulative sum of turns per episode. An episode's
// turn count is 1 + its largest turn_index.

#include <cstdint>

namespace moerl::algo {

struct TurnLayout {
  torch::Tensor token_turn;      // [T] int64: flat turn id of every token
  torch::Tensor turn_episode;    // [M] int64: episode of each turn (nondecreasing)
  torch::Tensor value_position;  // [M] int64: position whose value-head output is V(s_k)
  torch::Tensor turn_offsets;    // [N+1] int64: first flat turn of each episode
  std::int64_t num_turns = 0;    // M
};

// Builds the turn bookkeeping from the token layout (token_batch.h), whose
// positions are the learner's packed targets: position t holds the model's
// state after its input token t, the state that scores target t. The state
// value of turn k is read at the position of the turn's first generated
// target: that state has read all of turn k's observation, the prefix the
// policy saw when it started action k. Throws moerl::Error when a turn has no
// generated token. Bookkeeping runs on the host; results are on
// sequence_index's device.
TurnLayout make_turn_layout(const torch::Tensor& sequence_index, const torch::Tensor& turn_index,
                            const torch::Tensor& loss_mask, std::int64_t num_sequences);

// token_values [T] (value head on every token) -> [M], differentiable.
torch::Tensor gather_turn_values(const torch::Tensor& token_values, const TurnLayout& layout);

struct GaeOptions {
  double gamma = 1.0;  // discount per turn
  double lambda = 0.95;
};

struct GaeResult {
  torch::Tensor advantages;  // [M] A_k
  torch::Tensor returns;     // [M] A_k + V(s_k): lambda-return targets for the value loss
};

// GAE (Schulman et al. 2016, eq. 16) per episode, backwards over turns:
//   delta_k = r_k + gamma * V(s_{k+1}) - V(s_k)
//   A_k     = delta_k + gamma * lambda * A_{k+1}
// with V(s_K) = bootstrap_values[n] after an episode's last turn (0 where
// bootstrap_values is undefined: terminal episodes; pass values for episodes
// cut off by a turn limit). turn_rewards, turn_values [M]; turn_episode [M]
// int64, each episode's turns contiguous and in order. Computed in double on
// the host, returned detached in turn_values' dtype and device.
GaeResult gae_over_turns(const torch::Tensor& turn_rewards, const torch::Tensor& turn_values,
                         const torch::Tensor& turn_episode, const GaeOptions& options,
                         const torch::Tensor& bootstrap_values = torch::Tensor());

}  // namespace moerl::algo
