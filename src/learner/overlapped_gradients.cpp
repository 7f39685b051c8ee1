// Bucketed gradient averaging overlapped with the backward pass.

#include "moerl/learner/overlapped_gradients.h"

#include <string>

#include "moerl/core/check.h"
#include "moerl/learner/gradient_averaging.h"
#include "moerl/runtime/mailbox.h"

namespace moerl::learner {
struct OverlappedGradients::Bucket {
  torch::Tensor buffer;         // flat, where the all-reduce runs
  std::vector<size_t> members;  // parameter indices
  size_t filled = 0;            // members whose gradient is in the buffer
  std::unique_ptr<comm::CommRequest> request;
  bool started = false;
};

OverlappedGradients::OverlappedGradients(std::vector<torch::Tensor> parameters, comm::Communicator& group,
                                         double learners, double timeout_s, std::size_t bucket_bytes)
    : parameters_(std::move(parameters)), group_(group), learners_(learners), timeout_s_(timeout_s) {
  // One learner alone: its gradients are already their own average.
  if (group_.size() == 1 && learners_ == 1) return;
  slots_.resize(parameters_.size());
  // Reverse order: the backward reaches the last parameters first.
  std::vector<std::vector<size_t>> groups;
  std::size_t bytes = bucket_bytes;  // start a new bucket at once
  for (size_t i = parameters_.size(); i-- > 0;) {
    const std::size_t size = static_cast<std::size_t>(parameters_[i].numel()) * parameters_[i].element_size();
    if (bytes >= bucket_bytes ||
        (!groups.empty() && parameters_[groups.back().front()].scalar_type() != parameters_[i].scalar_type())) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += size;
  }
  // NCCL reduces device memory; MPI needs host memory (comm/group_backend.h).
  const bool on_host = group_.backend() != "nccl";
  for (const auto& members : groups) {
    auto bucket = std::make_unique<Bucket>();
    bucket->members = members;
    std::int64_t elements = 0;
    for (size_t i : members) {
      slots_[i] = {buckets_.size(), elements, false};
      elements += parameters_[i].numel();
    }
    const torch::Tensor& first = parameters_[members.front()];
    gradient_wire_type(first.scalar_type());  // refuses another dtype here, not at the first all-reduce
    bucket->buffer = torch::zeros({elements}, first.options().device(on_host ? torch::kCPU : first.device()));
    buckets_.push_back(std::move(bucket));
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    MOERL_CHECK(parameters_[i].requires_grad(),
                "overlapped gradients: parameter " + std::to_string(i) + " does not require a gradient");
    hook_handles_.push_back(parameters_[i].register_hook([this, i](const torch::Tensor& grad) {
      on_gradient(i, grad);
      return torch::Tensor();  // the gradient itself is unchanged
    }));
  }
}

OverlappedGradients::~OverlappedGradients() {
  for (size_t i = 0; i < hook_handles_.size(); ++i) parameters_[i].remove_hook(hook_handles_[i]);
}

void OverlappedGradients::arm() {
  for (auto& slot : slots_) slot.filled = false;  // none when alone: nothing to do
  for (auto& bucket : buckets_) {
    bucket->filled = 0;
    bucket->started = false;
    bucket->request.reset();
  }
  next_to_start_ = 0;
  started_in_backward_ = 0;
  armed_ = true;
}

void OverlappedGradients::on_gradient(size_t parameter, const torch::Tensor& grad) {
  if (!armed_) return;
  Slot& slot = slots_[parameter];
  Bucket& bucket = *buckets_[slot.bucket];
  if (slot.filled || bucket.started) return;  // autograd visits a leaf once per backward
  const torch::Tensor& p = parameters_[parameter];
  torch::Tensor total = p.grad().defined() ? p.grad() + grad : grad;
  bucket.buffer.narrow(0, slot.offset, p.numel()).copy_(total.reshape({-1}));
  slot.filled = true;
  ++bucket.filled;
  start_ready_buckets();
  test_in_flight();
}

void OverlappedGradients::start_ready_buckets() {
  while (next_to_start_ < buckets_.size()) {
    Bucket& bucket = *buckets_[next_to_start_];
    if (bucket.filled < bucket.members.size()) return;
    start(bucket);
    ++started_in_backward_;
    ++next_to_start_;
  }
}

void OverlappedGradients::start(Bucket& bucket) {
  bucket.started = true;
  if (group_.size() == 1) return;
  bucket.request = group_.allreduce_sum_async(bucket.buffer.data_ptr(), static_cast<size_t>(bucket.buffer.numel()),
                                              gradient_wire_type(bucket.buffer.scalar_type()));
}

void OverlappedGradients::test_in_flight() {
  for (size_t b = 0; b < next_to_start_; ++b)
    if (buckets_[b]->request) buckets_[b]->request->test();
}

OverlapStats OverlappedGradients::finish() {
  MOERL_CHECK(armed_, "overlapped gradients: finish() without arm()");
  OverlapStats stats;
  stats.buckets = bucket_count();
  stats.started_in_backward = started_in_backward_;
  if (buckets_.empty()) {  // alone, or no parameters
    armed_ = false;
    return stats;
  }
  // The gradients this backward did not produce, as they stand, then every
  // bucket not yet started, in bucket order.
  for (; next_to_start_ < buckets_.size(); ++next_to_start_) {
    Bucket& bucket = *buckets_[next_to_start_];
    for (size_t i : bucket.members) {
      if (slots_[i].filled) continue;
      const torch::Tensor& p = parameters_[i];
      torch::Tensor part = bucket.buffer.narrow(0, slots_[i].offset, p.numel());
      if (p.grad().defined()) {
        part.copy_(p.grad().reshape({-1}));
      } else {
        part.zero_();
      }
    }
    start(bucket);
  }
  const double started = runtime::monotonic_seconds();
  for (auto& bucket : buckets_)
    if (bucket->request) bucket->request->wait(timeout_s_);
  stats.finish_wait_s = runtime::monotonic_seconds() - started;
  for (auto& bucket : buckets_) {
    bucket->buffer.div_(learners_);
    for (size_t i : bucket->members) {
      const torch::Tensor& p = parameters_[i];
      set_gradient(p, bucket->buffer.narrow(0, slots_[i].offset, p.numel()).view_as(p));
    }
  }
  armed_ = false;
  return stats;
}

}  // namespace moerl::learner
