#include "moerl/telemetry/metric_warnings.h"

#include <spdlog/fmt/fmt.h>

#include "moerl/core/string_affixes.h"

namespace moerl::telemetry {
namespace {

// "moe.layer.<L>.imbalance" -> "<L>"; "" for other names.
std::string imbalance_layer(const std::string& gauge) {
  const std::string head = "moe.layer.", tail = ".imbalance";
  if (!starts_with(gauge, head) || !ends_with(gauge, tail) || gauge.size() <= head.size() + tail.size()) return "";
  return gauge.substr(head.size(), gauge.size() - head.size() - tail.size());
}

// The expert with the largest share of layer `layer`'s load, and that share.
std::pair<std::string, double> busiest_expert(const MetricsSnapshot& s, const std::string& layer) {
  const std::string head = "moe.layer." + layer + ".expert.";
  std::pair<std::string, double> best{"?", 0.0};
  for (const auto& [name, value] : s.gauges)
    if (starts_with(name, head) && ends_with(name, ".load") && value > best.second)
      best = {name.substr(head.size(), name.size() - head.size() - 5), value};
  return best;
}

}  // namespace

void MetricWarnings::note(const std::string& key, bool holds, const std::string& when_on, const std::string& when_off,
                          std::vector<MetricWarning>& out) {
  Condition& c = conditions_[key];
  if (holds && (!c.active || ++c.checks_since_report >= options_.repeat_every)) {
    out.push_back({true, c.active ? when_on + " (still)" : when_on});
    c.active = true;
    c.checks_since_report = 0;
  } else if (!holds && c.active) {
    out.push_back({false, when_off});
    c = Condition{};
  }
}

void MetricWarnings::check_imbalance(const std::map<int, MetricsSnapshot>& latest, std::vector<MetricWarning>& out) {
  for (const auto& [rank, s] : latest)
    for (const auto& [gauge, ratio] : s.gauges) {
      const std::string layer = imbalance_layer(gauge);
      if (layer.empty()) continue;
      const auto [expert, share] = busiest_expert(s, layer);
      const std::string who = fmt::format("{} (rank {})", s.role, rank);
      note(fmt::format("imbalance/{}/{}", rank, layer), ratio > options_.imbalance_ratio,
           fmt::format("{}: MoE layer {}'s expert load is imbalanced: max/mean {:.2f} > {:.2f} ([telemetry] "
                       "imbalance_warn_ratio); expert {} took {:.0f}% of the last step's routed tokens",
                       who, layer, ratio, options_.imbalance_ratio, expert, 100 * share),
           fmt::format("{}: MoE layer {}'s expert load is balanced again (max/mean {:.2f})", who, layer, ratio), out);
    }
}

void MetricWarnings::check_env_latency(const std::map<int, MetricsSnapshot>& latest, std::vector<MetricWarning>& out) {
  const std::string head = "env.step_latency_s.";
  std::map<std::string, Histogram> merged;
  for (const auto& [rank, s] : latest)
    for (const auto& [name, histogram] : s.histograms)
      if (starts_with(name, head)) merged[name.substr(head.size())].merge(histogram);
  for (const auto& [family, now] : merged) {
    const Histogram recent = now.since(env_latency_seen_[family]);
    if (recent.count() < options_.min_steps) continue;  // too few steps to judge: wait for more
    env_latency_seen_[family] = now;
    const double p99 = recent.quantile(0.99);
    note("env_p99/" + family, p99 > options_.env_p99_s,
         fmt::format("env: family '{}' steps are slow: P99 {:.0f} ms over its last {} steps > {:.0f} ms ([telemetry] "
                     "env_p99_warn_s)",
                     family, 1e3 * p99, recent.count(), 1e3 * options_.env_p99_s),
         fmt::format("env: family '{}' steps are fast again: P99 {:.0f} ms over its last {} steps", family, 1e3 * p99,
                     recent.count()),
         out);
  }
}

std::vector<MetricWarning> MetricWarnings::check(const std::map<int, MetricsSnapshot>& latest) {
  std::vector<MetricWarning> out;
  check_imbalance(latest, out);
  check_env_latency(latest, out);
  return out;
}

}  // namespace moerl::telemetry
