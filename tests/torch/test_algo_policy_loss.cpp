// Policy and value losses on a tiny hand-computed batch: 2 sequences, 7
// tokens, ratios chosen so clipping triggers on both sides; gradient masking
// and finite-difference checks in double.

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "algo_test_support.h"
#include "moerl/algo/policy_loss.h"
#include "moerl/algo/token_batch.h"
#include "moerl/algo/value_loss.h"
#include "moerl/core/error.h"

namespace algo = moerl::algo;

namespace {

using algo_test::f64;
using algo_test::i64;

void require_values(const std::string& what, const torch::Tensor& got, const std::vector<double>& want,
                    double tol = 1e-9) {
  algo_test::require_close_values(what, got, want, tol);
}

void require_near(const std::string& what, double got, double want, double tol = 1e-9) {
  INFO(what << ": got " << got << " want " << want);
  CHECK(std::abs(got - want) <= tol);
}

// Sequence 0 (A = +1): tokens 0 (prompt) 1 2 3; sequence 1 (A = -1): 4 (obs) 5 6.
// Ratios r = exp(new - prox) on generated tokens: 1.5, 0.5, 1.1 | 0.6, 1.4.
// With clip_low 0.2, clip_high 0.28:
//   token 1: A>0, r 1.5 > 1.28  -> clipped high, loss -1.28, no gradient
//   token 2: A>0, r 0.5         -> loss -0.5
//   token 3: A>0, r 1.1         -> loss -1.1
//   token 5: A<0, r 0.6 < 0.8   -> clipped low,  loss +0.8, no gradient
//   token 6: A<0, r 1.4         -> loss +1.4 (never clipped above for A<0)
// Prompt/observation tokens hold garbage (-inf, huge) that must not leak.
struct Example {
  torch::Tensor prox = f64({-std::numeric_limits<double>::infinity(), -1, -1, -1, 7, -2, -2});
  torch::Tensor new_values = f64(
      {40, -1 + std::log(1.5), -1 + std::log(0.5), -1 + std::log(1.1), -30, -2 + std::log(0.6), -2 + std::log(1.4)});
  torch::Tensor adv = f64({5, 1, 1, 1, 9, -1, -1});
  torch::Tensor mask = f64({0, 1, 1, 1, 0, 1, 1});
  torch::Tensor seq = i64({0, 0, 0, 0, 1, 1, 1});
  // Importance weights exp(prox - beh) on generated tokens: 1.2, 3, 0.5 | 1, 2.5.
  torch::Tensor beh = f64({0, -1 - std::log(1.2), -1 - std::log(3.0), -1 - std::log(0.5), 0, -2, -2 - std::log(2.5)});

  algo::PolicyLossInputs inputs(const torch::Tensor& logp_new) const {
    algo::PolicyLossInputs in;
    in.logp_new = logp_new;
    in.logp_proximal = prox;
    in.advantages = adv;
    in.loss_mask = mask;
    in.sequence_index = seq;
    in.num_sequences = 2;
    return in;
  }
};

algo::PolicyLossOptions ppo_options() {
  algo::PolicyLossOptions o;
  o.clip_low = 0.2;
  o.clip_high = 0.28;
  return o;
}

torch::Tensor grad_of(const torch::Tensor& loss, const torch::Tensor& x) {
  return torch::autograd::grad({loss}, {x}, {}, false, false, true)[0];
}

// Central differences of f at x (double), compared with autograd.
void check_finite_differences(const std::string& what, const std::function<torch::Tensor(const torch::Tensor&)>& f,
                              const torch::Tensor& x0) {
  auto x = x0.clone().set_requires_grad(true);
  auto analytic = grad_of(f(x), x);
  const double eps = 1e-6;
  for (std::int64_t j = 0; j < x.numel(); ++j) {
    auto up = x0.clone();
    auto down = x0.clone();
    up[j] += eps;
    down[j] -= eps;
    const double numeric = (f(up).item<double>() - f(down).item<double>()) / (2 * eps);
    const double a = analytic[j].item<double>();
    INFO(what << ": d/d logp_new[" << j << "] analytic " << a << " numeric " << numeric);
    CHECK(std::abs(a - numeric) <= 1e-7 + 1e-6 * std::abs(numeric));
  }
}

}  // namespace

TEST_CASE("PPO clipped surrogate with clip-higher, three normalisations", "[algo]") {
  Example ex;
  auto x = ex.new_values.clone().set_requires_grad(true);
  auto o = ppo_options();

  auto r = algo::policy_loss(ex.inputs(x), o);
  const double sum = -1.28 - 0.5 - 1.1 + 0.8 + 1.4;  // -0.68
  require_near("token-mean loss", r.loss.item<double>(), sum / 5);
  require_near("policy_loss diag", r.policy_loss, sum / 5);
  require_near("clip fraction high", r.clip_fraction_high, 0.2);
  require_near("clip fraction low", r.clip_fraction_low, 0.2);
  require_near("ratio mean", r.ratio_mean, (1.5 + 0.5 + 1.1 + 0.6 + 1.4) / 5);
  require_near("importance weight mean (on-policy)", r.importance_weight_mean, 1);
  require_near("truncated fraction (on-policy)", r.importance_truncated_fraction, 0);
  CHECK(r.tokens_counted == 5);
  CHECK(r.sequences_counted == 2);
  CHECK(r.sequences_masked == 0);
  // d l / d logp = -r A where unclipped, 0 where clipped or masked; / 5 tokens.
  require_values("token-mean grad", grad_of(r.loss, x), {0, 0, -0.5 / 5, -1.1 / 5, 0, 0, 1.4 / 5});

  o.aggregation = algo::LossAggregation::SequenceMean;
  r = algo::policy_loss(ex.inputs(x), o);
  require_near("sequence-mean loss", r.loss.item<double>(), ((-1.28 - 0.5 - 1.1) / 3 + (0.8 + 1.4) / 2) / 2);
  require_values("sequence-mean grad", grad_of(r.loss, x), {0, 0, -0.5 / 6, -1.1 / 6, 0, 0, 1.4 / 4});

  o.aggregation = algo::LossAggregation::ConstantNormalizer;
  o.constant_normalizer = 10;
  r = algo::policy_loss(ex.inputs(x), o);
  require_near("constant-normaliser loss", r.loss.item<double>(), sum / (2 * 10));

  o.aggregation = algo::LossAggregation::TokenMean;
  o.denominator_override = 20;  // e.g. tokens of the whole global batch
  r = algo::policy_loss(ex.inputs(x), o);
  require_near("token-mean, global denominator", r.loss.item<double>(), sum / 20);

  o.aggregation = algo::LossAggregation::ConstantNormalizer;
  o.constant_normalizer = 0;
  CHECK_THROWS_AS(algo::policy_loss(ex.inputs(x), o), moerl::Error);
}

TEST_CASE("Decoupled PPO truncates importance weights at the cap", "[algo]") {
  Example ex;
  auto x = ex.new_values.clone().set_requires_grad(true);
  auto o = ppo_options();
  o.importance_cap = 2.0;
  auto in = ex.inputs(x);
  in.logp_behaviour = ex.beh;
  auto r = algo::policy_loss(in, o);
  // Weights 1.2, 3 -> 2, 0.5 | 1, 2.5 -> 2.
  const double want = (-1.28 * 1.2 - 0.5 * 2 - 1.1 * 0.5 + 0.8 * 1 + 1.4 * 2) / 5;
  require_near("weighted loss", r.loss.item<double>(), want);
  require_near("weight mean", r.importance_weight_mean, (1.2 + 2 + 0.5 + 1 + 2) / 5);
  require_near("truncated fraction", r.importance_truncated_fraction, 2.0 / 5);
  const double gap = (std::log(1.2) + std::log(3.0) + std::log(2.0) + 0 + std::log(2.5)) / 5;
  require_near("behaviour/proximal gap", r.behaviour_proximal_gap, gap);
  require_values("weighted grad", grad_of(r.loss, x), {0, 0, -0.5 * 2 / 5, -1.1 * 0.5 / 5, 0, 0, 1.4 * 2 / 5});

  // A larger cap lets 3 and 2.5 through.
  o.importance_cap = 10;
  r = algo::policy_loss(in, o);
  require_near("cap 10 loss", r.loss.item<double>(), (-1.28 * 1.2 - 0.5 * 3 - 1.1 * 0.5 + 0.8 + 1.4 * 2.5) / 5);
  require_near("cap 10 truncated", r.importance_truncated_fraction, 0);
}

TEST_CASE("Sequence mask drops episodes that drifted from the behaviour policy", "[algo]") {
  Example ex;
  auto x = ex.new_values.clone().set_requires_grad(true);
  auto in = ex.inputs(x);
  in.logp_behaviour = ex.beh;
  auto o = ppo_options();
  o.importance_cap = 2.0;

  // Mean |log w|: sequence 0 (log 1.2 + log 3 + log 2)/3 = 0.658; sequence 1 log(2.5)/2 = 0.458.
  o.sequence_mask = algo::SequenceMask::SequenceMaskMeanAbsLogRatio;
  o.sequence_mask_threshold = 0.6;
  auto keep = algo::sequence_keep_mask(ex.prox, ex.beh, ex.mask, ex.seq, 2, o);
  require_values("keep (mean abs)", keep.to(torch::kDouble), {0, 1}, 0);
  auto r = algo::policy_loss(in, o);
  CHECK(r.sequences_masked == 1);
  CHECK(r.tokens_counted == 2);
  CHECK(r.sequences_counted == 1);
  require_near("loss without sequence 0", r.loss.item<double>(), (0.8 * 1 + 1.4 * 2) / 2);
  require_values("grad without sequence 0", grad_of(r.loss, x), {0, 0, 0, 0, 0, 0, 1.4 * 2 / 2});

  // Geometric-mean ratio: sequence 0 exp((log 1.2 + log 3 - log 2)/3) = 1.216,
  // sequence 1 exp(log(2.5)/2) = 1.581; keep [0.8, 1.5] -> drop sequence 1.
  o.sequence_mask = algo::SequenceMask::SequenceMaskGeometricRatio;
  o.sequence_mask_low = 0.8;
  o.sequence_mask_high = 1.5;
  keep = algo::sequence_keep_mask(ex.prox, ex.beh, ex.mask, ex.seq, 2, o);
  require_values("keep (geometric)", keep.to(torch::kDouble), {1, 0}, 0);
  r = algo::policy_loss(in, o);
  CHECK(r.sequences_masked == 1);
  require_near("loss without sequence 1", r.loss.item<double>(), (-1.28 * 1.2 - 0.5 * 2 - 1.1 * 0.5) / 3);

  in.logp_behaviour = torch::Tensor();
  CHECK_THROWS_AS(algo::policy_loss(in, o), moerl::Error);
}

TEST_CASE("GSPO clips the geometric-mean ratio per sequence", "[algo]") {
  Example ex;
  auto x = ex.new_values.clone().set_requires_grad(true);
  algo::PolicyLossOptions o;
  o.ratio_level = algo::RatioLevel::RatioSequence;
  o.aggregation = algo::LossAggregation::SequenceMean;
  o.clip_low = 0.03;
  o.clip_high = 0.04;
  auto r = algo::policy_loss(ex.inputs(x), o);
  const double s0 = std::exp((std::log(1.5) + std::log(0.5) + std::log(1.1)) / 3);  // 0.938
  const double s1 = std::exp((std::log(0.6) + std::log(1.4)) / 2);                  // 0.917
  // Sequence 0: A > 0, s0 below the range: unclipped, loss -s0.
  // Sequence 1: A < 0, s1 < 0.97: clipped low as a whole, loss +0.97, no gradient.
  require_near("gspo loss", r.loss.item<double>(), (-s0 + 0.97) / 2);
  require_near("gspo ratio mean (per token)", r.ratio_mean, (3 * s0 + 2 * s1) / 5);
  require_near("gspo clip low (both tokens of sequence 1)", r.clip_fraction_low, 2.0 / 5);
  require_near("gspo clip high", r.clip_fraction_high, 0);
  // d(-s0/2)/d logp_t = -s0/2 * 1/3 for every token of sequence 0: through the mean.
  require_values("gspo grad", grad_of(r.loss, x), {0, -s0 / 6, -s0 / 6, -s0 / 6, 0, 0, 0});

  // Raising the ratio of sequence 1 into the range unclips both its tokens together.
  auto shifted = ex.new_values.clone();
  shifted[5] += 0.1;
  shifted[6] += 0.1;  // s1 * e^0.1 = 1.013
  r = algo::policy_loss(ex.inputs(shifted), o);
  require_near("gspo clip low after shift", r.clip_fraction_low, 0);
}

TEST_CASE("KL estimators k1 and k3 by hand", "[algo]") {
  auto logp = f64({-1, -2, -0.5});
  auto ref = f64({-1.5, -1, -0.5});
  // d = ref - logp = -0.5, 1, 0.
  require_values("k1", algo::kl_estimate(logp, ref, algo::KlEstimator::KlK1), {0.5, -1, 0});
  require_values("k3", algo::kl_estimate(logp, ref, algo::KlEstimator::KlK3),
                 {std::exp(-0.5) + 0.5 - 1, std::exp(1.0) - 2, 0});
  require_values("none", algo::kl_estimate(logp, ref, algo::KlEstimator::KlNone), {0, 0, 0});

  // In the loss: kl_coef * token mean of k3 over generated tokens.
  Example ex;
  auto o = ppo_options();
  o.kl_estimator = algo::KlEstimator::KlK3;
  o.kl_coef = 0.1;
  auto ref_tokens = ex.new_values.clone();
  ref_tokens[1] -= 0.5;  // d = -0.5
  ref_tokens[5] += 1.0;  // d = 1
  ref_tokens[0] = 1e9;   // a masked token: must not count
  auto in = ex.inputs(ex.new_values);
  in.logp_reference = ref_tokens;
  auto r = algo::policy_loss(in, o);
  const double kl = (std::exp(-0.5) + 0.5 - 1 + std::exp(1.0) - 2) / 5;
  require_near("kl diag", r.kl, kl);
  require_near("loss with kl", r.loss.item<double>(), -0.68 / 5 + 0.1 * kl);
  o.kl_estimator = algo::KlEstimator::KlK1;
  r = algo::policy_loss(in, o);
  require_near("k1 diag", r.kl, (0.5 - 1.0) / 5);
}

TEST_CASE("Entropy from logits", "[algo]") {
  auto uniform = torch::zeros({3, 7}, torch::kDouble).set_requires_grad(true);
  auto h = algo::token_entropy_from_logits(uniform);
  require_values("uniform", h, {std::log(7.0), std::log(7.0), std::log(7.0)}, 1e-12);
  const double inf = std::numeric_limits<double>::infinity();
  auto logits =
      torch::stack({f64({std::log(0.5), std::log(0.25), std::log(0.25)}), f64({0, -inf, 0})}).set_requires_grad(true);
  h = algo::token_entropy_from_logits(logits);
  require_values("known", h, {1.5 * std::log(2.0), std::log(2.0)}, 1e-12);
  auto g = grad_of(h.sum(), logits);
  INFO("entropy gradient with a -inf logit: " << g);
  CHECK(torch::isfinite(g).all().item<bool>());
  // Uniform is the maximum: zero gradient.
  require_values("uniform grad", grad_of(algo::token_entropy_from_logits(uniform).sum(), uniform).view({-1}),
                 std::vector<double>(21, 0.0), 1e-12);

  // Entropy bonus in the loss: -coef * token mean over generated tokens.
  Example ex;
  auto o = ppo_options();
  o.entropy_coef = 0.01;
  auto in = ex.inputs(ex.new_values);
  in.entropy = f64({100, 1, 2, 3, 100, 4, 5});
  auto r = algo::policy_loss(in, o);
  require_near("entropy diag", r.entropy, 3.0);
  require_near("loss with entropy", r.loss.item<double>(), -0.68 / 5 - 0.01 * 3.0);
}

TEST_CASE("Gradients reach generated tokens only and match finite differences", "[algo]") {
  Example ex;
  auto beh = ex.beh;
  auto ref = ex.new_values - 0.3;
  struct Variant {
    std::string name;
    algo::PolicyLossOptions options;
    bool off_policy;
  };
  std::vector<Variant> variants;
  {
    auto o = ppo_options();
    variants.push_back({"ppo token-mean", o, false});
    o.aggregation = algo::LossAggregation::SequenceMean;
    o.kl_estimator = algo::KlEstimator::KlK3;
    o.kl_coef = 0.2;
    variants.push_back({"ppo sequence-mean + k3", o, false});
    o.aggregation = algo::LossAggregation::ConstantNormalizer;
    o.constant_normalizer = 8;
    o.kl_estimator = algo::KlEstimator::KlK1;
    variants.push_back({"ppo constant + k1 + decoupled", o, true});
    o = ppo_options();
    o.sequence_mask = algo::SequenceMask::SequenceMaskMeanAbsLogRatio;
    o.sequence_mask_threshold = 0.6;
    variants.push_back({"decoupled + sequence mask", o, true});
    algo::PolicyLossOptions g;
    g.ratio_level = algo::RatioLevel::RatioSequence;
    g.aggregation = algo::LossAggregation::SequenceMean;
    g.clip_low = 0.03;
    g.clip_high = 0.04;
    variants.push_back({"gspo", g, false});
    g.clip_low = g.clip_high = 0.5;
    g.aggregation = algo::LossAggregation::TokenMean;
    variants.push_back({"gspo unclipped token-mean + decoupled", g, true});
  }
  for (const auto& v : variants) {
    auto f = [&](const torch::Tensor& logp_new) {
      auto in = ex.inputs(logp_new);
      if (v.off_policy) in.logp_behaviour = beh;
      in.logp_reference = ref;
      return algo::policy_loss(in, v.options).loss;
    };
    auto x = ex.new_values.clone().set_requires_grad(true);
    auto g = grad_of(f(x), x);
    INFO(v.name << ": gradient " << g);
    CHECK(g[0].item<double>() == 0.0);
    CHECK(g[4].item<double>() == 0.0);
    CHECK(torch::isfinite(g).all().item<bool>());
    // Finite differences with the masked positions at finite values (they are
    // not differentiated at -inf/huge offsets in the finite-difference sense).
    check_finite_differences(v.name, f, ex.new_values);
  }
}

TEST_CASE("Clipped value loss", "[algo]") {
  // e0: V 1.2, V_old 0.8, R 2: V_clip 1.0, (1-2)^2 = 1 > 0.64: clipped term wins, no gradient.
  // e1: V 2, V_old 2.5, R 3: V_clip 2.3, 0.49 < 1: unclipped wins, grad (V-R) = -1.
  // e2: V 0 = V_old, R 1: both 1, grad -1. e3: masked.
  auto v = f64({1.2, 2.0, 0.0, 3.0}).set_requires_grad(true);
  auto old_v = f64({0.8, 2.5, 0.0, 3.0});
  auto ret = f64({2.0, 3.0, 1.0, -50.0});
  auto mask = f64({1, 1, 1, 0});
  algo::ValueLossOptions o;
  o.clip = 0.2;
  auto r = algo::value_loss(v, old_v, ret, o, mask);
  require_near("value loss", r.loss.item<double>(), 0.5 * (1 + 1 + 1) / 3);
  require_near("value clip fraction", r.clip_fraction, 1.0 / 3);
  require_near("value mean", r.value_mean, (1.2 + 2.0 + 0.0) / 3);
  CHECK(r.count == 3);
  require_values("value grad", grad_of(r.loss, v), {0, -1.0 / 3, -1.0 / 3, 0});

  o.clip = 0;
  r = algo::value_loss(v, old_v, ret, o, mask);
  require_near("unclipped value loss", r.loss.item<double>(), 0.5 * (0.64 + 1 + 1) / 3);
  require_values("unclipped grad", grad_of(r.loss, v), {-0.8 / 3, -1.0 / 3, -1.0 / 3, 0});
  // Explained variance: R = (2,3,1) var 2/3; R - V = (0.8,1,1) var 0.08/9.
  require_near("explained variance", r.explained_variance, 1 - (0.08 / 9) / (2.0 / 3), 1e-9);
}
