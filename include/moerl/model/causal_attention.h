#pragma once
// Fused causal self-attention over packed sequences on the CPU: the LibTorch
// adapter (an autograd Function) of moerl_kernels/attention.h. It needs no
// [B, S] padding and no score tensor; the padded path in attention.cpp stays
// for caches, devices and dtypes this one does not take.

#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace moerl::model {

class KVCache;

// True when fused_causal_attention can take tensors like q: on the CPU, in
// float or double.
bool fused_causal_attention_supported(const torch::Tensor& q);

// q [T, H, D], k and v [T, kvH, D] packed (sequence after sequence, lengths
// summing to T, every length >= 1; H a multiple of kvH) -> [T, H, D]. Token i
// of a sequence sees its tokens i - window < j <= i (window 0: j <= i). The
// scores are scale * q k^T.
torch::Tensor fused_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const std::vector<std::int64_t>& lengths, std::int64_t window, double scale);

// True when fused_cached_attention can take q with this cache: what
// fused_causal_attention takes, a cache that stores q's dtype (not int8),
// and no gradient wanted (a cache holds detached tensors).
bool fused_cached_attention_supported(const torch::Tensor& q, const KVCache& cache);

// Attention of new tokens over a KV cache that already holds them (the
// rollout engine's prefill and decode): q [T, H, D] packed, row b with
// lengths[b] new tokens at positions past[b] .. in cache slot slots[b];
// keys and values come from the cache's layer. -> [T, H, D].
torch::Tensor fused_cached_attention(const torch::Tensor& q, const KVCache& cache, std::int64_t layer,
                                     const std::vector<std::int64_t>& slots, const std::vector<std::int64_t>& lengths,
                                     const std::vector<std::int64_t>& past, std::int64_t window, double scale);

}  // namespace moerl::model
