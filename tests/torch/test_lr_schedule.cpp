// The learning-rate schedule of [optim] and [pretrain]: warm-up, constant,
// cosine decay to 10% of the peak.

#include <catch2/catch.hpp>

#include "moerl/learner/lr_schedule.h"

using moerl::learner::LrSchedule;
using moerl::learner::scheduled_lr;

TEST_CASE("warm-up rises linearly to the peak, then the rate stays there without cosine", "[lr_schedule]") {
  const LrSchedule s{2e-3, 4, 100, false};
  CHECK(scheduled_lr(s, 0) == Approx(0.5e-3));
  CHECK(scheduled_lr(s, 1) == Approx(1.0e-3));
  CHECK(scheduled_lr(s, 3) == Approx(2.0e-3));
  CHECK(scheduled_lr(s, 4) == Approx(2.0e-3));
  CHECK(scheduled_lr(s, 99) == Approx(2.0e-3));
}

TEST_CASE("cosine decays from the peak after warm-up to 10% at the last step and stays there", "[lr_schedule]") {
  const LrSchedule s{1.0, 10, 110, true};
  CHECK(scheduled_lr(s, 9) == Approx(1.0));
  CHECK(scheduled_lr(s, 10) == Approx(1.0));
  CHECK(scheduled_lr(s, 60) == Approx(0.55));  // half way: 0.1 + 0.9 * 0.5
  CHECK(scheduled_lr(s, 110) == Approx(0.1));
  CHECK(scheduled_lr(s, 500) == Approx(0.1));
  for (std::int64_t step = 11; step <= 110; ++step) CHECK(scheduled_lr(s, step) < scheduled_lr(s, step - 1));
}

TEST_CASE("no warm-up: the first step runs at the peak", "[lr_schedule]") {
  CHECK(scheduled_lr({3e-4, 0, 200, false}, 0) == Approx(3e-4));
  CHECK(scheduled_lr({3e-4, 0, 200, true}, 0) == Approx(3e-4));
  CHECK(scheduled_lr({3e-4, 0, 1, true}, 1) == Approx(3e-5));
}
