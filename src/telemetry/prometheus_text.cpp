#include "moerl/telemetry/prometheus_text.h"

#include <spdlog/fmt/fmt.h>

#include <cctype>
#include <cmath>
#include <sstream>

#include "moerl/core/string_affixes.h"

namespace moerl::telemetry {
namespace {

// A dotted metric name whose `{label}` segments become labels.
struct SeriesPattern {
  const char* pattern;  // "env.retries.{family}.{reason}"
  const char* name;     // without prefix and _total; "" = left off the page
  const char* help;
  PrometheusLabels fixed = {};  // labels every series of the pattern carries
  double scale = 1.0;
};

// Longer patterns of one stem first does not matter: a pattern matches only
// names with its number of segments.
const std::vector<SeriesPattern>& series_patterns() {
  static const std::vector<SeriesPattern> patterns = {
      {"actor.policy_version", "actor_weight_version", "The weight version the actor generates with."},
      {"actor.env_failures.{family}.{reason}", "actor_env_failures",
       "Episodes an actor ended by an environment failure."},
      {"curriculum.{family}.changes", "curriculum_changes", "Curriculum level changes."},
      {"curriculum.{family}.difficulty", "curriculum_difficulty", "Training difficulty the curriculum chose."},
      {"curriculum.{family}.progress", "curriculum_progress", "Absolute learning progress of the family."},
      {"curriculum.{family}.weight", "curriculum_weight", "Sampling weight of the family."},
      {"env.failures.{family}.{reason}", "env_failures", "Sessions that failed for good, by reason."},
      {"env.failures.{family}", "", ""},  // the sum of the above
      {"env.retries.{family}.{reason}", "env_retries", "Session attempts retried, by reason."},
      {"env.retries.{family}", "", ""},  // the sum of the above
      {"env.invalid_utf8.{family}", "env_invalid_utf8", "Observations that were not valid UTF-8."},
      {"env.steps.{family}", "env_steps", "Environment steps served."},
      {"env.timeouts.{family}", "env_timeouts", "Environment steps that timed out."},
      {"env.step_latency_s.{family}", "env_step_latency_seconds", "One environment step, request to reply."},
      {"learner.env_failures.{family}.{reason}", "learner_env_failures", "Failure records learner 0 counted."},
      {"learner.family_pauses.{family}", "learner_family_pauses", "Times the circuit breaker paused the family."},
      {"learner.family_paused.{family}", "learner_family_paused", "1 while the circuit breaker holds the family back."},
      {"train.{family}.reward", "train_reward", "Mean reward of the last step's training episodes."},
      {"train.{family}.success", "train_success_ratio", "Success of the last step's training episodes."},
      {"eval.{family}.{mode}.success",
       "eval_success_ratio",
       "Held-out success of the newest evaluation.",
       {{"bound", "mean"}}},
      {"eval.{family}.{mode}.success_ci_low", "eval_success_ratio", "", {{"bound", "ci_low"}}},
      {"eval.{family}.{mode}.success_ci_high", "eval_success_ratio", "", {{"bound", "ci_high"}}},
      {"eval_stable.{family}.{mode}.success", "eval_stable_success_ratio",
       "Held-out success of the reference version (the base until one is accepted)."},
      {"moe.layer.{layer}.expert.{expert}.load", "moe_expert_load_ratio",
       "Share of the layer's routed tokens the expert received in the last step."},
      {"moe.layer.{layer}.imbalance", "moe_expert_imbalance_ratio", "Max over mean expert load in the last step."},
      {"moe.layer.{layer}.dropped_tokens", "moe_dropped_tokens", "Token routings dropped by expert capacity."},
      {"sync.receive_GB_per_s", "sync_receive_bytes_per_second", "Weight-sync receive rate.", {}, 1e9},
      {"sync.publish_GB_per_s", "sync_publish_bytes_per_second", "Weight-sync publish rate.", {}, 1e9},
  };
  return patterns;
}

std::vector<std::string> split_dots(const std::string& name) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(name);
  while (std::getline(in, part, '.')) parts.push_back(part);
  return parts;
}

// The labels of `metric` if it matches `pattern`.
std::optional<PrometheusLabels> match(const std::string& pattern, const std::vector<std::string>& segments) {
  const std::vector<std::string> wanted = split_dots(pattern);
  if (wanted.size() != segments.size()) return std::nullopt;
  PrometheusLabels labels;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const std::string& w = wanted[i];
    if (w.size() > 2 && w.front() == '{' && w.back() == '}')
      labels.emplace_back(w.substr(1, w.size() - 2), segments[i]);
    else if (w != segments[i])
      return std::nullopt;
  }
  return labels;
}

// Dots and anything else Prometheus does not allow in a name become '_';
// moerl's unit suffixes are spelled out.
std::string default_name(const std::string& metric) {
  std::string name;
  for (char c : metric) name += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_';
  if (ends_with(name, "_per_s")) return name.substr(0, name.size() - 2) + "second";
  if (ends_with(name, "_s")) return name + "econds";
  return name;
}

std::string with_prefix_and_suffix(const std::string& name, MetricKind kind) {
  std::string full = "moerl_" + name;
  if (kind == MetricKind::MetricCounter && !ends_with(full, "_total")) full += "_total";
  return full;
}

const char* type_name(MetricKind kind) {
  switch (kind) {
    case MetricKind::MetricCounter: return "counter";
    case MetricKind::MetricGauge: return "gauge";
    case MetricKind::MetricHistogram: return "histogram";
  }
  return "untyped";
}

// The fixed `le` bounds of a histogram, by its unit.
std::vector<double> histogram_bounds(const std::string& name) {
  std::vector<double> bounds;
  if (ends_with(name, "_versions")) {
    bounds.push_back(0);
    for (int k = 0; k <= 6; ++k) bounds.push_back(std::ldexp(1.0, k));
  } else {
    const int last = ends_with(name, "_seconds") ? 8 : 20;  // 256 s, or about a million
    for (int k = -12; k <= last; ++k) bounds.push_back(std::ldexp(1.0, k));
  }
  return bounds;
}

// Values at most `bound` (the bucket starting at a power of two counts under it).
std::uint64_t count_at_most(const Histogram& h, double bound) {
  std::uint64_t n = 0;
  for (const auto& [bucket, count] : h.buckets()) {
    if (bucket == Histogram::kNonPositiveBucket) {
      if (bound >= 0) n += count;
      continue;
    }
    if (bound > 0 && bucket <= static_cast<std::int32_t>(std::floor(std::log2(bound) * Histogram::kBucketsPerOctave)))
      n += count;
  }
  return n;
}

std::string label_text(const PrometheusLabels& labels) {
  std::string text;
  for (const auto& [key, value] : labels)
    text += (text.empty() ? "" : ",") + key + "=\"" + escape_label_value(value) + "\"";
  return "{" + text + "}";
}

// The samples of one metric family, written together under its TYPE line.
struct Family {
  MetricKind kind;
  std::string help;
  std::vector<std::string> lines;
};

class Page {
 public:
  void add(const std::string& name, MetricKind kind, const std::string& help, std::string line) {
    auto [it, fresh] = families_.try_emplace(name, Family{kind, help, {}});
    if (!fresh && it->second.kind != kind) return;  // one type per family: the first one seen holds
    if (it->second.help.empty()) it->second.help = help;
    it->second.lines.push_back(std::move(line));
  }
  std::string text() const {
    std::string out;
    for (const auto& [name, family] : families_) {
      out += "# HELP " + name + " " + (family.help.empty() ? "moerl metric." : family.help) + "\n";
      out += "# TYPE " + name + " " + type_name(family.kind) + "\n";
      for (const std::string& line : family.lines) out += line;
    }
    return out;
  }

 private:
  std::map<std::string, Family> families_;
};

struct Described {
  PrometheusSeries series;
  std::string help;
};

std::optional<Described> describe(const std::string& metric, MetricKind kind) {
  const std::vector<std::string> segments = split_dots(metric);
  for (const SeriesPattern& p : series_patterns()) {
    std::optional<PrometheusLabels> labels = match(p.pattern, segments);
    if (!labels) continue;
    if (std::string(p.name).empty()) return std::nullopt;
    labels->insert(labels->end(), p.fixed.begin(), p.fixed.end());
    return Described{{with_prefix_and_suffix(p.name, kind), *labels, p.scale}, p.help};
  }
  return Described{{with_prefix_and_suffix(default_name(metric), kind), {}, 1.0}, "moerl's " + metric + "."};
}

PrometheusLabels with_identity(const MetricsSnapshot& snapshot, const PrometheusLabels& labels) {
  PrometheusLabels all = {{"rank", std::to_string(snapshot.rank)}, {"role", snapshot.role}};
  all.insert(all.end(), labels.begin(), labels.end());
  return all;
}

void add_scalars(Page& page, const MetricsSnapshot& snapshot, const std::map<std::string, double>& values,
                 MetricKind kind) {
  for (const auto& [metric, value] : values) {
    const std::optional<Described> d = describe(metric, kind);
    if (!d) continue;
    page.add(d->series.name, kind, d->help,
             d->series.name + label_text(with_identity(snapshot, d->series.labels)) + " " +
                 format_sample_value(value * d->series.scale) + "\n");
  }
}

void add_histograms(Page& page, const MetricsSnapshot& snapshot) {
  for (const auto& [metric, histogram] : snapshot.histograms) {
    const std::optional<Described> d = describe(metric, MetricKind::MetricHistogram);
    if (!d) continue;
    const std::string& name = d->series.name;
    const PrometheusLabels labels = with_identity(snapshot, d->series.labels);
    std::string lines;
    for (double bound : histogram_bounds(name)) {
      PrometheusLabels with_le = labels;
      with_le.emplace_back("le", format_sample_value(bound));
      lines += name + "_bucket" + label_text(with_le) + " " + std::to_string(count_at_most(histogram, bound)) + "\n";
    }
    PrometheusLabels with_inf = labels;
    with_inf.emplace_back("le", "+Inf");
    lines += name + "_bucket" + label_text(with_inf) + " " + std::to_string(histogram.count()) + "\n";
    lines += name + "_sum" + label_text(labels) + " " + format_sample_value(histogram.sum()) + "\n";
    lines += name + "_count" + label_text(labels) + " " + std::to_string(histogram.count()) + "\n";
    page.add(name, MetricKind::MetricHistogram, d->help, std::move(lines));
  }
}

}  // namespace

std::optional<PrometheusSeries> prometheus_series(const std::string& metric, MetricKind kind) {
  const std::optional<Described> d = describe(metric, kind);
  if (!d) return std::nullopt;
  return d->series;
}

std::string format_sample_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string render_exposition(const std::map<int, MetricsSnapshot>& snapshots,
                              const std::vector<PrometheusSample>& extra_gauges) {
  Page page;
  for (const auto& [rank, snapshot] : snapshots) {
    add_scalars(page, snapshot, snapshot.counters, MetricKind::MetricCounter);
    add_scalars(page, snapshot, snapshot.gauges, MetricKind::MetricGauge);
    add_histograms(page, snapshot);
  }
  for (const PrometheusSample& sample : extra_gauges)
    page.add(sample.name, MetricKind::MetricGauge, sample.help,
             sample.name + label_text(sample.labels) + " " + format_sample_value(sample.value) + "\n");
  return page.text();
}

}  // namespace moerl::telemetry
