// Histograms (quantiles against exact order statistics), registry
// snapshots, per-role aggregation and the JSON they become; the metrics
// file of a resumed run.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "moerl/core/json_writer.h"
#include "moerl/telemetry/metrics_aggregator.h"
#include "moerl/telemetry/metrics_file.h"
#include "temp_dir.h"

using namespace moerl::telemetry;

namespace {

double exact_quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<size_t>(std::max(1.0, std::ceil(q * values.size())));
  return values[rank - 1];
}

}  // namespace

TEST_CASE("histogram quantiles are within the bucket resolution of exact ones", "[metrics]") {
  std::mt19937 rng(7);
  std::lognormal_distribution<double> latency(-5.0, 1.5);  // heavy-tailed, like step latencies
  std::vector<double> values;
  Histogram h;
  for (int i = 0; i < 20000; ++i) {
    values.push_back(latency(rng));
    h.record(values.back());
  }
  for (double q : {0.01, 0.5, 0.9, 0.99, 0.999}) {
    const double exact = exact_quantile(values, q);
    INFO("q=" << q << " exact=" << exact << " histogram=" << h.quantile(q));
    // 8 buckets per octave: the geometric midpoint is within 2^(1/16)-1 = 4.4%.
    CHECK(std::abs(h.quantile(q) / exact - 1.0) < 0.045);
  }
  CHECK(h.count() == 20000);
  CHECK(h.min() == *std::min_element(values.begin(), values.end()));
  CHECK(h.max() == *std::max_element(values.begin(), values.end()));
  CHECK(h.quantile(1.0) == h.max());
}

TEST_CASE("merging histograms equals recording everything in one", "[metrics]") {
  Histogram a, b, all;
  for (int i = 1; i <= 500; ++i) {
    const double v = i * 0.37;
    (i % 3 ? a : b).record(v);
    all.record(v);
  }
  a.merge(b);
  CHECK(a.count() == all.count());
  CHECK(a.sum() == Approx(all.sum()));
  CHECK(a.buckets() == all.buckets());
  CHECK(a.quantile(0.9) == all.quantile(0.9));
}

TEST_CASE("zero and negative values are kept apart from the log buckets", "[metrics]") {
  Histogram h;
  h.record(0.0);
  h.record(-1.0);
  h.record(4.0);
  CHECK(h.count() == 3);
  CHECK(h.quantile(0.5) == 0.0);
  CHECK(h.min() == -1.0);
  CHECK(h.quantile(1.0) == Approx(4.0).epsilon(0.05));
}

TEST_CASE("the aggregator sums counters, averages gauges and merges histograms per role", "[metrics]") {
  MetricsAggregator aggregator;
  for (int rank = 0; rank < 3; ++rank) {
    MetricsRegistry r(rank, rank == 0 ? "learner" : "actor");
    r.add("tokens", 100.0 * (rank + 1));
    r.set("occupancy", rank == 1 ? 0.5 : 1.0);
    r.record("latency_s", 0.01 * (rank + 1));
    aggregator.update(r.snapshot());
  }
  // A newer snapshot of rank 2 replaces the older one.
  MetricsRegistry newer(2, "actor");
  newer.add("tokens", 1000);
  newer.set("occupancy", 0.0);
  aggregator.update(newer.snapshot());

  const auto roles = aggregator.by_role();
  REQUIRE(roles.count("actor"));
  CHECK(roles.at("actor").counters.at("tokens") == 1200.0);
  CHECK(roles.at("actor").gauges.at("occupancy") == 0.25);
  CHECK(roles.at("actor").histograms.at("latency_s").count() == 1);
  CHECK(roles.at("learner").counters.at("tokens") == 100.0);

  const std::string line = aggregator.json_line(17);
  CHECK(line.find('\n') == std::string::npos);
  CHECK_THAT(line, Catch::StartsWith("{\"step\":17,\"time\":"));
  CHECK_THAT(line, Catch::Contains("\"actor\":{\"ranks\":2,\"counters\":{\"tokens\":1200}"));
  CHECK_THAT(line, Catch::Contains("\"ranks\":[{\"rank\":0,\"role\":\"learner\""));
}

TEST_CASE("JsonWriter escapes strings and writes non-finite numbers as null", "[metrics]") {
  moerl::JsonWriter json;
  json.begin_object()
      .key("text")
      .value("a\"b\\c\n\x01")
      .key("nan")
      .value(std::nan(""))
      .key("list")
      .begin_array()
      .value(1)
      .value(2.5)
      .value(true)
      .end_array()
      .end_object();
  CHECK(json.str() == R"({"text":"a\"b\\c\n\u0001","nan":null,"list":[1,2.5,true]})");
}

TEST_CASE("a resumed run's metrics file keeps the lines through its checkpoint's step", "[metrics]") {
  moerl_test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  // Steps 1-4, then a crash cut step 5 short; the resume from step 2 writes 3 again.
  std::ofstream(path) << "{\"step\":1,\"x\":1}\n{\"step\":2,\"x\":2}\n{\"step\":3,\"x\":3}\n"
                         "{\"step\":4,\"x\":4}\n{\"step\":5,\"x\n";
  CHECK(metrics_line_step("{\"step\":7}") == 7);
  CHECK_FALSE(metrics_line_step("{\"step\":7"));
  CHECK_FALSE(metrics_line_step("{\"steps\":7}"));
  CHECK(last_metrics_line_through(path, 3) == std::string("{\"step\":3,\"x\":3}"));
  CHECK(last_metrics_line_through(path, 99) == std::string("{\"step\":4,\"x\":4}"));
  CHECK_FALSE(last_metrics_line_through(path, 0));
  CHECK_FALSE(last_metrics_line_through(dir.file("missing.jsonl"), 3));

  CHECK(keep_lines_through_step(path, 2) == 3);
  std::ofstream(path, std::ios::app) << "{\"step\":3,\"x\":30}\n";
  CHECK(last_metrics_line_through(path, 3) == std::string("{\"step\":3,\"x\":30}"));
  CHECK(keep_lines_through_step(path, 3) == 0);
  CHECK(keep_lines_through_step(dir.file("missing.jsonl"), 3) == 0);
  CHECK_FALSE(std::filesystem::exists(dir.file("missing.jsonl")));
}
