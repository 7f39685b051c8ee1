#pragma once
// Clipped value loss for the PPO value head. Include after the LibTorch
// precompiled header.

#include <cstdint>

namespace moerl::algo {

struct ValueLossOptions {
  // PPO2-style value clipping (Schulman et al. 2017, OpenAI baselines ppo2):
  //   V_clip = V_old + clamp(V - V_old, -clip, clip)
  //   l = 0.5 * max((V - R)^2, (V_clip - R)^2)
  // clip <= 0: unclipped 0.5 * (V - R)^2.
  double clip = 0.2;
};

struct ValueLossResult {
  torch::Tensor loss;             // scalar: masked mean of l; differentiable in values
  double clip_fraction = 0;       // fraction where the clipped term is the larger one
  double value_mean = 0;          // mean V over the mask
  double explained_variance = 0;  // 1 - Var(R - V) / Var(R); 0 when Var(R) = 0
  std::int64_t count = 0;
};

// values [K] (from the value head, e.g. gather_turn_values), old_values [K]
// (the rollout-time estimates), returns [K] (GaeResult::returns), mask [K]
// optional (undefined = all). old_values, returns and mask are detached.
ValueLossResult value_loss(const torch::Tensor& values, const torch::Tensor& old_values, const torch::Tensor& returns,
                           const ValueLossOptions& options = {}, const torch::Tensor& mask = torch::Tensor());

}  // namespace moerl::algo
