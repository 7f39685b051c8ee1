// config.json sizes: out-of-range values, overflowing products and models
// larger than this machine's memory are configuration errors naming the
// file and the keys; parameter_count agrees with policy_parameter_shapes.

#include <catch2/catch.hpp>

#include <fstream>
#include <functional>
#include <string>

#include "moerl/config/config.h"
#include "moerl/hf/hf_config.h"
#include "moerl/hf/hf_weights.h"
#include "moerl/setup/config_loading.h"
#include "temp_dir.h"

using namespace moerl::hf;
using Catch::Matchers::Contains;
using moerl_test::TempDir;

namespace {

const std::string kFixtures = std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// The Mixtral fixture's config.json with one field's value replaced, in a
// directory of its own; read_hf_model's error, or "(no error)".
struct EditedConfig {
  TempDir dir;
  std::string path = dir.file("config.json");

  std::string error_with(const std::string& field, const std::string& value) {
    std::string text = read_text(kFixtures + "mixtral/config.json");
    const std::string key = "\"" + field + "\": ";
    const auto at = text.find(key);
    REQUIRE(at != std::string::npos);
    const auto start = at + key.size();
    text.replace(start, text.find_first_of(",\n", start) - start, value);
    std::ofstream(path, std::ios::trunc) << text;
    return error_of([&] { read_hf_model(dir.path.string()); });
  }
};

std::uint64_t counted_by_shapes(const moerl::config::ModelSection& m, const moerl::config::MoeSection& e) {
  std::uint64_t total = 0;
  for (const ParameterShape& p : policy_parameter_shapes(m, e)) {
    std::uint64_t n = 1;
    for (std::int64_t d : p.shape) n *= static_cast<std::uint64_t>(d);
    total += n;
  }
  return total;
}

}  // namespace

TEST_CASE("hf config: the unedited fixture loads (the edits below are what fails)", "[hf][hf_sizes]") {
  EditedConfig config;
  CHECK(config.error_with("hidden_size", "32") == "(no error)");
}

TEST_CASE("hf config: negative and zero sizes name the file and the key", "[hf][hf_sizes]") {
  EditedConfig config;
  CHECK_THAT(config.error_with("vocab_size", "-5"),
             Contains(config.path + ": field 'vocab_size': must be >= 2, got -5"));
  CHECK_THAT(config.error_with("hidden_size", "0"),
             Contains(config.path + ": field 'hidden_size': must be >= 1, got 0"));
  CHECK_THAT(config.error_with("num_hidden_layers", "-1"), Contains("field 'num_hidden_layers': must be >= 1, got -1"));
  CHECK_THAT(config.error_with("intermediate_size", "0"), Contains("field 'intermediate_size': must be >= 1, got 0"));
  CHECK_THAT(config.error_with("num_local_experts", "0"),
             Contains("field 'num_local_experts': must be >= 1, got 0 (a dense model is not an MoE model)"));
  CHECK_THAT(config.error_with("num_key_value_heads", "-2"), Contains("field 'num_key_value_heads': must be >= 1"));
}

TEST_CASE("hf config: integers beyond 2^53 are refused before any conversion", "[hf][hf_sizes]") {
  EditedConfig config;
  CHECK_THAT(config.error_with("vocab_size", "1e30"),
             Contains(config.path + ": field 'vocab_size': expected an integer of at most 2^53, got 1e+30"));
  CHECK_THAT(config.error_with("vocab_size", "-1e30"),
             Contains("field 'vocab_size': expected an integer of at most 2^53"));
  CHECK_THAT(config.error_with("max_position_embeddings", "1e999"),
             Contains("field 'max_position_embeddings': expected an integer of at most 2^53"));
  CHECK_THAT(config.error_with("hidden_size", "1e16"),
             Contains("field 'hidden_size': expected an integer of at most 2^53"));
}

TEST_CASE("hf config: sizes whose parameter count overflows name every size", "[hf][hf_sizes]") {
  EditedConfig config;
  const std::string error = config.error_with("hidden_size", "1e12");
  CHECK_THAT(error,
             Contains(config.path + ": the sizes (vocab_size 128, hidden_size 1000000000000, num_hidden_layers 3"));
  CHECK_THAT(error, Contains("give more parameters than a 64-bit count holds"));
  CHECK_THAT(config.error_with("intermediate_size", "4e15"), Contains("intermediate_size 4000000000000000"));
}

TEST_CASE("hf config: a model larger than physical memory is refused with the estimate", "[hf][hf_sizes]") {
  EditedConfig config;
  // 1e9 layers of 9408 parameters (32 wide, 4 experts of 16): 9.41e12 parameters, 34 TiB.
  const std::string error = config.error_with("num_hidden_layers", "1000000000");
  CHECK_THAT(error, Contains(config.path + ": the sizes (") && Contains("num_hidden_layers 1000000000"));
  CHECK_THAT(error, Contains("give 9.41e+12 parameters, 34.2 TiB as float32") && Contains("more than this machine's") &&
                        Contains("GiB of physical memory"));
  // Through the run config: a configuration error on [model] source.
  const std::string toml = "[model]\nsource = \"hf:" + config.dir.path.string() + "\"\n";
  CHECK_THAT(error_of([&] { moerl::setup::load_config_text(toml, "run.toml"); }),
             Contains("run.toml:2: [model] source: " + config.path + ": the sizes"));
}

TEST_CASE("hf config: moe.top_k is config.json's, rollout.moe_top_k overrides it for rollouts", "[hf][config]") {
  // qwen2_moe: 4 experts, num_experts_per_tok = 2.
  const std::string model = "[model]\nsource = \"hf:" + kFixtures + "qwen2_moe\"\n";
  const auto loaded =
      moerl::setup::load_config_text(model + "[rollout]\nmoe_top_k = 4\n[algo]\nrouting_replay = false\n", "run.toml");
  CHECK(loaded.moe.num_experts == 4);
  CHECK(loaded.moe.top_k == 2);
  CHECK(loaded.rollout.moe_top_k == 4);
  // Bounded by the model's experts (4, not the default 8).
  CHECK_THAT(error_of([&] {
               moerl::setup::load_config_text(model + "[rollout]\nmoe_top_k = 5\n[algo]\nrouting_replay = false\n",
                                              "run.toml");
             }),
             Contains("run.toml:4: [rollout] moe_top_k: must be <= moe.num_experts (4), got 5"));
  // Routing replay of another k is refused for hf: models too.
  CHECK_THAT(error_of([&] { moerl::setup::load_config_text(model + "[rollout]\nmoe_top_k = 1\n", "run.toml"); }),
             Contains("[rollout] moe_top_k: = 1 differs from moe.top_k = 2, and algo.routing_replay = true"));
  // The architecture key stays locked, and its error points at the override.
  CHECK_THAT(error_of([&] { moerl::setup::load_config_text(model + "[moe]\ntop_k = 1\n", "run.toml"); }),
             Contains("moe.top_k (the run config says 1, config.json 2)") &&
                 Contains("rollout.moe_top_k sets the experts per token of rollouts"));
}

TEST_CASE("parameter_count equals the sum over policy_parameter_shapes", "[hf][hf_sizes]") {
  for (const char* name : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"}) {
    INFO(name);
    const HfModel model = read_hf_model(kFixtures + name);
    CHECK(parameter_count(model.model, model.moe) == counted_by_shapes(model.model, model.moe));
  }
  moerl::config::ModelSection m;
  moerl::config::MoeSection e;
  CHECK(parameter_count(m, e) == counted_by_shapes(m, e));
  e.first_dense_layers = 1;
  e.sparse_step = 2;
  m.num_layers = 7;
  m.qk_norm = moerl::config::QkNorm::Full;
  m.o_bias = m.qkv_bias = true;
  m.tie_embeddings = true;
  e.shared_experts = 2;
  e.shared_expert_gate = true;
  CHECK(parameter_count(m, e) == counted_by_shapes(m, e));
  e.enabled = false;
  CHECK(parameter_count(m, e) == counted_by_shapes(m, e));
  m.d_model = std::int64_t{1} << 40;
  CHECK_FALSE(parameter_count(m, e).has_value());
}
