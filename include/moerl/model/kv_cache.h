#pragma once
// KVCache: the runtime decode state of a Policy (the "context" to the
// Policy's "model", as llama.cpp separates them). It holds the rotated keys
// and the values of every layer for a changing set of sequences, so that an
// actor can prefill new sessions, decode one token for all live ones and drop
// finished ones, all in the same batch.
//
// Layout: every sequence owns one slot; slot s holds positions
// [0, length(s)) contiguously in keys()/values(). Both tensors grow by
// doubling (slots when sequences are added, capacity when a sequence gets
// longer) up to ModelSection::max_seq_len positions. A later issue replaces
// this with paged blocks; the Policy only talks to the cache through
// slots_of/lengths_of/reserve/write/gather/advance.
//
// The cache stores detached tensors: gradients never flow through it. Use it
// under torch::NoGradGuard (rollouts); the learner runs Policy::forward
// without a cache.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>

#include "moerl/config/sections.h"

namespace moerl::model {

using SequenceId = std::int64_t;

class KVCache {
 public:
  // options: dtype and device of the cache; use the Policy's parameter options.
  KVCache(const config::ModelSection& model, torch::TensorOptions options,
          std::int64_t initial_slots = 4, std::int64_t initial_capacity = 64);
  // Move-only: a copy would share the tensors but not the bookkeeping, and
  // two caches writing into one slot would corrupt each other silently.
  KVCache(KVCache&&) = default;
  KVCache& operator=(KVCache&&) = default;
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  // A new, empty sequence (length 0). Ids are never reused.
  SequenceId add_sequence();
  // Frees the sequence's slot for reuse; throws for an unknown id.
  void remove_sequence(SequenceId id);
  void clear();  // removes every sequence; keeps the memory

  bool contains(SequenceId id) const;
  std::int64_t length(SequenceId id) const;  // cached positions of the sequence
  std::int64_t num_sequences() const { return static_cast<std::int64_t>(entries_.size()); }
  std::vector<SequenceId> sequences() const;  // in increasing id order

  std::int64_t num_layers() const { return num_layers_; }
  std::int64_t capacity() const { return capacity_; }  // positions per slot now allocated
  std::int64_t num_slots() const { return num_slots_; }
  std::int64_t memory_bytes() const;

  // ---- used by Policy::forward_cached ----
  // Slot and current length of each id (validated: known, no duplicates).
  std::vector<std::int64_t> slots_of(const std::vector<SequenceId>& ids) const;
  std::vector<std::int64_t> lengths_of(const std::vector<SequenceId>& ids) const;
  // Grows the capacity so that max_total_length positions fit; throws when
  // that exceeds max_seq_len.
  void reserve(std::int64_t max_total_length);
  // Stores k/v [T, kv_heads, head_dim] of layer at (slot[t], position[t]).
  void write(std::int64_t layer, const torch::Tensor& slots /*[T] int64*/,
             const torch::Tensor& positions /*[T] int64*/, const torch::Tensor& keys,
             const torch::Tensor& values);
  // Keys or values of the given slots, positions [0, length):
  // [B, length, kv_heads, head_dim] (a copy). Entries past a sequence's own
  // length hold stale finite data and must be masked by the caller.
  torch::Tensor gather_keys(std::int64_t layer, const torch::Tensor& slots /*[B]*/,
                            std::int64_t length) const;
  torch::Tensor gather_values(std::int64_t layer, const torch::Tensor& slots /*[B]*/,
                              std::int64_t length) const;
  // Adds new_lengths[i] to the length of ids[i]; called once the step's
  // forward pass succeeded, so a failed step leaves the lengths unchanged.
  void advance(const std::vector<SequenceId>& ids, const std::vector<std::int64_t>& new_lengths);

  const torch::Tensor& keys() const { return keys_; }
  const torch::Tensor& values() const { return values_; }

 private:
  struct Entry {
    std::int64_t slot = 0;
    std::int64_t length = 0;
  };
  void grow(std::int64_t slots, std::int64_t capacity);

  std::int64_t num_layers_;
  std::int64_t num_kv_heads_;
  std::int64_t head_dim_;
  std::int64_t max_seq_len_;
  torch::TensorOptions options_;
  std::int64_t num_slots_ = 0;
  std::int64_t capacity_ = 0;
  torch::Tensor keys_;    // [layers, slots, capacity, kv_heads, head_dim], RoPE applied
  torch::Tensor values_;  // [layers, slots, capacity, kv_heads, head_dim]
  std::unordered_map<SequenceId, Entry> entries_;
  std::vector<std::int64_t> free_slots_;
  SequenceId next_id_ = 0;
};

}  // namespace moerl::model
