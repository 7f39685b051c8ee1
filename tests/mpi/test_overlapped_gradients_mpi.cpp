// Overlapped bucketed gradient averaging against the flat all-reduce: three
// learners with different data (one routes every token to two experts, one
// has no data in the last micro-batch) train two micro-batches; the
// overlapped averages must equal average_gradients' on a copy of the same
// policy, buckets must start during the backward where the data allows, and
// the next step must work the same way.

#include <mpi.h>
#include <torch/torch.h>

#include "moerl/comm/mpi_communicator.h"
#include "moerl/learner/gradient_averaging.h"
#include "moerl/learner/overlapped_gradients.h"
#include "moerl/model/policy.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

model::Policy make_policy() {
  config::ModelSection m;
  m.vocab_size = 40;
  m.d_model = 24;
  m.num_layers = 2;
  m.d_ff = 32;
  m.max_seq_len = 32;
  m.init_std = 0.2;
  config::MoeSection s;
  s.enabled = true;
  s.num_experts = 8;
  s.top_k = 2;
  s.d_expert = 16;
  torch::manual_seed(3);
  return model::Policy(m, s);
}

// Loss of one micro-batch of this rank; rank 1 routes every token to experts 0 and 1.
torch::Tensor micro_batch_loss(model::PolicyImpl& policy, int rank, int step, int micro) {
  torch::manual_seed(100 * rank + 10 * step + micro);
  const torch::Tensor tokens = torch::randint(0, 40, {2, 8}, torch::kInt64);
  torch::Tensor forced;
  if (rank == 1) forced = torch::tensor({std::int64_t{0}, std::int64_t{1}}).repeat({16, 2, 1});  // [T, layers, k]
  const model::PolicyOutput out = policy.forward(tokens, torch::Tensor(), forced);
  const torch::Tensor probe = torch::randn(out.logits.sizes());
  return (torch::log_softmax(out.logits, -1) * probe).sum() / 20.0 + out.aux_loss;
}

}  // namespace

TEST_CASE("overlapped bucketed averaging equals the flat all-reduce", "[overlapped_gradients]") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  comm::MpiCommunicator learners(MPI_COMM_WORLD, "learners");
  // The averager's own group (MpiCommunicator duplicates the communicator):
  // its buckets start at different times on different learners, so no other
  // collective may share it.
  comm::MpiCommunicator gradient_group(MPI_COMM_WORLD, "gradient buckets");
  model::Policy flat = make_policy();
  model::Policy overlapped = make_policy();
  // Small buckets: many of them, so some start during the backward and some wait.
  learner::OverlappedGradients averager(overlapped->parameters(), gradient_group, gradient_group.size(), 30, 4096);
  REQUIRE(averager.bucket_count() > 4);
  for (int step = 0; step < 2; ++step) {
    INFO("rank " << rank << ", step " << step);
    flat->zero_grad();
    overlapped->zero_grad();
    const bool idle_in_last = rank == 2;
    micro_batch_loss(*flat, rank, step, 0).backward();
    micro_batch_loss(*overlapped, rank, step, 0).backward();
    averager.arm();
    if (!idle_in_last) {
      micro_batch_loss(*flat, rank, step, 1).backward();
      micro_batch_loss(*overlapped, rank, step, 1).backward();
    }
    learner::average_gradients(flat->parameters(), {}, {&learners, nullptr, 30});
    const learner::OverlapStats stats = averager.finish();
    CHECK(stats.buckets == averager.bucket_count());
    if (idle_in_last) {
      CHECK(stats.started_in_backward == 0);
    } else {
      CHECK(stats.started_in_backward > 0);
    }
    const auto want = flat->named_parameters();
    for (const auto& item : overlapped->named_parameters()) {
      INFO(item.key());
      const torch::Tensor& got = item.value().grad();
      const torch::Tensor& expected = want[item.key()].grad();
      REQUIRE(got.defined());
      REQUIRE(expected.defined());
      const double diff = (got - expected).abs().max().item<double>();
      CHECK(diff <= 1e-6 * (1 + expected.abs().max().item<double>()));
    }
  }
}
