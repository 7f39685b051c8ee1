#include "moerl/learner/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace moerl::learner {

double scheduled_lr(const LrSchedule& s, std::int64_t step) {
  if (s.warmup_steps > 0 && step < s.warmup_steps) return s.peak * static_cast<double>(step + 1) / s.warmup_steps;
  if (!s.cosine) return s.peak;
  const double progress = static_cast<double>(step - s.warmup_steps) /
                          static_cast<double>(std::max<std::int64_t>(1, s.total_steps - s.warmup_steps));
  return s.peak * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * std::min(1.0, progress))));
}

}  // namespace moerl::learner
