#pragma once
// One MoE layer's forward+backward, timed for our operators and for the
// per-expert-loop reference on the same parameters and input, on any device.
// Shared by `moerl bench moe` (CPU) and moerl_moe_gpu_bench (CUDA), so both
// report the same comparison. Include after the LibTorch precompiled header.

#include <cstdint>

#include "moerl/moe/moe_layer.h"

namespace moerl::bench {

struct MoeLayerShape {
  std::int64_t experts, top_k, shared;
};

// The benchmark's layer for `shape` at width `hidden`, seeded: coarse experts
// (d_expert = hidden) for E <= 8, Mixtral-like; fine-grained ones (hidden/4)
// otherwise, Qwen/DeepSeek-like.
moe::MoeFeedForward make_bench_layer(const MoeLayerShape& shape, std::int64_t hidden);

// The layer's input [tokens, hidden] on `device`, seeded, requiring grad.
torch::Tensor bench_input(std::int64_t tokens, std::int64_t hidden, const torch::Device& device);

struct MoeLayerTiming {
  double ours_s = 0;       // median seconds per forward+backward, our operators
  double reference_s = 0;  // the same for the per-expert-loop reference
};

// Times both paths on x's device (the layer must be there too); on CUDA each
// timed step ends with a device synchronise.
MoeLayerTiming time_moe_layer(moe::MoeFeedForwardImpl& layer, const torch::Tensor& x, int warmup, int reps);

}  // namespace moerl::bench
