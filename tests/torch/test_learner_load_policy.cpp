// learner::load_policy (--init FILE): weights saved by pretrain load into a
// policy of the same shape; any other shape is refused at load, naming the
// file, the first mismatched tensor with both shapes, and missing or
// unexpected tensors, and the policy keeps its weights.

#include <catch2/catch.hpp>

#include <fstream>
#include <functional>
#include <string>

#include "../unit/temp_dir.h"
#include "moerl/learner/pretrain.h"
#include "moerl/model/policy.h"

using Catch::Matchers::Contains;
using moerl::config::ModelSection;
using moerl::config::MoeSection;
using moerl::model::Policy;

namespace {

ModelSection small_model() {
  ModelSection m;
  m.vocab_size = 264;
  m.d_model = 32;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.d_ff = 48;
  m.max_seq_len = 64;
  return m;
}

MoeSection small_moe() {
  MoeSection e;
  e.num_experts = 4;
  e.top_k = 2;
  e.d_expert = 16;
  return e;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// The policy's weights as one flat copy, to see whether a load touched them.
torch::Tensor flat_weights(const Policy& policy) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : policy->parameters()) parts.push_back(p.detach().flatten().clone());
  return torch::cat(parts);
}

struct SavedPolicy {
  moerl_test::TempDir dir;
  std::string path = dir.file("base.pt");
  SavedPolicy(const ModelSection& m, const MoeSection& e) {
    torch::manual_seed(1);
    Policy policy(m, e);
    torch::save(policy, path);
    weights = flat_weights(policy);
  }
  torch::Tensor weights;
};

}  // namespace

TEST_CASE("load_policy copies weights saved from the same shape", "[learner][load_policy]") {
  const SavedPolicy saved(small_model(), small_moe());
  torch::manual_seed(2);
  Policy policy(small_model(), small_moe());
  REQUIRE_FALSE(flat_weights(policy).equal(saved.weights));
  moerl::learner::load_policy(policy, saved.path);
  CHECK(flat_weights(policy).equal(saved.weights));
}

TEST_CASE("load_policy refuses another shape at load, naming the tensor and both shapes", "[learner][load_policy]") {
  ModelSection narrow = small_model();
  narrow.d_model = 16;
  const SavedPolicy saved(narrow, small_moe());
  torch::manual_seed(2);
  Policy policy(small_model(), small_moe());
  const torch::Tensor before = flat_weights(policy);
  const std::string error = error_of([&] { moerl::learner::load_policy(policy, saved.path); });
  CHECK_THAT(error, Contains("cannot load policy weights from '" + saved.path + "'"));
  // embed_tokens.weight is the first parameter in model order.
  CHECK_THAT(error,
             Contains("tensor 'embed_tokens.weight' is [264, 16] in the file but [264, 32] in the configured model"));
  CHECK_THAT(error, Contains("more tensor(s) differ in shape"));
  CHECK(flat_weights(policy).equal(before));  // checked before anything was copied
}

TEST_CASE("load_policy names tensors missing from the file and tensors the model lacks", "[learner][load_policy]") {
  ModelSection deeper = small_model();
  deeper.num_layers = 3;
  SECTION("the file has fewer layers") {
    const SavedPolicy saved(small_model(), small_moe());
    Policy policy(deeper, small_moe());
    const std::string error = error_of([&] { moerl::learner::load_policy(policy, saved.path); });
    CHECK_THAT(error, Contains("missing from the file: layers.2.input_layernorm.weight, "));
    CHECK_THAT(error, !Contains("not in the configured model"));
    CHECK_THAT(error, !Contains("differ in shape"));
  }
  SECTION("the file has more layers") {
    const SavedPolicy saved(deeper, small_moe());
    Policy policy(small_model(), small_moe());
    const std::string error = error_of([&] { moerl::learner::load_policy(policy, saved.path); });
    CHECK_THAT(error, Contains("not in the configured model: layers.2."));
    CHECK_THAT(error, Contains(" more"));  // a layer has more tensors than the list shows
  }
}

TEST_CASE("load_policy names a file that is missing or not a torch archive", "[learner][load_policy]") {
  moerl_test::TempDir dir;
  Policy policy(small_model(), small_moe());
  CHECK_THAT(error_of([&] { moerl::learner::load_policy(policy, dir.file("absent.pt")); }),
             Contains("base policy '" + dir.file("absent.pt") + "' does not exist"));
  std::ofstream(dir.file("junk.pt")) << "not a torch archive";
  CHECK_THAT(error_of([&] { moerl::learner::load_policy(policy, dir.file("junk.pt")); }),
             Contains("cannot load policy weights from '" + dir.file("junk.pt") + "'"));
}
