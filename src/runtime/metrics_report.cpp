#include "moerl/runtime/metrics_report.h"

#include "moerl/runtime/mailbox.h"
#include "moerl/telemetry/resident_memory.h"

namespace moerl::runtime {
namespace {

void encode_map(ByteWriter& w, const std::map<std::string, double>& values) {
  w.put<std::uint64_t>(values.size());
  for (const auto& [name, value] : values) {
    w.put_string(name);
    w.put(value);
  }
}

std::map<std::string, double> decode_map(ByteReader& r) {
  std::map<std::string, double> values;
  const auto count = r.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string name = r.get_string();
    values[name] = r.get<double>();
  }
  return values;
}

}  // namespace

void MetricsReport::encode(ByteWriter& w) const {
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

MetricsReport MetricsReport::decode(ByteReader& r) {
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
      throw WireError("histogram '" + name + "' buckets hold " + std::to_string(total) +
                      " samples but its count says " + std::to_string(count));
    m.snapshot.histograms[name] = telemetry::Histogram::from_parts(std::move(buckets), count, sum, min, max);
  }
  return m;
}

MetricsReporter::MetricsReporter(Mailbox& mailbox, double interval_s, int coordinator_rank)
    : mailbox_(mailbox), interval_s_(interval_s), coordinator_(coordinator_rank) {
  next_at_ = monotonic_seconds() + interval_s_;
}

void MetricsReporter::maybe_send() {
  if (monotonic_seconds() < next_at_) return;
  send_now();
}

void MetricsReporter::send_first_news() {
  if (!sent_any_) send_now();
}

void MetricsReporter::send_now() {
  sent_any_ = true;
  next_at_ = monotonic_seconds() + interval_s_;
  telemetry::record_resident_memory();
  if (mailbox_.rank() == coordinator_) return;
  mailbox_.send(coordinator_, MetricsReport{telemetry::metrics().snapshot()});
}

}  // namespace moerl::runtime
