#include "moerl/telemetry/metrics.h"

#include <chrono>

namespace moerl::telemetry {

double unix_time_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

void MetricsRegistry::set_identity(int rank, std::string role) {
  std::lock_guard<std::mutex> lock(mutex_);
  rank_ = rank;
  role_ = std::move(role);
}

void MetricsRegistry::add(const std::string& counter, double amount) {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_[counter] += amount;
}

void MetricsRegistry::set(const std::string& gauge, double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  gauges_[gauge] = value;
}

void MetricsRegistry::record(const std::string& histogram, double value) {
  std::lock_guard<std::mutex> lock(mutex_);
  histograms_[histogram].record(value);
}

MetricsSnapshot MetricsRegistry::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return MetricsSnapshot{rank_, role_, unix_time_seconds(), counters_, gauges_, histograms_};
}

MetricsRegistry& metrics() {
  static MetricsRegistry registry;
  return registry;
}

}  // namespace moerl::telemetry
