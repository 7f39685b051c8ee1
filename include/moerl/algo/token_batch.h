#pragma once
// The packed token layout every function of the algo module works on, and the
// segment reductions over it. Include after the LibTorch precompiled header.
//
// A batch holds N sequences (episodes) packed back to back into T tokens:
//
//   sequence_index [T] int64  episode of each token, in [0, N). The tokens of
//                             one episode are contiguous and in order (needed
//                             only where a position is read relative to
//                             another: make_turn_layout).
//   loss_mask      [T]        1 on tokens the policy generated (actions), 0 on
//                             prompt and environment-observation tokens. Any
//                             dtype; nonzero means 1.
//   turn_index     [T] int64  turn of each token within its episode, 0-based:
//                             turn k = the observation before action k, then
//                             action k. Tokens after the last action carry the
//                             last turn's index (multi-turn PPO only).
//   log-probs      [T]        one per token: log pi(token | prefix).
//
// Episode-level tensors are [N] (rewards, group ids, per-episode advantages);
// per-turn tensors are [M], flattened in (episode, turn) order (see gae.h).
// Token-level tensors are [T]. Nothing here assumes a device: the reductions
// run where their inputs live.

#include <cstdint>

namespace moerl::algo {

// out[n] = sum of values[t] over tokens with segment[t] == n. values [T],
// segment [T] int64 in [0, num_segments) -> [num_segments]. Differentiable in
// values (index_add).
torch::Tensor segment_sum(const torch::Tensor& values, const torch::Tensor& segment, std::int64_t num_segments);

// Masked mean per segment: sum(values*mask) / sum(mask); 0 where a segment has
// no masked element. -> [num_segments], differentiable in values.
torch::Tensor segment_mean(const torch::Tensor& values, const torch::Tensor& mask, const torch::Tensor& segment,
                           std::int64_t num_segments);

// Generated-token count per episode: sum of loss_mask per sequence ->
// [N] int64 (the response length used by the overlong penalty).
torch::Tensor generated_lengths(const torch::Tensor& sequence_index, const torch::Tensor& loss_mask,
                                std::int64_t num_sequences);

// Per-episode (or per-turn) values onto tokens: out[t] = per_segment[segment[t]].
// per_segment [N] (or [M] with a token->turn map), segment [T] -> [T].
torch::Tensor broadcast_to_tokens(const torch::Tensor& per_segment, const torch::Tensor& segment);

}  // namespace moerl::algo
