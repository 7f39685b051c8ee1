// Data-parallel gradient averaging: one flat all-reduce per kind of parameter.

#include "moerl/learner/gradient_averaging.h"

#include "moerl/core/check.h"

namespace moerl::learner {
namespace {

// Sums the parameters' gradients over `group` in one flat buffer, then
// divides by `learners` and writes them back.
void sum_then_divide(const std::vector<torch::Tensor>& parameters, comm::Communicator& group, double learners,
                     double timeout_s) {
  if (parameters.empty()) return;
  std::vector<torch::Tensor> pieces;
  for (const auto& p : parameters)
    pieces.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  torch::Tensor flat = torch::cat(pieces).contiguous();
  if (group.size() > 1) {
    // NCCL reduces device memory in place; MPI needs the gradients on the
    // host (learners that share a GPU, comm/group_backend.h).
    const bool via_host = group.backend() != "nccl" && !flat.is_cpu();
    torch::Tensor buffer = via_host ? flat.to(torch::kCPU) : flat;
    auto request = group.allreduce_sum_async(buffer.data_ptr(), static_cast<size_t>(buffer.numel()),
                                             gradient_wire_type(buffer.scalar_type()));
    // The receiving threads keep taking episodes meanwhile; this wait has the message deadline.
    request->wait(timeout_s);
    if (via_host) flat.copy_(buffer);
  }
  flat.div_(learners);
  std::int64_t at = 0;
  for (const auto& p : parameters) {
    set_gradient(p, flat.narrow(0, at, p.numel()).view_as(p));
    at += p.numel();
  }
}

}  // namespace

void set_gradient(torch::Tensor parameter, const torch::Tensor& value) {
  if (parameter.grad().defined()) {
    parameter.mutable_grad().copy_(value);
  } else {
    parameter.mutable_grad() = value.to(parameter.device()).clone();
  }
}

comm::DataType gradient_wire_type(torch::ScalarType type) {
  MOERL_CHECK(type == torch::kFloat || type == torch::kDouble,
              std::string("gradients: float32 or float64 expected, got ") + c10::toString(type));
  return type == torch::kFloat ? comm::DataType::Float32 : comm::DataType::Float64;
}

void average_gradients(const std::vector<torch::Tensor>& replicated, const std::vector<torch::Tensor>& split_experts,
                       const GradientGroups& groups) {
  MOERL_CHECK(groups.learners != nullptr, "gradient averaging needs the learners' group");
  MOERL_CHECK(split_experts.empty() || groups.expert_replicas != nullptr,
              "gradient averaging: split experts need their replicas' group");
  const auto learners = static_cast<double>(groups.learners->size());
  if (learners == 1 && split_experts.empty()) return;
  sum_then_divide(replicated, *groups.learners, learners, groups.timeout_s);
  if (!split_experts.empty()) sum_then_divide(split_experts, *groups.expert_replicas, learners, groups.timeout_s);
}

}  // namespace moerl::learner
