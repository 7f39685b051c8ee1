#pragma once
// The LibTorch side of weight sync: byte views of a module's parameters, in
// parameters() order (the same on every rank that builds the same model).

#include <torch/torch.h>

#include <vector>

#include "moerl/sync/weight_sync.h"

namespace moerl::sync {

// Host views of every parameter; they must be contiguous CPU tensors (the
// NCCL path publishes device buffers through the same views).
std::vector<WeightView> module_weight_views(torch::nn::Module& module);

}  // namespace moerl::sync
