#pragma once
// KVCache: the runtime decode state of a Policy (the "context" to the
// Policy's "model", as llama.cpp separates them). It holds the rotated keys
// and the values of every layer for a changing set of sequences, so that an
// actor can prefill new sessions, decode one token for all live ones and drop
// finished ones, all in the same batch.
//
// Layout: paged. Keys and values live in a pool of fixed-size blocks
// ([layers, blocks, block_size, kv_heads, head_dim]); every sequence owns a
// slot, i.e. one row of the block table, listing the blocks that hold its
// positions in order (position p is at block table[slot][p / block_size],
// offset p % block_size). Blocks come from a free list; a sequence takes a
// new block only when its length crosses a block boundary, and gives all of
// them back when it is removed. Memory in use therefore follows the tokens
// actually held, not the longest sequence (used_bytes()); the pool itself
// grows by doubling up to max_blocks (memory_bytes()) and never shrinks.
// With max_blocks > 0 the pool is capped: prepare() throws KVCacheFullError
// (before touching any state) when a step needs more blocks than are free;
// the rollout engine checks blocks_needed() first and preempts sessions
// instead.
//
// The Policy only talks to the cache through slots_of/lengths_of/prepare/
// write/gather/advance. gather_* returns the padded [B, L, kv_heads,
// head_dim] view attention expects (a copy assembled block by block).
//
// Storage dtype (KVCacheDtype): Float keeps keys and values in the policy's
// dtype. Int8 keeps each (position, kv head) vector of head_dim numbers as
// int8 with one fp32 scale (its largest magnitude / 127, rounded to
// nearest): 4x fewer bytes per element, (1 + 4/head_dim)/4 of the Float
// bytes in all. gather_* dequantises (int8 * scale) into the policy's dtype,
// so attention does not change; each stored number is off by at most half
// its vector's scale. The behaviour log-probs an actor records then differ
// from the learner's recomputation, which runs without a cache; the
// learner's importance weights correct for that (docs/tuning.md measures it).
//
// The cache stores detached tensors: gradients never flow through it. Use it
// under torch::NoGradGuard (rollouts); the learner runs Policy::forward
// without a cache.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>

#include "moerl/config/sections.h"
#include "moerl/core/error.h"

namespace moerl::model {

using SequenceId = std::int64_t;

// Thrown by KVCache::prepare when the capped block pool cannot hold a step.
class KVCacheFullError : public Error {
 public:
  using Error::Error;
};

enum class KVCacheDtype { Float, Int8 };
const char* kv_cache_dtype_name(KVCacheDtype dtype);  // "float32" (the policy's dtype) | "int8"

struct PagedCacheOptions {
  std::int64_t block_size = 16;     // positions per block
  std::int64_t initial_blocks = 0;  // pool blocks allocated up front; 0 = 4 blocks
  std::int64_t max_blocks = 0;      // cap on pool blocks; 0 = unbounded
  std::int64_t initial_slots = 4;   // block-table rows allocated up front (cheap)
  KVCacheDtype dtype = KVCacheDtype::Float;
};

class KVCache {
 public:
  // options: dtype and device of the cache; use the Policy's parameter
  // options. initial_slots sequences of initial_capacity positions are
  // preallocated (block_size 16, unbounded pool).
  KVCache(const config::ModelSection& model, torch::TensorOptions options, std::int64_t initial_slots = 4,
          std::int64_t initial_capacity = 64, KVCacheDtype dtype = KVCacheDtype::Float);
  KVCache(const config::ModelSection& model, torch::TensorOptions options, const PagedCacheOptions& paged);
  // Move-only: a copy would share the tensors but not the bookkeeping, and
  // two caches writing into one block would corrupt each other silently.
  KVCache(KVCache&&) = default;
  KVCache& operator=(KVCache&&) = default;
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  // A new, empty sequence (length 0, no blocks). Ids are never reused.
  SequenceId add_sequence();
  // Frees the sequence's slot and blocks for reuse; throws for an unknown id.
  void remove_sequence(SequenceId id);
  void clear();  // removes every sequence; keeps the memory

  bool contains(SequenceId id) const;
  std::int64_t length(SequenceId id) const;  // cached positions of the sequence
  std::int64_t num_sequences() const { return static_cast<std::int64_t>(entries_.size()); }
  std::vector<SequenceId> sequences() const;  // in increasing id order

  std::int64_t num_layers() const { return num_layers_; }
  // Positions one sequence can address with the block table's current width.
  std::int64_t capacity() const { return table_width_ * block_size_; }
  std::int64_t num_slots() const { return num_slots_; }
  std::int64_t block_size() const { return block_size_; }
  std::int64_t num_blocks() const { return num_blocks_; }  // allocated pool blocks
  std::int64_t max_blocks() const { return max_blocks_; }  // 0 = unbounded
  std::int64_t blocks_in_use() const { return num_blocks_ - static_cast<std::int64_t>(free_blocks_.size()); }
  // Blocks a prepare() could still hand out (free ones plus pool growth);
  // a large number when the pool is unbounded.
  std::int64_t blocks_available() const;
  std::int64_t blocks_of(SequenceId id) const;
  KVCacheDtype dtype() const { return dtype_; }
  std::int64_t bytes_per_block() const;  // keys + values (+ their int8 scales) of all layers
  std::int64_t memory_bytes() const;     // allocated pool (keys + values + scales)
  std::int64_t used_bytes() const { return blocks_in_use() * bytes_per_block(); }

  // ---- used by Policy::forward_cached ----
  // Slot and current length of each id (validated: known, no duplicates).
  std::vector<std::int64_t> slots_of(const std::vector<SequenceId>& ids) const;
  std::vector<std::int64_t> lengths_of(const std::vector<SequenceId>& ids) const;
  // Widens the block table so that max_total_length positions are
  // addressable; throws when that exceeds max_seq_len. Allocates no blocks.
  void reserve(std::int64_t max_total_length);
  // New blocks a step appending new_lengths[i] positions to ids[i] needs.
  std::int64_t blocks_needed(const std::vector<SequenceId>& ids, const std::vector<std::int64_t>& new_lengths) const;
  // Allocates the blocks for such a step (and reserves the table width).
  // Throws (max_seq_len exceeded, or KVCacheFullError) before changing anything.
  void prepare(const std::vector<SequenceId>& ids, const std::vector<std::int64_t>& new_lengths);
  // Stores k/v [T, kv_heads, head_dim] of layer at (slot[t], position[t]);
  // the positions' blocks must have been prepared.
  void write(std::int64_t layer, const torch::Tensor& slots /*[T] int64*/, const torch::Tensor& positions /*[T] int64*/,
             const torch::Tensor& keys, const torch::Tensor& values);
  // Keys or values of the given slots, positions [0, length):
  // [B, length, kv_heads, head_dim] (a copy). Entries past a sequence's own
  // length hold stale finite data and must be masked by the caller.
  torch::Tensor gather_keys(std::int64_t layer, const torch::Tensor& slots /*[B]*/, std::int64_t length) const;
  torch::Tensor gather_values(std::int64_t layer, const torch::Tensor& slots /*[B]*/, std::int64_t length) const;
  // Adds new_lengths[i] to the length of ids[i]; called once the step's
  // forward pass succeeded, so a failed step leaves the lengths unchanged.
  void advance(const std::vector<SequenceId>& ids, const std::vector<std::int64_t>& new_lengths);

  // The stored pools: the policy's dtype, or int8 with key_scales()/value_scales().
  const torch::Tensor& keys() const { return keys_; }              // [layers, blocks, block_size, kv_heads, head_dim]
  const torch::Tensor& values() const { return values_; }          // same
  const torch::Tensor& key_scales() const { return key_scales_; }  // Int8: [layers, blocks, block_size, kv_heads] fp32
  const torch::Tensor& value_scales() const { return value_scales_; }  // same
  const torch::Tensor& block_table() const;                            // [slots, width] int64 (unused entries 0)

 private:
  struct Entry {
    std::int64_t slot = 0;
    std::int64_t length = 0;
    std::vector<std::int64_t> blocks;  // pool block of positions [i*bs, (i+1)*bs)
  };
  void init(std::int64_t initial_slots, std::int64_t initial_blocks);
  void grow_pool(std::int64_t blocks);
  void grow_slots(std::int64_t slots);
  torch::Tensor gather(const torch::Tensor& pool, const torch::Tensor& scales, std::int64_t layer,
                       const torch::Tensor& slots, std::int64_t length) const;
  void store(torch::Tensor& pool, torch::Tensor& scales, std::int64_t layer, const torch::Tensor& block,
             const torch::Tensor& offset, const torch::Tensor& data);
  void copy_rows_on_host(std::int64_t layer, const torch::Tensor& slots, const torch::Tensor& positions,
                         const torch::Tensor& keys, const torch::Tensor& values);
  std::int64_t blocks_for(std::int64_t positions) const { return (positions + block_size_ - 1) / block_size_; }

  std::int64_t num_layers_;
  std::int64_t num_kv_heads_;
  std::int64_t head_dim_;
  std::int64_t max_seq_len_;
  std::int64_t block_size_ = 16;
  std::int64_t max_blocks_ = 0;
  torch::TensorOptions options_;  // the policy's: what gather_* returns
  KVCacheDtype dtype_ = KVCacheDtype::Float;
  std::int64_t num_slots_ = 0;
  std::int64_t num_blocks_ = 0;
  std::int64_t table_width_ = 1;
  torch::Tensor keys_;           // [layers, blocks, block_size, kv_heads, head_dim], RoPE applied
  torch::Tensor values_;         // [layers, blocks, block_size, kv_heads, head_dim]
  torch::Tensor key_scales_;     // Int8 only: [layers, blocks, block_size, kv_heads] fp32
  torch::Tensor value_scales_;   // Int8 only: same
  mutable torch::Tensor table_;  // [slots, width] int64 on the cache's device; rebuilt when dirty
  mutable bool table_dirty_ = true;
  std::unordered_map<SequenceId, Entry> entries_;
  std::vector<std::int64_t> free_slots_;
  std::vector<std::int64_t> free_blocks_;  // a stack; the lowest block is handed out first
  SequenceId next_id_ = 0;
};

}  // namespace moerl::model
