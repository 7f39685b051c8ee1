#pragma once
// [run] dtype as LibTorch dtypes. The policy computes in compute_dtype();
// what must not lose precision stays float32 whatever it is: a learner's
// master weights and optimizer state, log-probs and losses (Policy returns
// float32 logits), the weights on the wire and in checkpoints.

#include <c10/core/ScalarType.h>

#include "moerl/config/sections.h"

namespace moerl::model {

inline c10::ScalarType compute_dtype(config::RunDtype dtype) {
  return dtype == config::RunDtype::BFloat16 ? c10::ScalarType::BFloat16 : c10::ScalarType::Float;
}

inline bool is_mixed_precision(config::RunDtype dtype) { return dtype != config::RunDtype::Float32; }

}  // namespace moerl::model
