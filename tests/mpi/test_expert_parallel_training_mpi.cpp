// Training with expert parallelism against training without it: every rank
// is a data-parallel learner with its own batches; the whole policies average
// all gradients over the learners, the split ones (expert groups of P
// consecutive ranks) average replicated parameters over every learner and
// expert shares over their replicas (learner/gradient_averaging.h). After 10
// AdamW steps each split policy must hold the whole policy's parameters: the
// replicated ones entirely, the experts as its slice. In double precision, so
// that a tight tolerance catches any misplaced contribution.

#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>

#include "moerl/comm/communicator_expert_exchange.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/learner/gradient_averaging.h"
#include "moerl/model/policy.h"
#include "expert_test_support.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

using expert_test::small_model;
using expert_test::small_moe;

// One MPI communicator split off MPI_COMM_WORLD, freed with the object.
struct SplitComm {
  SplitComm(int color, int key, const std::string& name) {
    MPI_Comm_split(MPI_COMM_WORLD, color, key, &handle);
    comm = std::make_unique<comm::MpiCommunicator>(handle, name);
  }
  ~SplitComm() {
    comm.reset();
    MPI_Comm_free(&handle);
  }
  MPI_Comm handle = MPI_COMM_NULL;
  std::unique_ptr<comm::MpiCommunicator> comm;
};

struct Batch {
  torch::Tensor tokens, lengths, probe;
};

// This rank's batch of a step: right-padded random tokens, and a fixed random
// probe the loss weighs the logits with.
Batch batch_of(int rank, int step, std::int64_t vocab) {
  torch::manual_seed(1000 * rank + step);
  Batch b;
  b.lengths = torch::randint(4, 11, {3}, torch::kInt64);
  b.lengths[0] = 10;  // the policy takes S = the longest row
  b.tokens = torch::randint(0, vocab, {3, 10}, torch::kInt64);
  b.probe = torch::randn({b.lengths.sum().item<std::int64_t>(), vocab}, torch::kDouble);
  return b;
}

torch::Tensor step_loss(model::PolicyImpl& policy, const Batch& b) {
  const model::PolicyOutput out = policy.forward(b.tokens, b.lengths);
  return (torch::log_softmax(out.logits, -1) * b.probe).sum() / 50.0 + out.aux_loss;
}

// Micro-batches rank `rank` has in step `step`: the same everywhere when
// `uneven` is false, else 0, 1 or 2 by rank and step, so that members of a
// group often have fewer than the others (or none) and must join the others'
// passes with Policy::idle_expert_pass.
int micro_batches(int rank, int step, bool uneven) { return uneven ? (rank + step) % 3 : 1; }

// The split policy's step: its own micro-batches, then idle passes until
// every member of the group has run as many as the busiest (a max-reduce of
// the counts, as the Learner does).
void split_backward(model::PolicyImpl& split, comm::Communicator& group, int rank, int step, bool uneven,
                    std::int64_t vocab) {
  const int mine = micro_batches(rank, step, uneven);
  double counts_slots[4] = {0, 0, 0, 0};
  counts_slots[group.rank()] = mine;
  group.allreduce_sum(counts_slots, 4, comm::DataType::Float64, 30);
  int most = 0;
  for (double c : counts_slots) most = std::max(most, static_cast<int>(c));
  for (int m = 0; m < mine; ++m) step_loss(split, batch_of(rank, 100 * m + step, vocab)).backward();
  for (int m = mine; m < most; ++m) split.idle_expert_pass().sum().backward();
}

void train_and_compare(int expert_parallel, bool uneven = false) {
  int rank = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  REQUIRE(ranks % expert_parallel == 0);
  comm::MpiCommunicator learners(MPI_COMM_WORLD, "learners");
  SplitComm expert_group(rank / expert_parallel, rank, "expert group");
  SplitComm replicas(rank % expert_parallel, rank, "expert replicas");
  auto exchange = std::make_shared<comm::CommunicatorExpertExchange>(*expert_group.comm, 30);

  const auto model = small_model();
  const auto moe = small_moe();
  torch::manual_seed(11);
  model::Policy whole(model, moe);
  torch::manual_seed(11);
  model::Policy split(model, moe, exchange);
  whole->to(torch::kDouble);
  split->to(torch::kDouble);
  REQUIRE(split->split_expert_parameters().size() == 6);  // 3 tensors in each of 2 MoE layers
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.01);
  torch::optim::AdamW whole_optimizer(whole->parameters(), options);
  torch::optim::AdamW split_optimizer(split->parameters(), options);
  learner::GradientGroups all_replicated{&learners, nullptr, 30};
  learner::GradientGroups with_experts{&learners, replicas.comm.get(), 30};

  for (int step = 0; step < 10; ++step) {
    whole_optimizer.zero_grad();
    split_optimizer.zero_grad();
    for (int m = 0; m < micro_batches(rank, step, uneven); ++m)
      step_loss(*whole, batch_of(rank, 100 * m + step, model.vocab_size)).backward();
    split_backward(*split, *expert_group.comm, rank, step, uneven, model.vocab_size);
    learner::average_gradients(whole->parameters(), {}, all_replicated);
    learner::average_gradients(split->replicated_parameters(), split->split_expert_parameters(), with_experts);
    whole_optimizer.step();
    split_optimizer.step();
  }

  const auto whole_params = whole->named_parameters();
  const auto member = rank % expert_parallel;
  int compared_experts = 0;
  for (const auto& item : split->named_parameters()) {
    torch::Tensor want = whole_params[item.key()];
    if (item.key().find(".mlp.experts.") != std::string::npos) {
      const std::int64_t share = moe.num_experts / expert_parallel;
      want = want.narrow(0, member * share, share);
      ++compared_experts;
    }
    INFO("rank " << rank << " of " << ranks << ", expert-parallel size " << expert_parallel << ": " << item.key());
    REQUIRE(item.value().sizes() == want.sizes());
    const double diff = (item.value() - want).abs().max().item<double>();
    CHECK(diff < 1e-9);
  }
  CHECK(compared_experts == 6);
  // And training moved the experts: parameters still at their initial values would prove nothing.
  torch::manual_seed(11);
  model::Policy initial(model, moe);
  initial->to(torch::kDouble);
  const auto initial_params = initial->named_parameters();
  for (const auto& item : whole_params)
    if (item.key().find(".mlp.experts.") != std::string::npos)
      CHECK((item.value() - initial_params[item.key()]).abs().max().item<double>() > 1e-3);
}

}  // namespace

TEST_CASE("10 steps with split experts end with the parameters of 10 steps without", "[expert_parallel_training]") {
  int ranks = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  SECTION("one expert group of every rank") { train_and_compare(ranks); }
  if (ranks >= 4) {
    SECTION("expert groups of two, with replicas") { train_and_compare(2); }
  }
  SECTION("members with fewer micro-batches, or none, join the others' passes idle") { train_and_compare(ranks, true); }
  if (ranks >= 4) {
    SECTION("uneven micro-batches in expert groups of two") { train_and_compare(2, true); }
  }
}
