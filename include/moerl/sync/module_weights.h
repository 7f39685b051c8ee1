#pragma once
// The LibTorch side of weight sync: byte views of a module's parameters, in
// parameters() order (the same on every rank that builds the same model),
// and the Rebind that lets a WeightReceiver swap versions without a copy.

#include <torch/torch.h>

#include <vector>

#include "moerl/sync/weight_sync.h"

namespace moerl::sync {

// Host views of every parameter; they must be contiguous CPU tensors (the
// NCCL path publishes device buffers through the same views).
std::vector<WeightView> module_weight_views(torch::nn::Module& module);

// Re-points every parameter of `module` (set_data, so every handle to it,
// the module's own members included, sees the new storage) into a flat
// buffer laid out as module_weight_views() lays them out. The parameters'
// storages hold the buffer alive. Anything that copied a parameter's data
// pointer, rather than holding the tensor, would be left behind; moerl's
// model keeps tensors only.
Rebind module_rebind(torch::nn::Module& module);

}  // namespace moerl::sync
