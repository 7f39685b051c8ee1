#pragma once
// Rendering moerl's metrics in Prometheus's text exposition format (version
// 0.0.4, what every Prometheus server scrapes), for learner 0's /metrics
// endpoint (metrics_server.h).
//
// moerl records metrics under dotted names that carry their unit and, for
// some, a family, reason, layer or expert as a name segment
// ("env.retries.sort.timeout", "moe.layer.0.expert.3.load"). Prometheus wants
// the unit in base units at the end of the name and the rest as labels:
//   env.retries.sort.timeout  (counter)  ->  moerl_env_retries_total{family="sort",reason="timeout"}
//   sync.publication_s      (histogram) ->  moerl_sync_publication_seconds_bucket{le="..."} ...
// A table of patterns (prometheus_text.cpp) names the segments that are
// labels; every other metric keeps its name, with dots as underscores, its
// unit spelled out and `_total` on counters. Every series carries the `rank`
// and `role` of the process it came from.
//
// Histograms keep moerl's log-spaced buckets (histogram.h, 8 per power of
// two); the page gives cumulative counts at powers of two over a fixed range
// per unit, so every scrape has the same `le` bounds. A bound 2^k counts the
// bucket that starts at 2^k (values up to 9% above it, the histogram's own
// resolution): integer-valued histograms such as staleness in versions are
// exact up to 8.

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moerl/telemetry/metrics.h"

namespace moerl::telemetry {

enum class MetricKind { MetricCounter, MetricGauge, MetricHistogram };

using PrometheusLabels = std::vector<std::pair<std::string, std::string>>;

// A moerl metric as Prometheus sees it.
struct PrometheusSeries {
  std::string name;         // "moerl_env_retries_total" (histograms: without _bucket/_sum/_count)
  PrometheusLabels labels;  // from the dotted name's segments (not rank/role)
  double scale = 1.0;       // multiplies the value (to base units)
};

// The Prometheus name and labels of a recorded metric; nullopt for metrics
// the page leaves out (totals whose per-reason series already sum to them).
std::optional<PrometheusSeries> prometheus_series(const std::string& metric, MetricKind kind);

// A value that is no recorded metric (learner 0's view of other ranks).
struct PrometheusSample {
  std::string name;  // full name: "moerl_rank_heartbeat_age_seconds"
  std::string help;
  PrometheusLabels labels;  // rank and role included
  double value = 0;
};

// The page: every rank's latest snapshot, then the extra gauges.
std::string render_exposition(const std::map<int, MetricsSnapshot>& snapshots,
                              const std::vector<PrometheusSample>& extra_gauges = {});

// Exposition-format spellings, for tests: a float ("+Inf", "NaN", shortest
// round-trip decimal) and an escaped label value.
std::string format_sample_value(double value);
std::string escape_label_value(const std::string& value);

}  // namespace moerl::telemetry
