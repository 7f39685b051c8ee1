#pragma once
// Policy-gradient losses of the PPO/GRPO family on packed token batches
// (layout: token_batch.h), with the knobs the RL-for-LLM literature added:
// asymmetric clipping, decoupled (off-policy) PPO with truncated importance
// weights, sequence masking of stale episodes, GSPO sequence-level ratios,
// three loss normalisations, KL to a reference policy, entropy bonus.
// Include after the LibTorch precompiled header.
//
// Gradients flow through logp_new and entropy only; every other input is
// detached inside. Tokens with loss_mask = 0 get exactly zero gradient.

#include <cstdint>

namespace moerl::algo {

// How the importance ratio is formed.
enum class RatioLevel {
  // PPO (Schulman et al. 2017, eq. 7): r_t = exp(logp_new_t - logp_proximal_t).
  RatioToken,
  // GSPO (Zheng et al. 2025, eq. 7): s_i = exp(mean_{t in i} (logp_new_t -
  // logp_proximal_t)), the geometric-mean ratio of sequence i, clipped at the
  // sequence level; every token of i carries s_i and its gradient flows
  // through the mean. Pair with LossAggregation::SequenceMean for the paper's
  // objective (1/G sum_i min(s_i A_i, clip(s_i) A_i)).
  RatioSequence,
};

// How the per-token loss l_t (over counted tokens, mask m_t) becomes a scalar.
enum class LossAggregation {
  // sum_t m_t l_t / sum_t m_t: every token weighs the same (DAPO, eq. 8).
  TokenMean,
  // 1/N' sum_i (sum_{t in i} m_t l_t / sum_{t in i} m_t) over the N' sequences
  // with a counted token (GRPO, Shao et al. 2024, eq. 3).
  SequenceMean,
  // sum_t m_t l_t / (N' * constant_normalizer): Dr.GRPO's fixed length
  // normaliser (Liu et al. 2025), no bias toward short or long answers.
  ConstantNormalizer,
};

// Drops whole episodes whose behaviour policy strayed too far from the
// proximal one (masked importance sampling at the sequence level).
enum class SequenceMask {
  SequenceMaskNone,
  // drop if mean_{t in i} |logp_proximal_t - logp_behaviour_t| > threshold
  SequenceMaskMeanAbsLogRatio,
  // drop unless low <= exp(mean_{t in i}(logp_proximal_t - logp_behaviour_t)) <= high
  SequenceMaskGeometricRatio,
};

// KL(pi_new || pi_ref) per token, estimated from the sampled token (Schulman
// 2020, "Approximating KL Divergence"), with d = logp_ref - logp_new:
enum class KlEstimator {
  KlNone,
  KlK1,  // -d = logp_new - logp_ref (unbiased, can be negative)
  KlK3,  // exp(d) - d - 1 (unbiased, >= 0; GRPO eq. 4)
};

struct PolicyLossOptions {
  RatioLevel ratio_level = RatioLevel::RatioToken;
  // Clip range [1 - clip_low, 1 + clip_high]; clip_high > clip_low is DAPO's
  // "clip-higher" (Yu et al. 2025, eq. 10).
  double clip_low = 0.2;
  double clip_high = 0.2;

  LossAggregation aggregation = LossAggregation::TokenMean;
  double constant_normalizer = 0;  // ConstantNormalizer: e.g. the generation max length
  // > 0 replaces the computed denominator (tokens for TokenMean, sequences for
  // SequenceMean and ConstantNormalizer): use the count over the whole global
  // batch when it is split into micro-batches or over data-parallel ranks, so
  // the summed gradients equal the full-batch gradient.
  double denominator_override = 0;

  // Decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy
  // optimization"; Fu et al. 2025, AReaL eq. 5): with logp_behaviour given,
  // each token loss is multiplied by the detached weight
  //   w_t = min(exp(logp_proximal_t - logp_behaviour_t), importance_cap)
  // (truncated importance sampling, Ionides 2008; cap <= 0: no truncation).
  double importance_cap = 2.0;

  SequenceMask sequence_mask = SequenceMask::SequenceMaskNone;
  double sequence_mask_threshold = 0.5;  // SequenceMaskMeanAbsLogRatio
  double sequence_mask_low = 0.5;        // SequenceMaskGeometricRatio
  double sequence_mask_high = 2.0;       // SequenceMaskGeometricRatio

  KlEstimator kl_estimator = KlEstimator::KlNone;
  double kl_coef = 0;       // loss += kl_coef * aggregate(kl_t)
  double entropy_coef = 0;  // loss -= entropy_coef * aggregate(entropy_t)
};

struct PolicyLossInputs {
  torch::Tensor logp_new;        // [T] current policy; the only input the loss differentiates
  torch::Tensor logp_proximal;   // [T] the "old" policy of the clip; undefined = logp_new.detach()
  torch::Tensor logp_behaviour;  // [T] actor's rollout log-probs; undefined = on-policy (w = 1)
  torch::Tensor logp_reference;  // [T] frozen reference policy; needed when kl_estimator != KlNone
  torch::Tensor advantages;      // [T] per token (broadcast_to_tokens)
  torch::Tensor loss_mask;       // [T] 1 = generated token
  torch::Tensor sequence_index;  // [T] int64 in [0, num_sequences)
  std::int64_t num_sequences = 0;
  torch::Tensor entropy;  // [T] optional (token_entropy_from_logits); kept differentiable
};

// The loss and what a dashboard wants to see of it. Diagnostic means are over
// the counted tokens (mask after sequence masking), token-weighted, except the
// behaviour/proximal gap, which is over all generated tokens.
struct LossResult {
  torch::Tensor loss;                        // scalar: policy + kl_coef * kl - entropy_coef * entropy
  double policy_loss = 0;                    // aggregated clipped surrogate (with importance weights)
  double kl = 0;                             // aggregated KL estimate (0 when KlNone)
  double entropy = 0;                        // aggregated entropy (0 when not given)
  double clip_fraction_low = 0;              // A < 0 and ratio < 1 - clip_low (gradient cut)
  double clip_fraction_high = 0;             // A > 0 and ratio > 1 + clip_high (gradient cut)
  double ratio_mean = 0;                     // mean of r_t (token) or s_i per token (sequence)
  double importance_weight_mean = 0;         // mean w_t after truncation (1 when on-policy)
  double importance_truncated_fraction = 0;  // fraction of tokens with raw weight > cap
  double behaviour_proximal_gap = 0;         // mean |logp_proximal - logp_behaviour|
  std::int64_t tokens_counted = 0;           // generated tokens left after sequence masking
  std::int64_t sequences_counted = 0;        // sequences with a counted token
  std::int64_t sequences_masked = 0;         // sequences dropped by the sequence mask
};

// Validates shapes and options (throws moerl::Error naming what is wrong),
// then computes the loss. All [T] inputs share one device; the diagnostics
// cost one device-to-host copy.
LossResult policy_loss(const PolicyLossInputs& inputs, const PolicyLossOptions& options);

// Per-token KL estimate (see KlEstimator); logp_reference is detached.
// KlNone gives zeros. [T], [T] -> [T].
torch::Tensor kl_estimate(const torch::Tensor& logp_new, const torch::Tensor& logp_reference, KlEstimator estimator);

// Entropy of the full next-token distribution at each position:
// H_t = -sum_v softmax(z_t)_v log softmax(z_t)_v. logits [T,V] -> [T],
// differentiable in the logits; log V for uniform logits.
torch::Tensor token_entropy_from_logits(const torch::Tensor& logits);

// The episodes the sequence mask keeps: [N] bool. Exposed for tests and for
// the learner's statistics; policy_loss applies it itself.
torch::Tensor sequence_keep_mask(const torch::Tensor& logp_proximal, const torch::Tensor& logp_behaviour,
                                 const torch::Tensor& loss_mask, const torch::Tensor& sequence_index,
                                 std::int64_t num_sequences, const PolicyLossOptions& options);

}  // namespace moerl::algo
