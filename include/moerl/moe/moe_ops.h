#pragma once
// The MoE operators, each with autograd, on CPU (float, bfloat16, double) and
// CUDA (float, bfloat16): route -> plan -> dispatch -> grouped SwiGLU ->
// combine. Thin LibTorch adapters over the raw-pointer kernels in
// moerl_kernels/moe.h.
//
// bfloat16: activations and expert weights are stored in bf16; every sum
// (combine's k rows, dispatch's gradient scatter-add, the gate gradient's dot
// products, the expert GEMMs and the SwiGLU between them) runs in float32 and
// is rounded to bf16 once. The router runs in float32: route() returns float32
// gates for bf16 logits, combine() takes float32 gates with bf16 rows (bf16
// gates are widened) and returns float32 gate gradients. On CPU the bf16
// expert GEMMs run through the float32 BLAS path on widened copies.
// Gradients are first order only (the backward kernels are not themselves
// differentiable). Include after the LibTorch precompiled header.

#include <cstdint>

#include "moerl/config/sections.h"

namespace moerl::moe {

// Where each (token, choice) assignment goes in the expert-contiguous layout.
// Built on the device of the routing; nothing here needs the host on the GPU
// path (rows is a bound known from the sizes alone).
struct RoutePlan {
  torch::Tensor routed;      // [E] int64: assignments per expert before capacity
  torch::Tensor counts;      // [E] int64: kept assignments per expert
  torch::Tensor offsets;     // [E+1] int64: padded segment starts; offsets[E] = rows in use
  torch::Tensor dest_row;    // [T*k] int64: permuted row of each assignment, -1 = dropped
  torch::Tensor row_source;  // [rows] int64: assignment of each permuted row, -1 = padding
  torch::Tensor dropped;     // [1] int64: assignments dropped by capacity
  std::int64_t tokens = 0;
  std::int64_t top_k = 0;
  std::int64_t experts = 0;
  std::int64_t rows = 0;  // T*k + E*(block_size-1): size of the permuted buffers
};

// expert_indices [T,k] int64 in [0,E). capacity < 0: dropless.
RoutePlan make_route_plan(const torch::Tensor& expert_indices, std::int64_t experts, std::int64_t capacity,
                          std::int64_t block_size);

struct RouteResult {
  torch::Tensor expert_indices;  // [T,k] int64 (forced ones when given)
  torch::Tensor gates;           // [T,k] gate weights, differentiable in the logits
  torch::Tensor balance_loss;    // scalar: E * sum_e f_e * P_e; undefined without with_losses
  torch::Tensor z_loss;          // scalar: mean_t logsumexp(logits_t)^2; undefined without with_losses
};

// logits [T,E]. forced_experts: undefined or [T,k] int64 (routing replay: the
// gates are recomputed over these experts and still depend on the logits).
// f_e counts the chosen (not forced-away) assignments before capacity; P_e is
// the mean router probability. Softmax, top-k, gates and losses are computed
// in float32 for float32, bf16 or float16 logits (double stays double).
// with_losses = false skips the two losses (about 15 small tensor ops per
// layer that a decode step, which trains on nothing, would pay serially).
RouteResult route(const torch::Tensor& logits, const config::MoeSection& moe,
                  const torch::Tensor& forced_experts = torch::Tensor(), bool with_losses = true);

// x [T,H] -> [rows,H] in expert-contiguous order; padding rows are zero.
torch::Tensor dispatch(const torch::Tensor& x, const RoutePlan& plan);

// Grouped SwiGLU over the plan's segments:
//   y[r] = W_down[e] (silu(W_gate[e] x[r]) * (W_up[e] x[r]))
// x [rows,H], w_gate/w_up [E,D,H], w_down [E,H,D] -> [rows,H].
torch::Tensor grouped_swiglu(const torch::Tensor& x, const torch::Tensor& w_gate, const torch::Tensor& w_up,
                             const torch::Tensor& w_down, const RoutePlan& plan);

// expert_out [rows,H], gates [T,k] -> [T,H]: sum over kept choices of gate * row.
// gates: expert_out's dtype, or float32 (or bf16, widened) for bf16 expert_out.
torch::Tensor combine(const torch::Tensor& expert_out, const torch::Tensor& gates, const RoutePlan& plan);

}  // namespace moerl::moe
