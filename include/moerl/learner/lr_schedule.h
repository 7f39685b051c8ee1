#pragma once
// The learning-rate schedule shared by RL ([optim]) and pretraining
// ([pretrain]): linear warm-up, then constant or cosine decay that reaches
// 10% of the peak at total_steps and stays there.

#include <cstdint>

namespace moerl::learner {

struct LrSchedule {
  double peak = 1e-3;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  bool cosine = false;
};

// The rate of optimizer step `step` (0-based).
double scheduled_lr(const LrSchedule& schedule, std::int64_t step);

}  // namespace moerl::learner
