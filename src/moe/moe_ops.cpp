// LibTorch adapters and autograd Functions of the MoE operators. Each adapter
// checks dims, dtype, device and contiguity, dispatches on dtype and makes one
// launcher call into moerl_kernels (CUDA) or splits work across threads with
// at::parallel_for (CPU).
//
// Dtypes: activations float or bfloat16 (CPU and CUDA) or double (CPU only,
// for gradient checks). Gates and gate gradients are in the accumulation
// dtype (float for bf16 activations, see accum_dtype), so the router's float32
// gates are never rounded to bf16.

#include "moerl/moe/moe_ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "moerl/moe/buffer_pool.h"
#include "moerl_kernels/moe.h"

// Torch's own CUDA API (current stream, device guard) exists only when the
// LibTorch we build against was built with CUDA; its generated CUDA macro
// header is the marker. Debian's CPU-only LibTorch ships c10/cuda headers but
// not that one. Without it CUDA tensors cannot exist, and the default stream
// is used for the (then unreachable) CUDA branch.
#if defined(MOERL_WITH_CUDA) && __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#define MOERL_MOE_TORCH_CUDA 1
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace moerl::moe {
namespace {

namespace k = moerl::kernels;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_int64_vector(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined() && t.scalar_type() == torch::kInt64 && t.is_contiguous(), "moe: ", name,
              " must be a contiguous int64 tensor");
}

void check_rows(const torch::Tensor& t, const char* name, std::int64_t rows) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows, "moe: ", name, " must be [", rows, ", H], got ", t.sizes());
  TORCH_CHECK(
      t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble || t.scalar_type() == torch::kBFloat16,
      "moe: ", name, " must be float, double or bfloat16, got ", t.scalar_type());
}

// LibTorch's element type -> the kernels' (the same bits: c10::BFloat16 and
// moerl::kernels::bfloat16 both hold the upper half of an IEEE float).
template <typename T>
struct KernelScalar {
  using type = T;
};
template <>
struct KernelScalar<at::BFloat16> {
  using type = k::bfloat16;
};
template <typename T>
using kernel_t = typename KernelScalar<T>::type;
static_assert(sizeof(at::BFloat16) == sizeof(k::bfloat16), "bf16 layouts differ");

bool is_bf16(const torch::Tensor& t) { return t.scalar_type() == torch::kBFloat16; }

torch::ScalarType accum_dtype(torch::ScalarType activations) {
  return activations == torch::kBFloat16 ? torch::kFloat : activations;
}

template <typename T>
kernel_t<T>* kdata(const torch::Tensor& t) {
  return reinterpret_cast<kernel_t<T>*>(t.data_ptr<T>());
}

#ifdef MOERL_WITH_CUDA
void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "moe: CUDA ", what, " failed: ", cudaGetErrorString(err));
}

cudaStream_t stream_of(const torch::Tensor& t) {
#ifdef MOERL_MOE_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
  (void)t;
  return nullptr;  // legacy default stream
#endif
}

void check_cuda_dtype(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16, "moe: CUDA ", name,
              " must be float32 or bfloat16, got ", t.scalar_type());
}

// Makes t's device current for the launches of this scope.
struct DeviceScope {
#ifdef MOERL_MOE_TORCH_CUDA
  explicit DeviceScope(const torch::Tensor& t) : guard(t.device()) {}
  c10::cuda::CUDAGuard guard;
#else
  explicit DeviceScope(const torch::Tensor&) {}
#endif
};
#endif

#ifndef MOERL_WITH_CUDA
[[noreturn]] void no_cuda_build(const char* op) {
  TORCH_CHECK(false, "moe: ", op, " got a CUDA tensor but moerl was built without CUDA kernels");
}
#endif

// Grain for row-parallel loops: enough work per chunk to amortise a task.
std::int64_t row_grain(std::int64_t hidden) {
  return std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(hidden, 1));
}

// ---- raw launches (no autograd) -------------------------------------------

// out[r] = w[row_source[r]] * x[row_source[r]/k]
torch::Tensor gather_rows(const torch::Tensor& x, const torch::Tensor& row_source, const torch::Tensor& weights,
                          std::int64_t top_k) {
  const std::int64_t tokens = x.size(0), hidden = x.size(1), rows = row_source.size(0);
  auto out = pooled_empty({rows, hidden}, x.options());
  if (rows == 0 || hidden == 0) return out.zero_();
  if (x.is_cuda()) {
#ifdef MOERL_WITH_CUDA
    check_cuda_dtype(x, "dispatch input");
    DeviceScope scope(x);
    const std::int64_t* src = row_source.data_ptr<std::int64_t>();
    const float* wp = weights.defined() ? weights.data_ptr<float>() : nullptr;
    check_cuda(is_bf16(x) ? k::moe_dispatch_cuda(kdata<at::BFloat16>(x), src, wp, tokens, top_k, hidden, rows,
                                                 kdata<at::BFloat16>(out), stream_of(x))
                          : k::moe_dispatch_cuda(x.data_ptr<float>(), src, wp, tokens, top_k, hidden, rows,
                                                 out.data_ptr<float>(), stream_of(x)),
               "moe_dispatch");
    return out;
#else
    no_cuda_build("dispatch");
#endif
  }
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, x.scalar_type(), "moe_gather_rows", [&] {
    using kt = kernel_t<scalar_t>;
    using acc_t = k::accum_t<kt>;
    const kt* xp = kdata<scalar_t>(x);
    const std::int64_t* src = row_source.data_ptr<std::int64_t>();
    const acc_t* wp = weights.defined() ? weights.data_ptr<acc_t>() : nullptr;
    kt* op = kdata<scalar_t>(out);
    at::parallel_for(0, rows, row_grain(hidden), [&](std::int64_t b, std::int64_t e) {
      k::moe_dispatch_cpu<kt>(xp, src + b, wp, tokens, top_k, hidden, e - b, op + b * hidden);
    });
  });
  return out;
}

// y[t] = sum_j w[t*k+j] * src[dest_row[t*k+j]]
torch::Tensor scatter_sum(const torch::Tensor& src, const torch::Tensor& dest_row, const torch::Tensor& weights,
                          std::int64_t tokens, std::int64_t top_k) {
  const std::int64_t hidden = src.size(1);
  auto y = pooled_empty({tokens, hidden}, src.options());
  if (tokens == 0 || hidden == 0) return y.zero_();
  if (src.is_cuda()) {
#ifdef MOERL_WITH_CUDA
    check_cuda_dtype(src, "combine input");
    DeviceScope scope(src);
    const std::int64_t* dest = dest_row.data_ptr<std::int64_t>();
    const float* wp = weights.defined() ? weights.data_ptr<float>() : nullptr;
    check_cuda(is_bf16(src) ? k::moe_combine_cuda(kdata<at::BFloat16>(src), dest, wp, tokens, top_k, hidden,
                                                  kdata<at::BFloat16>(y), stream_of(src))
                            : k::moe_combine_cuda(src.data_ptr<float>(), dest, wp, tokens, top_k, hidden,
                                                  y.data_ptr<float>(), stream_of(src)),
               "moe_combine");
    return y;
#else
    no_cuda_build("combine");
#endif
  }
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, src.scalar_type(), "moe_scatter_sum", [&] {
    using kt = kernel_t<scalar_t>;
    using acc_t = k::accum_t<kt>;
    const kt* sp = kdata<scalar_t>(src);
    const std::int64_t* dest = dest_row.data_ptr<std::int64_t>();
    const acc_t* wp = weights.defined() ? weights.data_ptr<acc_t>() : nullptr;
    kt* yp = kdata<scalar_t>(y);
    at::parallel_for(0, tokens, row_grain(hidden * top_k), [&](std::int64_t b, std::int64_t e) {
      k::moe_combine_cpu<kt>(sp, dest + b * top_k, wp ? wp + b * top_k : nullptr, e - b, top_k, hidden,
                             yp + b * hidden);
    });
  });
  return y;
}

// grad_w[a] = <grad_y[a/k], src[dest_row[a]]>, in the accumulation dtype.
torch::Tensor gate_grad(const torch::Tensor& grad_y, const torch::Tensor& src, const torch::Tensor& dest_row,
                        std::int64_t top_k) {
  const std::int64_t tokens = grad_y.size(0), hidden = grad_y.size(1);
  TORCH_CHECK(grad_y.scalar_type() == src.scalar_type(), "moe: combine gradient dtype ", grad_y.scalar_type(),
              " != expert output dtype ", src.scalar_type());
  auto grad_w = torch::empty({tokens, top_k}, grad_y.options().dtype(accum_dtype(grad_y.scalar_type())));
  if (tokens == 0 || top_k == 0) return grad_w;
  if (grad_y.is_cuda()) {
#ifdef MOERL_WITH_CUDA
    check_cuda_dtype(grad_y, "combine gradient");
    DeviceScope scope(grad_y);
    const std::int64_t* dest = dest_row.data_ptr<std::int64_t>();
    float* wp = grad_w.data_ptr<float>();
    check_cuda(is_bf16(grad_y) ? k::moe_combine_gate_grad_cuda(kdata<at::BFloat16>(grad_y), kdata<at::BFloat16>(src),
                                                               dest, tokens, top_k, hidden, wp, stream_of(grad_y))
                               : k::moe_combine_gate_grad_cuda(grad_y.data_ptr<float>(), src.data_ptr<float>(), dest,
                                                               tokens, top_k, hidden, wp, stream_of(grad_y)),
               "moe_combine_gate_grad");
    return grad_w;
#else
    no_cuda_build("combine backward");
#endif
  }
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, grad_y.scalar_type(), "moe_gate_grad", [&] {
    using kt = kernel_t<scalar_t>;
    using acc_t = k::accum_t<kt>;
    const kt* gp = kdata<scalar_t>(grad_y);
    const kt* sp = kdata<scalar_t>(src);
    const std::int64_t* dest = dest_row.data_ptr<std::int64_t>();
    acc_t* wp = grad_w.data_ptr<acc_t>();
    at::parallel_for(0, tokens, row_grain(hidden * top_k), [&](std::int64_t b, std::int64_t e) {
      k::moe_combine_gate_grad_cpu<kt>(gp + b * hidden, sp, dest + b * top_k, e - b, top_k, hidden, wp + b * top_k);
    });
  });
  return grad_w;
}

// ---- autograd Functions ---------------------------------------------------

class DispatchFunction : public torch::autograd::Function<DispatchFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& dest_row,
                               const torch::Tensor& row_source, std::int64_t top_k) {
    ctx->save_for_backward({dest_row});
    ctx->saved_data["top_k"] = top_k;
    ctx->saved_data["tokens"] = x.size(0);
    return gather_rows(x, row_source, torch::Tensor(), top_k);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::int64_t top_k = ctx->saved_data["top_k"].toInt();
    const std::int64_t tokens = ctx->saved_data["tokens"].toInt();
    auto grad_x = scatter_sum(grads[0].contiguous(), saved[0], torch::Tensor(), tokens, top_k);
    return {grad_x, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class CombineFunction : public torch::autograd::Function<CombineFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& expert_out, const torch::Tensor& gates,
                               const torch::Tensor& dest_row, const torch::Tensor& row_source) {
    ctx->save_for_backward({expert_out, gates, dest_row, row_source});
    const std::int64_t tokens = gates.size(0), top_k = gates.size(1);
    return scatter_sum(expert_out, dest_row, gates, tokens, top_k);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& expert_out = saved[0];
    const auto& gates = saved[1];
    const std::int64_t top_k = gates.size(1);
    auto grad_y = grads[0].contiguous();
    torch::Tensor grad_out, grad_gates;
    if (ctx->needs_input_grad(0)) grad_out = gather_rows(grad_y, saved[3], gates, top_k);
    if (ctx->needs_input_grad(1)) grad_gates = gate_grad(grad_y, expert_out, saved[2], top_k);
    return {grad_out, grad_gates, torch::Tensor(), torch::Tensor()};
  }
};

// CPU grouped SwiGLU. Work items are (expert, row block) for the forward; the
// backward goes per expert because the weight gradients of one expert sum
// over all its rows (one writer per expert, no atomics, deterministic).
struct Segment {
  std::int64_t expert, begin, end;
};

std::vector<Segment> cpu_segments(const torch::Tensor& offsets, std::int64_t experts, std::int64_t block_rows) {
  const std::int64_t* off = offsets.data_ptr<std::int64_t>();
  std::vector<Segment> out;
  for (std::int64_t e = 0; e < experts; ++e) {
    for (std::int64_t b = off[e]; b < off[e + 1]; b += block_rows) {
      out.push_back({e, b, std::min(off[e + 1], b + block_rows)});
    }
  }
  return out;
}

struct SwiGluActivations {
  torch::Tensor gu, act, out;  // [rows,2D] gate pre-activation | up, [rows,D], [rows,H]
};

SwiGluActivations swiglu_forward_cpu(const torch::Tensor& x, const torch::Tensor& wg, const torch::Tensor& wu,
                                     const torch::Tensor& wd, const torch::Tensor& offsets, std::int64_t experts) {
  const std::int64_t rows = x.size(0), hidden = x.size(1), d_expert = wg.size(1);
  SwiGluActivations a;
  // Rows inside segments are all overwritten below; only rows past the last
  // segment need zeros (in the output; the saved activations there are unused).
  const std::int64_t used = offsets.data_ptr<std::int64_t>()[experts];
  a.gu = pooled_empty({rows, 2 * d_expert}, x.options());
  a.act = pooled_empty({rows, d_expert}, x.options());
  a.out = pooled_empty({rows, hidden}, x.options());
  a.out.narrow(0, used, rows - used).zero_();
  // Split segments into row blocks only as far as the threads need items:
  // every extra block re-packs the expert's weights inside BLAS. Blocks stay
  // >= 128 rows so each GEMM remains efficient.
  const std::int64_t threads = at::get_num_threads();
  const std::int64_t block_rows = threads <= 1 ? std::max<std::int64_t>(rows, 1)
                                               : std::max<std::int64_t>(128, (used + 4 * threads - 1) / (4 * threads));
  const auto segs = cpu_segments(offsets, experts, block_rows);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "moe_swiglu_fwd", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wgp = wg.data_ptr<scalar_t>();
    const scalar_t* wup = wu.data_ptr<scalar_t>();
    const scalar_t* wdp = wd.data_ptr<scalar_t>();
    scalar_t* gup = a.gu.data_ptr<scalar_t>();
    scalar_t* hp = a.act.data_ptr<scalar_t>();
    scalar_t* yp = a.out.data_ptr<scalar_t>();
    const std::int64_t w_in = d_expert * hidden;  // one expert's slice of each weight
    at::parallel_for(0, static_cast<std::int64_t>(segs.size()), 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        const Segment& s = segs[i];
        k::moe_swiglu_forward_rows_cpu<scalar_t>(
            xp + s.begin * hidden, wgp + s.expert * w_in, wup + s.expert * w_in, wdp + s.expert * w_in, s.end - s.begin,
            hidden, d_expert, gup + s.begin * 2 * d_expert, hp + s.begin * d_expert, yp + s.begin * hidden);
      }
    });
  });
  return a;
}

struct SwiGluGrads {
  torch::Tensor dx, dwg, dwu, dwd;
};

// One work item per expert: its weight gradients sum over all its rows, so
// one writer per expert needs no atomics and stays deterministic.
SwiGluGrads swiglu_backward_cpu(const torch::Tensor& x, const torch::Tensor& wg, const torch::Tensor& wu,
                                const torch::Tensor& wd, const torch::Tensor& offsets, const torch::Tensor& gu,
                                const torch::Tensor& h, const torch::Tensor& dy) {
  const std::int64_t experts = wg.size(0), rows = x.size(0), hidden = x.size(1), d_expert = wg.size(1);
  const auto* off = offsets.data_ptr<std::int64_t>();
  SwiGluGrads g;
  g.dx = pooled_empty({rows, hidden}, x.options());
  g.dx.narrow(0, off[experts], rows - off[experts]).zero_();
  g.dwg = pooled_empty(wg.sizes(), wg.options());
  g.dwu = pooled_empty(wu.sizes(), wu.options());
  g.dwd = pooled_empty(wd.sizes(), wd.options());
  std::int64_t max_rows = 0;
  for (std::int64_t e = 0; e < experts; ++e) max_rows = std::max(max_rows, off[e + 1] - off[e]);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "moe_swiglu_bwd", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* gup = gu.data_ptr<scalar_t>();
    const scalar_t* hp = h.data_ptr<scalar_t>();
    const scalar_t* dyp = dy.data_ptr<scalar_t>();
    const scalar_t* wgp = wg.data_ptr<scalar_t>();
    const scalar_t* wup = wu.data_ptr<scalar_t>();
    const scalar_t* wdp = wd.data_ptr<scalar_t>();
    scalar_t* dxp = g.dx.data_ptr<scalar_t>();
    scalar_t* dwgp = g.dwg.data_ptr<scalar_t>();
    scalar_t* dwup = g.dwu.data_ptr<scalar_t>();
    scalar_t* dwdp = g.dwd.data_ptr<scalar_t>();
    const std::int64_t w_in = d_expert * hidden;
    at::parallel_for(0, experts, 1, [&](std::int64_t b, std::int64_t e) {
      // [dG | dU] of the largest segment, reused for each expert of this chunk.
      std::vector<scalar_t> scratch(static_cast<std::size_t>(max_rows * 2 * d_expert));
      for (std::int64_t ex = b; ex < e; ++ex) {
        const std::int64_t r0 = off[ex];
        k::moe_swiglu_backward_rows_cpu<scalar_t>(xp + r0 * hidden, gup + r0 * 2 * d_expert, hp + r0 * d_expert,
                                                  dyp + r0 * hidden, wgp + ex * w_in, wup + ex * w_in, wdp + ex * w_in,
                                                  off[ex + 1] - r0, hidden, d_expert, scratch.data(), dxp + r0 * hidden,
                                                  dwgp + ex * w_in, dwup + ex * w_in, dwdp + ex * w_in);
      }
    });
  });
  return g;
}

#ifdef MOERL_WITH_CUDA
torch::Tensor gemm_cuda(char form, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& offsets,
                        std::int64_t experts, std::int64_t n, std::int64_t kdim) {
  const std::int64_t rows = a.size(0);
  const auto* off = offsets.data_ptr<std::int64_t>();
  cudaStream_t stream = stream_of(a);
  check_cuda_dtype(a, "grouped GEMM operand");
  TORCH_CHECK(b.scalar_type() == a.scalar_type(), "moe: grouped GEMM operands differ in dtype: ", a.scalar_type(),
              " and ", b.scalar_type());
  torch::Tensor c;
  if (form == 't') {
    c = torch::empty({experts, n, kdim}, a.options());
  } else if (form == 'f') {  // forward: C [rows,N] = A [rows,K] B[e]^T
    c = torch::empty({rows, n}, a.options());
  } else {  // 'n': C [rows,K] = A [rows,N] B[e]
    c = torch::empty({rows, kdim}, a.options());
  }
  // One launcher per form; T is float or k::bfloat16 (float accumulation in both).
  auto launch = [&](auto* ap, auto* bp, auto* cp) {
    if (form == 't') return k::moe_grouped_gemm_tn_cuda(ap, bp, off, rows, experts, n, kdim, cp, stream);
    if (form == 'f') return k::moe_grouped_gemm_nt_cuda(ap, bp, off, rows, experts, n, kdim, cp, stream);
    return k::moe_grouped_gemm_nn_cuda(ap, bp, off, rows, experts, n, kdim, cp, stream);
  };
  const cudaError_t err = is_bf16(a)
                              ? launch(static_cast<const k::bfloat16*>(kdata<at::BFloat16>(a)),
                                       static_cast<const k::bfloat16*>(kdata<at::BFloat16>(b)), kdata<at::BFloat16>(c))
                              : launch(static_cast<const float*>(a.data_ptr<float>()),
                                       static_cast<const float*>(b.data_ptr<float>()), c.data_ptr<float>());
  check_cuda(err, "moe_grouped_gemm");
  return c;
}
#endif

class GroupedSwiGluFunction : public torch::autograd::Function<GroupedSwiGluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& wg,
                               const torch::Tensor& wu, const torch::Tensor& wd, const torch::Tensor& offsets) {
    const std::int64_t experts = wg.size(0);
    torch::Tensor g, u, h, y;
    if (x.is_cuda()) {
#ifdef MOERL_WITH_CUDA
      DeviceScope scope(x);
      const std::int64_t hidden = x.size(1), d_expert = wg.size(1);
      g = gemm_cuda('f', x, wg, offsets, experts, d_expert, hidden);
      u = gemm_cuda('f', x, wu, offsets, experts, d_expert, hidden);
      // bf16: the SwiGLU in float, rounded once (not once per elementwise op).
      h = is_bf16(x) ? (torch::silu(g.to(torch::kFloat)) * u.to(torch::kFloat)).to(torch::kBFloat16)
                     : torch::silu(g) * u;
      y = gemm_cuda('f', h, wd, offsets, experts, hidden, d_expert);
#else
      no_cuda_build("grouped_swiglu");
#endif
    } else if (is_bf16(x)) {
      // bf16 on CPU: BLAS has no bf16 GEMM, so the expert compute runs in
      // float on widened copies (float accumulation, as on CUDA) and only the
      // output is rounded to bf16. The saved [G | U] and H stay float.
      const auto f = torch::kFloat;
      auto a = swiglu_forward_cpu(x.to(f), wg.to(f), wu.to(f), wd.to(f), offsets, experts);
      g = a.gu, h = a.act, y = a.out.to(torch::kBFloat16);
    } else {
      // CPU saves [G | U] in one buffer as g; u stays undefined.
      auto a = swiglu_forward_cpu(x, wg, wu, wd, offsets, experts);
      g = a.gu, h = a.act, y = a.out;
    }
    ctx->save_for_backward({x, wg, wu, wd, offsets, g, u, h});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto &x = s[0], &wg = s[1], &wu = s[2], &wd = s[3], &offsets = s[4];
    const auto &g = s[5], &u = s[6], &h = s[7];
    auto dy = grads[0].contiguous();
    torch::Tensor dx, dwg, dwu, dwd;
    if (x.is_cuda()) {
#ifdef MOERL_WITH_CUDA
      DeviceScope scope(x);
      const std::int64_t experts = wg.size(0), hidden = x.size(1), d_expert = wg.size(1);
      auto dh = gemm_cuda('n', dy, wd, offsets, experts, hidden, d_expert);
      // The SwiGLU's backward in float for bf16, rounded once per output.
      const auto f = is_bf16(x) ? torch::kFloat : x.scalar_type();
      auto gf = g.to(f), uf = u.to(f), dhf = dh.to(f);
      auto sig = torch::sigmoid(gf);
      auto du = (dhf * gf * sig).to(x.scalar_type()).contiguous();
      auto dg = (dhf * uf * sig * (1 + gf * (1 - sig))).to(x.scalar_type()).contiguous();
      dwd = gemm_cuda('t', dy, h, offsets, experts, hidden, d_expert);
      dx = gemm_cuda('n', dg, wg, offsets, experts, d_expert, hidden);
      dx.add_(gemm_cuda('n', du, wu, offsets, experts, d_expert, hidden));
      dwg = gemm_cuda('t', dg, x, offsets, experts, d_expert, hidden);
      dwu = gemm_cuda('t', du, x, offsets, experts, d_expert, hidden);
#else
      no_cuda_build("grouped_swiglu backward");
#endif
    } else if (is_bf16(x)) {
      // As in the forward: float compute on widened copies (g and h were saved
      // in float), each gradient rounded to bf16 once.
      const auto f = torch::kFloat, b = torch::kBFloat16;
      auto r = swiglu_backward_cpu(x.to(f), wg.to(f), wu.to(f), wd.to(f), offsets, g, h, dy.to(f));
      dx = r.dx.to(b), dwg = r.dwg.to(b), dwu = r.dwu.to(b), dwd = r.dwd.to(b);
    } else {
      auto r = swiglu_backward_cpu(x, wg, wu, wd, offsets, g, h, dy);
      dx = r.dx, dwg = r.dwg, dwu = r.dwu, dwd = r.dwd;
    }
    return {dx, dwg, dwu, dwd, torch::Tensor()};
  }
};

}  // namespace

// ---- public operators -----------------------------------------------------

RoutePlan make_route_plan(const torch::Tensor& expert_indices, std::int64_t experts, std::int64_t capacity,
                          std::int64_t block_size) {
  TORCH_CHECK(expert_indices.dim() == 2, "moe: expert_indices must be [T,k], got ", expert_indices.sizes());
  TORCH_CHECK(expert_indices.scalar_type() == torch::kInt64, "moe: expert_indices must be int64");
  TORCH_CHECK(experts > 0 && block_size >= 1, "moe: need experts > 0 and block_size >= 1");
  auto idx = expert_indices.contiguous();
  RoutePlan p;
  p.tokens = idx.size(0);
  p.top_k = idx.size(1);
  p.experts = experts;
  p.rows = k::moe_permuted_rows(p.tokens, p.top_k, experts, block_size);
  auto opts = idx.options();
  p.routed = torch::empty({experts}, opts);
  p.counts = torch::empty({experts}, opts);
  p.offsets = torch::empty({experts + 1}, opts);
  p.dest_row = torch::empty({p.tokens * p.top_k}, opts);
  p.row_source = torch::empty({p.rows}, opts);
  p.dropped = torch::empty({1}, opts);
  if (idx.is_cuda()) {
#ifdef MOERL_WITH_CUDA
    DeviceScope scope(idx);
    auto ws = torch::empty({static_cast<std::int64_t>(k::moe_plan_workspace_bytes(p.tokens, p.top_k, experts))},
                           idx.options().dtype(torch::kUInt8));
    check_cuda(k::moe_plan_cuda(idx.data_ptr<std::int64_t>(), p.tokens, p.top_k, experts, capacity, block_size,
                                p.routed.data_ptr<std::int64_t>(), p.counts.data_ptr<std::int64_t>(),
                                p.offsets.data_ptr<std::int64_t>(), p.dest_row.data_ptr<std::int64_t>(),
                                p.row_source.data_ptr<std::int64_t>(), p.dropped.data_ptr<std::int64_t>(),
                                ws.data_ptr(), stream_of(idx)),
               "moe_plan");
#else
    no_cuda_build("make_route_plan");
#endif
  } else {
    const auto* ip = idx.data_ptr<std::int64_t>();
    for (std::int64_t a = 0; a < p.tokens * p.top_k; ++a) {
      TORCH_CHECK(ip[a] >= 0 && ip[a] < experts, "moe: expert index ", ip[a], " at ", a, " outside [0, ", experts, ")");
    }
    k::moe_plan_cpu(ip, p.tokens, p.top_k, experts, capacity, block_size, p.routed.data_ptr<std::int64_t>(),
                    p.counts.data_ptr<std::int64_t>(), p.offsets.data_ptr<std::int64_t>(),
                    p.dest_row.data_ptr<std::int64_t>(), p.row_source.data_ptr<std::int64_t>(),
                    p.dropped.data_ptr<std::int64_t>());
  }
  return p;
}

RouteResult route(const torch::Tensor& logits, const config::MoeSection& moe, const torch::Tensor& forced_experts,
                  bool with_losses) {
  TORCH_CHECK(logits.dim() == 2, "moe: router logits must be [T,E], got ", logits.sizes());
  const std::int64_t tokens = logits.size(0), experts = logits.size(1), top_k = moe.top_k;
  TORCH_CHECK(top_k >= 1 && top_k <= experts, "moe: top_k=", top_k, " must be in [1, ", experts, "]");
  RouteResult r;
  const bool forced = forced_experts.defined();
  if (forced) {
    TORCH_CHECK(forced_experts.dim() == 2 && forced_experts.size(0) == tokens && forced_experts.size(1) == top_k,
                "moe: forced_experts must be [", tokens, ", ", top_k, "], got ", forced_experts.sizes());
    r.expert_indices = forced_experts.to(logits.device(), torch::kInt64).contiguous();
  }
  // Router math in at least float32 so that half-precision models route stably.
  auto lg = logits.scalar_type() == torch::kDouble ? logits : logits.to(torch::kFloat);
  auto probs = torch::softmax(lg, -1);  // [T,E]
  if (moe.router == config::RouterMode::SoftmaxThenTopK) {
    if (!forced) r.expert_indices = std::get<1>(torch::topk(probs.detach(), top_k, -1));
    r.gates = probs.gather(1, r.expert_indices);
    if (moe.renormalize) r.gates = r.gates / r.gates.sum(-1, true).clamp_min(1e-20);
  } else {
    if (!forced) r.expert_indices = std::get<1>(torch::topk(lg.detach(), top_k, -1));
    r.gates = torch::softmax(lg.gather(1, r.expert_indices), -1);
  }
  // Gates stay in the router's dtype (float32 for bf16 logits): combine
  // weights bf16 expert rows with float gates, and the gate gradient is a
  // float sum (moe_ops.h).
  r.gates = r.gates.contiguous();
  if (!with_losses) return r;
  if (tokens == 0) {
    r.balance_loss = torch::zeros({}, lg.options());
    r.z_loss = torch::zeros({}, lg.options());
    return r;
  }
  // f_e: share of assignments per expert (no gradient, as in Switch/GShard).
  auto load = torch::zeros({experts}, lg.options())
                  .scatter_add_(0, r.expert_indices.reshape({-1}), torch::ones({tokens * top_k}, lg.options()));
  auto f = load / static_cast<double>(tokens * top_k);
  r.balance_loss = static_cast<double>(experts) * (f * probs.mean(0)).sum();
  r.z_loss = torch::logsumexp(lg, -1).pow(2).mean();
  return r;
}

torch::Tensor dispatch(const torch::Tensor& x, const RoutePlan& plan) {
  check_rows(x, "dispatch input", plan.tokens);
  check_int64_vector(plan.row_source, "row_source");
  TORCH_CHECK(x.device() == plan.row_source.device(), "moe: dispatch input on ", x.device(), " but plan on ",
              plan.row_source.device());
  return DispatchFunction::apply(x.contiguous(), plan.dest_row, plan.row_source, plan.top_k);
}

torch::Tensor grouped_swiglu(const torch::Tensor& x, const torch::Tensor& w_gate, const torch::Tensor& w_up,
                             const torch::Tensor& w_down, const RoutePlan& plan) {
  check_rows(x, "grouped_swiglu input", plan.rows);
  const std::int64_t hidden = x.size(1);
  TORCH_CHECK(w_gate.dim() == 3 && w_gate.size(0) == plan.experts && w_gate.size(2) == hidden,
              "moe: w_gate must be [E=", plan.experts, ", D, H=", hidden, "], got ", w_gate.sizes());
  const std::int64_t d_expert = w_gate.size(1);
  TORCH_CHECK(w_up.sizes() == w_gate.sizes(), "moe: w_up ", w_up.sizes(), " != w_gate ", w_gate.sizes());
  TORCH_CHECK(
      w_down.dim() == 3 && w_down.size(0) == plan.experts && w_down.size(1) == hidden && w_down.size(2) == d_expert,
      "moe: w_down must be [", plan.experts, ", ", hidden, ", ", d_expert, "], got ", w_down.sizes());
  for (const auto* w : {&w_gate, &w_up, &w_down}) {
    TORCH_CHECK(w->scalar_type() == x.scalar_type() && w->device() == x.device(),
                "moe: expert weights must match the input's dtype and device");
  }
  return GroupedSwiGluFunction::apply(x.contiguous(), w_gate.contiguous(), w_up.contiguous(), w_down.contiguous(),
                                      plan.offsets);
}

torch::Tensor combine(const torch::Tensor& expert_out, const torch::Tensor& gates, const RoutePlan& plan) {
  check_rows(expert_out, "combine input", plan.rows);
  TORCH_CHECK(gates.dim() == 2 && gates.size(0) == plan.tokens && gates.size(1) == plan.top_k, "moe: gates must be [",
              plan.tokens, ", ", plan.top_k, "], got ", gates.sizes());
  // bf16 rows take float gates (the router's own); bf16 gates are widened
  // here (differentiably), so a caller may pass either.
  const auto gate_dtype = accum_dtype(expert_out.scalar_type());
  const torch::Tensor g = is_bf16(expert_out) && is_bf16(gates) ? gates.to(gate_dtype) : gates;
  TORCH_CHECK(g.scalar_type() == gate_dtype, "moe: gates must be ", gate_dtype, " for ", expert_out.scalar_type(),
              " expert output, got ", gates.scalar_type());
  TORCH_CHECK(g.device() == expert_out.device(), "moe: gates on ", g.device(), " but expert output on ",
              expert_out.device());
  return CombineFunction::apply(expert_out.contiguous(), g.contiguous(), plan.dest_row, plan.row_source);
}

}  // namespace moerl::moe
