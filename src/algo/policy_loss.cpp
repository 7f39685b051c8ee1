// PPO/GRPO-family policy losses (formulas and sources in policy_loss.h).
//
// Every [T] input is first made safe at positions with loss_mask = 0: those
// hold prompt and observation tokens whose log-probs may be garbage (or
// -inf). torch::where selects a constant there, so the forward pass stays
// finite and the backward pass gives exactly zero gradient to logp_new at
// those positions (where() routes the incoming gradient to one branch only).

#include "moerl/algo/policy_loss.h"

#include <string>
#include <utility>
#include <vector>

#include "moerl/algo/token_batch.h"
#include "moerl/core/check.h"

namespace moerl::algo {

namespace {

void check_token_tensor(const char* name, const torch::Tensor& t, std::int64_t tokens, const torch::Tensor& like) {
  MOERL_CHECK(t.dim() == 1 && t.size(0) == tokens,
              std::string("policy_loss: ") + name + " must be [T] with T = " + std::to_string(tokens) + ", got " +
                  std::to_string(t.dim()) + " dims and " + std::to_string(t.numel()) + " elements");
  MOERL_CHECK(t.device() == like.device(), std::string("policy_loss: ") + name + " is on another device than logp_new");
}

// where(gen, x, 0) with x cast to dtype; detached unless keep_grad.
torch::Tensor masked_or_zero(const torch::Tensor& x, const torch::Tensor& gen, torch::ScalarType dtype,
                             bool keep_grad) {
  auto v = keep_grad ? x.to(dtype) : x.detach().to(dtype);
  return torch::where(gen, v, torch::zeros_like(v));
}

// The normalisation shared by the policy, KL and entropy terms.
class Aggregator {
 public:
  Aggregator(const PolicyLossOptions& options, torch::Tensor counted, torch::Tensor seq, std::int64_t num_sequences)
      : options_(options), counted_(std::move(counted)), seq_(std::move(seq)), n_(num_sequences) {
    auto counted_f = counted_.to(torch::kDouble);
    per_seq_tokens_ = segment_sum(counted_f, seq_, n_);  // [N] double
    tokens_ = counted_f.sum();
    sequences_ = per_seq_tokens_.gt(0).sum().to(torch::kDouble);
  }

  // x [T] (finite everywhere) -> scalar in x's dtype.
  torch::Tensor operator()(const torch::Tensor& x) const {
    auto xm = torch::where(counted_, x, torch::zeros_like(x));
    const auto dtype = x.scalar_type();
    switch (options_.aggregation) {
      case LossAggregation::TokenMean: {
        auto denom = options_.denominator_override > 0
                         ? torch::scalar_tensor(options_.denominator_override, tokens_.options())
                         : tokens_.clamp_min(1.0);
        return xm.sum() / denom.to(dtype);
      }
      case LossAggregation::SequenceMean: {
        auto per_seq = segment_sum(xm, seq_, n_) / per_seq_tokens_.clamp_min(1.0).to(dtype);
        return per_seq.sum() / sequence_denominator().to(dtype);
      }
      case LossAggregation::ConstantNormalizer:
        return xm.sum() / (sequence_denominator() * options_.constant_normalizer).to(dtype);
    }
    return xm.sum();  // unreachable
  }

  const torch::Tensor& tokens() const { return tokens_; }        // scalar double
  const torch::Tensor& sequences() const { return sequences_; }  // scalar double

 private:
  torch::Tensor sequence_denominator() const {
    if (options_.denominator_override > 0)
      return torch::scalar_tensor(options_.denominator_override, sequences_.options());
    return sequences_.clamp_min(1.0);
  }

  const PolicyLossOptions& options_;
  torch::Tensor counted_;  // [T] bool
  torch::Tensor seq_;      // [T] int64
  std::int64_t n_;
  torch::Tensor per_seq_tokens_;  // [N] double
  torch::Tensor tokens_;
  torch::Tensor sequences_;
};

void check_options(const PolicyLossOptions& o) {
  MOERL_CHECK(o.clip_low >= 0 && o.clip_low < 1,
              "policy_loss: clip_low must be in [0, 1), got " + std::to_string(o.clip_low));
  MOERL_CHECK(o.clip_high >= 0, "policy_loss: clip_high must be >= 0, got " + std::to_string(o.clip_high));
  MOERL_CHECK(o.aggregation != LossAggregation::ConstantNormalizer || o.constant_normalizer > 0,
              "policy_loss: ConstantNormalizer needs constant_normalizer > 0");
  MOERL_CHECK(o.sequence_mask_low <= o.sequence_mask_high, "policy_loss: sequence_mask_low exceeds sequence_mask_high");
}

}  // namespace

torch::Tensor kl_estimate(const torch::Tensor& logp_new, const torch::Tensor& logp_reference, KlEstimator estimator) {
  if (estimator == KlEstimator::KlNone) return torch::zeros_like(logp_new);
  MOERL_CHECK(logp_reference.defined() && logp_reference.sizes() == logp_new.sizes(),
              "kl_estimate: logp_reference must match logp_new");
  // d = log pi_ref - log pi_new at the sampled token.
  auto d = logp_reference.detach().to(logp_new.scalar_type()) - logp_new;
  if (estimator == KlEstimator::KlK1) return -d;
  return torch::exp(d) - d - 1;
}

torch::Tensor token_entropy_from_logits(const torch::Tensor& logits) {
  MOERL_CHECK(logits.dim() == 2, "token_entropy_from_logits: logits must be [T,V]");
  auto logp = torch::log_softmax(logits, -1);
  auto p = logp.exp();
  // Entries with p = 0 (logit -inf) contribute 0 and must not turn 0 * -inf
  // into NaN, forward or backward.
  auto logp_safe = torch::where(p > 0, logp, torch::zeros_like(logp));
  return -(p * logp_safe).sum(-1);
}

torch::Tensor sequence_keep_mask(const torch::Tensor& logp_proximal, const torch::Tensor& logp_behaviour,
                                 const torch::Tensor& loss_mask, const torch::Tensor& sequence_index,
                                 std::int64_t num_sequences, const PolicyLossOptions& options) {
  torch::NoGradGuard no_grad;
  if (options.sequence_mask == SequenceMask::SequenceMaskNone)
    return torch::ones({num_sequences}, loss_mask.options().dtype(torch::kBool));
  MOERL_CHECK(logp_proximal.defined() && logp_behaviour.defined(),
              "sequence_keep_mask: the sequence mask needs proximal and behaviour log-probs");
  auto gen = loss_mask.ne(0);
  auto seq = sequence_index.to(torch::kLong);
  auto diff = masked_or_zero(logp_proximal, gen, torch::kDouble, false) -
              masked_or_zero(logp_behaviour, gen, torch::kDouble, false);
  if (options.sequence_mask == SequenceMask::SequenceMaskMeanAbsLogRatio) {
    auto gap = segment_mean(diff.abs(), gen, seq, num_sequences);
    return gap <= options.sequence_mask_threshold;
  }
  auto geo = segment_mean(diff, gen, seq, num_sequences).exp();
  return (geo >= options.sequence_mask_low).logical_and(geo <= options.sequence_mask_high);
}

LossResult policy_loss(const PolicyLossInputs& in, const PolicyLossOptions& options) {
  check_options(options);
  MOERL_CHECK(in.logp_new.defined() && in.logp_new.dim() == 1 && in.logp_new.is_floating_point(),
              "policy_loss: logp_new must be a floating [T] tensor");
  const std::int64_t tokens = in.logp_new.size(0);
  const std::int64_t n = in.num_sequences;
  MOERL_CHECK(n > 0, "policy_loss: num_sequences must be positive");
  check_token_tensor("advantages", in.advantages, tokens, in.logp_new);
  check_token_tensor("loss_mask", in.loss_mask, tokens, in.logp_new);
  check_token_tensor("sequence_index", in.sequence_index, tokens, in.logp_new);
  MOERL_CHECK(!in.sequence_index.is_floating_point(), "policy_loss: sequence_index must be integer");
  if (in.logp_proximal.defined()) check_token_tensor("logp_proximal", in.logp_proximal, tokens, in.logp_new);
  if (in.logp_behaviour.defined()) check_token_tensor("logp_behaviour", in.logp_behaviour, tokens, in.logp_new);
  if (in.entropy.defined()) check_token_tensor("entropy", in.entropy, tokens, in.logp_new);
  if (options.kl_estimator != KlEstimator::KlNone) {
    MOERL_CHECK(in.logp_reference.defined(), "policy_loss: the KL term needs logp_reference");
    check_token_tensor("logp_reference", in.logp_reference, tokens, in.logp_new);
  }
  MOERL_CHECK(options.sequence_mask == SequenceMask::SequenceMaskNone || in.logp_behaviour.defined(),
              "policy_loss: the sequence mask needs logp_behaviour");

  const auto dtype = in.logp_new.scalar_type();
  const auto gen = in.loss_mask.ne(0);  // [T] bool: generated tokens
  const auto seq = in.sequence_index.to(torch::kLong);
  const auto new_s = masked_or_zero(in.logp_new, gen, dtype, true);
  const auto prox_s = in.logp_proximal.defined() ? masked_or_zero(in.logp_proximal, gen, dtype, false) : new_s.detach();
  const auto adv = masked_or_zero(in.advantages, gen, dtype, false);

  // Decoupled PPO: truncated importance weight behaviour -> proximal.
  auto weights = torch::ones_like(new_s);
  auto truncated = torch::zeros_like(gen);
  auto gap = torch::zeros_like(new_s);
  if (in.logp_behaviour.defined()) {
    auto beh_s = masked_or_zero(in.logp_behaviour, gen, dtype, false);
    auto log_w = prox_s - beh_s;
    auto raw = log_w.exp();
    gap = log_w.abs();
    if (options.importance_cap > 0) {
      truncated = raw > options.importance_cap;
      weights = raw.clamp_max(options.importance_cap);
    } else {
      weights = raw;
    }
  }

  // Sequence mask: the tokens that count are generated tokens of kept episodes.
  auto keep = sequence_keep_mask(prox_s, in.logp_behaviour.defined() ? in.logp_behaviour : prox_s, in.loss_mask, seq, n,
                                 options);
  auto counted = gen.logical_and(keep.index_select(0, seq));
  Aggregator aggregate(options, counted, seq, n);

  // Ratio: per token (PPO) or the per-sequence geometric mean (GSPO).
  auto log_ratio = new_s - prox_s;
  torch::Tensor ratio;
  if (options.ratio_level == RatioLevel::RatioToken) {
    ratio = log_ratio.exp();
  } else {
    auto seq_log_ratio = segment_mean(log_ratio, gen, seq, n);  // [N], gradient through the mean
    ratio = seq_log_ratio.exp().index_select(0, seq);
  }
  auto clipped = ratio.clamp(1.0 - options.clip_low, 1.0 + options.clip_high);
  // -min(r A, clip(r) A): the pessimistic surrogate (PPO eq. 7), per token.
  auto surrogate = torch::max(-ratio * adv, -clipped * adv);
  auto token_loss = surrogate * weights;

  auto policy = aggregate(token_loss);
  auto total = policy;
  auto kl = torch::scalar_tensor(0.0, new_s.options());
  if (options.kl_estimator != KlEstimator::KlNone) {
    auto ref_s = masked_or_zero(in.logp_reference, gen, dtype, false);
    kl = aggregate(kl_estimate(new_s, ref_s, options.kl_estimator));
    total = total + options.kl_coef * kl;
  }
  auto entropy = torch::scalar_tensor(0.0, new_s.options());
  if (in.entropy.defined()) {
    entropy = aggregate(masked_or_zero(in.entropy, gen, dtype, true));
    total = total - options.entropy_coef * entropy;
  }

  LossResult result;
  result.loss = total;
  {
    // All diagnostics in one tensor: one device-to-host copy per step.
    torch::NoGradGuard no_grad;
    auto cf = counted.to(torch::kDouble);
    auto tok = aggregate.tokens().clamp_min(1.0);
    auto token_mean = [&](const torch::Tensor& x) { return (x.to(torch::kDouble) * cf).sum() / tok; };
    auto high = counted.logical_and(adv > 0).logical_and(ratio.detach() > 1.0 + options.clip_high);
    auto low = counted.logical_and(adv < 0).logical_and(ratio.detach() < 1.0 - options.clip_low);
    auto genf = gen.to(torch::kDouble);
    auto has_gen = segment_sum(genf, seq, n).gt(0);
    auto masked_seqs = has_gen.logical_and(keep.logical_not()).sum().to(torch::kDouble);
    std::vector<torch::Tensor> stats = {
        policy.detach().to(torch::kDouble),
        kl.detach().to(torch::kDouble),
        entropy.detach().to(torch::kDouble),
        token_mean(low),
        token_mean(high),
        token_mean(ratio.detach()),
        token_mean(weights),
        token_mean(truncated),
        (gap.to(torch::kDouble) * genf).sum() / genf.sum().clamp_min(1.0),
        aggregate.tokens(),
        aggregate.sequences(),
        masked_seqs,
    };
    auto host = torch::stack(stats).to(torch::kCPU).contiguous();
    const auto* h = host.data_ptr<double>();
    result.policy_loss = h[0];
    result.kl = h[1];
    result.entropy = h[2];
    result.clip_fraction_low = h[3];
    result.clip_fraction_high = h[4];
    result.ratio_mean = h[5];
    result.importance_weight_mean = h[6];
    result.importance_truncated_fraction = h[7];
    result.behaviour_proximal_gap = h[8];
    result.tokens_counted = static_cast<std::int64_t>(h[9] + 0.5);
    result.sequences_counted = static_cast<std::int64_t>(h[10] + 0.5);
    result.sequences_masked = static_cast<std::int64_t>(h[11] + 0.5);
  }
  return result;
}

}  // namespace moerl::algo
