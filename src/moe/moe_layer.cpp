// The MoE feed-forward module and its per-expert-loop reference.

#include "moerl/moe/moe_layer.h"

#include <algorithm>
#include <cmath>

#include "moerl/moe/moe_ops.h"

namespace moerl::moe {
namespace {

// Down projections are scaled by 1/sqrt(2*num_layers): each layer adds two
// residual branches, and this keeps the residual stream's variance flat at
// init (GPT-2 style), which small models need to train stably.
double down_std(const config::ModelSection& model) {
  return model.init_std / std::sqrt(2.0 * static_cast<double>(std::max<std::int64_t>(model.num_layers, 1)));
}

torch::Tensor swiglu(const torch::Tensor& x, const torch::Tensor& wg, const torch::Tensor& wu,
                     const torch::Tensor& wd) {
  return torch::matmul(torch::silu(torch::matmul(x, wg.t())) * torch::matmul(x, wu.t()), wd.t());
}

RouterStats stats_from_loads(std::vector<std::int64_t> loads, std::int64_t dropped) {
  RouterStats s;
  s.tokens_per_expert = std::move(loads);
  s.dropped_tokens = dropped;
  double total = 0, max_load = 0;
  for (auto v : s.tokens_per_expert) {
    total += static_cast<double>(v);
    max_load = std::max(max_load, static_cast<double>(v));
  }
  const auto experts = static_cast<double>(s.tokens_per_expert.size());
  if (total > 0) {
    s.imbalance = max_load / (total / experts);
    for (auto v : s.tokens_per_expert) {
      if (v > 0) {
        const double p = static_cast<double>(v) / total;
        s.load_entropy -= p * std::log(p);
      }
    }
  }
  return s;
}

std::vector<std::int64_t> to_vector(const torch::Tensor& t) {
  auto c = t.to(torch::kCPU, torch::kInt64).contiguous();
  const auto* p = c.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(p, p + c.numel());
}

void check_input(const torch::Tensor& x, std::int64_t d_model) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == d_model, "moe: input must be [T, d_model=", d_model, "], got ", x.sizes());
}

// w in dtype: a differentiable cast (its backward returns the gradient in w's
// own dtype, e.g. float32 for float32 master weights), or w itself.
torch::Tensor as_dtype(const torch::Tensor& w, torch::ScalarType dtype) {
  return w.scalar_type() == dtype ? w : w.to(dtype);
}

// float32 for a bf16 compute dtype, else the compute dtype itself. The
// router computes in it: its logits are a [T,H]x[H,E] product, cheap next to
// the experts, and in float32 they do not flip near-tied expert choices the
// way bf16 rounding would, so bf16 activations route as float32 ones on the
// same values do. The aux loss is a loss term and is kept in it too.
torch::ScalarType at_least_float(torch::ScalarType compute) {
  return compute == torch::kBFloat16 ? torch::kFloat : compute;
}

}  // namespace

std::int64_t expert_capacity(const config::MoeSection& moe, std::int64_t num_tokens) {
  if (moe.capacity_factor <= 0) return -1;
  return static_cast<std::int64_t>(std::ceil(moe.capacity_factor * static_cast<double>(num_tokens) *
                                             static_cast<double>(moe.top_k) / static_cast<double>(moe.num_experts)));
}

MoeExpertsImpl::MoeExpertsImpl(std::int64_t num_experts, std::int64_t d_model, std::int64_t d_expert) {
  gate_proj = register_parameter("gate_proj", torch::empty({num_experts, d_expert, d_model}));
  up_proj = register_parameter("up_proj", torch::empty({num_experts, d_expert, d_model}));
  down_proj = register_parameter("down_proj", torch::empty({num_experts, d_model, d_expert}));
}

SwiGluImpl::SwiGluImpl(std::int64_t d_model, std::int64_t d_hidden) {
  auto lin = [](std::int64_t in, std::int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  gate_proj = register_module("gate_proj", lin(d_model, d_hidden));
  up_proj = register_module("up_proj", lin(d_model, d_hidden));
  down_proj = register_module("down_proj", lin(d_hidden, d_model));
}

torch::Tensor SwiGluImpl::forward(const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  const auto dt = x.scalar_type();
  auto lin = [&](const torch::nn::Linear& l, const torch::Tensor& v) { return F::linear(v, as_dtype(l->weight, dt)); };
  return lin(down_proj, torch::silu(lin(gate_proj, x)) * lin(up_proj, x));
}

MoeFeedForwardImpl::MoeFeedForwardImpl(const config::ModelSection& model, const config::MoeSection& moe,
                                       std::shared_ptr<ExpertExchange> expert_group)
    : moe_(moe), routing_(moe), expert_group_(std::move(expert_group)), d_model_(model.d_model) {
  TORCH_CHECK(moe.num_experts >= 1 && moe.top_k >= 1 && moe.top_k <= moe.num_experts, "moe: need 1 <= top_k (",
              moe.top_k, ") <= num_experts (", moe.num_experts, ")");
  TORCH_CHECK(moe.d_expert >= 1 && model.d_model >= 1, "moe: d_expert and d_model must be >= 1");
  TORCH_CHECK(moe.block_size >= 1, "moe: block_size must be >= 1, got ", moe.block_size);
  shard_ = expert_group_ ? moe::expert_shard(moe.num_experts, expert_group_->rank(), expert_group_->size())
                         : ExpertShard{0, moe.num_experts};
  gate =
      register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(model.d_model, moe.num_experts).bias(false)));
  experts = register_module("experts", MoeExperts(shard_.count, model.d_model, moe.d_expert));
  if (moe.shared_experts > 0) {
    const std::int64_t d_shared = moe.d_shared_expert > 0 ? moe.d_shared_expert : moe.shared_experts * moe.d_expert;
    shared_expert = register_module("shared_expert", SwiGlu(model.d_model, d_shared));
    if (moe.shared_expert_gate) {
      shared_expert_gate = register_module("shared_expert_gate",
                                           torch::nn::Linear(torch::nn::LinearOptions(model.d_model, 1).bias(false)));
    }
  }
  torch::NoGradGuard no_grad;
  const double std_in = model.init_std, std_out = down_std(model);
  gate->weight.normal_(0, std_in);
  // Every member draws the whole layer's experts and keeps its slice.
  normal_expert_share_(experts->gate_proj, shard_, moe.num_experts, std_in);
  normal_expert_share_(experts->up_proj, shard_, moe.num_experts, std_in);
  normal_expert_share_(experts->down_proj, shard_, moe.num_experts, std_out);
  if (shared_expert) {
    shared_expert->gate_proj->weight.normal_(0, std_in);
    shared_expert->up_proj->weight.normal_(0, std_in);
    shared_expert->down_proj->weight.normal_(0, std_out);
  }
  if (shared_expert_gate) shared_expert_gate->weight.normal_(0, std_in);
}

void MoeFeedForwardImpl::set_active_experts(std::int64_t k) {
  TORCH_CHECK(k >= 0 && k <= moe_.num_experts, "moe: active experts must be 0 (moe.top_k = ", moe_.top_k,
              ") or in [1, num_experts = ", moe_.num_experts, "], got ", k);
  routing_.top_k = k == 0 ? moe_.top_k : k;
}

torch::ScalarType moe_compute_dtype(const torch::Tensor& x, const torch::Tensor& weight) {
  const auto a = x.scalar_type(), w = weight.scalar_type();
  if (a == w) return a;
  const bool mixed = (a == torch::kBFloat16 && w == torch::kFloat) || (a == torch::kFloat && w == torch::kBFloat16);
  TORCH_CHECK(mixed, "moe: input dtype ", a, " and parameter dtype ", w,
              " cannot be mixed (mixed precision is float32 with bfloat16)");
  return torch::kBFloat16;
}

torch::Tensor shared_expert_output(MoeFeedForwardImpl& layer, const torch::Tensor& x) {
  torch::Tensor y = layer.shared_expert->forward(x);
  if (layer.shared_expert_gate) {
    namespace F = torch::nn::functional;
    y = torch::sigmoid(F::linear(x, as_dtype(layer.shared_expert_gate->weight, x.scalar_type()))) * y;
  }
  return y;
}

MoeOutput MoeFeedForwardImpl::forward(const torch::Tensor& x_in, const torch::Tensor& forced_experts,
                                      bool with_losses) {
  namespace F = torch::nn::functional;
  check_input(x_in, d_model_);
  const std::int64_t tokens = x_in.size(0);
  const auto dt = moe_compute_dtype(x_in, experts->gate_proj);
  const auto x = as_dtype(x_in, dt);  // [T, d_model]
  const auto rt = at_least_float(dt);
  auto logits = F::linear(as_dtype(x, rt), as_dtype(gate->weight, rt));  // [T,E]
  RouteResult r = route(logits, routing_, forced_experts, with_losses);
  // With an expert group the rows leave in one piece per member: no padding
  // between experts here, the receiving member pads its own (block_size).
  RoutePlan plan = make_route_plan(r.expert_indices, moe_.num_experts, expert_capacity(routing_, tokens),
                                   expert_group_ ? 1 : moe_.block_size);
  auto rows = dispatch(x, plan);  // [R, d_model]
  const auto w_gate = as_dtype(experts->gate_proj, dt), w_up = as_dtype(experts->up_proj, dt),
             w_down = as_dtype(experts->down_proj, dt);
  auto expert_out = expert_group_
                        ? expert_parallel_swiglu(rows, plan, w_gate, w_up, w_down, *expert_group_, moe_.block_size)
                        : grouped_swiglu(rows, w_gate, w_up, w_down, plan);  // [R, d_model]
  MoeOutput out;
  // Gates stay float32 for bf16 rows (combine accumulates in float).
  out.hidden = combine(expert_out, r.gates, plan);  // [T, d_model]
  if (shared_expert) out.hidden = out.hidden + shared_expert_output(*this, x);
  out.expert_indices = r.expert_indices;
  if (with_losses)
    out.aux_loss = (moe_.aux_loss_weight * r.balance_loss + moe_.z_loss_weight * r.z_loss)
                       .to(rt);  // the router's dtype: float32 at least
  if (!collect_stats_) return out;
  // Statistics are host values: one small device-to-host copy per forward,
  // after all the launches of the layer have been queued.
  auto counters = torch::cat({plan.routed, plan.dropped});
  auto host = to_vector(counters);
  const std::int64_t dropped = host.back();
  host.pop_back();
  out.stats = stats_from_loads(std::move(host), dropped);
  return out;
}

MoeOutput reference_moe_forward(MoeFeedForwardImpl& layer, const torch::Tensor& x_in,
                                const torch::Tensor& forced_experts) {
  namespace F = torch::nn::functional;
  TORCH_CHECK(!layer.expert_group(), "moe: the per-expert reference needs a layer that holds all its experts");
  config::MoeSection moe = layer.moe_config();
  moe.top_k = layer.active_experts();  // route as the layer does now
  check_input(x_in, layer.gate->weight.size(1));
  const std::int64_t tokens = x_in.size(0);
  // The same dtype rule as the layer (moe_compute_dtype).
  const auto dt = moe_compute_dtype(x_in, layer.experts->gate_proj);
  const auto x = as_dtype(x_in, dt);
  const auto rt = at_least_float(dt);
  auto logits = F::linear(as_dtype(x, rt), as_dtype(layer.gate->weight, rt));
  RouteResult r = route(logits, moe, forced_experts);
  const std::int64_t capacity = expert_capacity(moe, tokens);
  auto gates = r.gates.to(x.scalar_type());
  auto y = torch::zeros_like(x);
  // Per-expert weight views, as a ModuleList of per-expert Linear layers
  // would hold them (unbind once: its backward stacks the gradients once,
  // rather than one full-size gradient per expert as indexing would).
  auto w_gate = as_dtype(layer.experts->gate_proj, dt).unbind(0);
  auto w_up = as_dtype(layer.experts->up_proj, dt).unbind(0);
  auto w_down = as_dtype(layer.experts->down_proj, dt).unbind(0);
  std::vector<std::int64_t> loads(moe.num_experts, 0);
  std::int64_t dropped = 0;
  for (std::int64_t e = 0; e < moe.num_experts; ++e) {
    auto hit = (r.expert_indices == e).nonzero();  // [n,2] (token, slot), row-major order
    const std::int64_t n = hit.size(0);
    loads[e] = n;
    if (n == 0) continue;
    if (capacity >= 0 && n > capacity) {
      dropped += n - capacity;
      hit = hit.narrow(0, 0, capacity);
      if (capacity == 0) continue;
    }
    auto token = hit.select(1, 0), slot = hit.select(1, 1);
    auto xs = x.index_select(0, token);
    auto ys = swiglu(xs, w_gate[e], w_up[e], w_down[e]);
    auto w = gates.index({token, slot}).unsqueeze(1);
    y.index_add_(0, token, ys * w);
  }
  MoeOutput out;
  out.hidden = layer.shared_expert ? y + shared_expert_output(layer, x) : y;
  out.expert_indices = r.expert_indices;
  out.aux_loss = (moe.aux_loss_weight * r.balance_loss + moe.z_loss_weight * r.z_loss)
                     .to(rt);  // the router's dtype: float32 at least
  out.stats = stats_from_loads(std::move(loads), dropped);
  return out;
}

}  // namespace moerl::moe
