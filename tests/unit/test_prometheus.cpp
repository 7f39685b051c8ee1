// The Prometheus page (telemetry/prometheus_text.h) and the server that
// serves it (telemetry/metrics_server.h), fetched over real HTTP.
#include <httplib.h>

#include <catch2/catch.hpp>
#include <regex>
#include <sstream>

#include "moerl/core/error.h"
#include "moerl/telemetry/metrics_server.h"
#include "moerl/telemetry/prometheus_text.h"

using namespace moerl::telemetry;

namespace {

MetricsSnapshot snapshot_of(int rank, const std::string& role, const MetricsRegistry& registry) {
  MetricsSnapshot s = registry.snapshot();
  s.rank = rank;
  s.role = role;
  return s;
}

// The value of the one sample line that starts with `series` (name and labels, exactly).
double sample(const std::string& page, const std::string& series) {
  std::istringstream lines(page);
  std::string line;
  int found = 0;
  double value = 0;
  while (std::getline(lines, line))
    if (line.rfind(series + " ", 0) == 0) {
      ++found;
      value = std::stod(line.substr(series.size() + 1));
    }
  INFO(series << " in\n" << page);
  REQUIRE(found == 1);
  return value;
}

}  // namespace

TEST_CASE("prometheus names: labels from the dotted name, base units, _total on counters", "[prometheus]") {
  using K = MetricKind;
  auto retries = prometheus_series("env.retries.sort.timeout", K::MetricCounter);
  REQUIRE(retries);
  CHECK(retries->name == "moerl_env_retries_total");
  CHECK(retries->labels == PrometheusLabels{{"family", "sort"}, {"reason", "timeout"}});
  // The per-family total is the sum of the per-reason series: left off.
  CHECK_FALSE(prometheus_series("env.retries.sort", K::MetricCounter));
  auto load = prometheus_series("moe.layer.1.expert.7.load", K::MetricGauge);
  REQUIRE(load);
  CHECK(load->name == "moerl_moe_expert_load_ratio");
  CHECK(load->labels == PrometheusLabels{{"layer", "1"}, {"expert", "7"}});
  auto latency = prometheus_series("sync.publication_s", K::MetricHistogram);
  REQUIRE(latency);
  CHECK(latency->name == "moerl_sync_publication_seconds");
  auto rate = prometheus_series("sync.receive_GB_per_s", K::MetricGauge);
  REQUIRE(rate);
  CHECK(rate->name == "moerl_sync_receive_bytes_per_second");
  CHECK(rate->scale == 1e9);
  CHECK(prometheus_series("rollout.decode_tokens", K::MetricCounter)->name == "moerl_rollout_decode_tokens_total");
  CHECK(prometheus_series("learner.step", K::MetricGauge)->name == "moerl_learner_step");
  CHECK(prometheus_series("weird-name.x", K::MetricGauge)->name == "moerl_weird_name_x");
  auto ci = prometheus_series("eval.sort.greedy.success_ci_low", K::MetricGauge);
  REQUIRE(ci);
  CHECK(ci->name == "moerl_eval_success_ratio");
  CHECK(ci->labels == PrometheusLabels{{"family", "sort"}, {"mode", "greedy"}, {"bound", "ci_low"}});
}

TEST_CASE("prometheus page: one TYPE per family, every rank's series, cumulative buckets", "[prometheus]") {
  MetricsRegistry learner, actor;
  learner.set("learner.step", 12);
  learner.add("env.retries.sort.timeout", 3);
  learner.add("env.retries.sort", 3);
  for (int v : {0, 1, 1, 2, 3, 5}) learner.record("learner.staleness_versions", v);
  actor.set("actor.policy_version", 11);
  actor.add("env.retries.sort.timeout", 2);
  for (double s : {0.001, 0.003, 0.2, 0.7}) actor.record("env.step_latency_s.sort", s);
  const std::map<int, MetricsSnapshot> snapshots = {{0, snapshot_of(0, "learner", learner)},
                                                    {1, snapshot_of(1, "actor", actor)}};
  const std::string page = render_exposition(
      snapshots,
      {{"moerl_rank_heartbeat_age_seconds", "Since the last heartbeat.", {{"rank", "1"}, {"role", "actor"}}, 0.25}});
  INFO(page);
  CHECK(sample(page, "moerl_learner_step{rank=\"0\",role=\"learner\"}") == 12);
  CHECK(sample(page, "moerl_actor_weight_version{rank=\"1\",role=\"actor\"}") == 11);
  CHECK(sample(page, "moerl_env_retries_total{rank=\"0\",role=\"learner\",family=\"sort\",reason=\"timeout\"}") == 3);
  CHECK(sample(page, "moerl_env_retries_total{rank=\"1\",role=\"actor\",family=\"sort\",reason=\"timeout\"}") == 2);
  CHECK(sample(page, "moerl_rank_heartbeat_age_seconds{rank=\"1\",role=\"actor\"}") == 0.25);
  // One TYPE line per family, even with series from two ranks.
  const std::regex type_line("# TYPE moerl_env_retries_total counter");
  CHECK(std::distance(std::sregex_iterator(page.begin(), page.end(), type_line), std::sregex_iterator()) == 1);
  CHECK(page.find("# TYPE moerl_env_step_latency_seconds histogram") != std::string::npos);
  CHECK(page.find("# HELP moerl_learner_step ") != std::string::npos);
  // Staleness: integer values are counted exactly at their bounds.
  const std::string st = "moerl_learner_staleness_versions_bucket{rank=\"0\",role=\"learner\",le=";
  CHECK(sample(page, st + "\"0\"}") == 1);
  CHECK(sample(page, st + "\"1\"}") == 3);
  CHECK(sample(page, st + "\"2\"}") == 4);
  CHECK(sample(page, st + "\"4\"}") == 5);
  CHECK(sample(page, st + "\"8\"}") == 6);
  CHECK(sample(page, st + "\"+Inf\"}") == 6);
  CHECK(sample(page, "moerl_learner_staleness_versions_count{rank=\"0\",role=\"learner\"}") == 6);
  CHECK(sample(page, "moerl_learner_staleness_versions_sum{rank=\"0\",role=\"learner\"}") == 12);
  // Latency: 2 of 4 under 1/256 s, 3 under 0.25 s, all under 1 s.
  const std::string lat = "moerl_env_step_latency_seconds_bucket{rank=\"1\",role=\"actor\",family=\"sort\",le=";
  CHECK(sample(page, lat + "\"0.00390625\"}") == 2);
  CHECK(sample(page, lat + "\"0.25\"}") == 3);
  CHECK(sample(page, lat + "\"1\"}") == 4);
  CHECK(sample(page, lat + "\"256\"}") == 4);
  CHECK(page.find("le=\"512\"") == std::string::npos);  // seconds stop at 256
}

TEST_CASE("prometheus spellings: special floats and escaped label values", "[prometheus]") {
  CHECK(format_sample_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_sample_value(std::nan("")) == "NaN");
  CHECK(format_sample_value(0.5) == "0.5");
  CHECK(format_sample_value(3) == "3");
  CHECK(escape_label_value("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
}

TEST_CASE("metrics server: serves the page it is given over HTTP, and names the address it cannot take",
          "[prometheus]") {
  int calls = 0;
  MetricsServer server("127.0.0.1", 0, [&calls] {
    ++calls;
    return "# TYPE moerl_up gauge\nmoerl_up " + std::to_string(calls) + "\n";
  });
  REQUIRE(server.port() > 0);
  CHECK(server.url() == "http://127.0.0.1:" + std::to_string(server.port()) + "/metrics");
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(5, 0);
  for (int i = 1; i <= 2; ++i) {
    auto response = client.Get("/metrics");
    REQUIRE(response);
    CHECK(response->status == 200);
    CHECK(response->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0) == 0);
    CHECK(response->body == "# TYPE moerl_up gauge\nmoerl_up " + std::to_string(i) + "\n");
  }
  auto missing = client.Get("/nothing");
  REQUIRE(missing);
  CHECK(missing->status == 404);
  // The port is taken: a second server says so, with the keys to change.
  try {
    MetricsServer second("127.0.0.1", server.port(), [] { return std::string(); });
    FAIL("a second server took a port in use");
  } catch (const moerl::Error& error) {
    const std::string what = error.what();
    CHECK(what.find("127.0.0.1:" + std::to_string(server.port())) != std::string::npos);
    CHECK(what.find("prometheus_port") != std::string::npos);
  }
}
