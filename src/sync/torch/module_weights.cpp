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

}  // namespace moerl::sync
