#include "moerl/telemetry/metrics_report.h"

#include <unistd.h>

#include <filesystem>

#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"

namespace moerl::telemetry {

namespace {

void encode_map(runtime::ByteWriter& w, const std::map<std::string, double>& values) {
  w.put<std::uint64_t>(values.size());
  for (const auto& [name, value] : values) {
    w.put_string(name);
    w.put(value);
  }
}

std::map<std::string, double> decode_map(runtime::ByteReader& r) {
  std::map<std::string, double> values;
  const auto count = r.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string name = r.get_string();
    values[name] = r.get<double>();
  }
  return values;
}

void write_histogram(JsonWriter& json, const Histogram& h) {
  json.begin_object()
      .key("count").value(static_cast<std::int64_t>(h.count()))
      .key("mean").value(h.mean())
      .key("p50").value(h.quantile(0.5))
      .key("p90").value(h.quantile(0.9))
      .key("p99").value(h.quantile(0.99))
      .key("max").value(h.max())
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

void MetricsReport::encode(runtime::ByteWriter& w) const {
  w.put(snapshot.rank);
  w.put_string(snapshot.role);
  w.put(snapshot.taken_at_s);
  encode_map(w, snapshot.counters);
  encode_map(w, snapshot.gauges);
  w.put<std::uint64_t>(snapshot.histograms.size());
  for (const auto& [name, h] : snapshot.histograms) {
    w.put_string(name);
    w.put<std::uint64_t>(h.count());
    w.put(h.sum());
    w.put(h.min());
    w.put(h.max());
    w.put<std::uint64_t>(h.buckets().size());
    for (const auto& [bucket, n] : h.buckets()) {
      w.put(bucket);
      w.put(n);
    }
  }
}

MetricsReport MetricsReport::decode(runtime::ByteReader& r) {
  MetricsReport m;
  m.snapshot.rank = r.get<std::int32_t>();
  m.snapshot.role = r.get_string();
  m.snapshot.taken_at_s = r.get<double>();
  m.snapshot.counters = decode_map(r);
  m.snapshot.gauges = decode_map(r);
  const auto histograms = r.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < histograms; ++i) {
    std::string name = r.get_string();
    const auto count = r.get<std::uint64_t>();
    const auto sum = r.get<double>();
    const auto min = r.get<double>();
    const auto max = r.get<double>();
    const auto bucket_count = r.get<std::uint64_t>();
    std::map<std::int32_t, std::uint64_t> buckets;
    std::uint64_t total = 0;
    for (std::uint64_t b = 0; b < bucket_count; ++b) {
      const auto bucket = r.get<std::int32_t>();
      const auto n = r.get<std::uint64_t>();
      buckets[bucket] = n;
      total += n;
    }
    if (total != count)
      throw runtime::WireError("histogram '" + name + "' buckets hold " + std::to_string(total) +
                               " samples but its count says " + std::to_string(count));
    m.snapshot.histograms[name] = Histogram::from_parts(std::move(buckets), count, sum, min, max);
  }
  return m;
}

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

JsonLinesFile::JsonLinesFile(const std::string& path) : path_(path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  file_.open(path, std::ios::app);
  if (!file_) throw Error("cannot open metrics file '" + path + "' for appending");
}

std::int64_t keep_lines_through_step(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  if (!in) return 0;
  std::string kept, line;
  std::int64_t dropped = 0;
  while (std::getline(in, line)) {
    bool keep = false;
    try {
      const std::optional<JsonValue> at = JsonValue::parse(line).find("step");
      keep = at && at->as_number() <= static_cast<double>(step);
    } catch (const JsonError&) {
      keep = false;  // a line cut short by a crash
    }
    if (keep) {
      kept += line + "\n";
    } else {
      ++dropped;
    }
  }
  in.close();
  if (dropped == 0) return 0;
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << kept;
    out.flush();
    if (!out) throw Error("cannot rewrite metrics file '" + path + "' (writing '" + temporary + "')");
  }
  std::filesystem::rename(temporary, path);
  return dropped;
}

void JsonLinesFile::append(const std::string& line) {
  file_ << line << '\n';
  file_.flush();
  if (!file_) throw Error("error while writing metrics file '" + path_ + "'");
}

}  // namespace moerl::telemetry

#include <chrono>

#include "moerl/runtime/mailbox.h"

namespace moerl::telemetry {

MetricsReporter::MetricsReporter(runtime::Mailbox& mailbox, double interval_s, int coordinator_rank)
    : mailbox_(mailbox), interval_s_(interval_s), coordinator_(coordinator_rank) {
  next_at_ = runtime::monotonic_seconds() + interval_s_;
}

void record_resident_memory() {
  // /proc/self/statm: total and resident size, in pages.
  std::ifstream statm("/proc/self/statm");
  double total_pages = 0, resident_pages = 0;
  if (statm >> total_pages >> resident_pages)
    metrics().set("process.resident_bytes", resident_pages * static_cast<double>(sysconf(_SC_PAGESIZE)));
}

void MetricsReporter::maybe_send() {
  if (runtime::monotonic_seconds() < next_at_) return;
  send_now();
}

void MetricsReporter::send_now() {
  next_at_ = runtime::monotonic_seconds() + interval_s_;
  record_resident_memory();
  if (mailbox_.rank() == coordinator_) return;
  mailbox_.send(coordinator_, MetricsReport{metrics().snapshot()});
}

}  // namespace moerl::telemetry
