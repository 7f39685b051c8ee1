#include "moerl/model/kv_cache.h"

#include <algorithm>
#include <unordered_set>

#include "moerl/core/error.h"

namespace moerl::model {

KVCache::KVCache(const config::ModelSection& model, torch::TensorOptions options,
                 std::int64_t initial_slots, std::int64_t initial_capacity)
    : num_layers_(model.num_layers),
      num_kv_heads_(model.num_kv_heads),
      head_dim_(model.d_model / model.num_heads),
      max_seq_len_(model.max_seq_len),
      options_(options) {
  MOERL_CHECK(initial_slots > 0 && initial_capacity > 0,
              "KVCache needs positive initial slots and capacity");
  MOERL_CHECK(model.num_heads > 0 && model.d_model % model.num_heads == 0,
              "KVCache: d_model must be a multiple of num_heads");
  grow(initial_slots, std::min(initial_capacity, max_seq_len_));
  for (std::int64_t s = num_slots_ - 1; s >= 0; --s) free_slots_.push_back(s);  // slot 0 first
}

void KVCache::grow(std::int64_t slots, std::int64_t capacity) {
  if (slots <= num_slots_ && capacity <= capacity_) return;
  slots = std::max(slots, num_slots_);
  capacity = std::max(capacity, capacity_);
  // Zero-filled, not empty: masked keys never matter, but a NaN in a masked
  // value would still poison probs @ values (0 * NaN).
  auto make = [&](const torch::Tensor& old) {
    torch::Tensor fresh = torch::zeros({num_layers_, slots, capacity, num_kv_heads_, head_dim_}, options_);
    if (old.defined()) fresh.narrow(1, 0, old.size(1)).narrow(2, 0, old.size(2)).copy_(old);
    return fresh;
  };
  keys_ = make(keys_);
  values_ = make(values_);
  num_slots_ = slots;
  capacity_ = capacity;
}

SequenceId KVCache::add_sequence() {
  if (free_slots_.empty()) {
    // Every slot is in use: double the slots (copies the live sequences once).
    const std::int64_t old = num_slots_;
    grow(std::max<std::int64_t>(old * 2, 1), capacity_);
    for (std::int64_t s = num_slots_ - 1; s >= old; --s) free_slots_.push_back(s);
  }
  const std::int64_t slot = free_slots_.back();
  free_slots_.pop_back();
  const SequenceId id = next_id_++;
  entries_[id] = Entry{slot, 0};
  return id;
}

void KVCache::remove_sequence(SequenceId id) {
  auto it = entries_.find(id);
  MOERL_CHECK(it != entries_.end(), "KVCache::remove_sequence: unknown sequence " + std::to_string(id));
  free_slots_.push_back(it->second.slot);
  entries_.erase(it);
}

void KVCache::clear() {
  entries_.clear();
  free_slots_.clear();
  for (std::int64_t s = num_slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
}

bool KVCache::contains(SequenceId id) const { return entries_.count(id) != 0; }

std::int64_t KVCache::length(SequenceId id) const {
  auto it = entries_.find(id);
  MOERL_CHECK(it != entries_.end(), "KVCache::length: unknown sequence " + std::to_string(id));
  return it->second.length;
}

std::vector<SequenceId> KVCache::sequences() const {
  std::vector<SequenceId> ids;
  ids.reserve(entries_.size());
  for (const auto& kv : entries_) ids.push_back(kv.first);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::int64_t KVCache::memory_bytes() const {
  return static_cast<std::int64_t>(keys_.nbytes() + values_.nbytes());
}

std::vector<std::int64_t> KVCache::slots_of(const std::vector<SequenceId>& ids) const {
  std::vector<std::int64_t> slots;
  slots.reserve(ids.size());
  std::unordered_set<SequenceId> seen;
  for (SequenceId id : ids) {
    auto it = entries_.find(id);
    MOERL_CHECK(it != entries_.end(), "KVCache: unknown sequence " + std::to_string(id));
    MOERL_CHECK(seen.insert(id).second, "KVCache: sequence " + std::to_string(id) +
                                            " appears twice in one step");
    slots.push_back(it->second.slot);
  }
  return slots;
}

std::vector<std::int64_t> KVCache::lengths_of(const std::vector<SequenceId>& ids) const {
  std::vector<std::int64_t> lengths;
  lengths.reserve(ids.size());
  for (SequenceId id : ids) lengths.push_back(length(id));
  return lengths;
}

void KVCache::reserve(std::int64_t max_total_length) {
  MOERL_CHECK(max_total_length <= max_seq_len_,
              "KVCache: a sequence would reach " + std::to_string(max_total_length) +
                  " positions, more than model.max_seq_len = " + std::to_string(max_seq_len_));
  if (max_total_length <= capacity_) return;
  grow(num_slots_, std::min(std::max(max_total_length, capacity_ * 2), max_seq_len_));
}

void KVCache::write(std::int64_t layer, const torch::Tensor& slots, const torch::Tensor& positions,
                    const torch::Tensor& keys, const torch::Tensor& values) {
  torch::NoGradGuard no_grad;
  keys_.select(0, layer).index_put_({slots, positions}, keys.detach().to(keys_.scalar_type()));
  values_.select(0, layer).index_put_({slots, positions}, values.detach().to(values_.scalar_type()));
}

torch::Tensor KVCache::gather_keys(std::int64_t layer, const torch::Tensor& slots,
                                   std::int64_t length) const {
  return keys_.select(0, layer).narrow(1, 0, length).index_select(0, slots);
}

torch::Tensor KVCache::gather_values(std::int64_t layer, const torch::Tensor& slots,
                                     std::int64_t length) const {
  return values_.select(0, layer).narrow(1, 0, length).index_select(0, slots);
}

void KVCache::advance(const std::vector<SequenceId>& ids, const std::vector<std::int64_t>& new_lengths) {
  MOERL_CHECK(ids.size() == new_lengths.size(), "KVCache::advance: ids and lengths differ in size");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto it = entries_.find(ids[i]);
    MOERL_CHECK(it != entries_.end(), "KVCache::advance: unknown sequence " + std::to_string(ids[i]));
    it->second.length += new_lengths[i];
  }
}

}  // namespace moerl::model
