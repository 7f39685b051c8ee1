#include "moerl/sync/module_weights.h"

#include "moerl/core/check.h"

namespace moerl::sync {

std::vector<WeightView> module_weight_views(torch::nn::Module& module) {
  std::vector<WeightView> views;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    MOERL_CHECK(p.is_contiguous(), "parameter " + item.key() + " is not contiguous; weight sync needs flat storage");
    views.push_back({item.key(), p.data_ptr(), static_cast<size_t>(p.numel()) * p.element_size()});
  }
  return views;
}

Rebind module_rebind(torch::nn::Module& module) {
  std::vector<torch::Tensor> parameters = module.parameters(/*recurse=*/true);
  return [parameters](const FlatWeights& weights) {
    torch::NoGradGuard no_grad;
    size_t at = 0;
    for (const torch::Tensor& p : parameters) {
      const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
      MOERL_CHECK(at + bytes <= weights->size(),
                  "weight sync: the flat weights are smaller than the module's parameters");
      MOERL_CHECK(at % p.element_size() == 0, "weight sync: a parameter would sit misaligned in the flat weights");
      // The deleter owns a reference: the buffer lives while this storage does.
      torch::Tensor flat = torch::from_blob(
          weights->data() + at, p.sizes(), [keep = weights](void*) {}, p.options());
      p.set_data(flat);
      at += bytes;
    }
    MOERL_CHECK(at == weights->size(), "weight sync: the flat weights are larger than the module's parameters");
  };
}

HostWeights::HostWeights(torch::nn::Module& module, torch::Dtype wire) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    names_.push_back(item.key());
    parameters_.push_back(p);
    if (!p.device().is_cpu() || p.scalar_type() != wire || !p.is_contiguous()) staged_ = true;
  }
  if (!staged_) {
    host_ = parameters_;  // the parameters themselves
    return;
  }
  for (const torch::Tensor& p : parameters_) {
    // Pinned host memory lets the device copies run at full bus speed.
    const auto options = torch::TensorOptions().dtype(wire).pinned_memory(p.device().is_cuda());
    host_.push_back(torch::empty(p.sizes(), options));
  }
  pull();
}

std::vector<WeightView> HostWeights::views() {
  std::vector<WeightView> views;
  for (size_t i = 0; i < host_.size(); ++i)
    views.push_back({names_[i], host_[i].data_ptr(), static_cast<size_t>(host_[i].numel()) * host_[i].element_size()});
  return views;
}

void HostWeights::pull() {
  if (!staged_) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < host_.size(); ++i) host_[i].copy_(parameters_[i].detach());
}

void HostWeights::push() {
  if (!staged_) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < host_.size(); ++i) parameters_[i].copy_(host_[i]);
}

}  // namespace moerl::sync
