#pragma once
// Causal self-attention of one packed sequence and one kv head on the CPU,
// forward and backward, without padding and without a [queries, keys] score
// tensor per head.
//
// Why our own: the padded path (model/attention.cpp) builds scores for every
// sequence at the batch's longest length, masks them, soft-maxes them and
// keeps them for the backward: on a learner's batch of 32 episodes that was
// two thirds of the update (bench update, 1 thread). Here each block of
// queries multiplies only the keys it may see (its causal and sliding-window
// range), the probabilities live in a scratch block that stays in cache, and
// the backward recomputes them from the row's log-sum-exp (the
// FlashAttention recipe, Dao et al. 2022), so nothing of size queries x keys
// is ever stored.
//
// Layout (the model's packed layout, no copies): a sequence of n tokens,
// token t of query head h at q[t * q_stride + h * head_dim]; the task's
// pointers start at the sequence's first token and at the first query head of
// the kv head's group (heads g * group .. g * group + group - 1 share kv head
// g, the Llama/Mixtral convention); keys and values at k[t * kv_stride].
// Query i of the task sits at position past + i and sees the keys at
// positions j with p - window < j <= p, p = past + i (window 0: every
// j <= p); keys are indexed by position, so past keys come first (a KV
// cache's; 0 for a whole sequence).
// lse holds one float per (token, query head of the group) at
// lse[t * lse_stride + h].
//
// Threading: none of its own; a caller runs tasks (sequence, kv head) on
// its threads. Each task writes only its own rows of out, lse and dq and its
// own (sequence, kv head) rows of dk and dv, so tasks never race.

#include <cstdint>

namespace moerl::kernels {

struct CausalAttentionTask {
  std::int64_t tokens = 0;      // n: queries (keys: past + n)
  std::int64_t past = 0;        // keys before the first query
  std::int64_t group = 1;       // query heads per kv head
  std::int64_t head_dim = 0;    // D
  std::int64_t q_stride = 0;    // elements between tokens in q, out, dout, dq
  std::int64_t kv_stride = 0;   // elements between tokens in k, v, dk, dv
  std::int64_t lse_stride = 0;  // elements between tokens in lse
  std::int64_t window = 0;      // sliding window; 0 = none
};

// Scratch elements one task needs (forward and backward alike).
std::int64_t causal_attention_scratch(const CausalAttentionTask& task);

// The keys and values of one sequence and one kv head in a paged KV cache
// (model/kv_cache.h): position j lives in pool block blocks[j / block_size]
// at offset j % block_size; a pool block holds block_size positions of
// position_stride elements (kv_heads * head_dim), and keys/values point at
// this kv head's part of pool block 0.
template <typename Scalar>
struct PagedKeys {
  const Scalar* keys = nullptr;
  const Scalar* values = nullptr;
  const std::int64_t* blocks = nullptr;
  std::int64_t block_size = 0;
  std::int64_t position_stride = 0;
};

// Scratch elements causal_attention_paged_forward_cpu needs for a task.
std::int64_t causal_attention_paged_scratch(const CausalAttentionTask& task);

// The forward with keys and values read from a paged cache (the task's
// kv_stride is ignored): the visible positions are copied, one kv head at a
// time, into scratch that stays in cache, instead of the whole batch being
// gathered into a padded copy per layer and step. lse may be null.
template <typename Scalar>
void causal_attention_paged_forward_cpu(const CausalAttentionTask& task, Scalar scale, const Scalar* q,
                                        const PagedKeys<Scalar>& cache, Scalar* out, Scalar* lse, Scalar* scratch);

// Scratch elements causal_attention_paged_decode_cpu needs.
std::int64_t causal_attention_paged_decode_scratch(const CausalAttentionTask& task, std::int64_t kv_heads);

// One decode token (task.tokens == 1) of one sequence, every kv head at once,
// read in place from the paged cache: cache.keys/values point at kv head 0,
// q and out at the token's query head 0 (heads side by side, kv head h / group
// serving query head h). A decode step's attention is dot products of a few
// dozen elements, where the GEMMs of the general path and its copy of the
// keys cost more than the arithmetic; reading all kv heads of a position
// together walks each pool block front to back.
template <typename Scalar>
void causal_attention_paged_decode_cpu(const CausalAttentionTask& task, std::int64_t kv_heads, Scalar scale,
                                       const Scalar* q, const PagedKeys<Scalar>& cache, Scalar* out, Scalar* scratch);

// out = softmax(scale q k^T, causal) v; lse = log-sum-exp of each query's
// scaled scores.
template <typename Scalar>
void causal_attention_forward_cpu(const CausalAttentionTask& task, Scalar scale, const Scalar* q, const Scalar* k,
                                  const Scalar* v, Scalar* out, Scalar* lse, Scalar* scratch);

// dq is written; dk and dv are added to (a caller zeroes them once).
template <typename Scalar>
void causal_attention_backward_cpu(const CausalAttentionTask& task, Scalar scale, const Scalar* q, const Scalar* k,
                                   const Scalar* v, const Scalar* out, const Scalar* lse, const Scalar* dout,
                                   Scalar* dq, Scalar* dk, Scalar* dv, Scalar* scratch);

}  // namespace moerl::kernels
