#pragma once
// [run] dtype = "bfloat16" in the learner: mixed precision with float32
// master weights.
//
//   master (float32: the optimizer's, checkpoints', weight sync's)
//     --refresh()-->  compute copy (bfloat16: forward and backward)
//   master.grad (float32)
//     <--accumulate_gradients()--  compute copy's .grad (bfloat16), after every micro-batch's backward
//
// Why an explicit compute copy rather than autocast:
//  - LibTorch's autocast switches differ between 1.13 (at::autocast::
//    set_enabled / set_cpu_enabled) and 2.x (set_autocast_enabled(device
//    type, ...)); moerl builds against both.
//  - Autocast casts only the ATen operators on its lists. moerl's MoE
//    operators are custom autograd functions with their own kernels: under
//    autocast they would meet float32 expert weights beside bf16 activations.
//    With a copy every operator sees one dtype.
//  - The learner then computes on exactly the bf16 weights the actors hold
//    (both round the same float32 weights the same way), so on fresh data
//    the importance ratio starts at 1, not at a float32-vs-bf16 gap.
// The cost is one bf16 copy of the weights (2 bytes per parameter beside the
// master's 4 and AdamW's 8) and one cast per optimizer step. Gradients are
// summed in float32 across micro-batches (bf16 sums lose the small ones).
// Log-probs and losses are float32 either way (Policy widens its logits).

#include <torch/torch.h>

#include <vector>

namespace moerl::learner {

class MixedPrecision {
 public:
  // `compute`: a module of the same architecture (parameters() in the same
  // order and shapes), in the compute dtype, on the master's device.
  MixedPrecision(torch::nn::Module& master, torch::nn::Module& compute);

  // master -> compute weights (after an optimizer step, a load, a rollback).
  void refresh();
  // compute .grad -> master .grad (added, in float32); the compute copy's
  // gradients are cleared for the next micro-batch.
  void accumulate_gradients();

 private:
  std::vector<torch::Tensor> master_;
  std::vector<torch::Tensor> compute_;
};

}  // namespace moerl::learner
