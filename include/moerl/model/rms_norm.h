#pragma once
// Root-mean-square layer norm (no mean subtraction, no bias), as in Llama,
// Mixtral and Qwen-MoE: y = x / sqrt(mean(x^2) + eps) * weight.

#include <cstdint>

#include <torch/torch.h>

namespace moerl::model {

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(std::int64_t dim, double eps);

  // x: [..., dim] -> [..., dim]. Half-precision inputs are normalised in
  // float32 (the sum of squares overflows fp16) and cast back.
  torch::Tensor forward(const torch::Tensor& x);

  void reset_parameters();  // weight = 1

  torch::Tensor weight;  // [dim]
  double eps;
};
TORCH_MODULE(RMSNorm);

}  // namespace moerl::model
