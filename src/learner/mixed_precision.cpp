#include "moerl/learner/mixed_precision.h"

#include "moerl/core/check.h"

namespace moerl::learner {

MixedPrecision::MixedPrecision(torch::nn::Module& master, torch::nn::Module& compute)
    : master_(master.parameters()), compute_(compute.parameters()) {
  MOERL_CHECK(master_.size() == compute_.size(), "mixed precision: the master has " + std::to_string(master_.size()) +
                                                     " parameters, the compute copy " +
                                                     std::to_string(compute_.size()));
  for (size_t i = 0; i < master_.size(); ++i) {
    MOERL_CHECK(master_[i].sizes() == compute_[i].sizes(), "mixed precision: parameter " + std::to_string(i) + " is " +
                                                               c10::str(master_[i].sizes()) + " in the master, " +
                                                               c10::str(compute_[i].sizes()) + " in the compute copy");
    MOERL_CHECK(master_[i].scalar_type() == torch::kFloat32,
                "mixed precision: master weights must be float32, parameter " + std::to_string(i) + " is " +
                    std::string(c10::toString(master_[i].scalar_type())));
    MOERL_CHECK(master_[i].device() == compute_[i].device(),
                "mixed precision: master and compute copy must share a device, parameter " + std::to_string(i) +
                    " is on " + master_[i].device().str() + " and " + compute_[i].device().str());
  }
  refresh();
}

void MixedPrecision::refresh() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master_.size(); ++i) compute_[i].copy_(master_[i]);
}

void MixedPrecision::accumulate_gradients() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master_.size(); ++i) {
    torch::Tensor& from = compute_[i].mutable_grad();
    if (!from.defined()) continue;  // no gradient reached it (an expert no token chose)
    torch::Tensor& to = master_[i].mutable_grad();
    if (to.defined()) {
      to.add_(from.to(torch::kFloat32));
    } else {
      to = from.to(torch::kFloat32);
    }
    from = torch::Tensor();
  }
}

}  // namespace moerl::learner
