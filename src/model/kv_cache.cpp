#include "moerl/model/kv_cache.h"

#include "moerl/core/check.h"
#include "moerl/model/attention.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_set>

namespace moerl::model {

namespace {

// Int8 storage: one scale per (position, head) vector, so an outlier in one
// head or token does not coarsen the others (keys carry RoPE and vary by
// position; per-token scales keep prefill and decode writes independent).
constexpr double kInt8Max = 127.0;

}  // namespace

const char* kv_cache_dtype_name(KVCacheDtype dtype) { return dtype == KVCacheDtype::Int8 ? "int8" : "float32"; }

KVCache::KVCache(const config::ModelSection& model, torch::TensorOptions options, std::int64_t initial_slots,
                 std::int64_t initial_capacity, KVCacheDtype dtype)
    : num_layers_(model.num_layers),
      num_kv_heads_(model.num_kv_heads),
      head_dim_(attention_head_dim(model)),
      max_seq_len_(model.max_seq_len),
      options_(options),
      dtype_(dtype) {
  MOERL_CHECK(initial_slots > 0 && initial_capacity > 0, "KVCache needs positive initial slots and capacity");
  MOERL_CHECK(model.num_heads > 0 && head_dim_ > 0, "KVCache: the model needs heads of a positive size");
  const std::int64_t capacity = std::min(initial_capacity, max_seq_len_);
  init(initial_slots, initial_slots * blocks_for(capacity));
  table_width_ = std::max<std::int64_t>(1, blocks_for(capacity));
}

KVCache::KVCache(const config::ModelSection& model, torch::TensorOptions options, const PagedCacheOptions& paged)
    : num_layers_(model.num_layers),
      num_kv_heads_(model.num_kv_heads),
      head_dim_(attention_head_dim(model)),
      max_seq_len_(model.max_seq_len),
      block_size_(paged.block_size),
      max_blocks_(paged.max_blocks),
      options_(options),
      dtype_(paged.dtype) {
  MOERL_CHECK(paged.block_size > 0, "KVCache: block_size must be positive");
  MOERL_CHECK(paged.max_blocks >= 0 && paged.initial_blocks >= 0 && paged.initial_slots > 0,
              "KVCache: initial/max blocks must be >= 0 and initial slots > 0");
  MOERL_CHECK(model.num_heads > 0 && head_dim_ > 0, "KVCache: the model needs heads of a positive size");
  std::int64_t initial = paged.initial_blocks > 0 ? paged.initial_blocks : 4;
  if (max_blocks_ > 0) initial = std::min(initial, max_blocks_);
  init(paged.initial_slots, initial);
}

void KVCache::init(std::int64_t initial_slots, std::int64_t initial_blocks) {
  grow_pool(std::max<std::int64_t>(initial_blocks, 1));
  grow_slots(initial_slots);
}

void KVCache::grow_pool(std::int64_t blocks) {
  if (blocks <= num_blocks_) return;
  // Zero-filled, not empty: masked keys never matter, but a NaN in a masked
  // value would still poison probs @ values (0 * NaN).
  auto make = [&](const torch::Tensor& old, std::vector<std::int64_t> shape, torch::TensorOptions options) {
    torch::Tensor fresh = torch::zeros(shape, options);
    if (old.defined()) fresh.narrow(1, 0, old.size(1)).copy_(old);
    return fresh;
  };
  const bool int8 = dtype_ == KVCacheDtype::Int8;
  const torch::TensorOptions stored = int8 ? options_.dtype(torch::kInt8) : options_;
  keys_ = make(keys_, {num_layers_, blocks, block_size_, num_kv_heads_, head_dim_}, stored);
  values_ = make(values_, {num_layers_, blocks, block_size_, num_kv_heads_, head_dim_}, stored);
  if (int8) {
    key_scales_ = make(key_scales_, {num_layers_, blocks, block_size_, num_kv_heads_}, options_.dtype(torch::kFloat));
    value_scales_ =
        make(value_scales_, {num_layers_, blocks, block_size_, num_kv_heads_}, options_.dtype(torch::kFloat));
  }
  // Push the new blocks so that the lowest one is popped first.
  for (std::int64_t b = blocks - 1; b >= num_blocks_; --b) free_blocks_.push_back(b);
  std::sort(free_blocks_.begin(), free_blocks_.end(), std::greater<std::int64_t>());
  num_blocks_ = blocks;
}

void KVCache::grow_slots(std::int64_t slots) {
  if (slots <= num_slots_) return;
  for (std::int64_t s = slots - 1; s >= num_slots_; --s) free_slots_.insert(free_slots_.begin(), s);
  num_slots_ = slots;
  table_dirty_ = true;
}

SequenceId KVCache::add_sequence() {
  // Every slot in use: double the block-table rows (no KV data moves).
  if (free_slots_.empty()) grow_slots(std::max<std::int64_t>(num_slots_ * 2, 1));
  const std::int64_t slot = free_slots_.back();
  free_slots_.pop_back();
  const SequenceId id = next_id_++;
  entries_[id] = Entry{slot, 0, {}};
  table_dirty_ = true;
  return id;
}

void KVCache::remove_sequence(SequenceId id) {
  auto it = entries_.find(id);
  MOERL_CHECK(it != entries_.end(), "KVCache::remove_sequence: unknown sequence " + std::to_string(id));
  free_slots_.push_back(it->second.slot);
  for (std::int64_t b : it->second.blocks) free_blocks_.push_back(b);
  std::sort(free_blocks_.begin(), free_blocks_.end(), std::greater<std::int64_t>());
  entries_.erase(it);
  table_dirty_ = true;
}

void KVCache::clear() {
  entries_.clear();
  free_slots_.clear();
  for (std::int64_t s = num_slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
  free_blocks_.clear();
  for (std::int64_t b = num_blocks_ - 1; b >= 0; --b) free_blocks_.push_back(b);
  table_dirty_ = true;
}

bool KVCache::contains(SequenceId id) const { return entries_.count(id) != 0; }

std::int64_t KVCache::length(SequenceId id) const {
  auto it = entries_.find(id);
  MOERL_CHECK(it != entries_.end(), "KVCache::length: unknown sequence " + std::to_string(id));
  return it->second.length;
}

std::int64_t KVCache::blocks_of(SequenceId id) const {
  auto it = entries_.find(id);
  MOERL_CHECK(it != entries_.end(), "KVCache::blocks_of: unknown sequence " + std::to_string(id));
  return static_cast<std::int64_t>(it->second.blocks.size());
}

std::vector<SequenceId> KVCache::sequences() const {
  std::vector<SequenceId> ids;
  ids.reserve(entries_.size());
  for (const auto& kv : entries_) ids.push_back(kv.first);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::int64_t KVCache::blocks_available() const {
  const auto free = static_cast<std::int64_t>(free_blocks_.size());
  if (max_blocks_ <= 0) return std::numeric_limits<std::int64_t>::max() / 2;
  return free + (max_blocks_ - num_blocks_);
}

std::int64_t KVCache::bytes_per_block() const {
  const std::int64_t elements = num_layers_ * block_size_ * num_kv_heads_ * head_dim_;
  const std::int64_t scales = dtype_ == KVCacheDtype::Int8 ? num_layers_ * block_size_ * num_kv_heads_ * 4 : 0;
  return 2 * (elements * static_cast<std::int64_t>(keys_.element_size()) + scales);
}

std::int64_t KVCache::memory_bytes() const {
  std::int64_t bytes = static_cast<std::int64_t>(keys_.nbytes() + values_.nbytes());
  if (key_scales_.defined()) bytes += static_cast<std::int64_t>(key_scales_.nbytes() + value_scales_.nbytes());
  return bytes;
}

std::vector<std::int64_t> KVCache::slots_of(const std::vector<SequenceId>& ids) const {
  std::vector<std::int64_t> slots;
  slots.reserve(ids.size());
  std::unordered_set<SequenceId> seen;
  for (SequenceId id : ids) {
    auto it = entries_.find(id);
    MOERL_CHECK(it != entries_.end(), "KVCache: unknown sequence " + std::to_string(id));
    MOERL_CHECK(seen.insert(id).second, "KVCache: sequence " + std::to_string(id) + " appears twice in one step");
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
  const std::int64_t width = blocks_for(max_total_length);
  if (width <= table_width_) return;
  table_width_ = std::max(width, std::min(table_width_ * 2, blocks_for(max_seq_len_)));
  table_dirty_ = true;
}

std::int64_t KVCache::blocks_needed(const std::vector<SequenceId>& ids,
                                    const std::vector<std::int64_t>& new_lengths) const {
  MOERL_CHECK(ids.size() == new_lengths.size(), "KVCache::blocks_needed: ids and lengths differ in size");
  std::int64_t needed = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto it = entries_.find(ids[i]);
    MOERL_CHECK(it != entries_.end(), "KVCache: unknown sequence " + std::to_string(ids[i]));
    const std::int64_t want = blocks_for(it->second.length + new_lengths[i]);
    needed += std::max<std::int64_t>(0, want - static_cast<std::int64_t>(it->second.blocks.size()));
  }
  return needed;
}

void KVCache::prepare(const std::vector<SequenceId>& ids, const std::vector<std::int64_t>& new_lengths) {
  std::int64_t max_total = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) max_total = std::max(max_total, length(ids[i]) + new_lengths[i]);
  MOERL_CHECK(max_total <= max_seq_len_,
              "KVCache: a sequence would reach " + std::to_string(max_total) +
                  " positions, more than model.max_seq_len = " + std::to_string(max_seq_len_));
  const std::int64_t needed = blocks_needed(ids, new_lengths);
  const auto free = static_cast<std::int64_t>(free_blocks_.size());
  if (needed > free) {
    const std::int64_t want = std::max(num_blocks_ * 2, num_blocks_ + needed - free);
    const std::int64_t target = max_blocks_ > 0 ? std::min(want, max_blocks_) : want;
    if (target - num_blocks_ + free < needed) {
      throw KVCacheFullError("KVCache: the step needs " + std::to_string(needed) + " new blocks but only " +
                             std::to_string(blocks_available()) + " of max_blocks = " + std::to_string(max_blocks_) +
                             " are free");
    }
    grow_pool(target);
  }
  reserve(max_total);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    Entry& e = entries_.at(ids[i]);
    const std::int64_t want = blocks_for(e.length + new_lengths[i]);
    while (static_cast<std::int64_t>(e.blocks.size()) < want) {
      e.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
      table_dirty_ = true;
    }
  }
}

const torch::Tensor& KVCache::block_table() const {
  if (table_dirty_ || !table_.defined()) {
    std::vector<std::int64_t> host(static_cast<std::size_t>(num_slots_ * table_width_), 0);
    for (const auto& kv : entries_) {
      const Entry& e = kv.second;
      const std::size_t n = std::min<std::size_t>(e.blocks.size(), static_cast<std::size_t>(table_width_));
      std::copy(e.blocks.begin(), e.blocks.begin() + static_cast<std::ptrdiff_t>(n),
                host.begin() + static_cast<std::ptrdiff_t>(e.slot * table_width_));
    }
    table_ = torch::tensor(host, torch::TensorOptions().dtype(torch::kLong))
                 .view({num_slots_, table_width_})
                 .to(options_.device());
    table_dirty_ = false;
  }
  return table_;
}

void KVCache::write(std::int64_t layer, const torch::Tensor& slots, const torch::Tensor& positions,
                    const torch::Tensor& keys, const torch::Tensor& values) {
  torch::NoGradGuard no_grad;
  if (dtype_ == KVCacheDtype::Float && keys_.device().is_cpu() && keys.device().is_cpu() &&
      keys.scalar_type() == keys_.scalar_type() && values.scalar_type() == keys_.scalar_type()) {
    copy_rows_on_host(layer, slots, positions, keys, values);
    return;
  }
  const torch::Tensor& table = block_table();
  const torch::Tensor block = table.index({slots, positions.div(block_size_, "floor")});  // [T]
  const torch::Tensor offset = positions.remainder(block_size_);                          // [T]
  store(keys_, key_scales_, layer, block, offset, keys.detach());
  store(values_, value_scales_, layer, block, offset, values.detach());
}

// A decode step writes one position per sequence and layer: a row copy
// each, where the indexed tensor ops (a table lookup, a division, a
// remainder, two index_put_) cost more than the bytes.
void KVCache::copy_rows_on_host(std::int64_t layer, const torch::Tensor& slots, const torch::Tensor& positions,
                                const torch::Tensor& keys, const torch::Tensor& values) {
  const torch::Tensor slot = slots.to(torch::kLong).contiguous(), position = positions.to(torch::kLong).contiguous();
  const torch::Tensor k = keys.contiguous(), v = values.contiguous();
  const std::int64_t tokens = slot.numel();
  MOERL_CHECK(position.numel() == tokens && k.size(0) == tokens && v.size(0) == tokens,
              "KVCache::write: slots, positions, keys and values differ in tokens");
  const torch::Tensor& table = block_table();
  const std::int64_t* table_rows = table.data_ptr<std::int64_t>();
  const std::int64_t* slot_of = slot.data_ptr<std::int64_t>();
  const std::int64_t* position_of = position.data_ptr<std::int64_t>();
  const auto row_bytes = static_cast<std::size_t>(num_kv_heads_ * head_dim_) * keys_.element_size();
  const std::int64_t layer_bytes = keys_[0].numel() * keys_.element_size();
  char* key_pool = static_cast<char*>(keys_.data_ptr()) + layer * layer_bytes;
  char* value_pool = static_cast<char*>(values_.data_ptr()) + layer * layer_bytes;
  const char* key_rows = static_cast<const char*>(k.data_ptr());
  const char* value_rows = static_cast<const char*>(v.data_ptr());
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t s = slot_of[t], p = position_of[t];
    MOERL_CHECK(s >= 0 && s < num_slots_ && p >= 0 && p < capacity(),
                "KVCache::write: slot " + std::to_string(s) + ", position " + std::to_string(p) +
                    " is outside the block table (" + std::to_string(num_slots_) + " slots of " +
                    std::to_string(capacity()) + " positions)");
    const std::int64_t row = table_rows[s * table_width_ + p / block_size_] * block_size_ + p % block_size_;
    std::memcpy(key_pool + row * static_cast<std::int64_t>(row_bytes), key_rows + t * row_bytes, row_bytes);
    std::memcpy(value_pool + row * static_cast<std::int64_t>(row_bytes), value_rows + t * row_bytes, row_bytes);
  }
}

void KVCache::store(torch::Tensor& pool, torch::Tensor& scales, std::int64_t layer, const torch::Tensor& block,
                    const torch::Tensor& offset, const torch::Tensor& data /*[T, kvh, D]*/) {
  if (dtype_ == KVCacheDtype::Float) {
    pool.select(0, layer).index_put_({block, offset}, data.to(pool.scalar_type()));
    return;
  }
  const torch::Tensor x = data.to(torch::kFloat);
  // A zero vector keeps scale 0 and dequantises to zeros; no division by it.
  const torch::Tensor scale = x.abs().amax(-1) / kInt8Max;  // [T, kvh]
  const torch::Tensor safe = torch::where(scale > 0, scale, torch::ones_like(scale));
  const torch::Tensor q = (x / safe.unsqueeze(-1)).round().clamp(-kInt8Max, kInt8Max).to(torch::kInt8);
  pool.select(0, layer).index_put_({block, offset}, q);
  scales.select(0, layer).index_put_({block, offset}, scale);
}

torch::Tensor KVCache::gather(const torch::Tensor& pool, const torch::Tensor& scales, std::int64_t layer,
                              const torch::Tensor& slots, std::int64_t length) const {
  const std::int64_t rows = slots.size(0);
  const std::int64_t nb = blocks_for(length);
  MOERL_CHECK(nb <= table_width_, "KVCache::gather: length " + std::to_string(length) + " exceeds the block table (" +
                                      std::to_string(capacity()) + " positions); call prepare() first");
  const torch::Tensor blocks = block_table().index_select(0, slots).narrow(1, 0, nb).reshape({-1});  // [B*nb]
  const torch::Tensor stored = pool.select(0, layer)
                                   .index_select(0, blocks)                                   // [B*nb, bs, kvh, D]
                                   .view({rows, nb * block_size_, num_kv_heads_, head_dim_})  // [B, nb*bs, kvh, D]
                                   .narrow(1, 0, length);
  if (dtype_ == KVCacheDtype::Float) return stored;
  const torch::Tensor scale = scales.select(0, layer)
                                  .index_select(0, blocks)  // [B*nb, bs, kvh]
                                  .view({rows, nb * block_size_, num_kv_heads_})
                                  .narrow(1, 0, length);
  return (stored.to(torch::kFloat) * scale.unsqueeze(-1)).to(options_.dtype().toScalarType());
}

torch::Tensor KVCache::gather_keys(std::int64_t layer, const torch::Tensor& slots, std::int64_t length) const {
  return gather(keys_, key_scales_, layer, slots, length);
}

torch::Tensor KVCache::gather_values(std::int64_t layer, const torch::Tensor& slots, std::int64_t length) const {
  return gather(values_, value_scales_, layer, slots, length);
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
