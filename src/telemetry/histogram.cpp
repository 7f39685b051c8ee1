#include "moerl/telemetry/histogram.h"

#include <algorithm>
#include <cmath>

namespace moerl::telemetry {

std::int32_t Histogram::bucket_of(double value) {
  if (!(value > 0)) return kNonPositiveBucket;
  return static_cast<std::int32_t>(std::floor(std::log2(value) * kBucketsPerOctave));
}

double Histogram::bucket_midpoint(std::int32_t bucket) {
  if (bucket == kNonPositiveBucket) return 0.0;
  // Geometric midpoint of [2^(b/8), 2^((b+1)/8)).
  return std::exp2((bucket + 0.5) / kBucketsPerOctave);
}

void Histogram::record(double value) {
  if (std::isnan(value)) return;
  if (count_ == 0) {
    min_ = max_ = value;
  } else {
    min_ = std::min(min_, value);
    max_ = std::max(max_, value);
  }
  ++count_;
  sum_ += value;
  ++buckets_[bucket_of(value)];
}

void Histogram::merge(const Histogram& other) {
  if (other.count_ == 0) return;
  if (count_ == 0) {
    min_ = other.min_;
    max_ = other.max_;
  } else {
    min_ = std::min(min_, other.min_);
    max_ = std::max(max_, other.max_);
  }
  count_ += other.count_;
  sum_ += other.sum_;
  for (const auto& [bucket, n] : other.buckets_) buckets_[bucket] += n;
}

Histogram Histogram::since(const Histogram& earlier) const {
  Histogram h;
  for (const auto& [bucket, n] : buckets_) {
    const auto it = earlier.buckets_.find(bucket);
    const std::uint64_t before = it == earlier.buckets_.end() ? 0 : std::min(it->second, n);
    if (n > before) h.buckets_[bucket] = n - before;
    h.count_ += n - before;
  }
  if (h.count_ == 0) return Histogram();
  h.sum_ = sum_ - earlier.sum_;
  h.min_ = min_;
  h.max_ = max_;
  return h;
}

double Histogram::quantile(double q) const {
  if (count_ == 0) return 0.0;
  // The extremes are known exactly; only interior quantiles are estimated.
  if (q <= 0.0) return min_;
  if (q >= 1.0) return max_;
  // The rank of the wanted sample, 1-based, as in the nearest-rank method.
  const auto wanted = static_cast<std::uint64_t>(std::max(1.0, std::ceil(q * static_cast<double>(count_))));
  std::uint64_t seen = 0;
  for (const auto& [bucket, n] : buckets_) {
    seen += n;
    if (seen >= wanted) return std::clamp(bucket_midpoint(bucket), min_, max_);
  }
  return max_;
}

Histogram Histogram::from_parts(std::map<std::int32_t, std::uint64_t> buckets, std::uint64_t count, double sum,
                                double min, double max) {
  Histogram h;
  h.buckets_ = std::move(buckets);
  h.count_ = count;
  h.sum_ = sum;
  h.min_ = min;
  h.max_ = max;
  return h;
}

}  // namespace moerl::telemetry
