// Learner 0's log warnings for expert-load imbalance and slow environment
// steps (telemetry/metric_warnings.h), and Histogram::since behind the P99.
#include <catch2/catch.hpp>

#include "moerl/telemetry/metric_warnings.h"

using namespace moerl::telemetry;

namespace {

MetricsSnapshot learner_with_imbalance(double ratio) {
  MetricsSnapshot s;
  s.rank = 0;
  s.role = "learner";
  s.gauges["moe.layer.1.imbalance"] = ratio;
  s.gauges["moe.layer.1.expert.0.load"] = 0.1;
  s.gauges["moe.layer.1.expert.3.load"] = 0.6;
  return s;
}

MetricsSnapshot env_worker(int rank, const Histogram& latency) {
  MetricsSnapshot s;
  s.rank = rank;
  s.role = "env_worker";
  s.histograms["env.step_latency_s.maze"] = latency;
  return s;
}

}  // namespace

TEST_CASE("Histogram::since keeps only what came after the earlier copy", "[telemetry][warnings]") {
  Histogram h;
  for (int i = 0; i < 100; ++i) h.record(0.01);
  const Histogram earlier = h;
  for (int i = 0; i < 50; ++i) h.record(1.0);
  const Histogram recent = h.since(earlier);
  CHECK(recent.count() == 50);
  CHECK(recent.sum() == Approx(50.0));
  CHECK(recent.quantile(0.5) == Approx(1.0).epsilon(0.05));
  CHECK(h.since(h).count() == 0);
}

TEST_CASE("imbalance warnings: when it starts, every repeat_every checks while it lasts, once when it ends",
          "[telemetry][warnings]") {
  MetricWarnings warnings({2.0, 0.5, 20, 3});
  CHECK(warnings.check({{0, learner_with_imbalance(1.9)}}).empty());
  auto started = warnings.check({{0, learner_with_imbalance(2.6)}});
  REQUIRE(started.size() == 1);
  CHECK(started[0].started);
  CHECK(started[0].message.find("layer 1") != std::string::npos);
  CHECK(started[0].message.find("2.60 > 2.00") != std::string::npos);
  CHECK(started[0].message.find("expert 3 took 60%") != std::string::npos);
  CHECK(started[0].message.find("rank 0") != std::string::npos);
  CHECK(warnings.check({{0, learner_with_imbalance(2.6)}}).empty());
  CHECK(warnings.check({{0, learner_with_imbalance(2.6)}}).empty());
  auto repeated = warnings.check({{0, learner_with_imbalance(2.7)}});
  REQUIRE(repeated.size() == 1);
  CHECK(repeated[0].message.find("(still)") != std::string::npos);
  auto ended = warnings.check({{0, learner_with_imbalance(1.2)}});
  REQUIRE(ended.size() == 1);
  CHECK_FALSE(ended[0].started);
  CHECK(warnings.check({{0, learner_with_imbalance(1.2)}}).empty());
}

TEST_CASE("environment P99 warnings: of the steps since the last check, merged over env workers",
          "[telemetry][warnings]") {
  MetricWarnings warnings({2.0, 0.5, 20, 100});
  Histogram a, b;
  for (int i = 0; i < 200; ++i) a.record(0.05);
  CHECK(warnings.check({{2, env_worker(2, a)}, {3, env_worker(3, b)}}).empty());
  // 30 new steps, 5 of them slow (> 1% of 30): P99 ~ 0.8 s.
  for (int i = 0; i < 25; ++i) a.record(0.05);
  for (int i = 0; i < 5; ++i) b.record(0.8);
  auto slow = warnings.check({{2, env_worker(2, a)}, {3, env_worker(3, b)}});
  REQUIRE(slow.size() == 1);
  CHECK(slow[0].message.find("'maze'") != std::string::npos);
  CHECK(slow[0].message.find("over its last 30 steps") != std::string::npos);
  // Too few new steps to judge: nothing said, nothing forgotten.
  for (int i = 0; i < 10; ++i) a.record(0.05);
  CHECK(warnings.check({{2, env_worker(2, a)}, {3, env_worker(3, b)}}).empty());
  // 10 + 20 fast ones: the old slow steps are not counted again.
  for (int i = 0; i < 20; ++i) a.record(0.05);
  auto fast = warnings.check({{2, env_worker(2, a)}, {3, env_worker(3, b)}});
  REQUIRE(fast.size() == 1);
  CHECK_FALSE(fast[0].started);
}
