#pragma once
// Polling with a growing pause: fast answers stay fast, long waits cost
// almost no CPU (ranks share cores with compute threads).

#include <algorithm>
#include <chrono>
#include <thread>

namespace moerl::runtime {

class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us_));
    pause_us_ = std::min(pause_us_ * 2, 2000);
  }

 private:
  int pause_us_ = 20;
};

}  // namespace moerl::runtime
