// Rollout sampling: greedy, temperature, top-k, top-p on hand-made
// distributions, and the empirical frequencies of the counter-based sampler.

#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "moerl/rollout/sampling.h"

using moerl::rollout::counter_uniform;
using moerl::rollout::filter_distribution;
using moerl::rollout::FilteredDistribution;
using moerl::rollout::sample_position;
using moerl::rollout::sample_token;
using moerl::rollout::SamplingParams;

namespace {

std::vector<double> log_of(const std::vector<double>& probs) {
  std::vector<double> out;
  for (double p : probs) out.push_back(std::log(p));
  return out;
}

}  // namespace

TEST_CASE("greedy sampling is the argmax with log-prob 0", "[rollout][sampling]") {
  const std::vector<double> logits{0.1, 2.5, -1.0, 2.4999, 0.0, 2.5};  // tie 1 vs 5: lower id wins
  SamplingParams greedy;
  greedy.greedy = true;
  for (std::uint64_t i = 0; i < 20; ++i) {
    const auto tok = sample_token(logits.data(), 6, greedy, 99, i);
    INFO("draw " << i << ": token " << tok.id << ", expected 1");
    CHECK(tok.id == 1);
    CHECK(tok.log_prob == 0.0);
  }
}

TEST_CASE("temperature scales the logits before the softmax", "[rollout][sampling]") {
  const std::vector<double> logits{1.0, -0.5, 3.0, 0.25, 2.0};
  for (double t : {0.5, 1.0, 2.0}) {
    SamplingParams p;
    p.temperature = t;
    const FilteredDistribution d = filter_distribution(logits, p);
    REQUIRE(d.ids.size() == logits.size());
    double z = 0;
    for (double l : logits) z += std::exp(l / t);
    for (std::int64_t id = 0; id < 5; ++id) {
      const double expected = logits[static_cast<std::size_t>(id)] / t - std::log(z);
      INFO("T=" << t << " id " << id << ": log p = " << d.log_prob(id) << ", expected " << expected);
      CHECK(std::abs(d.log_prob(id) - expected) < 1e-12);
    }
    CHECK(d.ids.front() == 2);  // sorted descending
  }
}

TEST_CASE("top-p keeps exactly the smallest prefix with mass >= p", "[rollout][sampling]") {
  const std::vector<double> logits = log_of({0.1, 0.4, 0.2, 0.3});  // sorted: 1 (.4), 3 (.3), 2 (.2), 0 (.1)
  struct Case {
    double p;
    std::vector<std::int64_t> ids;
  };
  for (const Case& c : {Case{0.3, {1}}, Case{0.4, {1}}, Case{0.41, {1, 3}}, Case{0.7, {1, 3}}, Case{0.71, {1, 3, 2}},
                        Case{0.9, {1, 3, 2}}, Case{0.95, {1, 3, 2, 0}}, Case{1.0, {1, 3, 2, 0}}}) {
    SamplingParams params;
    params.top_p = c.p;
    const FilteredDistribution d = filter_distribution(logits, params);
    INFO("top_p " << c.p << ": kept " << d.ids.size() << " tokens, expected " << c.ids.size());
    CHECK(d.ids == c.ids);
    double mass = 0;
    for (std::int64_t id : c.ids) mass += std::exp(logits[static_cast<std::size_t>(id)]);
    for (std::size_t i = 0; i < d.ids.size(); ++i) {
      CHECK(std::abs(d.probs[i] - std::exp(logits[static_cast<std::size_t>(d.ids[i])]) / mass) < 1e-12);
    }
  }
  CHECK_THROWS(filter_distribution(logits, SamplingParams{1.0, 0, 0.0, false}));
  CHECK_THROWS(filter_distribution(logits, SamplingParams{0.0, 0, 1.0, false}));
}

TEST_CASE("top-k keeps the k most likely tokens", "[rollout][sampling]") {
  const std::vector<double> logits{0.5, 3.0, -2.0, 1.5, 2.5, 0.0};
  for (std::int64_t k : {1, 2, 3, 6, 10}) {
    SamplingParams params;
    params.top_k = k;
    const FilteredDistribution d = filter_distribution(logits, params);
    const std::vector<std::int64_t> order{1, 4, 3, 0, 5, 2};
    const std::size_t n = static_cast<std::size_t>(std::min<std::int64_t>(k, 6));
    INFO("top_k " << k << ": kept " << d.ids.size());
    CHECK(d.ids == std::vector<std::int64_t>(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n)));
    double total = 0;
    for (double p : d.probs) total += p;
    CHECK(std::abs(total - 1.0) < 1e-12);
  }
  // top-k then top-p: k=3 leaves {1, 4, 3}; p=0.5 then keeps the prefix of those.
  SamplingParams both;
  both.top_k = 3;
  both.top_p = 0.5;
  const FilteredDistribution d = filter_distribution(logits, both);
  CHECK(d.ids == std::vector<std::int64_t>{1});  // p(1 | top3) = e^3 / (e^3+e^2.5+e^1.5) = 0.55
}

TEST_CASE("empirical frequencies match the filtered distribution", "[rollout][sampling]") {
  std::vector<double> logits;
  for (int i = 0; i < 40; ++i) logits.push_back(std::sin(1.7 * i) * 2.0);
  SamplingParams params;
  params.temperature = 0.8;
  params.top_k = 12;
  params.top_p = 0.9;
  const FilteredDistribution d = filter_distribution(logits, params);
  const int draws = 40000;
  std::map<std::int64_t, int> counts;
  for (int i = 0; i < draws; ++i) {
    const auto tok = sample_token(logits.data(), 40, params, 1234, static_cast<std::uint64_t>(i));
    ++counts[tok.id];
    CHECK(std::abs(tok.log_prob - d.log_prob(tok.id)) < 1e-12);
  }
  double chi2 = 0;
  for (std::size_t i = 0; i < d.ids.size(); ++i) {
    const double expected = d.probs[i] * draws;
    const double observed = counts.count(d.ids[i]) ? counts[d.ids[i]] : 0;
    chi2 += (observed - expected) * (observed - expected) / expected;
  }
  std::int64_t outside = draws;
  for (std::int64_t id : d.ids) outside -= counts.count(id) ? counts[id] : 0;
  const double dof = static_cast<double>(d.ids.size()) - 1;
  // Mean dof, sd sqrt(2 dof): 6 sd is far beyond chance.
  INFO("kept " << d.ids.size() << " tokens; chi2 = " << chi2 << " with " << dof << " dof; draws outside = " << outside);
  CHECK(outside == 0);
  CHECK(chi2 < dof + 6 * std::sqrt(2 * dof));
  // The uniforms themselves: mean 1/2, and different seeds are different streams.
  double mean = 0;
  for (int i = 0; i < draws; ++i) mean += counter_uniform(7, static_cast<std::uint64_t>(i));
  mean /= draws;
  CHECK(std::abs(mean - 0.5) < 0.01);
  CHECK(counter_uniform(7, 3) != counter_uniform(8, 3));
  CHECK(counter_uniform(7, 3) == counter_uniform(7, 3));
  CHECK(sample_position(d, 0.0) == 0);
}
