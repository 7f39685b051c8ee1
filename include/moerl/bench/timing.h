#pragma once
// Wall-clock timing shared by the benchmarks.

#include <algorithm>
#include <chrono>
#include <vector>

namespace moerl::bench {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The q-quantile (0..1) of v by the nearest rank; 0 for no values.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// The fastest of `repetitions` runs of body(), in seconds: the run least
// disturbed by the rest of the machine.
template <typename F>
double best_seconds(int repetitions, F&& body) {
  double best = 1e30;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// The median of `reps` runs of fn() after `warmup` untimed ones, in seconds:
// for work whose first calls allocate and whose timings are noisy both ways.
template <typename F>
double median_seconds(F&& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds.empty() ? 0.0 : seconds[seconds.size() / 2];
}

}  // namespace moerl::bench
