#include "moerl/learner/value_head.h"

namespace moerl::learner {

ValueHeadImpl::ValueHeadImpl(std::int64_t d_model) {
  hidden_layer_ = register_module("hidden", torch::nn::Linear(d_model, d_model));
  output_layer_ = register_module("output", torch::nn::Linear(d_model, 1));
  torch::NoGradGuard no_grad;
  output_layer_->weight.zero_();
  output_layer_->bias.zero_();
}

torch::Tensor ValueHeadImpl::forward(const torch::Tensor& hidden) {
  // A bf16 policy's hidden state is widened to the critic's own dtype (float32: [run] dtype leaves it alone).
  const torch::Tensor input = hidden.detach().to(output_layer_->weight.scalar_type());
  return output_layer_->forward(torch::silu(hidden_layer_->forward(input))).squeeze(-1);
}

}  // namespace moerl::learner
