#include "moerl/telemetry/metrics_aggregator.h"

#include <algorithm>

#include "moerl/core/json_writer.h"

namespace moerl::telemetry {
namespace {

void write_histogram(JsonWriter& json, const Histogram& h) {
  json.begin_object()
      .key("count")
      .value(static_cast<std::int64_t>(h.count()))
      .key("mean")
      .value(h.mean())
      .key("p50")
      .value(h.quantile(0.5))
      .key("p90")
      .value(h.quantile(0.9))
      .key("p99")
      .value(h.quantile(0.99))
      .key("max")
      .value(h.max())
      .end_object();
}

void write_values(JsonWriter& json, const char* name, const std::map<std::string, double>& values) {
  json.key(name).begin_object();
  for (const auto& [key, value] : values) json.key(key).value(value);
  json.end_object();
}

void write_snapshot_body(JsonWriter& json, const MetricsSnapshot& s) {
  write_values(json, "counters", s.counters);
  write_values(json, "gauges", s.gauges);
  json.key("histograms").begin_object();
  for (const auto& [key, h] : s.histograms) {
    json.key(key);
    write_histogram(json, h);
  }
  json.end_object();
}

}  // namespace

void MetricsAggregator::update(const MetricsSnapshot& snapshot) { latest_[snapshot.rank] = snapshot; }

std::map<std::string, MetricsSnapshot> MetricsAggregator::by_role() const {
  std::map<std::string, MetricsSnapshot> roles;
  std::map<std::string, std::map<std::string, int>> gauge_counts;
  for (const auto& [rank, s] : latest_) {
    MetricsSnapshot& agg = roles[s.role];
    agg.role = s.role;
    agg.taken_at_s = std::max(agg.taken_at_s, s.taken_at_s);
    for (const auto& [k, v] : s.counters) agg.counters[k] += v;
    for (const auto& [k, v] : s.gauges) {
      agg.gauges[k] += v;
      ++gauge_counts[s.role][k];
    }
    for (const auto& [k, h] : s.histograms) agg.histograms[k].merge(h);
  }
  for (auto& [role, agg] : roles)
    for (auto& [k, v] : agg.gauges) v /= gauge_counts[role][k];
  return roles;
}

std::string MetricsAggregator::json_line(std::int64_t step) const {
  JsonWriter json;
  const double now = unix_time_seconds();
  // "time" in %.9g keeps 10 s of resolution; "time_ms" is exact enough to time steps.
  json.begin_object().key("step").value(step).key("time").value(now);
  json.key("time_ms").value(static_cast<std::int64_t>(now * 1000.0));
  json.key("roles").begin_object();
  std::map<std::string, int> ranks_per_role;
  for (const auto& [rank, s] : latest_) ++ranks_per_role[s.role];
  for (const auto& [role, agg] : by_role()) {
    json.key(role).begin_object().key("ranks").value(ranks_per_role[role]);
    write_snapshot_body(json, agg);
    json.end_object();
  }
  json.end_object().key("ranks").begin_array();
  for (const auto& [rank, s] : latest_) {
    json.begin_object().key("rank").value(rank).key("role").value(s.role);
    write_snapshot_body(json, s);
    json.end_object();
  }
  json.end_array().end_object();
  return json.str();
}

}  // namespace moerl::telemetry
