#pragma once
// A mergeable histogram with log-spaced buckets (8 per power of two, so any
// quantile is within ~4.5% of the true value). Buckets are sparse: a latency
// histogram holds a few dozen. Ranks send them to learner 0, which merges
// them per role without losing the tails that averages hide.

#include <cstdint>
#include <map>

namespace moerl::telemetry {

class Histogram {
 public:
  void record(double value);
  void merge(const Histogram& other);

  std::uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  double min() const { return count_ ? min_ : 0.0; }
  double max() const { return count_ ? max_ : 0.0; }
  double mean() const { return count_ ? sum_ / static_cast<double>(count_) : 0.0; }
  // The values recorded after `earlier`, a copy of this histogram taken
  // before (bucket counts and sum subtracted; min and max stay this one's,
  // so quantiles of the difference are clamped to the whole range).
  Histogram since(const Histogram& earlier) const;
  // q in [0, 1]; 0 for an empty histogram. Clamped to [min, max].
  double quantile(double q) const;

  // Bucket index -> count; values <= 0 go to kNonPositiveBucket.
  const std::map<std::int32_t, std::uint64_t>& buckets() const { return buckets_; }
  static Histogram from_parts(std::map<std::int32_t, std::uint64_t> buckets, std::uint64_t count, double sum,
                              double min, double max);

  static constexpr std::int32_t kNonPositiveBucket = INT32_MIN;
  static constexpr int kBucketsPerOctave = 8;

 private:
  static std::int32_t bucket_of(double value);
  static double bucket_midpoint(std::int32_t bucket);

  std::map<std::int32_t, std::uint64_t> buckets_;
  std::uint64_t count_ = 0;
  double sum_ = 0;
  double min_ = 0;
  double max_ = 0;
};

}  // namespace moerl::telemetry
