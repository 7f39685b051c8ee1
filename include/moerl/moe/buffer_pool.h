#pragma once
// Recycled host buffers for the MoE operators' large CPU tensors (permuted
// rows, expert activations, weight gradients). Include after the LibTorch
// precompiled header.
//
// Why: one MoE layer's step allocates a few hundred MB in tensors of tens of
// MB each. glibc serves allocations that large with mmap and unmaps them on
// free, so every step took a page fault per 4 KiB page it touched: a quarter
// of the layer's forward+backward time at d_model 1024 (measured with perf).
// Buffers released here are kept (up to a byte limit) and handed out again.

#include <cstdint>

namespace moerl::moe {

// Like torch::empty (uninitialised) for CPU tensors; other devices and small
// tensors go to torch::empty. The tensor's storage returns to the pool when
// its last reference goes.
torch::Tensor pooled_empty(at::IntArrayRef sizes, const torch::TensorOptions& options);

// Bytes held idle by the pool; buffers released beyond the limit are freed.
std::int64_t pooled_bytes_idle();
void set_pool_limit_bytes(std::int64_t bytes);  // default 1 GiB; 0 disables caching
void release_pooled_buffers();                  // frees every idle buffer

}  // namespace moerl::moe
