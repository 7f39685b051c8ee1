#pragma once
// The learner's tensors in checkpoint shards: which arrays a member of an
// expert group writes, and how a learner of any expert-parallel layout fills
// its tensors from a version saved in any other (storage/expert_shards.h).
//
// Arrays, by name:
//   model/NAME                    a policy parameter
//   value_head/NAME               PPO's critic
//   optimizer/ARRAY/step          AdamW's state of the parameter saved as ARRAY:
//   optimizer/ARRAY/exp_avg       step (int64 scalar) and the moments, shaped
//   optimizer/ARRAY/exp_avg_sq    like the parameter (max_exp_avg_sq with amsgrad)
// The optimizer state is keyed by the parameter's name, not by its position
// in LibTorch's param groups, and sliced as the parameter is, so resharding it
// is the same row gather as for the weights. Plain arrays, unlike LibTorch's
// own serialisation (a TorchScript archive with per-save unique names), are
// also bitwise reproducible, comparable by `moerl checkpoint diff`, and
// independent of the LibTorch version.
//
// Expert arrays (the routed experts of MoE layers, and their moments) hold
// this member's rows [first, first+count) of E along dim 0; member 0 writes
// every other array (and each expert parameter's step, a scalar).
// Include after the LibTorch precompiled header.

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/model/policy.h"
#include "moerl/storage/expert_shards.h"

namespace moerl::learner {

// The experts a policy holds: rows `rows` of the `experts` rows of every
// expert tensor, as member `member` of an expert group of `members`.
struct ExpertLayout {
  int member = 0;
  int members = 1;
  std::int64_t experts = 0;  // E; 0 without MoE layers
  storage::RowRange rows;
  std::string text() const;  // "member 1 of 2 (experts [4, 8) of 8)"
};

ExpertLayout expert_layout(const model::PolicyImpl& policy);

// A trained tensor under its array name.
struct TrainedArray {
  std::string name;  // "model/layers.1.mlp.experts.gate_proj"
  torch::Tensor tensor;
  bool expert_rows = false;  // dim 0 holds the layout's rows of E experts
};

// The policy's parameters under "model/", the value head's (when there is
// one) under "value_head/", in parameters() order.
std::vector<TrainedArray> trained_arrays(model::PolicyImpl& policy, torch::nn::Module* value_head);

// The state AdamW keeps for `parameter`; null when it never stepped. Throws
// moerl::Error for another optimizer's state.
torch::optim::AdamWParamState* adamw_state(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter);

// Write this member's share of the arrays (float32, whatever the tensors'
// dtype and device); each returns the names of the expert arrays written (an
// ExpertSplit's list).
std::vector<std::string> add_trained_arrays(storage::CheckpointWriter& writer, const std::vector<TrainedArray>& arrays,
                                            const ExpertLayout& layout);
std::vector<std::string> add_optimizer_state(storage::CheckpointWriter& writer, torch::optim::Optimizer& optimizer,
                                             const std::vector<TrainedArray>& arrays, const ExpertLayout& layout);

// Fill the tensors (and the optimizer's state) from a version of any
// layout: expert arrays with this layout's rows, gathered from whichever
// shards hold them. Every array is checked before anything is copied, so a
// misfit leaves the tensors as they were. The optimizer state may also be
// in the two older formats: by param-group position
// (optimizer/groupG/paramI/...) or LibTorch's serialised bytes
// (optimizer/torch_state, which only a learner holding every expert reads).
void read_trained_arrays(const storage::ShardedVersion& version, const std::vector<TrainedArray>& arrays,
                         const ExpertLayout& layout);
void read_optimizer_state(const storage::ShardedVersion& version, torch::optim::Optimizer& optimizer,
                          const std::vector<TrainedArray>& arrays, const ExpertLayout& layout);

}  // namespace moerl::learner
