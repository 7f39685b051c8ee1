// Size-bucketed free lists of large host buffers (see moerl/moe/buffer_pool.h).

#include "moerl/moe/buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace moerl::moe {
namespace {

// Below this glibc serves allocations from its heap without page faults.
constexpr std::size_t kMinPooledBytes = std::size_t{1} << 20;
constexpr std::size_t kAlignment = 64;

// Buckets of 2^k * {1, 1.25, 1.5, 1.75}: a batch of a slightly different
// token count reuses the buffers of the previous one, at most 25% slack.
std::size_t bucket_bytes(std::size_t bytes) {
  std::size_t top = kMinPooledBytes;
  while (top * 2 <= bytes) top *= 2;
  const std::size_t quarter = top / 4;
  return (bytes + quarter - 1) / quarter * quarter;
}

class BufferPool {
 public:
  void* acquire(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        idle_ -= bytes;
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlignment, bytes);
    TORCH_CHECK(p != nullptr, "moe buffer pool: out of memory allocating ", bytes, " bytes");
    return p;
  }

  void release(void* p, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (idle_ + bytes <= limit_) {
        free_[bytes].push_back(p);
        idle_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  std::size_t idle() {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_;
  }

  void set_limit(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = bytes;
    }
    trim();
  }

  // Frees idle buffers, largest first, until at most the limit stays idle.
  void trim(bool all = false) {
    std::vector<void*> doomed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::size_t keep = all ? 0 : limit_;
      for (auto it = free_.rbegin(); it != free_.rend() && idle_ > keep; ++it) {
        while (!it->second.empty() && idle_ > keep) {
          doomed.push_back(it->second.back());
          it->second.pop_back();
          idle_ -= it->first;
        }
      }
    }
    for (void* p : doomed) std::free(p);
  }

 private:
  std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;
  std::size_t idle_ = 0;
  std::size_t limit_ = std::size_t{1} << 30;
};

BufferPool& pool() {
  // Never destroyed: tensors may release their buffers during static
  // destruction, after a function-local static pool would be gone.
  static BufferPool* p = new BufferPool();
  return *p;
}

}  // namespace

torch::Tensor pooled_empty(at::IntArrayRef sizes, const torch::TensorOptions& options) {
  std::size_t numel = 1;
  for (auto s : sizes) {
    TORCH_CHECK(s >= 0, "moe buffer pool: negative size in ", sizes);
    numel *= static_cast<std::size_t>(s);
  }
  const std::size_t bytes = numel * options.dtype().itemsize();
  if (options.device().type() != torch::kCPU || bytes < kMinPooledBytes) {
    return torch::empty(sizes, options);
  }
  const std::size_t bucket = bucket_bytes(bytes);
  void* p = pool().acquire(bucket);
  return torch::from_blob(
      p, sizes, [bucket](void* q) { pool().release(q, bucket); }, options);
}

std::int64_t pooled_bytes_idle() { return static_cast<std::int64_t>(pool().idle()); }

void set_pool_limit_bytes(std::int64_t bytes) {
  pool().set_limit(static_cast<std::size_t>(std::max<std::int64_t>(bytes, 0)));
}

void release_pooled_buffers() { pool().trim(true); }

}  // namespace moerl::moe
