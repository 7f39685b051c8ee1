#pragma once
// Token sampling for rollouts: temperature, top-k, top-p (nucleus), greedy,
// with a per-session counter-based random stream.
//
// Reproducibility. Every draw is a pure function of (session seed, index of
// the token in the session's episode) and the logits: u = splitmix64 of the
// pair, mapped to [0, 1), then the inverse CDF of the filtered distribution.
// No generator is shared between sessions, so the tokens of a session do not
// depend on which other sessions share its batch, nor on the order in which
// the engine visits them.
//
// Filtering order (as Hugging Face's generate): logits / temperature ->
// keep the top_k largest -> keep the smallest prefix of the remaining
// probabilities (sorted, descending) whose mass is >= top_p -> renormalise.
// Ties are broken by the lower token id. Greedy is the point mass on the
// argmax; its behaviour log-prob is therefore 0.
//
// All arithmetic is in double on the host: vocabularies of LLMs are small
// enough for that to be cheap next to the forward pass, and double keeps the
// recorded log-probs free of accumulation noise.

#include <cstdint>
#include <vector>

namespace moerl::rollout {

struct SamplingParams {
  double temperature = 1.0;  // > 0; ignored when greedy
  std::int64_t top_k = 0;    // 0 = no top-k filter
  double top_p = 1.0;        // in (0, 1]; 1 = no nucleus filter
  bool greedy = false;       // argmax; temperature/top_k/top_p are ignored
};

// A distribution restricted to the tokens a sampler may draw: ids in
// descending order of probability (ties: lower id first), probabilities
// renormalised to sum to 1.
struct FilteredDistribution {
  std::vector<std::int64_t> ids;
  std::vector<double> probs;
  // log of the filtered probability of `id`; -infinity when it was filtered out.
  double log_prob(std::int64_t id) const;
};

// Validates params (throws moerl::Error naming the field) and filters.
FilteredDistribution filter_distribution(const double* logits, std::int64_t vocab, const SamplingParams& params);
FilteredDistribution filter_distribution(const std::vector<double>& logits, const SamplingParams& params);

// splitmix64 finaliser over a 64-bit state.
std::uint64_t splitmix64(std::uint64_t x);
// The uniform in [0, 1) of draw `index` of the stream `seed` (53-bit mantissa).
double counter_uniform(std::uint64_t seed, std::uint64_t index);

// Inverse CDF: the first position whose cumulative probability exceeds u
// (the last one if rounding leaves u above the total).
std::size_t sample_position(const FilteredDistribution& dist, double u);

struct SampledToken {
  std::int64_t id = 0;
  double log_prob = 0;        // under the filtered (sampling) distribution
  double model_log_prob = 0;  // under the raw model distribution (temperature 1, no filter)
};

// One draw: filter, then inverse CDF with counter_uniform(seed, index).
SampledToken sample_token(const double* logits, std::int64_t vocab, const SamplingParams& params, std::uint64_t seed,
                          std::uint64_t index);

}  // namespace moerl::rollout
