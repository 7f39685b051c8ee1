#include "moerl/sync/module_weights.h"

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

}  // namespace moerl::sync
