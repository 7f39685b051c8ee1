// Expert parallelism against one rank: every member of an expert group
// (MPI_COMM_WORLD here, 2 ranks and 4 oversubscribed) runs the split layer on
// its own tokens and the whole layer on the same tokens; outputs, input and
// router gradients must match, and each member's expert gradients must equal
// the whole layer's expert gradients summed over every member's tokens. The
// routings include experts that no member sends a token to, members that
// receive nothing, a member with no tokens, capacity drops, padded local
// segments and a shared expert.

#include <mpi.h>
#include <torch/torch.h>

#include <memory>
#include <sstream>

#include "moerl/comm/communicator_expert_exchange.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/moe/moe_layer.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

struct SplitCase {
  std::string name;
  std::int64_t top_k = 2, shared = 0, block = 1;
  double capacity = 0;               // <= 0: dropless
  bool forced_to_first_two = false;  // every token to experts 0 and 1
  bool last_member_idle = false;     // the last member routes no tokens
  torch::Dtype dtype = torch::kDouble;
  double tolerance = 1e-10;
};

constexpr std::int64_t kExperts = 8, kModel = 16, kExpert = 12;

moe::MoeFeedForward make_layer(const SplitCase& c, std::shared_ptr<moe::ExpertExchange> group) {
  config::ModelSection m;
  m.d_model = kModel;
  m.num_layers = 2;
  m.init_std = 0.3;
  config::MoeSection s;
  s.num_experts = kExperts;
  s.top_k = c.top_k;
  s.d_expert = kExpert;
  s.shared_experts = c.shared;
  s.block_size = c.block;
  s.capacity_factor = c.capacity;
  s.aux_loss_weight = 0.05;
  s.z_loss_weight = 0.01;
  torch::manual_seed(7);  // the same weights on every member, split or whole
  moe::MoeFeedForward layer(m, s, std::move(group));
  layer->to(c.dtype);
  return layer;
}

void check_close(const torch::Tensor& got, const torch::Tensor& want, double tolerance, const std::string& what) {
  INFO(what << ": shapes " << got.sizes() << " and " << want.sizes());
  REQUIRE(got.sizes() == want.sizes());
  if (got.numel() == 0) return;
  const double diff = (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>();
  const double scale = 1 + want.to(torch::kDouble).abs().max().item<double>();
  INFO(what << ": max abs diff " << diff << " at scale " << scale);
  CHECK(diff <= tolerance * scale);
}

torch::Tensor grad_or_zeros(const torch::Tensor& p) { return p.grad().defined() ? p.grad() : torch::zeros_like(p); }

// The sum over every member of t (double on the wire, returned in t's dtype).
torch::Tensor sum_over_members(const torch::Tensor& t) {
  torch::Tensor buffer = t.to(torch::kDouble).contiguous().clone();
  MPI_Allreduce(MPI_IN_PLACE, buffer.data_ptr<double>(), static_cast<int>(buffer.numel()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return buffer.to(t.scalar_type());
}

void compare_split_with_whole(const SplitCase& c) {
  comm::MpiCommunicator group_comm(MPI_COMM_WORLD, "expert group");
  const int member = group_comm.rank(), members = group_comm.size();
  auto exchange = std::make_shared<comm::CommunicatorExpertExchange>(group_comm, 30);
  auto whole = make_layer(c, nullptr);
  auto split = make_layer(c, exchange);
  const moe::ExpertShard shard = split->expert_shard();
  REQUIRE(shard.count == kExperts / members);
  REQUIRE(shard.first == member * shard.count);
  // The split layer was initialised as the slice of the whole one.
  check_close(split->experts->gate_proj, whole->experts->gate_proj.narrow(0, shard.first, shard.count), 0,
              "initial gate_proj slice");
  check_close(split->experts->down_proj, whole->experts->down_proj.narrow(0, shard.first, shard.count), 0,
              "initial down_proj slice");

  // Two passes: the second runs on what the first's backward left behind.
  for (int pass = 0; pass < 2; ++pass) {
    INFO(c.name << ", member " << member << " of " << members << ", pass " << pass);
    torch::manual_seed(100 + 10 * member + pass);
    const std::int64_t tokens = (c.last_member_idle && member == members - 1) ? 0 : 13 + 7 * member;
    const torch::Tensor x = torch::randn({tokens, kModel}, torch::TensorOptions().dtype(c.dtype));
    const torch::Tensor probe = torch::randn({tokens, kModel}, torch::TensorOptions().dtype(c.dtype));
    torch::Tensor forced;
    if (c.forced_to_first_two)
      forced = torch::tensor({std::int64_t{0}, std::int64_t{1}}).repeat({tokens, 1}).narrow(1, 0, c.top_k);
    for (auto& p : whole->parameters()) p.mutable_grad() = torch::Tensor();
    for (auto& p : split->parameters()) p.mutable_grad() = torch::Tensor();

    auto xw = x.clone().requires_grad_(true), xs = x.clone().requires_grad_(true);
    auto out_whole = whole->forward(xw, forced);
    auto out_split = split->forward(xs, forced);
    ((out_whole.hidden * probe).sum() + out_whole.aux_loss).backward();
    ((out_split.hidden * probe).sum() + out_split.aux_loss).backward();

    check_close(out_split.hidden, out_whole.hidden, c.tolerance, "hidden");
    CHECK(torch::equal(out_split.expert_indices, out_whole.expert_indices));
    CHECK(out_split.stats.tokens_per_expert == out_whole.stats.tokens_per_expert);
    CHECK(out_split.stats.dropped_tokens == out_whole.stats.dropped_tokens);
    check_close(grad_or_zeros(xs), grad_or_zeros(xw), c.tolerance, "input gradient");
    check_close(grad_or_zeros(split->gate->weight), grad_or_zeros(whole->gate->weight), c.tolerance, "router gradient");
    if (c.shared > 0)
      check_close(grad_or_zeros(split->shared_expert->up_proj->weight),
                  grad_or_zeros(whole->shared_expert->up_proj->weight), c.tolerance, "shared expert gradient");
    // A member's experts learn from every member's tokens.
    const torch::Tensor* split_weights[] = {&split->experts->gate_proj, &split->experts->up_proj,
                                            &split->experts->down_proj};
    const torch::Tensor* whole_weights[] = {&whole->experts->gate_proj, &whole->experts->up_proj,
                                            &whole->experts->down_proj};
    for (int w = 0; w < 3; ++w) {
      const torch::Tensor summed = sum_over_members(grad_or_zeros(*whole_weights[w]));
      check_close(grad_or_zeros(*split_weights[w]), summed.narrow(0, shard.first, shard.count), c.tolerance,
                  "expert gradient " + std::to_string(w));
    }
  }
}

}  // namespace

TEST_CASE("an expert-parallel layer computes what the whole layer computes on each member's tokens",
          "[expert_parallel]") {
  std::vector<SplitCase> cases(5);
  cases[0].name = "random routing, top-2, dropless";
  cases[1].name = "every token to experts 0 and 1, padded local segments, shared expert";
  cases[1].forced_to_first_two = true;
  cases[1].block = 4;
  cases[1].shared = 1;
  cases[2].name = "capacity drops, an idle member";
  cases[2].capacity = 0.6;
  cases[2].block = 2;
  cases[2].last_member_idle = true;
  cases[3].name = "top-1";
  cases[3].top_k = 1;
  cases[4].name = "float32, top-3, padded";
  cases[4].top_k = 3;
  cases[4].block = 3;
  cases[4].dtype = torch::kFloat;
  cases[4].tolerance = 2e-5;
  for (const auto& c : cases) {
    SECTION(c.name) { compare_split_with_whole(c); }
  }
}

TEST_CASE("experts that do not split evenly over the group are refused by name", "[expert_parallel]") {
  comm::MpiCommunicator group_comm(MPI_COMM_WORLD, "expert group");
  if (group_comm.size() == 1) return;
  CHECK_THROWS_WITH(moe::expert_shard(group_comm.size() + 1, 0, group_comm.size()),
                    Catch::Contains("cannot be split evenly") && Catch::Contains("moe.num_experts"));
}
