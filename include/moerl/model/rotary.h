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

// cos and sin of every token's angles, [T, 1, head_dim / 2] in the dtype of
// the tensors they rotate. Computing them takes about a dozen small tensor
// ops; a forward computes them once and rotates q and k of every layer with
// them (AttentionBatch::rotary_for).
struct RotaryAngles {
  torch::Tensor cos, sin;
};

// positions: [T] int64 (absolute position of each token in its sequence).
// Angles are computed in float64 and cast to dtype, so a cached decode and a
// full forward see bit-identical rotations.
RotaryAngles rotary_angles(const torch::Tensor& positions, std::int64_t head_dim, double theta,
                           torch::ScalarType dtype);

// x: [T, heads, head_dim] (head_dim even), rotated by angles of x's dtype.
// Returns [T, heads, head_dim].
torch::Tensor apply_rotary(const torch::Tensor& x, const RotaryAngles& angles);

// Both steps in one: rotary_angles for x's head_dim and dtype, then apply_rotary.
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions, double theta);

}  // namespace moerl::model
