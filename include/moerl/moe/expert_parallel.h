#pragma once
// Expert parallelism: the routed experts of an MoE layer split over the P
// members of an expert group, each member holding E/P consecutive experts
// (member m: experts [m*E/P, (m+1)*E/P)). Every member routes its own tokens
// over all E experts, as without expert parallelism; then
//
//   1. counts: each member tells each other how many of its rows go to each
//      of that member's experts (one small all-to-all);
//   2. dispatch: the rows, already in expert-contiguous order from moerl's own
//      dispatch, go to the members that own their experts (all-to-all-v);
//      rows for experts of one member are consecutive, so each member's part
//      is one slice;
//   3. the receiving member runs its local experts over what arrived (its
//      own dispatch, grouped SwiGLU and combine with unit gates, which puts
//      the outputs back in arrival order);
//   4. combine: the outputs return to the members that sent the rows
//      (all-to-all-v with the counts reversed), and each member combines its
//      tokens' outputs with their gates.
//
// Autograd runs both exchanges backwards (the gradient of rows that arrived
// returns to their sender), so a member's expert gradients sum every member's
// tokens, as the gradient of the whole layer over all members' tokens does.
// Capacity is applied by the sender to its own tokens, so a member's result
// equals the whole layer's result on that member's tokens alone.
//
// Every member must call the layer, and its backward, the same number of
// times in the same order, also with no tokens: the exchanges are
// collectives. Include after the LibTorch precompiled header.

#include <cstdint>

#include "moerl/moe/expert_exchange.h"
#include "moerl/moe/moe_ops.h"

namespace moerl::moe {

// The experts a member holds.
struct ExpertShard {
  std::int64_t first = 0;
  std::int64_t count = 0;
};

// Member `member` of `members` holds experts [first, first+count); throws
// unless experts divides evenly.
ExpertShard expert_shard(std::int64_t experts, int member, int members);

// Fills `share` ([shard.count, ...], a member's experts) with its rows of one
// normal(0, std) draw over all `experts` ([experts, ...]): the random stream,
// and so the weights, are the whole layer's whatever the split. A share of
// every expert is drawn in place. Call without gradient recording.
void normal_expert_share_(torch::Tensor share, ExpertShard shard, std::int64_t experts, double std);

// The drop-in for grouped_swiglu when the experts are split over the exchange's
// members. rows [rows, H] from dispatch(x, plan), where plan has no padding
// between expert segments (block_size 1); w_gate/w_up [E/P, D, H] and
// w_down [E/P, H, D] are this member's experts; block_size pads the local
// experts' segments as moe.block_size does. Returns [rows, H] in the plan's
// order, zero past the rows in use, like grouped_swiglu.
torch::Tensor expert_parallel_swiglu(const torch::Tensor& rows, const RoutePlan& plan, const torch::Tensor& w_gate,
                                     const torch::Tensor& w_up, const torch::Tensor& w_down, ExpertExchange& exchange,
                                     std::int64_t block_size);

}  // namespace moerl::moe
