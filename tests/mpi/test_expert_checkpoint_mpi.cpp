// Sharded checkpoints with resharding: a group of P learners with split
// experts trains a few AdamW steps and saves one version (shard m by member
// m); a group of Q learners (another sub-communicator of the world: the first
// Q ranks) resumes it. Parameters and AdamW state must then equal, bitwise,
// the saving group's gathered (logical) state, and one further step must
// match the saving group's own next step on the same data. Scenarios at 2
// ranks: 2->1, 1->2, 2->2; at 4 ranks: 2->1, 2->4, 4->2, 1->4. And
// learner::load_policy (a torch::save file of the whole policy) into a split one.
//
// Also the hidden [ep_checkpoint_probe] (for tests/cli/test_expert_checkpoint.sh,
// 2 ranks): the same weights saved at expert-parallel 2 and unsplit.

#include <mpi.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moerl/comm/communicator_expert_exchange.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/config/config.h"
#include "moerl/learner/checkpointing.h"
#include "moerl/learner/gradient_averaging.h"
#include "moerl/learner/pretrain.h"
#include "moerl/learner/sharded_weights.h"
#include "moerl/model/policy.h"
#include "expert_test_support.h"
#include "moerl/setup/config_loading.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

constexpr int kSteps = 3;  // AdamW steps before the save

using expert_test::small_model;
using expert_test::small_moe;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// The first `size` ranks of the world; the other ranks are not members.
struct FirstRanks {
  explicit FirstRanks(int size) {
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < size ? 0 : MPI_UNDEFINED, world_rank(), &handle);
    if (handle != MPI_COMM_NULL)
      comm = std::make_unique<comm::MpiCommunicator>(handle, "first " + std::to_string(size));
  }
  ~FirstRanks() {
    comm.reset();
    if (handle != MPI_COMM_NULL) MPI_Comm_free(&handle);
  }
  bool member() const { return handle != MPI_COMM_NULL; }
  MPI_Comm handle = MPI_COMM_NULL;
  std::unique_ptr<comm::MpiCommunicator> comm;
};

// A learner of an expert group (the whole policy when the group has one member).
struct GroupLearner {
  GroupLearner(comm::Communicator& group, std::uint64_t seed) : group(group), self(MPI_COMM_SELF, "self") {
    torch::manual_seed(static_cast<std::int64_t>(seed));
    if (group.size() > 1) {
      exchange = std::make_shared<comm::CommunicatorExpertExchange>(group, 30);
      policy = model::Policy(small_model(), small_moe(), exchange);
    } else {
      policy = model::Policy(small_model(), small_moe());
    }
    optimizer = std::make_unique<torch::optim::AdamW>(policy->parameters(),
                                                      torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  }

  // One step on the given batches of the data (each member its own), losses
  // scaled by `scale`: the group's average gradient is that of the batches'.
  void step(const std::vector<int>& batches, int step_index, double scale);

  comm::Communicator& group;
  comm::MpiCommunicator self;
  std::shared_ptr<comm::CommunicatorExpertExchange> exchange;
  model::Policy policy{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

struct Batch {
  torch::Tensor tokens, lengths, probe;
};

// Batch `index` of a step: right-padded random tokens, and a fixed random
// probe the loss weighs the logits with.
Batch batch_of(int index, int step) {
  torch::manual_seed(1000 * index + step);
  Batch b;
  b.lengths = torch::randint(4, 11, {3}, torch::kInt64);
  b.lengths[0] = 10;  // the policy takes S = the longest row
  b.tokens = torch::randint(0, small_model().vocab_size, {3, 10}, torch::kInt64);
  b.probe = torch::randn({b.lengths.sum().item<std::int64_t>(), small_model().vocab_size});
  return b;
}

void GroupLearner::step(const std::vector<int>& batches, int step_index, double scale) {
  optimizer->zero_grad();
  for (int index : batches) {
    const Batch b = batch_of(index, step_index);
    const model::PolicyOutput out = policy->forward(b.tokens, b.lengths);
    const torch::Tensor loss = (torch::log_softmax(out.logits, -1) * b.probe).sum() / 50.0 + out.aux_loss;
    (loss * scale).backward();
  }
  learner::GradientGroups groups{&group, &self, 30};
  learner::average_gradients(policy->replicated_parameters(), policy->split_expert_parameters(), groups);
  optimizer->step();
}

// Every trained tensor and AdamW moment of a group's learners, logical
// (expert rows gathered over the group), by array name; on every world rank.
struct Logical {
  std::map<std::string, torch::Tensor> tensors;
  std::int64_t step = 0;
};

// Collective over the world; `learner` is null on ranks outside the group
// (world rank 0 must be member 0).
Logical gather_logical(GroupLearner* learner, MPI_Comm group) {
  torch::manual_seed(0);
  model::Policy shapes(small_model(), small_moe());  // names and whole shapes
  Logical out;
  std::vector<learner::TrainedArray> mine;
  if (learner) mine = learner::trained_arrays(*learner->policy, nullptr);
  const auto whole = learner::trained_arrays(*shapes, nullptr);
  for (size_t i = 0; i < whole.size(); ++i) {
    std::vector<std::pair<std::string, torch::Tensor>> parts;
    if (learner) {
      const auto* adam = learner::adamw_state(*learner->optimizer, mine[i].tensor);
      REQUIRE(adam != nullptr);
      out.step = adam->step();
      parts = {{whole[i].name, mine[i].tensor.detach()},
               {"optimizer/" + whole[i].name + "/exp_avg", adam->exp_avg()},
               {"optimizer/" + whole[i].name + "/exp_avg_sq", adam->exp_avg_sq()}};
    } else {
      parts = {{whole[i].name, {}},
               {"optimizer/" + whole[i].name + "/exp_avg", {}},
               {"optimizer/" + whole[i].name + "/exp_avg_sq", {}}};
    }
    for (auto& [name, part] : parts) {
      torch::Tensor logical = torch::empty(whole[i].tensor.sizes(), torch::kFloat32);
      if (learner) {
        const torch::Tensor local = part.contiguous();
        if (whole[i].expert_rows && learner->group.size() > 1) {
          MPI_Allgather(local.data_ptr(), static_cast<int>(local.numel()), MPI_FLOAT, logical.data_ptr(),
                        static_cast<int>(local.numel()), MPI_FLOAT, group);
        } else {
          logical.copy_(local);
        }
      }
      MPI_Bcast(logical.data_ptr(), static_cast<int>(logical.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD);
      out.tensors[name] = logical;
    }
  }
  MPI_Bcast(&out.step, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  return out;
}

// The rows of `logical` this learner holds.
torch::Tensor own_rows(const torch::Tensor& logical, const learner::TrainedArray& array,
                       const learner::ExpertLayout& layout) {
  return array.expert_rows ? logical.narrow(0, layout.rows.first, layout.rows.count) : logical;
}

// A shared temporary directory made by world rank 0.
std::string shared_directory(const std::string& name) {
  std::string path;
  if (world_rank() == 0) {
    const auto base = std::filesystem::temp_directory_path() / ("moerl_ep_ckpt_" + std::to_string(::getpid()));
    path = (base / name).string();
    std::filesystem::remove_all(path);
  }
  int length = static_cast<int>(path.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(static_cast<size_t>(length));
  MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

learner::CheckpointSettings settings_for(const std::string& directory) {
  learner::CheckpointSettings settings;
  settings.directory = directory;
  settings.checkpoint.keep_last = 5;
  return settings;
}

// Save at expert-parallel `saved`, resume at `resumed`.
void save_then_resume(int saved, int resumed) {
  const std::string scenario = "saved at expert-parallel " + std::to_string(saved) + ", resumed at " +
                               std::to_string(resumed) + " (world rank " + std::to_string(world_rank()) + ")";
  INFO(scenario);
  const std::string directory = shared_directory(std::to_string(saved) + "_to_" + std::to_string(resumed));
  FirstRanks savers(saved);
  std::unique_ptr<GroupLearner> saver;
  if (savers.member()) {
    saver = std::make_unique<GroupLearner>(*savers.comm, 11);
    const int member = savers.comm->rank();
    for (int step = 0; step < kSteps; ++step) saver->step({member}, step, 1.0);
    learner::LearnerState state;
    state.step = kSteps;
    state.version = kSteps;
    learner::save_checkpoint(settings_for(directory), *saver->policy, *saver->optimizer, state, {}, std::nullopt,
                             nullptr, learner::ShardGroup{savers.comm.get(), 30});
  }
  const Logical at_save = gather_logical(saver.get(), savers.handle);
  if (saver) saver->step({savers.comm->rank()}, kSteps, 1.0);
  const Logical after_step = gather_logical(saver.get(), savers.handle);
  CHECK(at_save.step == kSteps);
  saver.reset();

  FirstRanks resumers(resumed);
  if (resumers.member()) {
    GroupLearner loaded(*resumers.comm, 99);  // other weights until the load
    const learner::LearnerState state =
        learner::load_checkpoint_version(directory, kSteps, *loaded.policy, loaded.optimizer.get());
    CHECK(state.step == kSteps);
    const learner::ExpertLayout layout = learner::expert_layout(*loaded.policy);
    CHECK(layout.members == resumed);
    int experts_compared = 0;
    for (const auto& array : learner::trained_arrays(*loaded.policy, nullptr)) {
      INFO(array.name);
      CHECK(torch::equal(array.tensor, own_rows(at_save.tensors.at(array.name), array, layout)));
      const auto* adam = learner::adamw_state(*loaded.optimizer, array.tensor);
      REQUIRE(adam != nullptr);
      CHECK(adam->step() == at_save.step);
      CHECK(torch::equal(adam->exp_avg(),
                         own_rows(at_save.tensors.at("optimizer/" + array.name + "/exp_avg"), array, layout)));
      CHECK(torch::equal(adam->exp_avg_sq(),
                         own_rows(at_save.tensors.at("optimizer/" + array.name + "/exp_avg_sq"), array, layout)));
      experts_compared += array.expert_rows;
    }
    CHECK(experts_compared == 6);  // 3 tensors in each of 2 MoE layers

    // The next step on the saving group's data: member q takes the batches
    // of members q, q+Q, ... (Q < P) or of member q mod P (Q > P).
    const int member = resumers.comm->rank();
    std::vector<int> batches;
    if (resumed <= saved) {
      for (int m = member; m < saved; m += resumed) batches.push_back(m);
    } else {
      batches.push_back(member % saved);
    }
    const double scale = std::min(1.0, static_cast<double>(resumed) / saved);
    loaded.step(batches, kSteps, scale);
    double worst = 0;
    for (const auto& array : learner::trained_arrays(*loaded.policy, nullptr)) {
      const torch::Tensor want = own_rows(after_step.tensors.at(array.name), array, layout);
      const double diff = (array.tensor - want).abs().max().item<double>();
      INFO(array.name << ": max |resumed - reference| after one more step " << diff);
      CHECK(diff < 1e-6);
      worst = std::max(worst, diff);
      CHECK(learner::adamw_state(*loaded.optimizer, array.tensor)->step() == after_step.step);
    }
    if (member == 0) std::printf("%s: next step within %.3g of the reference\n", scenario.c_str(), worst);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(std::filesystem::path(directory).parent_path());
}

}  // namespace

TEST_CASE("a version saved at one expert-parallel size resumes at another", "[expert_checkpoint]") {
  if (world_size() >= 4) {
    save_then_resume(2, 1);
    save_then_resume(2, 4);
    save_then_resume(4, 2);
    save_then_resume(1, 4);
  } else {
    REQUIRE(world_size() == 2);
    save_then_resume(2, 1);
    save_then_resume(1, 2);
    save_then_resume(2, 2);
  }
}

TEST_CASE("a version of another expert count is refused, naming both layouts", "[expert_checkpoint]") {
  // A group size that does not divide E cannot build its policy at all
  // (moe::expert_shard), so the misfit a load meets is another E: 8 into 4.
  const std::string directory = shared_directory("other_experts");
  FirstRanks savers(2);
  if (savers.member()) {
    GroupLearner saver(*savers.comm, 11);
    saver.step({savers.comm->rank()}, 0, 1.0);
    learner::LearnerState state;
    state.version = 1;
    learner::save_checkpoint(settings_for(directory), *saver.policy, *saver.optimizer, state, {}, std::nullopt, nullptr,
                             learner::ShardGroup{savers.comm.get(), 30});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    auto moe = small_moe();
    moe.num_experts = 4;
    torch::manual_seed(1);
    model::Policy other(small_model(), moe);
    CHECK_THROWS_WITH(learner::load_checkpoint_version(directory, 1, *other, nullptr),
                      Catch::Contains("expert-parallel 2 (experts [0, 4) [4, 8) of 8)") &&
                          Catch::Contains("all 4 experts") && Catch::Contains("v000001"));
    std::filesystem::remove_all(std::filesystem::path(directory).parent_path());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("load_policy gives a split policy its rows of the file's whole tensors", "[expert_checkpoint]") {
  const std::string directory = shared_directory("init");
  const std::string path = directory + "/policy.pt";
  torch::manual_seed(21);
  model::Policy whole(small_model(), small_moe());
  if (world_rank() == 0) {
    std::filesystem::create_directories(directory);
    torch::save(whole, path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    FirstRanks group(2);
    if (group.member()) {
      GroupLearner split(*group.comm, 99);
      learner::load_policy(split.policy, path);
      const learner::ExpertLayout layout = learner::expert_layout(*split.policy);
      const auto wanted = learner::trained_arrays(*whole, nullptr);
      const auto loaded = learner::trained_arrays(*split.policy, nullptr);
      REQUIRE(wanted.size() == loaded.size());
      for (size_t i = 0; i < loaded.size(); ++i) {
        INFO(loaded[i].name);
        CHECK(torch::equal(loaded[i].tensor, own_rows(wanted[i].tensor, loaded[i], layout)));
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(std::filesystem::path(directory).parent_path());
}

// For tests/cli/test_expert_checkpoint.sh on 2 ranks: the policy of the
// config file $MOERL_EP_PROBE_CONFIG, after one AdamW step, saved as version
// 1 at expert-parallel 2 into $MOERL_EP_PROBE_OUT/split and unsplit (by
// rank 0 alone) into $MOERL_EP_PROBE_OUT/whole: the same weights, two layouts.
TEST_CASE("probe: one policy saved at expert-parallel 2 and unsplit", "[.][ep_checkpoint_probe]") {
  const char* config_path = std::getenv("MOERL_EP_PROBE_CONFIG");
  const char* out = std::getenv("MOERL_EP_PROBE_OUT");
  REQUIRE(config_path != nullptr);
  REQUIRE(out != nullptr);
  REQUIRE(world_size() == 2);
  const config::Config config = setup::load_config_file(config_path);
  comm::MpiCommunicator world(MPI_COMM_WORLD, "world");
  auto exchange = std::make_shared<comm::CommunicatorExpertExchange>(world, 30);
  learner::LearnerState state;
  state.step = 1;
  state.version = 1;
  auto save = [&](model::Policy policy, const std::string& directory, const learner::ShardGroup& group) {
    torch::optim::AdamW optimizer(policy->parameters(), torch::optim::AdamWOptions(1e-2));
    // The same gradient for both: drawn whole, this learner's rows kept.
    torch::manual_seed(3);
    const learner::ExpertLayout layout = learner::expert_layout(*policy);
    for (const auto& array : learner::trained_arrays(*policy, nullptr)) {
      auto shape = array.tensor.sizes().vec();
      if (array.expert_rows) shape[0] = layout.experts;
      const torch::Tensor grad = torch::randn(shape);
      array.tensor.mutable_grad() =
          array.expert_rows ? grad.narrow(0, layout.rows.first, layout.rows.count).clone() : grad;
    }
    optimizer.step();
    learner::CheckpointSettings settings = settings_for(directory);
    settings.config_toml = config::to_toml(config);
    learner::save_checkpoint(settings, *policy, optimizer, state, {}, std::nullopt, nullptr, group);
  };
  torch::manual_seed(5);
  save(model::Policy(config.model, config.moe, exchange), std::string(out) + "/split", {&world, 30});
  if (world.rank() == 0) {
    torch::manual_seed(5);
    save(model::Policy(config.model, config.moe), std::string(out) + "/whole", {});
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
