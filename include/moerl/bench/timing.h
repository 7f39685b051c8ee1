#pragma once
// Wall-clock timing shared by the benchmarks.

#include <algorithm>
#include <chrono>

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

}  // namespace moerl::bench
