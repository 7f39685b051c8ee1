// Segment reductions over the packed token layout (see token_batch.h).

#include "moerl/algo/token_batch.h"

#include "moerl/core/check.h"

namespace moerl::algo {

torch::Tensor segment_sum(const torch::Tensor& values, const torch::Tensor& segment, std::int64_t num_segments) {
  MOERL_CHECK(values.dim() == 1 && segment.dim() == 1 && values.size(0) == segment.size(0),
              "segment_sum: values and segment must both be [T]");
  MOERL_CHECK(num_segments >= 0, "segment_sum: negative segment count");
  // Out-of-place index_add keeps autograd: d out[n] / d values[t] = [segment[t] == n].
  auto zeros = torch::zeros({num_segments}, values.options());
  return zeros.index_add(0, segment.to(torch::kLong), values);
}

torch::Tensor segment_mean(const torch::Tensor& values, const torch::Tensor& mask, const torch::Tensor& segment,
                           std::int64_t num_segments) {
  auto m = mask.to(values.scalar_type()).ne(0).to(values.scalar_type()).detach();
  auto sums = segment_sum(values * m, segment, num_segments);
  auto counts = segment_sum(m, segment, num_segments);
  // Empty segments: divide by 1 and get 0 rather than NaN.
  return sums / counts.clamp_min(1.0);
}

torch::Tensor generated_lengths(const torch::Tensor& sequence_index, const torch::Tensor& loss_mask,
                                std::int64_t num_sequences) {
  MOERL_CHECK(loss_mask.dim() == 1 && loss_mask.size(0) == sequence_index.size(0),
              "generated_lengths: loss_mask and sequence_index must both be [T]");
  return segment_sum(loss_mask.ne(0).to(torch::kLong), sequence_index, num_sequences);
}

torch::Tensor broadcast_to_tokens(const torch::Tensor& per_segment, const torch::Tensor& segment) {
  MOERL_CHECK(per_segment.dim() == 1 && segment.dim() == 1,
              "broadcast_to_tokens: expects per_segment [N] and segment [T]");
  return per_segment.index_select(0, segment.to(torch::kLong));
}

}  // namespace moerl::algo
