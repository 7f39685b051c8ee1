#include "moerl/rollout/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "moerl/core/check.h"

namespace moerl::rollout {

double FilteredDistribution::log_prob(std::int64_t id) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == id) return std::log(probs[i]);
  }
  return -std::numeric_limits<double>::infinity();
}

FilteredDistribution filter_distribution(const double* logits, std::int64_t vocab, const SamplingParams& params) {
  MOERL_CHECK(vocab > 0, "sampling: empty vocabulary");
  FilteredDistribution out;
  if (params.greedy) {
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < vocab; ++i) {
      if (logits[i] > logits[best]) best = i;  // strict: the lower id wins ties
    }
    out.ids = {best};
    out.probs = {1.0};
    return out;
  }
  MOERL_CHECK(params.temperature > 0 && std::isfinite(params.temperature),
              "sampling: temperature must be > 0, got " + std::to_string(params.temperature));
  MOERL_CHECK(params.top_k >= 0, "sampling: top_k must be >= 0, got " + std::to_string(params.top_k));
  MOERL_CHECK(params.top_p > 0 && params.top_p <= 1,
              "sampling: top_p must be in (0, 1], got " + std::to_string(params.top_p));

  std::vector<std::int64_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](std::int64_t a, std::int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::size_t keep = order.size();
  if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < order.size()) {
    keep = static_cast<std::size_t>(params.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), by_logit);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  order.resize(keep);

  // Softmax over the kept tokens at the given temperature (max-subtracted).
  const double inv_t = 1.0 / params.temperature;
  const double top = logits[order[0]] * inv_t;
  std::vector<double> probs(keep);
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(logits[order[i]] * inv_t - top);
    total += probs[i];
  }
  for (double& p : probs) p /= total;

  if (params.top_p < 1.0) {
    // Smallest prefix with mass >= top_p. A tiny slack keeps p = 1 - 1e-17
    // style round-off from pulling in one extra token.
    double mass = 0;
    std::size_t n = 0;
    while (n < keep) {
      mass += probs[n];
      ++n;
      if (mass >= params.top_p - 1e-12) break;
    }
    order.resize(n);
    probs.resize(n);
    for (double& p : probs) p /= mass;
  }
  out.ids = std::move(order);
  out.probs = std::move(probs);
  return out;
}

FilteredDistribution filter_distribution(const std::vector<double>& logits, const SamplingParams& params) {
  return filter_distribution(logits.data(), static_cast<std::int64_t>(logits.size()), params);
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

double counter_uniform(std::uint64_t seed, std::uint64_t index) {
  // Two rounds: the first decorrelates nearby seeds, the second mixes in the
  // counter, so (seed, i) and (seed + 1, i) give unrelated draws.
  const std::uint64_t bits = splitmix64(splitmix64(seed) ^ (index * 0xD1B54A32D192ED03ULL));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // / 2^53
}

std::size_t sample_position(const FilteredDistribution& dist, double u) {
  MOERL_CHECK(!dist.probs.empty(), "sampling: empty distribution");
  double cumulative = 0;
  for (std::size_t i = 0; i < dist.probs.size(); ++i) {
    cumulative += dist.probs[i];
    if (u < cumulative) return i;
  }
  return dist.probs.size() - 1;
}

SampledToken sample_token(const double* logits, std::int64_t vocab, const SamplingParams& params, std::uint64_t seed,
                          std::uint64_t index) {
  const FilteredDistribution dist = filter_distribution(logits, vocab, params);
  const std::size_t pos = params.greedy ? 0 : sample_position(dist, counter_uniform(seed, index));
  SampledToken token;
  token.id = dist.ids[pos];
  token.log_prob = std::log(dist.probs[pos]);
  // Raw model log-prob: log_softmax at temperature 1.
  double top = logits[0];
  for (std::int64_t i = 1; i < vocab; ++i) top = std::max(top, logits[i]);
  double total = 0;
  for (std::int64_t i = 0; i < vocab; ++i) total += std::exp(logits[i] - top);
  token.model_log_prob = logits[token.id] - top - std::log(total);
  return token;
}

}  // namespace moerl::rollout
