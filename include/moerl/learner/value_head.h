#pragma once
// The PPO critic: a small MLP that reads the policy's final hidden state and
// predicts the expected return from that point of the episode.
//
// It reads the hidden state detached from the policy graph: the critic starts
// from scratch while the policy starts from a trained base, and a shared-trunk
// value loss would move the policy's features from the first step (its
// gradients dwarf the policy gradient while the value head is still wrong).
// As a probe on the policy's own features it learns V without touching them.
// The last layer starts at zero, so V = 0 until the critic has learned.

#include <torch/torch.h>

#include <cstdint>

namespace moerl::learner {

class ValueHeadImpl : public torch::nn::Module {
 public:
  explicit ValueHeadImpl(std::int64_t d_model);
  // hidden [T, d_model] -> values [T].
  torch::Tensor forward(const torch::Tensor& hidden);

 private:
  torch::nn::Linear hidden_layer_{nullptr};
  torch::nn::Linear output_layer_{nullptr};
};
TORCH_MODULE(ValueHead);

}  // namespace moerl::learner
