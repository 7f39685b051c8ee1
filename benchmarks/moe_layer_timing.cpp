// See moe_layer_timing.h.

#include "moe_layer_timing.h"

#include <algorithm>

#include "moerl/bench/timing.h"

namespace moerl::bench {

moe::MoeFeedForward make_bench_layer(const MoeLayerShape& shape, std::int64_t hidden) {
  config::ModelSection model;
  model.d_model = hidden;
  model.num_layers = 4;
  config::MoeSection moe;
  moe.num_experts = shape.experts;
  moe.top_k = shape.top_k;
  moe.shared_experts = shape.shared;
  moe.d_expert = shape.experts <= 8 ? hidden : std::max<std::int64_t>(hidden / 4, 32);
  torch::manual_seed(1);
  return moe::MoeFeedForward(model, moe);
}

torch::Tensor bench_input(std::int64_t tokens, std::int64_t hidden, const torch::Device& device) {
  torch::manual_seed(2);
  return torch::randn({tokens, hidden}).to(device).set_requires_grad(true);
}

MoeLayerTiming time_moe_layer(moe::MoeFeedForwardImpl& layer, const torch::Tensor& x, int warmup, int reps) {
  const torch::Device device = x.device();
  auto proj = torch::randn(x.sizes()).to(device);
  auto step = [&](bool reference) {
    // Gradients reset to none, as PyTorch 2.x's zero_grad does by default:
    // backward then hands each parameter its new gradient instead of adding it
    // to a zeroed one (for both paths alike).
    layer.zero_grad(/*set_to_none=*/true);
    auto out = reference ? moe::reference_moe_forward(layer, x) : layer.forward(x);
    ((out.hidden * proj).sum() + out.aux_loss).backward();
    // CUDA kernels run asynchronously: a step ends when its kernels do.
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  MoeLayerTiming t;
  t.ours_s = median_seconds([&] { step(false); }, warmup, reps);
  t.reference_s = median_seconds([&] { step(true); }, warmup, reps);
  return t;
}

}  // namespace moerl::bench
