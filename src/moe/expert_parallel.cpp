// Expert parallelism: the exchanges around a member's local experts.

#include "moerl/moe/expert_parallel.h"

#include <numeric>
#include <string>
#include <vector>

namespace moerl::moe {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<std::int64_t> host_values(const torch::Tensor& t) {
  auto c = t.to(torch::kCPU, torch::kInt64).contiguous();
  const auto* p = c.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(p, p + c.numel());
}

std::int64_t sum(const std::vector<std::int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), std::int64_t{0});
}

// Sends rows [sum(send_rows), H] to the members (send_rows[p] consecutive rows
// to member p) and returns what arrived, [sum(receive_rows), H], member-major,
// on rows' device. The collectives take host memory (a device tensor is
// staged through the host, as the communicators do for NCCL too).
torch::Tensor exchange_rows(const torch::Tensor& rows, ExpertExchange& exchange,
                            const std::vector<std::int64_t>& send_rows, const std::vector<std::int64_t>& receive_rows) {
  const torch::Tensor host = rows.to(torch::kCPU).contiguous();
  const auto row_bytes = static_cast<std::size_t>(rows.size(1)) * host.element_size();
  auto in_bytes = [&](const std::vector<std::int64_t>& counts) {
    std::vector<std::size_t> bytes;
    for (auto c : counts) bytes.push_back(static_cast<std::size_t>(c) * row_bytes);
    return bytes;
  };
  torch::Tensor received = torch::empty({sum(receive_rows), rows.size(1)}, host.options());
  exchange.exchange_bytes(host.data_ptr(), in_bytes(send_rows), received.data_ptr(), in_bytes(receive_rows));
  return received.to(rows.device());
}

// exchange_rows with autograd: the backward sends each received row's
// gradient back to the member the row came from (the same exchange with the
// counts swapped). Every member runs it, so it stays a collective in the
// backward too; an unused output's gradient arrives as zeros (materialised).
struct RowExchange : torch::autograd::Function<RowExchange> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& rows, ExpertExchange* exchange,
                               const std::vector<std::int64_t>& send_rows,
                               const std::vector<std::int64_t>& receive_rows) {
    ctx->saved_data["exchange"] = reinterpret_cast<std::int64_t>(exchange);
    ctx->saved_data["send_rows"] = send_rows;
    ctx->saved_data["receive_rows"] = receive_rows;
    return exchange_rows(rows, *exchange, send_rows, receive_rows);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* exchange = reinterpret_cast<ExpertExchange*>(ctx->saved_data["exchange"].toInt());
    const auto send_rows = ctx->saved_data["send_rows"].toIntVector();
    const auto receive_rows = ctx->saved_data["receive_rows"].toIntVector();
    return {exchange_rows(grads[0], *exchange, receive_rows, send_rows), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// The local experts over the rows that arrived: `arrived` [N, H] holds, for
// each sending member in turn, its rows for local expert 0, 1, ... as
// `arrived_counts` [members * local] says. Returns [N, H] in arrival order.
torch::Tensor run_local_experts(const torch::Tensor& arrived, const std::vector<std::int64_t>& arrived_counts,
                                const torch::Tensor& w_gate, const torch::Tensor& w_up, const torch::Tensor& w_down,
                                std::int64_t block_size) {
  const std::int64_t local = w_gate.size(0);
  // Each arrived row's local expert, as a [N, 1] routing for moerl's own plan:
  // the plan keeps arrival order within an expert, so combine (unit gates)
  // puts each output back in its row's place.
  std::vector<std::int64_t> expert_of_row;
  expert_of_row.reserve(static_cast<size_t>(arrived.size(0)));
  for (size_t i = 0; i < arrived_counts.size(); ++i)
    expert_of_row.insert(expert_of_row.end(), static_cast<size_t>(arrived_counts[i]),
                         static_cast<std::int64_t>(i) % local);
  auto routing = torch::tensor(expert_of_row, torch::kInt64).view({-1, 1}).to(arrived.device());
  const RoutePlan plan = make_route_plan(routing, local, /*capacity=*/-1, block_size);
  const auto gate_dtype = arrived.scalar_type() == torch::kBFloat16 ? torch::kFloat : arrived.scalar_type();
  auto unit_gates = torch::ones({arrived.size(0), 1}, arrived.options().dtype(gate_dtype));
  auto out = grouped_swiglu(dispatch(arrived, plan), w_gate, w_up, w_down, plan);
  return combine(out, unit_gates, plan);
}

}  // namespace

ExpertShard expert_shard(std::int64_t experts, int member, int members) {
  TORCH_CHECK(members >= 1 && member >= 0 && member < members, "moe: expert group member ", member, " of ", members);
  TORCH_CHECK(experts % members == 0, "moe: ", experts, " experts cannot be split evenly over an expert group of ",
              members, " (moe.num_experts must be a multiple of the expert-parallel size)");
  const std::int64_t count = experts / members;
  return {member * count, count};
}

void normal_expert_share_(torch::Tensor share, ExpertShard shard, std::int64_t experts, double std) {
  if (shard.count == experts) {
    share.normal_(0, std);
    return;
  }
  auto sizes = share.sizes().vec();
  sizes[0] = experts;
  share.copy_(torch::empty(sizes, share.options()).normal_(0, std).narrow(0, shard.first, shard.count));
}

torch::Tensor expert_parallel_swiglu(const torch::Tensor& rows, const RoutePlan& plan, const torch::Tensor& w_gate,
                                     const torch::Tensor& w_up, const torch::Tensor& w_down, ExpertExchange& exchange,
                                     std::int64_t block_size) {
  const int members = exchange.size();
  const std::int64_t local = w_gate.size(0);
  TORCH_CHECK(plan.experts == local * members, "moe: the plan routes over ", plan.experts, " experts but ", members,
              " members holding ", local, " each hold ", local * members);
  // How many of this member's rows go to each expert; they size the exchange.
  const std::vector<std::int64_t> counts = host_values(plan.counts);
  const std::vector<std::int64_t> offsets = host_values(plan.offsets);
  const std::int64_t in_use = sum(counts);
  TORCH_CHECK(offsets.back() == in_use, "moe: expert parallelism needs a plan without padding (block_size 1)");
  std::vector<std::int64_t> send_rows(static_cast<size_t>(members), 0);
  for (std::int64_t e = 0; e < plan.experts; ++e) send_rows[static_cast<size_t>(e / local)] += counts[e];

  const std::vector<std::int64_t> arrived_counts = exchange.exchange_counts(counts, static_cast<std::size_t>(local));
  std::vector<std::int64_t> receive_rows(static_cast<size_t>(members), 0);
  for (size_t i = 0; i < arrived_counts.size(); ++i) receive_rows[i / static_cast<size_t>(local)] += arrived_counts[i];

  auto arrived = RowExchange::apply(rows.narrow(0, 0, in_use), &exchange, send_rows, receive_rows);
  auto computed = run_local_experts(arrived, arrived_counts, w_gate, w_up, w_down, block_size);
  auto returned = RowExchange::apply(computed, &exchange, receive_rows, send_rows);  // [in_use, H]
  // The plan's rows past those in use (assignments dropped by capacity) stay zero.
  return torch::constant_pad_nd(returned, {0, 0, 0, rows.size(0) - in_use});
}

}  // namespace moerl::moe
