#pragma once
// Saving and resuming the learner through the HDF5 checkpoint store: model
// parameters (one dataset each, by name), the optimizer state (LibTorch's
// own serialisation, as bytes), learner step, policy version, the data
// cursor of learner 0's task coordinator, the resolved config and the step's
// metrics. Every learner holds the same weights, so learner 0 writes one
// shard; every learner reads it on resume.

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include "moerl/config/config.h"
#include "moerl/model/policy.h"

namespace moerl::learner {

struct LearnerState {
  std::int64_t step = 0;
  std::int64_t version = 0;
  std::int64_t next_group = 0;   // task coordinator cursor: training resumes on new seeds
  std::int64_t next_seed = 0;
  double reward_mean = 0;
};

std::string checkpoint_directory(const config::Config& config);

// Writes version `state.version` and moves `latest`; applies retention.
void save_checkpoint(const config::Config& config, model::PolicyImpl& policy, torch::optim::Optimizer& optimizer,
                     const LearnerState& state);

// `spec` is "auto" (latest valid, falling back past corrupt versions and
// saying so) or a path to a store directory's version ("DIR" = its latest,
// "DIR:VERSION|TAG"). Returns nothing when "auto" finds no checkpoint.
std::optional<LearnerState> load_checkpoint(const config::Config& config, const std::string& spec,
                                            model::PolicyImpl& policy, torch::optim::Optimizer* optimizer);

}  // namespace moerl::learner
