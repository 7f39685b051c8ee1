#pragma once
// Rotary position embedding (RoPE) in the "rotate half" layout of the Hugging
// Face Llama/Mixtral/Qwen implementations: channel i of the first half is
// paired with channel i + head_dim/2, rotated by angle
// position * theta^(-2i/head_dim). Using this layout keeps q_proj/k_proj
// weights interchangeable with those checkpoints (no channel permutation).
//
// A free function, not a module: it has no weights, and the angles are
// computed from each token's own position, which is what lets a ragged batch
// (every sequence at a different offset in its KV cache) share one call.

#include <cstdint>

#include <torch/torch.h>

namespace moerl::model {

// x: [T, heads, head_dim] (head_dim even), positions: [T] int64 (absolute
// position of each token in its sequence). Returns [T, heads, head_dim].
// Angles are computed in float64 and cast to x's dtype, so a cached decode
// and a full forward see bit-identical rotations.
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions, double theta);

}  // namespace moerl::model
