#pragma once
// Data-parallel gradient averaging over the learners, with or without expert
// parallelism. A parameter is either
//   - replicated: every learner holds it (dense layers, routers, shared
//     experts); its gradients are summed over all learners; or
//   - a share of split experts (moe/expert_parallel.h): the learners of an
//     expert group hold different shares, and a member's gradient already
//     sums its whole group's tokens (the exchanges run backwards); its
//     gradients are summed over its replicas, the learners of the other
//     groups that hold the same share.
// Both sums then cover every learner's tokens once and are divided by the
// number of learners: the mean that data parallelism takes for the whole
// model, so a job trains the same model whatever its expert-parallel size.
// Include after the LibTorch precompiled header.

#include <vector>

#include "moerl/comm/communicator.h"

namespace moerl::learner {

struct GradientGroups {
  comm::Communicator* learners = nullptr;  // every learner
  // The learners holding this learner's share of the split experts (itself
  // included); null without expert parallelism.
  comm::Communicator* expert_replicas = nullptr;
  double timeout_s = 60;  // each all-reduce's deadline
};

// The wire type of gradients: master weights are float32; float64 for tests
// that compare tightly. Throws for any other dtype.
comm::DataType gradient_wire_type(torch::ScalarType type);

// parameter.grad = value (copied: value may be a view of a buffer, on the
// host while the parameter is on a device).
void set_gradient(torch::Tensor parameter, const torch::Tensor& value);

// Averages the gradients in place (a parameter without one gets one: zeros
// where no token reached it, e.g. an unused expert). Every learner calls it
// with the same parameter lists, in the same order.
void average_gradients(const std::vector<torch::Tensor>& replicated, const std::vector<torch::Tensor>& split_experts,
                       const GradientGroups& groups);

}  // namespace moerl::learner
