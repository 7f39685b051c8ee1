#pragma once
// MoE dispatch/combine and grouped-GEMM kernels. Every CUDA launcher
// (*_cuda, declared when MOERL_WITH_CUDA) has a CPU twin (*_cpu) with the same
// arguments (less the stream) and the same results; tests compare the two.
//
// Vocabulary (T tokens, k choices per token, E experts, H hidden):
//   assignment a = t*k + j     the j-th expert choice of token t
//   expert_idx [T*k]           expert of each assignment, in [0, E)
//   dest_row   [T*k]           row of the assignment in the permuted layout,
//                              -1 when dropped by capacity
//   row_source [R]             inverse: assignment of each permuted row, -1 for
//                              padding rows
//   counts     [E]             kept assignments per expert
//   offsets    [E+1]           exclusive start of each expert's segment, each
//                              segment padded to a multiple of block_size;
//                              offsets[E] = rows in use
//   R = moe_permuted_rows(T, k, E, block_size): an upper bound on offsets[E]
//                              known without looking at the routing, so the GPU
//                              path never waits on the host; rows in
//                              [offsets[E], R) and padding rows are zero.
// Within an expert's segment assignments keep their order (by a), so the
// layout is deterministic and identical on CPU and GPU.
//
// Element types: Scalar is float, double (CPU only: gradient checks) or
// bfloat16 (moerl_kernels/bfloat16.h). Gate weights and gate gradients are
// accum_t<Scalar> (float for bf16): the router's gates stay in float32, and
// every sum (combine's k expert rows, gradient scatter-adds, dot products,
// GEMM reductions) accumulates in accum_t and rounds to Scalar once on store.

#include <cstddef>
#include <cstdint>

#include "moerl_kernels/bfloat16.h"

#ifdef MOERL_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moerl::kernels {

// Upper bound on the permuted rows: T*k + E*(block_size-1).
std::int64_t moe_permuted_rows(std::int64_t tokens, std::int64_t top_k, std::int64_t experts, std::int64_t block_size);

// Routing plan. capacity < 0: unbounded (dropless). Assignments of expert e
// beyond the first `capacity` (in order of a) are dropped. Writes counts,
// offsets, dest_row, row_source (all R entries) and dropped[0] (number of
// dropped assignments). routed [E] receives the assignments per expert before
// capacity (for the load-balancing loss and statistics).
void moe_plan_cpu(const std::int64_t* expert_idx, std::int64_t tokens, std::int64_t top_k, std::int64_t experts,
                  std::int64_t capacity, std::int64_t block_size, std::int64_t* routed, std::int64_t* counts,
                  std::int64_t* offsets, std::int64_t* dest_row, std::int64_t* row_source, std::int64_t* dropped);

// Dispatch (a row gather): out[r,:] = w[a] * x[a/k,:] with a = row_source[r]
// (w = 1 when weights is null), zero when a < 0. x [T,H], out [rows,H].
// With weights this is also the backward of combine for the expert outputs.
// Rows are independent: a caller may pass a sub-range of rows.
template <typename Scalar>
void moe_dispatch_cpu(const Scalar* x, const std::int64_t* row_source, const accum_t<Scalar>* weights,
                      std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, std::int64_t rows, Scalar* out);

// Combine (a weighted row sum): y[t,:] = sum_j w[t*k+j] * src[dest_row[t*k+j],:]
// over kept assignments (w = 1 when weights is null). src [rows,H], y [T,H].
// Without weights this is the backward of dispatch. Tokens are independent: a
// caller may pass a sub-range of tokens (offsetting dest_row, weights and y).
template <typename Scalar>
void moe_combine_cpu(const Scalar* src, const std::int64_t* dest_row, const accum_t<Scalar>* weights,
                     std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, Scalar* y);

// Gradient of combine for the gate weights:
// grad_w[a] = <grad_y[a/k,:], src[dest_row[a],:]>, 0 for dropped assignments.
template <typename Scalar>
void moe_combine_gate_grad_cpu(const Scalar* grad_y, const Scalar* src, const std::int64_t* dest_row,
                               std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, accum_t<Scalar>* grad_w);

// Grouped GEMMs over the expert segments given by offsets [E+1] (rows >=
// offsets[E] are written as zero by the two row-wise forms).
//   nt: C[r,:] = A[r,:] @ B[e]^T   A [rows,K], B [E,N,K], C [rows,N]  (forward)
//   nn: C[r,:] = A[r,:] @ B[e]     A [rows,N], B [E,N,K], C [rows,K]  (input grad)
//   tn: C[e]   = A_e^T @ X_e       A [rows,N], X [rows,K], C [E,N,K]  (weight grad)
template <typename Scalar>
void moe_grouped_gemm_nt_cpu(const Scalar* A, const Scalar* B, const std::int64_t* offsets, std::int64_t rows,
                             std::int64_t experts, std::int64_t N, std::int64_t K, Scalar* C);
template <typename Scalar>
void moe_grouped_gemm_nn_cpu(const Scalar* A, const Scalar* B, const std::int64_t* offsets, std::int64_t rows,
                             std::int64_t experts, std::int64_t N, std::int64_t K, Scalar* C);
template <typename Scalar>
void moe_grouped_gemm_tn_cpu(const Scalar* A, const Scalar* X, const std::int64_t* offsets, std::int64_t rows,
                             std::int64_t experts, std::int64_t N, std::int64_t K, Scalar* C);

// CPU grouped SwiGLU (float and double only: the adapter runs bf16 through
// the float path), one expert's rows at a time (the adapter runs these
// over (expert, row block) items in parallel; BLAS does the products).
//   forward:  gu[r] = [x[r] W_gate^T | x[r] W_up^T]   gu [n, 2D]: gate pre-activation, then up
//             h[r]  = silu(g[r]) * u[r]                h [n, D]
//             y[r]  = h[r] W_down^T                    y [n, H]
// x [n,H]; w_gate, w_up [D,H]; w_down [H,D] (one expert's slices).
template <typename Scalar>
void moe_swiglu_forward_rows_cpu(const Scalar* x, const Scalar* w_gate, const Scalar* w_up, const Scalar* w_down,
                                 std::int64_t n, std::int64_t hidden, std::int64_t d_expert, Scalar* gu, Scalar* h,
                                 Scalar* y);

// Backward of one expert's whole segment from the forward's saved gu and h:
// writes dx [n,H] and this expert's weight gradients dw_gate, dw_up [D,H],
// dw_down [H,D] (zero when n == 0). scratch holds n*2*D values.
template <typename Scalar>
void moe_swiglu_backward_rows_cpu(const Scalar* x, const Scalar* gu, const Scalar* h, const Scalar* dy,
                                  const Scalar* w_gate, const Scalar* w_up, const Scalar* w_down, std::int64_t n,
                                  std::int64_t hidden, std::int64_t d_expert, Scalar* scratch, Scalar* dx,
                                  Scalar* dw_gate, Scalar* dw_up, Scalar* dw_down);

#ifdef MOERL_WITH_CUDA
// Device workspace (bytes) that moe_plan_cuda needs for T*k assignments.
std::size_t moe_plan_workspace_bytes(std::int64_t tokens, std::int64_t top_k, std::int64_t experts);

// All pointers are device pointers; nothing is copied to the host.
cudaError_t moe_plan_cuda(const std::int64_t* expert_idx, std::int64_t tokens, std::int64_t top_k, std::int64_t experts,
                          std::int64_t capacity, std::int64_t block_size, std::int64_t* routed, std::int64_t* counts,
                          std::int64_t* offsets, std::int64_t* dest_row, std::int64_t* row_source,
                          std::int64_t* dropped, void* workspace, cudaStream_t stream);

// float and bf16 overloads; gate weights and gate gradients are float in both.
cudaError_t moe_dispatch_cuda(const float* x, const std::int64_t* row_source, const float* weights, std::int64_t tokens,
                              std::int64_t top_k, std::int64_t hidden, std::int64_t rows, float* out,
                              cudaStream_t stream);
cudaError_t moe_dispatch_cuda(const bfloat16* x, const std::int64_t* row_source, const float* weights,
                              std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, std::int64_t rows,
                              bfloat16* out, cudaStream_t stream);
cudaError_t moe_combine_cuda(const float* src, const std::int64_t* dest_row, const float* weights, std::int64_t tokens,
                             std::int64_t top_k, std::int64_t hidden, float* y, cudaStream_t stream);
cudaError_t moe_combine_cuda(const bfloat16* src, const std::int64_t* dest_row, const float* weights,
                             std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, bfloat16* y,
                             cudaStream_t stream);
cudaError_t moe_combine_gate_grad_cuda(const float* grad_y, const float* src, const std::int64_t* dest_row,
                                       std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, float* grad_w,
                                       cudaStream_t stream);
cudaError_t moe_combine_gate_grad_cuda(const bfloat16* grad_y, const bfloat16* src, const std::int64_t* dest_row,
                                       std::int64_t tokens, std::int64_t top_k, std::int64_t hidden, float* grad_w,
                                       cudaStream_t stream);

// One launch each, whatever E; segment bounds are read from offsets on the
// device. The bf16 forms stage tiles in float (shared memory) and accumulate
// in float: plain FMA, not tensor cores.
cudaError_t moe_grouped_gemm_nt_cuda(const float* A, const float* B, const std::int64_t* offsets, std::int64_t rows,
                                     std::int64_t experts, std::int64_t N, std::int64_t K, float* C,
                                     cudaStream_t stream);
cudaError_t moe_grouped_gemm_nt_cuda(const bfloat16* A, const bfloat16* B, const std::int64_t* offsets,
                                     std::int64_t rows, std::int64_t experts, std::int64_t N, std::int64_t K,
                                     bfloat16* C, cudaStream_t stream);
cudaError_t moe_grouped_gemm_nn_cuda(const float* A, const float* B, const std::int64_t* offsets, std::int64_t rows,
                                     std::int64_t experts, std::int64_t N, std::int64_t K, float* C,
                                     cudaStream_t stream);
cudaError_t moe_grouped_gemm_nn_cuda(const bfloat16* A, const bfloat16* B, const std::int64_t* offsets,
                                     std::int64_t rows, std::int64_t experts, std::int64_t N, std::int64_t K,
                                     bfloat16* C, cudaStream_t stream);
cudaError_t moe_grouped_gemm_tn_cuda(const float* A, const float* X, const std::int64_t* offsets, std::int64_t rows,
                                     std::int64_t experts, std::int64_t N, std::int64_t K, float* C,
                                     cudaStream_t stream);
cudaError_t moe_grouped_gemm_tn_cuda(const bfloat16* A, const bfloat16* X, const std::int64_t* offsets,
                                     std::int64_t rows, std::int64_t experts, std::int64_t N, std::int64_t K,
                                     bfloat16* C, cudaStream_t stream);
#endif

}  // namespace moerl::kernels
