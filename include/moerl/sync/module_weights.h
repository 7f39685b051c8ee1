#pragma once
// The LibTorch side of weight sync: byte views of a module's parameters, in
// parameters() order (the same on every rank that builds the same model),
// and the Rebind that lets a WeightReceiver swap versions without a copy.

#include <torch/torch.h>

#include <vector>

#include "moerl/sync/weight_sync.h"

namespace moerl::sync {

// Host views of every parameter; they must be contiguous CPU tensors (the
// NCCL path publishes device buffers through the same views). A module on a
// device or in another dtype than float32 goes through HostWeights below.
std::vector<WeightView> module_weight_views(torch::nn::Module& module);

// Re-points every parameter of `module` (set_data, so every handle to it,
// the module's own members included, sees the new storage) into a flat
// buffer laid out as module_weight_views() lays them out. The parameters'
// storages hold the buffer alive. Anything that copied a parameter's data
// pointer, rather than holding the tensor, would be left behind; moerl's
// model keeps tensors only.
Rebind module_rebind(torch::nn::Module& module);

// The host bytes weight sync moves, in the wire dtype (float32, or bfloat16
// when [run] dtype is bfloat16: the actors compute in bf16, so half the bytes
// carry everything they use), for a module whose parameters may live on a
// CUDA device or in another dtype ([run] device and dtype). Publisher and
// receivers must lay out the same bytes (the layout fingerprint covers names
// and sizes, so both sides must use the same wire dtype), and the checksums
// run on host memory, so such a module goes through host copies: pull()
// before publishing, push() after a received version is applied. For a
// module of contiguous CPU parameters already in the wire dtype nothing is
// copied: views() are module_weight_views(), pull() and push() do nothing,
// and swap mode (module_rebind) stays available.
class HostWeights {
 public:
  explicit HostWeights(torch::nn::Module& module, torch::Dtype wire = torch::kFloat32);

  // False when the parameters are the wire bytes themselves (no copies).
  bool staged() const { return staged_; }
  // Host views in the wire dtype, in parameters() order, named as module_weight_views() names them.
  std::vector<WeightView> views();
  // Parameters -> host copies (device to host, cast to the wire dtype; a
  // float32 master rounds to bf16 exactly as an actor's .to(bf16) does).
  void pull();
  // Host copies -> parameters, each cast to its parameter's dtype and device.
  void push();

 private:
  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;
  std::vector<torch::Tensor> host_;  // wire dtype, contiguous, CPU (pinned for CUDA parameters)
  bool staged_ = false;
};

}  // namespace moerl::sync
