// Decoding with split experts against decoding without: every rank of an
// expert group (MPI_COMM_WORLD) greedily decodes its own prompts with a KV
// cache, once with the whole policy and once with the split one, step by step
// in lockstep (each cached forward is a collective over the group). Each rank
// must pick the same tokens, and its last logits must match.

#include <mpi.h>
#include <torch/torch.h>

#include <memory>

#include "moerl/comm/communicator_expert_exchange.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/model/policy.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

struct Decoded {
  torch::Tensor tokens;       // [B, steps] int64
  torch::Tensor last_logits;  // [B, vocab]
};

// Greedy decoding of `steps` tokens after right-padded prompts.
Decoded greedy(model::PolicyImpl& policy, const torch::Tensor& prompts, const torch::Tensor& lengths,
               std::int64_t steps) {
  torch::NoGradGuard no_grad;
  model::KVCache cache = policy.make_cache(prompts.size(0), 64);
  std::vector<model::SequenceId> ids;
  for (std::int64_t b = 0; b < prompts.size(0); ++b) ids.push_back(cache.add_sequence());
  auto out = policy.forward_cached(prompts, lengths, cache, ids, torch::Tensor(), /*next_token_only=*/true);
  std::vector<torch::Tensor> picked;
  for (std::int64_t s = 0; s < steps; ++s) {
    const torch::Tensor next = out.next_token_logits().argmax(-1).unsqueeze(1);  // [B, 1]
    picked.push_back(next);
    out = policy.forward_cached(next, torch::Tensor(), cache, ids, torch::Tensor(), true);
  }
  return {torch::cat(picked, 1), out.next_token_logits()};
}

}  // namespace

TEST_CASE("a split policy decodes the tokens the whole policy decodes", "[expert_parallel_decode]") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  comm::MpiCommunicator group(MPI_COMM_WORLD, "expert group");
  auto exchange = std::make_shared<comm::CommunicatorExpertExchange>(group, 30);
  config::ModelSection model;
  model.vocab_size = 48;
  model.d_model = 32;
  model.num_layers = 2;
  model.d_ff = 48;
  model.max_seq_len = 64;
  model.init_std = 0.3;
  config::MoeSection moe;
  moe.enabled = true;
  moe.num_experts = 8;
  moe.top_k = 2;
  moe.d_expert = 24;
  moe.block_size = 4;
  torch::manual_seed(5);
  model::Policy whole(model, moe);
  torch::manual_seed(5);
  model::Policy split(model, moe, exchange);
  whole->to(torch::kDouble);
  split->to(torch::kDouble);

  // Each rank its own prompts, a different number of them and of different lengths.
  torch::manual_seed(200 + rank);
  const std::int64_t rows = 2 + rank;
  const torch::Tensor lengths = torch::randint(3, 9, {rows}, torch::kInt64);
  const torch::Tensor prompts = torch::randint(0, model.vocab_size, {rows, lengths.max().item<std::int64_t>()});
  const Decoded want = greedy(*whole, prompts, lengths, 12);
  const Decoded got = greedy(*split, prompts, lengths, 12);
  INFO("rank " << rank << ": whole " << want.tokens << "\nsplit " << got.tokens);
  CHECK(torch::equal(got.tokens, want.tokens));
  CHECK((got.last_logits - want.last_logits).abs().max().item<double>() < 1e-9);
  // Greedy decoding that repeats one token would hardly test the routing.
  CHECK(std::get<0>(at::_unique(want.tokens)).numel() > 3);
}
