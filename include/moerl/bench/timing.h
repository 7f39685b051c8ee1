#pragma once
// Wall-clock timing shared by the benchmarks.

#include <algorithm>
#include <chrono>
#include <vector>

namespace moerl::bench {

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
