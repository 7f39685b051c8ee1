#include "moerl/model/causal_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "moerl/core/check.h"
#include "moerl/model/kv_cache.h"
#include "moerl_kernels/attention.h"

namespace moerl::model {
namespace {

namespace k = moerl::kernels;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct PackedShape {
  std::int64_t tokens = 0, heads = 0, kv_heads = 0, head_dim = 0;
};

PackedShape check_packed(const torch::Tensor& q, const torch::Tensor& key, const torch::Tensor& value,
                         const std::vector<std::int64_t>& lengths) {
  MOERL_CHECK(q.dim() == 3 && key.dim() == 3 && value.dim() == 3,
              "fused attention: q, k and v must be [tokens, heads, head_dim]");
  MOERL_CHECK(key.sizes() == value.sizes(), "fused attention: k and v differ in shape");
  MOERL_CHECK(q.size(0) == key.size(0) && q.size(2) == key.size(2),
              "fused attention: q and k differ in tokens or head size");
  MOERL_CHECK(key.size(1) > 0 && q.size(1) % key.size(1) == 0,
              "fused attention: query heads must be a multiple of kv heads");
  MOERL_CHECK(fused_causal_attention_supported(q) && q.scalar_type() == key.scalar_type() &&
                  q.scalar_type() == value.scalar_type(),
              "fused attention: q, k and v must be CPU tensors of one dtype, float or double");
  std::int64_t total = 0;
  for (auto n : lengths) {
    MOERL_CHECK(n >= 1, "fused attention: every sequence needs at least one token, got " + std::to_string(n));
    total += n;
  }
  MOERL_CHECK(total == q.size(0), "fused attention: lengths sum to " + std::to_string(total) + ", q has " +
                                      std::to_string(q.size(0)) + " tokens");
  return {q.size(0), q.size(1), key.size(1), q.size(2)};
}

k::CausalAttentionTask task_of(const PackedShape& s, std::int64_t tokens, std::int64_t window) {
  k::CausalAttentionTask t;
  t.tokens = tokens;
  t.group = s.heads / s.kv_heads;
  t.head_dim = s.head_dim;
  t.q_stride = s.heads * s.head_dim;
  t.kv_stride = s.kv_heads * s.head_dim;
  t.lse_stride = s.heads;
  t.window = window;
  return t;
}

// One task's sequence and kv head, and where its data starts in the packed
// tensors, in elements: q, out, dout and dq at q; k, v, dk and dv at kv; lse
// at lse.
struct TaskOffsets {
  std::size_t sequence = 0;
  std::int64_t kv_head = 0;
  std::int64_t q = 0, kv = 0, lse = 0;
};

// Runs fn(task, offsets, scratch) for every (sequence, kv head) on
// LibTorch's intra-op threads, each thread with scratch of its own. past:
// cached positions per sequence (empty: none).
template <typename Fn>
void for_each_task(const PackedShape& s, const std::vector<std::int64_t>& lengths,
                   const std::vector<std::int64_t>& past, std::int64_t window, Fn&& fn) {
  std::vector<std::int64_t> first(lengths.size(), 0);
  std::exclusive_scan(lengths.begin(), lengths.end(), first.begin(), std::int64_t{0});
  const auto tasks = static_cast<std::int64_t>(lengths.size()) * s.kv_heads;
  at::parallel_for(0, tasks, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<char> scratch;
    for (std::int64_t i = begin; i < end; ++i) {
      const auto seq = static_cast<std::size_t>(i / s.kv_heads);
      const std::int64_t kv_head = i % s.kv_heads;
      k::CausalAttentionTask t = task_of(s, lengths[seq], window);
      if (!past.empty()) t.past = past[seq];
      const TaskOffsets at{seq, kv_head, first[seq] * t.q_stride + kv_head * t.group * s.head_dim,
                           first[seq] * t.kv_stride + kv_head * s.head_dim,
                           first[seq] * t.lse_stride + kv_head * t.group};
      fn(t, at, scratch);
    }
  });
}

template <typename Scalar>
Scalar* scratch_for(std::int64_t elements, std::vector<char>& bytes) {
  bytes.resize(static_cast<std::size_t>(elements) * sizeof(Scalar));
  return reinterpret_cast<Scalar*>(bytes.data());
}

class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                               const torch::Tensor& v_in, const std::vector<std::int64_t>& lengths, std::int64_t window,
                               double scale) {
    const auto q = q_in.contiguous(), key = k_in.contiguous(), value = v_in.contiguous();
    const PackedShape s = check_packed(q, key, value, lengths);
    auto out = torch::empty_like(q);
    auto lse = torch::empty({s.tokens, s.heads}, q.options());
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_causal_attention", [&] {
      for_each_task(s, lengths, {}, window,
                    [&](const k::CausalAttentionTask& t, const TaskOffsets& at, std::vector<char>& scratch) {
                      k::causal_attention_forward_cpu<scalar_t>(
                          t, static_cast<scalar_t>(scale), q.data_ptr<scalar_t>() + at.q,
                          key.data_ptr<scalar_t>() + at.kv, value.data_ptr<scalar_t>() + at.kv,
                          out.data_ptr<scalar_t>() + at.q, lse.data_ptr<scalar_t>() + at.lse,
                          scratch_for<scalar_t>(k::causal_attention_scratch(t), scratch));
                    });
    });
    ctx->save_for_backward({q, key, value, out, lse});
    ctx->saved_data["lengths"] = lengths;
    ctx->saved_data["window"] = window;
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &key = saved[1], &value = saved[2], &out = saved[3], &lse = saved[4];
    const auto lengths = ctx->saved_data["lengths"].toIntVector();
    const std::int64_t window = ctx->saved_data["window"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto dout = grads[0].contiguous();
    const PackedShape s = check_packed(q, key, value, lengths);
    auto dq = torch::empty_like(q), dk = torch::zeros_like(key), dv = torch::zeros_like(value);
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_causal_attention_backward", [&] {
      for_each_task(
          s, lengths, {}, window,
          [&](const k::CausalAttentionTask& t, const TaskOffsets& at, std::vector<char>& scratch) {
            k::causal_attention_backward_cpu<scalar_t>(
                t, static_cast<scalar_t>(scale), q.data_ptr<scalar_t>() + at.q, key.data_ptr<scalar_t>() + at.kv,
                value.data_ptr<scalar_t>() + at.kv, out.data_ptr<scalar_t>() + at.q, lse.data_ptr<scalar_t>() + at.lse,
                dout.data_ptr<scalar_t>() + at.q, dq.data_ptr<scalar_t>() + at.q, dk.data_ptr<scalar_t>() + at.kv,
                dv.data_ptr<scalar_t>() + at.kv, scratch_for<scalar_t>(k::causal_attention_scratch(t), scratch));
          });
    });
    return {dq, dk, dv, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The paged cache's rows of `layer` as the kernels read them: keys and
// values at kv head 0, blocks at the table's first row (a sequence adds its
// slot's row, a task its kv head).
template <typename Scalar>
k::PagedKeys<Scalar> layer_rows(const KVCache& cache, const torch::Tensor& table, std::int64_t layer) {
  const torch::Tensor& pool_keys = cache.keys();  // [layers, blocks, block_size, kv_heads, D]
  const std::int64_t layer_elements = pool_keys[0].numel();
  k::PagedKeys<Scalar> rows;
  rows.keys = pool_keys.data_ptr<Scalar>() + layer * layer_elements;
  rows.values = cache.values().data_ptr<Scalar>() + layer * layer_elements;
  rows.blocks = table.data_ptr<std::int64_t>();
  rows.block_size = cache.block_size();
  rows.position_stride = pool_keys.size(3) * pool_keys.size(4);
  return rows;
}

// A decode step: one token per sequence, so a task is a sequence with all
// its kv heads (moerl_kernels/attention.h, causal_attention_paged_decode_cpu).
template <typename Scalar>
void decode_sequences(const PackedShape& s, const k::PagedKeys<Scalar>& layer, std::int64_t table_width,
                      const torch::Tensor& q, const std::vector<std::int64_t>& slots,
                      const std::vector<std::int64_t>& past, std::int64_t window, double scale, torch::Tensor& out) {
  const std::int64_t row = s.heads * s.head_dim;  // one token's q and out
  at::parallel_for(0, static_cast<std::int64_t>(slots.size()), 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<char> scratch;
    k::PagedKeys<Scalar> rows = layer;
    for (std::int64_t b = begin; b < end; ++b) {
      const auto seq = static_cast<std::size_t>(b);
      k::CausalAttentionTask t = task_of(s, 1, window);
      t.past = past[seq];
      rows.blocks = layer.blocks + slots[seq] * table_width;
      k::causal_attention_paged_decode_cpu<Scalar>(
          t, s.kv_heads, static_cast<Scalar>(scale), q.data_ptr<Scalar>() + b * row, rows,
          out.data_ptr<Scalar>() + b * row,
          scratch_for<Scalar>(k::causal_attention_paged_decode_scratch(t, s.kv_heads), scratch));
    }
  });
}

}  // namespace

bool fused_cached_attention_supported(const torch::Tensor& q, const KVCache& cache) {
  return fused_causal_attention_supported(q) && cache.dtype() == KVCacheDtype::Float &&
         cache.keys().scalar_type() == q.scalar_type() && cache.keys().device() == q.device() &&
         !(torch::GradMode::is_enabled() && q.requires_grad());
}

torch::Tensor fused_cached_attention(const torch::Tensor& q_in, const KVCache& cache, std::int64_t layer,
                                     const std::vector<std::int64_t>& slots, const std::vector<std::int64_t>& lengths,
                                     const std::vector<std::int64_t>& past, std::int64_t window, double scale) {
  MOERL_CHECK(fused_cached_attention_supported(q_in, cache),
              "fused cached attention: needs CPU float/double queries without gradient and a cache of their dtype");
  MOERL_CHECK(slots.size() == lengths.size() && past.size() == lengths.size(),
              "fused cached attention: slots, lengths and past differ in size");
  const auto q = q_in.contiguous();
  const torch::Tensor& pool_keys = cache.keys();  // [layers, blocks, block_size, kv_heads, D]
  MOERL_CHECK(q.dim() == 3 && q.size(2) == pool_keys.size(4) && q.size(1) % pool_keys.size(3) == 0,
              "fused cached attention: q must be [tokens, heads, head_dim] matching the cache");
  const PackedShape s{q.size(0), q.size(1), pool_keys.size(3), q.size(2)};
  const torch::Tensor table = cache.block_table().contiguous();  // [slots, width] on the host
  const bool decode = std::all_of(lengths.begin(), lengths.end(), [](std::int64_t n) { return n == 1; });
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "fused_cached_attention", [&] {
    const k::PagedKeys<scalar_t> rows = layer_rows<scalar_t>(cache, table, layer);
    if (decode) {
      decode_sequences<scalar_t>(s, rows, table.size(1), q, slots, past, window, scale, out);
      return;
    }
    for_each_task(s, lengths, past, window,
                  [&](const k::CausalAttentionTask& t, const TaskOffsets& at, std::vector<char>& scratch) {
                    k::PagedKeys<scalar_t> paged = rows;
                    paged.keys += at.kv_head * s.head_dim;
                    paged.values += at.kv_head * s.head_dim;
                    paged.blocks += slots[at.sequence] * table.size(1);
                    k::causal_attention_paged_forward_cpu<scalar_t>(
                        t, static_cast<scalar_t>(scale), q.data_ptr<scalar_t>() + at.q, paged,
                        out.data_ptr<scalar_t>() + at.q, nullptr,
                        scratch_for<scalar_t>(k::causal_attention_paged_scratch(t), scratch));
                  });
  });
  return out;
}

bool fused_causal_attention_supported(const torch::Tensor& q) {
  return q.device().is_cpu() && (q.scalar_type() == torch::kFloat || q.scalar_type() == torch::kDouble);
}

torch::Tensor fused_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const std::vector<std::int64_t>& lengths, std::int64_t window, double scale) {
  return CausalAttentionFunction::apply(q, k, v, lengths, window, scale);
}

}  // namespace moerl::model
