// Expert-sharded weight sync between learners and actors that split the
// routed experts differently (P_L learner members, actors in groups of P_A):
// every actor ends each version with exactly its share of the whole policy's
// weights at that version (compared with a whole policy built and perturbed
// alike), in float32 and over a bfloat16 wire; a corrupted bucket on one
// channel refuses that version on the actors it reaches, and only there, and
// the next version lands; an actor receives fewer bytes the larger P_A is; a
// layout mismatch ends every rank with an error naming both sides' P.
//
// Ranks 0..L-1 are learners (the ones past P_L idle), the rest actors; run on
// 4 ranks (2 learners, 2 actors) and on 6 (2 learners and 4 actors, or 4 and
// 2, where P_A = 4 leaves actor members 2 and 3 without actors: their
// channels are not made, and learner members 2 and 3 publish nothing).

#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>

#include "moerl/model/policy.h"
#include "moerl/moe/expert_parallel.h"
#include "moerl/sync/module_weights.h"
#include "moerl/sync/policy_sync_views.h"
#include "moerl/sync/sharded_weight_sync.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

constexpr std::int64_t kExperts = 8;

// An expert group for building a member's share of a policy: weight sync
// never runs the layers, so the exchanges are never called.
class ShareOnly : public moe::ExpertExchange {
 public:
  ShareOnly(int member, int members) : member_(member), members_(members) {}
  int rank() const override { return member_; }
  int size() const override { return members_; }
  std::vector<std::int64_t> exchange_counts(const std::vector<std::int64_t>&, std::size_t) override {
    throw std::logic_error("ShareOnly: no exchanges in a weight sync test");
  }
  void exchange_bytes(const void*, const std::vector<std::size_t>&, void*, const std::vector<std::size_t>&) override {
    throw std::logic_error("ShareOnly: no exchanges in a weight sync test");
  }
  moe::ExchangeTotals totals() const override { return {}; }

 private:
  int member_, members_;
};

struct Configs {
  config::ModelSection model;
  config::MoeSection moe;
  Configs() {
    model.vocab_size = 48;
    model.d_model = 32;
    model.num_layers = 2;
    model.d_ff = 48;
    model.max_seq_len = 64;
    model.init_std = 0.3;
    moe.enabled = true;
    moe.num_experts = kExperts;
    moe.top_k = 2;
    moe.d_expert = 24;
  }
};

// Member `member` of `members`' share of the policy (all of it for one member,
// built without an expert group as a job without expert parallelism does).
model::Policy share_of_policy(const Configs& c, int member, int members) {
  return members == 1 ? model::Policy(c.model, c.moe)
                      : model::Policy(c.model, c.moe, std::make_shared<ShareOnly>(member, members));
}

bool routed_experts(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

// The policy at `version`: the seed's weights plus a perturbation drawn per
// version over the whole policy, of which a share keeps its experts.
void set_version(model::PolicyImpl& policy, std::int64_t version, int member, int members) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  policy.reset_parameters();
  const auto parameters = policy.named_parameters(/*recurse=*/true);
  for (size_t i = 0; i < parameters.size(); ++i) {
    torch::manual_seed(1000 * version + static_cast<std::int64_t>(i));
    torch::Tensor p = parameters[i].value();
    torch::Tensor delta = torch::empty_like(p);
    if (routed_experts(parameters[i].key()))
      moe::normal_expert_share_(delta, moe::expert_shard(kExperts, member, members), kExperts, 0.05);
    else
      delta.normal_(0, 0.05);
    p.add_(delta);
  }
}

// Whether `share` holds exactly actor member a's part of the whole policy at
// `version` (as the wire dtype rounds it); names the first parameter that differs.
std::string differs(model::PolicyImpl& share, const Configs& c, std::int64_t version, int member, int members,
                    torch::Dtype wire) {
  model::Policy whole(c.model, c.moe);
  set_version(*whole, version, 0, 1);
  const auto want = whole->named_parameters(true);
  const auto got = share.named_parameters(true);
  for (size_t i = 0; i < want.size(); ++i) {
    torch::Tensor expected = want[i].value().detach();
    if (routed_experts(want[i].key())) {
      const moe::ExpertShard shard = moe::expert_shard(kExperts, member, members);
      expected = expected.narrow(0, shard.first, shard.count);
    }
    expected = expected.to(wire).to(torch::kFloat32);
    if (!torch::equal(got[i].value().detach(), expected))
      return got[i].key() + " (max difference " +
             std::to_string((got[i].value().detach() - expected).abs().max().item<double>()) + ")";
  }
  return "";
}

struct Case {
  int learner_ranks;  // world ranks 0..learner_ranks-1 are learners
  int learner_members;
  int actor_members;
  torch::Dtype wire;
  bool snapshot;
};

std::string describe(const Case& c) {
  return "P_L = " + std::to_string(c.learner_members) + " (of " + std::to_string(c.learner_ranks) +
         " learners), P_A = " + std::to_string(c.actor_members) + ", wire " +
         (c.wire == torch::kFloat32 ? "float32" : "bfloat16") + (c.snapshot ? ", snapshot" : ", in place");
}

// The sync communicator of a case: learner members, then the actors; idle learners get none.
MPI_Comm sync_comm(const Case& c, int rank) {
  const bool in_sync = rank >= c.learner_ranks || rank < c.learner_members;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, in_sync ? 0 : MPI_UNDEFINED, rank, &comm);
  return comm;
}

// The channel whose version 2 is corrupted: the first expert channel of the last learner member.
size_t corrupted_channel(const sync::ExpertSyncPlan& plan, int learner_members) {
  for (size_t c : plan.learner_channels(learner_members - 1))
    if (plan.channels()[c].experts.count > 0) return c;
  throw std::logic_error("no expert channel");
}

sync::SyncOptions test_options(const Case& c) {
  sync::SyncOptions options;
  options.bucket_bytes = 4096;  // many buckets per channel
  options.timeout_s = 30;
  options.snapshot = c.snapshot;
  return options;
}

void run_learner(const Case& c, const Configs& configs, MPI_Comm comm, int member) {
  model::Policy policy = share_of_policy(configs, member, c.learner_members);
  sync::HostWeights host(*policy, c.wire);
  const sync::ExpertSyncLayout layout{kExperts, c.learner_members, c.actor_members};
  sync::ShardedWeightPublisher publisher(comm, layout, member, sync::policy_sync_views(*policy, host.views()),
                                         test_options(c));
  for (std::int64_t v = 1; v <= 3; ++v) {
    set_version(*policy, v, member, c.learner_members);
    host.pull();
    const size_t corrupted = corrupted_channel(publisher.plan(), c.learner_members);
    const auto& mine = publisher.channels();
    // A channel no actor holds is never made (P_A = 4 with 2 actors): nothing to corrupt then.
    if (v == 2 && std::find(mine.begin(), mine.end(), corrupted) != mine.end())
      publisher.corrupt_next_publication(corrupted, 0);
    publisher.publish(v);
    publisher.finish();
    size_t published = 0;
    for (size_t channel : publisher.channels()) published += publisher.plan().channels()[channel].bytes();
    CHECK(publisher.last().bytes == published);
  }
  publisher.close();
}

// Returns the bytes this actor received per version.
size_t run_actor(const Case& c, const Configs& configs, MPI_Comm comm, int member) {
  model::Policy policy = share_of_policy(configs, member, c.actor_members);
  set_version(*policy, 0, member, c.actor_members);
  sync::HostWeights host(*policy, c.wire);
  const sync::ExpertSyncLayout layout{kExperts, c.learner_members, c.actor_members};
  sync::ShardedWeightReceiver receiver(comm, layout, member, sync::policy_sync_views(*policy, host.views()),
                                       test_options(c));
  const sync::SyncChannel& corrupted =
      receiver.plan().channels()[corrupted_channel(receiver.plan(), c.learner_members)];
  const bool hit = corrupted.reaches(member);
  for (std::int64_t v = 1; v <= 3; ++v) {
    INFO("version " << v);
    if (v == 2 && hit) {
      // Refused as a whole: the other channels' version 2 is dropped unapplied.
      CHECK_THROWS_WITH(receiver.wait_ready(30), Catch::Contains("channel '" + corrupted.name + "'") &&
                                                     Catch::Contains("weights version 2: bucket 0 of"));
      CHECK(receiver.current_version() == 1);
      host.push();
      CHECK(differs(*policy, configs, 1, member, c.actor_members, c.wire) == "");
      continue;
    }
    REQUIRE(receiver.wait_ready(30));
    CHECK(receiver.apply() == v);
    host.push();
    CHECK(differs(*policy, configs, v, member, c.actor_members, c.wire) == "");
    CHECK(receiver.last().bytes == receiver.bytes_per_version());
  }
  while (!receiver.closed()) receiver.poll();
  return receiver.bytes_per_version();
}

// The bytes an actor of P_A members holds: every replicated parameter and E/P_A experts of the others.
size_t share_bytes(const Configs& configs, int actor_members, torch::Dtype wire) {
  model::Policy whole(configs.model, configs.moe);
  const size_t element = wire == torch::kFloat32 ? 4 : 2;
  size_t bytes = 0;
  for (const auto& item : whole->named_parameters(true)) {
    const auto numel = static_cast<size_t>(item.value().numel());
    bytes += (routed_experts(item.key()) ? numel / static_cast<size_t>(actor_members) : numel) * element;
  }
  return bytes;
}

std::vector<Case> cases(int world) {
  if (world == 4)
    return {{2, 2, 1, torch::kFloat32, true},
            {2, 2, 2, torch::kFloat32, false},
            {2, 1, 2, torch::kBFloat16, true},
            {2, 1, 1, torch::kFloat32, false}};
  return {{2, 2, 1, torch::kFloat32, true},   {2, 2, 2, torch::kFloat32, false}, {2, 2, 4, torch::kFloat32, true},
          {2, 1, 4, torch::kBFloat16, false}, {2, 1, 2, torch::kFloat32, true},  {4, 4, 2, torch::kFloat32, false},
          {4, 4, 1, torch::kBFloat16, true},  {4, 4, 4, torch::kFloat32, true}};
}

}  // namespace

TEST_CASE("each actor receives exactly its share of the experts from the learners that own them", "[sharded_sync]") {
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  REQUIRE((world == 4 || world == 6));
  const Configs configs;
  std::map<int, size_t> float32_bytes;  // per P_A, on this actor
  for (const Case& c : cases(world)) {
    INFO(describe(c) << ", rank " << rank);
    MPI_Comm comm = sync_comm(c, rank);
    if (rank < c.learner_ranks) {
      if (rank < c.learner_members) run_learner(c, configs, comm, rank);
    } else {
      const int member = (rank - c.learner_ranks) % c.actor_members;
      const size_t bytes = run_actor(c, configs, comm, member);
      CHECK(bytes == share_bytes(configs, c.actor_members, c.wire));
      if (c.wire == torch::kFloat32) float32_bytes[c.actor_members] = bytes;
    }
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // The memory point of expert parallelism on the actors: a larger P_A, fewer bytes.
  if (rank >= 2) {
    INFO("bytes per version by P_A on rank " << rank);
    REQUIRE(float32_bytes.count(1) == 1);
    REQUIRE(float32_bytes.count(2) == 1);
    CHECK(float32_bytes[2] < float32_bytes[1]);
    if (float32_bytes.count(4)) CHECK(float32_bytes[4] < float32_bytes[2]);
  }
}

namespace {

// Constructs this rank's side of a sync (learners: ranks 0 and 1) and expects the error `matches`.
void expect_refused(const sync::ExpertSyncLayout& layout, int member, const std::vector<sync::ShardedWeightView>& views,
                    const Catch::Matchers::Impl::MatcherBase<std::string>& matches) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto construct = [&] {
    if (rank < 2)
      sync::ShardedWeightPublisher(MPI_COMM_WORLD, layout, member, views, {});
    else
      sync::ShardedWeightReceiver(MPI_COMM_WORLD, layout, member, views, {});
  };
  CHECK_THROWS_WITH(construct(), matches);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

TEST_CASE("a layout mismatch between learners and actors ends every rank naming both sides", "[sharded_sync]") {
  // Every rank fails in the constructor, before any channel exists, whichever
  // rank is wrong: no rank is left waiting in a split the others never make.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool learner = rank < 2;
  const int member = learner ? rank : (rank - 2) % 2;
  Configs configs;

  SECTION("the actors believe in one learner member while two publish") {
    model::Policy policy = share_of_policy(configs, member, 2);
    const auto views = sync::policy_sync_views(*policy, sync::module_weight_views(*policy));
    expect_refused({kExperts, learner ? 2 : 1, 2}, member, views,
                   Catch::Contains("layout mismatch") &&
                       Catch::Contains("learner member 0 (rank 0, E = 8, P_L = 2, P_A = 2)") &&
                       Catch::Contains("actor member 0 (rank 2, E = 8, P_L = 1, P_A = 2)"));
  }
  SECTION("the actors hold another model") {
    if (!learner) configs.moe.d_expert = 16;
    model::Policy policy = share_of_policy(configs, member, 2);
    const auto views = sync::policy_sync_views(*policy, sync::module_weight_views(*policy));
    expect_refused({kExperts, 2, 2}, member, views,
                   Catch::Contains("actor member 0 (rank 2, E = 8, P_L = 2, P_A = 2) holds another model than "
                                   "learner member 0"));
  }
  SECTION("one actor's expert tensor cannot hold its share") {
    model::Policy policy = share_of_policy(configs, member, 2);
    auto views = sync::policy_sync_views(*policy, sync::module_weight_views(*policy));
    if (rank == 2)
      for (auto& v : views)
        if (v.split) v.view.bytes -= 1;  // not a whole number of experts
    const std::string own = "split parameter layers.0.mlp.experts.gate_proj (12287 bytes) cannot hold 4 experts";
    if (rank == 2)
      expect_refused({kExperts, 2, 2}, member, views, Catch::Contains(own));
    else
      expect_refused({kExperts, 2, 2}, member, views,
                     Catch::Contains("actor member 0 (rank 2, E = 8, P_L = 2, P_A = 2) could not set up its side"));
  }
}
