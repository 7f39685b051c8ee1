#pragma once
// The dense SwiGLU feed-forward of non-MoE layers:
// down_proj(silu(gate_proj(x)) * up_proj(x)). Names match the Llama/Qwen
// checkpoint names (mlp.gate_proj / mlp.up_proj / mlp.down_proj).

#include <cstdint>

#include <torch/torch.h>

namespace moerl::model {

class SwiGluFeedForwardImpl : public torch::nn::Module {
 public:
  SwiGluFeedForwardImpl(std::int64_t d_model, std::int64_t d_ff);

  torch::Tensor forward(const torch::Tensor& x);  // [T, d_model] -> [T, d_model]

  torch::nn::Linear gate_proj{nullptr};  // weight [d_ff, d_model]
  torch::nn::Linear up_proj{nullptr};    // weight [d_ff, d_model]
  torch::nn::Linear down_proj{nullptr};  // weight [d_model, d_ff]; residual output
};
TORCH_MODULE(SwiGluFeedForward);

}  // namespace moerl::model
