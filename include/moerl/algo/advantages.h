#pragma once
// Episode-level advantage estimators for group-sampled RL (G samples per task
// seed form a group), dynamic sampling, and the overlong reward penalty.
// Include after the LibTorch precompiled header.
//
// Inputs: rewards [N] (one scalar per episode), group_ids [N] int64 (any
// values; equal ids = same group). Outputs are [N] in the rewards' dtype and
// device, detached (advantages are constants for the policy gradient); spread
// them onto tokens with broadcast_to_tokens(adv, sequence_index).

#include <cstdint>

namespace moerl::algo {

struct GroupAdvantageOptions {
  // Divide by the group standard deviation (GRPO). false gives Dr.GRPO.
  bool normalize_by_std = true;
  // Bessel-corrected std (divide by G-1), as torch.std and most GRPO code;
  // false: population std (divide by G). Groups of one have std 0.
  bool unbiased_std = true;
  double eps = 1e-6;  // added to the std
};

// GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 outcome supervision):
//   A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps).
torch::Tensor grpo_advantages(const torch::Tensor& rewards, const torch::Tensor& group_ids,
                              const GroupAdvantageOptions& options = {});

// Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"):
//   A_i = r_i - mean_{j in g(i)} r_j  (no std normalisation; pair it with
//   LossAggregation::ConstantNormalizer in the loss: no length normalisation).
torch::Tensor dr_grpo_advantages(const torch::Tensor& rewards, const torch::Tensor& group_ids);

// RLOO (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics"):
//   A_i = r_i - 1/(G-1) sum_{j in g(i), j != i} r_j  = G/(G-1) (r_i - mean_g).
// A group of one has no baseline: its advantage is 0.
torch::Tensor rloo_advantages(const torch::Tensor& rewards, const torch::Tensor& group_ids);

// Process-reward GRPO (Shao et al. 2024, DeepSeekMath, sec. 4.1.3, process
// supervision), with each environment turn as a step: every turn reward is
// normalised against all turn rewards of its episode's group (mean, and the
// std unless options.normalize_by_std is false), and a turn's advantage is
// the sum of its own and its episode's later normalised rewards:
//   S_{i,k} = sum_{k' >= k} (r_{i,k'} - mean_g) / (std_g + eps),
// and, with the std (GRPO), these sums divided once more by their own std
// over the group's turns, A_{i,k} = S_{i,k} / (std_g(S) + eps), so that every
// group's advantages have the same scale whatever its episodes' lengths (with
// one turn per episode this is grpo_advantages). Without it (Dr.GRPO),
// A_{i,k} = S_{i,k} with the mean only.
// turn_rewards [M] in (episode, turn) order; turn_episode [M] int64, the
// episode of each turn in 0..N-1, nondecreasing; group_ids [N]. -> [M].
torch::Tensor turn_group_advantages(const torch::Tensor& turn_rewards, const torch::Tensor& turn_episode,
                                    const torch::Tensor& group_ids, const GroupAdvantageOptions& options = {});

// Dynamic sampling (Yu et al. 2025, DAPO, sec. 3.2): groups whose rewards all
// agree (max - min <= tolerance) carry no group-relative signal and are
// dropped.
struct GroupFilter {
  torch::Tensor kept;  // [N] bool, rewards' device: episode kept
  std::int64_t dropped_episodes = 0;
  std::int64_t dropped_groups = 0;
  std::int64_t kept_groups = 0;
};
GroupFilter filter_zero_variance_groups(const torch::Tensor& rewards, const torch::Tensor& group_ids,
                                        double tolerance = 1e-8);

// DAPO soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward:
//   0                                  if L <= L_max - L_cache
//   ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
//   -1                                 if L > L_max
// times `factor`. response_lengths [N] (any numeric dtype; see
// generated_lengths) -> [N] float32 (or the lengths' dtype when floating).
struct OverlongOptions {
  std::int64_t max_length = 0;    // L_max, in generated tokens
  std::int64_t cache_length = 0;  // L_cache: width of the linear ramp, 0 < L_cache <= L_max
  double factor = 1.0;
};
torch::Tensor overlong_penalty(const torch::Tensor& response_lengths, const OverlongOptions& options);

// Dense 0..G-1 ids for arbitrary group ids, in order of first appearance.
// group_ids [N] int64 -> [N] int64 on the same device; *num_groups receives G.
torch::Tensor dense_group_ids(const torch::Tensor& group_ids, std::int64_t* num_groups);

}  // namespace moerl::algo
