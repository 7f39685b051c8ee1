// Hugging Face models: moerl against the reference implementation's logits
// and greedy continuations (fixtures made by tests/parity/make_fixtures.py),
// export then re-import bitwise, and refusal of broken weight files.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "../unit/temp_dir.h"
#include "moerl/config/config.h"
#include "moerl/core/json_value.h"
#include "moerl/hf/hf_config.h"
#include "moerl/hf/hf_weights.h"
#include "moerl/model/hf_policy_loader.h"
#include "moerl/hf/safetensors.h"
#include "moerl/model/param_report.h"
#include "moerl/setup/config_loading.h"
#include "moerl/storage/atomic_file.h"

using namespace moerl;
using Catch::Matchers::Contains;
using moerl_test::TempDir;

namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/";
const char* const kArchitectures[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};

config::Config hf_config(const std::string& dir) {
  return setup::load_config_text("[model]\nsource = \"hf:" + dir + "\"\n", "parity.toml");
}

model::Policy load_hf_policy(const config::Config& config) { return model::load_hf_policy(config.model, config.moe); }

struct Reference {
  std::vector<std::vector<std::int64_t>> prompts;
  std::vector<std::vector<std::int64_t>> greedy;
  std::vector<torch::Tensor> logits;  // [len(prompt), vocab] each
};

std::vector<std::int64_t> int_list(const JsonValue& array) {
  std::vector<std::int64_t> out;
  for (const JsonValue& v : array.as_array()) out.push_back(static_cast<std::int64_t>(v.as_number()));
  return out;
}

Reference read_reference(const std::string& dir) {
  const JsonValue json = JsonValue::parse(storage::read_whole_file(dir + "/reference.json"));
  Reference r;
  for (const JsonValue& p : json.at("prompts").as_array()) r.prompts.push_back(int_list(p));
  for (const JsonValue& g : json.at("greedy").as_array()) r.greedy.push_back(int_list(g));
  const hf::SafetensorsFile file(dir + "/reference.safetensors");
  for (std::size_t i = 0; i < r.prompts.size(); ++i) {
    const hf::TensorInfo& info = file.info("logits." + std::to_string(i));
    r.logits.push_back(torch::from_blob(const_cast<std::uint8_t*>(file.data(info)), info.shape).clone());
  }
  return r;
}

// max |ours - ref| / max |ref|
double relative_error(const torch::Tensor& ours, const torch::Tensor& ref) {
  return (ours - ref).abs().max().item<double>() / ref.abs().max().item<double>();
}

torch::Tensor row(const std::vector<std::int64_t>& ids) { return torch::tensor(ids, torch::kLong).unsqueeze(0); }

// Greedy decoding through the KV cache: one prefill, then one token a step.
std::vector<std::int64_t> greedy_cached(model::PolicyImpl& policy, const std::vector<std::int64_t>& prompt,
                                        std::size_t steps) {
  model::KVCache cache = policy.make_cache(1, 64);
  const model::SequenceId id = cache.add_sequence();
  torch::Tensor tokens = row(prompt);
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < steps; ++i) {
    const auto result = policy.forward_cached(tokens, torch::tensor({tokens.size(1)}, torch::kLong), cache, {id});
    const std::int64_t next = result.next_token_logits().argmax(-1).item<std::int64_t>();
    out.push_back(next);
    tokens = torch::tensor({{next}}, torch::kLong);
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

void copy_fixture(const std::string& name, const fs::path& to) {
  for (const auto& entry : fs::directory_iterator(kFixtures + name)) {
    fs::copy_file(entry.path(), to / entry.path().filename(), fs::copy_options::overwrite_existing);
  }
}

std::vector<hf::ParameterView> views(model::PolicyImpl& policy) {
  std::vector<hf::ParameterView> out;
  for (const auto& item : policy.named_parameters()) {
    const torch::Tensor& p = item.value();
    REQUIRE(p.is_contiguous());
    REQUIRE(p.scalar_type() == torch::kFloat);
    out.push_back({item.key(), std::vector<std::int64_t>(p.sizes().begin(), p.sizes().end()), p.data_ptr<float>()});
  }
  return out;
}

// A snapshot of every parameter, to prove a refused load changed nothing.
std::vector<torch::Tensor> snapshot(model::PolicyImpl& policy) {
  std::vector<torch::Tensor> out;
  for (const auto& p : policy.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool unchanged(model::PolicyImpl& policy, const std::vector<torch::Tensor>& before) {
  const auto now = policy.parameters();
  for (std::size_t i = 0; i < now.size(); ++i)
    if (!torch::equal(now[i], before[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("hf parity: logits match the reference to 1e-4 in float32", "[hf][parity]") {
  torch::NoGradGuard no_grad;
  for (const char* name : kArchitectures) {
    INFO("architecture " << name);
    const std::string dir = kFixtures + name;
    const Reference ref = read_reference(dir);
    model::Policy policy = load_hf_policy(hf_config(dir));
    policy->eval();
    for (std::size_t i = 0; i < ref.prompts.size(); ++i) {
      const torch::Tensor logits = policy->forward(row(ref.prompts[i])).logits;
      const double err = relative_error(logits, ref.logits[i]);
      INFO("prompt " << i << ": max relative error " << err);
      CHECK(err <= 1e-4);
    }
    // Both prompts as one ragged batch: padding changes nothing.
    const std::size_t a = ref.prompts[0].size(), b = ref.prompts[1].size();
    torch::Tensor batch = torch::zeros({2, static_cast<std::int64_t>(std::max(a, b))}, torch::kLong);
    batch[0].narrow(0, 0, a).copy_(torch::tensor(ref.prompts[0]));
    batch[1].narrow(0, 0, b).copy_(torch::tensor(ref.prompts[1]));
    const auto out =
        policy->forward(batch, torch::tensor({static_cast<std::int64_t>(a), static_cast<std::int64_t>(b)}));
    const torch::Tensor unpacked = out.unpack(out.logits);
    CHECK(relative_error(unpacked[0].narrow(0, 0, a), ref.logits[0]) <= 1e-4);
    CHECK(relative_error(unpacked[1].narrow(0, 0, b), ref.logits[1]) <= 1e-4);
  }
}

TEST_CASE("hf parity: greedy continuations through the KV cache are the reference's", "[hf][parity]") {
  torch::NoGradGuard no_grad;
  for (const char* name : kArchitectures) {
    INFO("architecture " << name);
    const std::string dir = kFixtures + name;
    const Reference ref = read_reference(dir);
    model::Policy policy = load_hf_policy(hf_config(dir));
    policy->eval();
    for (std::size_t i = 0; i < ref.prompts.size(); ++i) {
      CHECK(greedy_cached(*policy, ref.prompts[i], ref.greedy[i].size()) == ref.greedy[i]);
    }
  }
}

TEST_CASE("hf weights: policy_parameter_shapes lists the policy's parameters in order", "[hf]") {
  for (const char* name : kArchitectures) {
    INFO("architecture " << name);
    const config::Config config = hf_config(kFixtures + name);
    model::Policy policy(config.model, config.moe);
    const auto expected = hf::policy_parameter_shapes(config.model, config.moe);
    const auto params = policy->named_parameters();
    REQUIRE(params.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CHECK(params[i].key() == expected[i].name);
      CHECK(std::vector<std::int64_t>(params[i].value().sizes().begin(), params[i].value().sizes().end()) ==
            expected[i].shape);
    }
  }
}

TEST_CASE("hf export: export then re-import round-trips bitwise, config included", "[hf]") {
  for (const char* name : kArchitectures) {
    INFO("architecture " << name);
    const std::string dir = kFixtures + name;
    const config::Config config = hf_config(dir);
    model::Policy policy = load_hf_policy(config);
    TempDir out;
    // Small shards so that every model spans several files.
    const hf::ExportResult result =
        hf::export_hf_model(views(*policy), config.model, config.moe, out.path.string(), 40000);
    CHECK(result.shards.size() >= 3);
    CHECK(result.architecture == hf::read_hf_model(dir).architecture);
    CHECK(std::find(result.copied.begin(), result.copied.end(), "generation_config.json") != result.copied.end());

    // The exported config.json describes the same architecture.
    const hf::HfModel back = hf::read_hf_model(out.path.string());
    const hf::HfModel orig = hf::read_hf_model(dir);
    CHECK(back.model.d_model == orig.model.d_model);
    CHECK(back.model.head_dim == orig.model.head_dim);
    CHECK(back.model.qk_norm == orig.model.qk_norm);
    CHECK(back.model.qkv_bias == orig.model.qkv_bias);
    CHECK(back.model.sliding_window == orig.model.sliding_window);
    CHECK(back.model.rope_theta == orig.model.rope_theta);
    CHECK(back.model.norm_eps == orig.model.norm_eps);
    CHECK(back.moe.renormalize == orig.moe.renormalize);
    CHECK(back.moe.first_dense_layers == orig.moe.first_dense_layers);
    CHECK(back.moe.sparse_step == orig.moe.sparse_step);
    CHECK(back.moe.d_shared_expert == orig.moe.d_shared_expert);
    CHECK(back.json.at("eos_token_id").as_number() == orig.json.at("eos_token_id").as_number());
    CHECK(back.json.at("bos_token_id").as_number() == orig.json.at("bos_token_id").as_number());

    torch::manual_seed(99);  // other random weights first: the load must replace all of them
    model::Policy again = load_hf_policy(hf_config(out.path.string()));
    const auto a = policy->named_parameters(), b = again->named_parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].key());
      CHECK(torch::equal(a[i].value(), b[i].value()));
    }
  }
}

TEST_CASE("hf load: broken weight files are refused naming file and tensor, nothing half-loaded", "[hf]") {
  TempDir dir;
  copy_fixture("mixtral", dir.path);
  const config::Config config = hf_config(dir.path.string());
  const hf::Architecture arch = hf::Architecture::Mixtral;
  model::Policy policy(config.model, config.moe);
  const auto before = snapshot(*policy);
  const std::string file = dir.file("model.safetensors");

  // Every tensor of the fixture, as (name, dtype, shape, bytes).
  struct Owned {
    std::string name;
    hf::DType dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<Owned> tensors;
  {
    const hf::SafetensorsFile f(file);
    for (const auto& t : f.tensors())
      tensors.push_back({t.name, t.dtype, t.shape, std::vector<std::uint8_t>(f.data(t), f.data(t) + t.bytes())});
  }
  auto rewrite = [&](const std::function<void(std::vector<Owned>&)>& edit) {
    std::vector<Owned> copy = tensors;
    edit(copy);
    std::vector<hf::TensorToWrite> out;
    for (const Owned& t : copy) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
    hf::write_safetensors(file, out);
  };
  const std::string expert = "model.layers.1.block_sparse_moe.experts.2.w3.weight";

  SECTION("truncated file") {
    const auto size = fs::file_size(file);
    fs::resize_file(file, size - 100);
    CHECK_THAT(error_of([&] { model::load_hf_weights(*policy, dir.path.string(), arch); }),
               Contains(file) && Contains("truncated"));
  }
  SECTION("wrong shape") {
    rewrite([&](std::vector<Owned>& t) {
      for (Owned& o : t)
        if (o.name == expert) o.shape = {32, 16};
    });
    CHECK_THAT(error_of([&] { model::load_hf_weights(*policy, dir.path.string(), arch); }),
               Contains(file) && Contains(expert) && Contains("[32, 16]") && Contains("[16, 32]"));
  }
  SECTION("missing tensor") {
    rewrite([&](std::vector<Owned>& t) {
      t.erase(std::remove_if(t.begin(), t.end(), [&](const Owned& o) { return o.name == expert; }), t.end());
    });
    CHECK_THAT(error_of([&] { model::load_hf_weights(*policy, dir.path.string(), arch); }),
               Contains("missing tensor '" + expert + "'") && Contains("layers.1.mlp.experts.up_proj"));
  }
  SECTION("a tensor the architecture does not have") {
    rewrite([&](std::vector<Owned>& t) { t.push_back({"model.extra.weight", hf::DType::F32, {1}, {0, 0, 0, 0}}); });
    CHECK_THAT(error_of([&] { model::load_hf_weights(*policy, dir.path.string(), arch); }),
               Contains(file) && Contains("unexpected tensor 'model.extra.weight'"));
  }
  SECTION("the wrong architecture's names") {
    CHECK_THAT(error_of([&] { model::load_hf_weights(*policy, dir.path.string(), hf::Architecture::Qwen3Moe); }),
               Contains("missing tensor 'model.layers.0.mlp.gate.weight'"));
  }
  CHECK(unchanged(*policy, before));
}

TEST_CASE("hf load: BF16 and F16 files load as their float32 values", "[hf]") {
  TempDir dir;
  copy_fixture("olmoe", dir.path);
  const config::Config config = hf_config(dir.path.string());
  model::Policy reference = load_hf_policy(config);
  for (const auto dtype : {hf::DType::BF16, hf::DType::F16}) {
    const torch::Dtype torch_dtype = dtype == hf::DType::BF16 ? torch::kBFloat16 : torch::kHalf;
    std::vector<torch::Tensor> keep;
    std::vector<hf::TensorToWrite> out;
    {
      const hf::SafetensorsFile f(kFixtures + "olmoe/model.safetensors");
      for (const auto& t : f.tensors()) {
        torch::Tensor v = torch::from_blob(const_cast<std::uint8_t*>(f.data(t)), t.shape).to(torch_dtype).contiguous();
        keep.push_back(v);
        out.push_back({t.name, dtype, t.shape, v.data_ptr(), static_cast<std::size_t>(v.numel()) * 2});
      }
      hf::write_safetensors(dir.file("model.safetensors"), out);
    }
    model::Policy policy = load_hf_policy(config);
    const auto a = reference->named_parameters(), b = policy->named_parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].key());
      CHECK(torch::equal(a[i].value().to(torch_dtype).to(torch::kFloat), b[i].value()));
    }
  }
}

TEST_CASE("hf models: the analytic parameter count covers every architecture feature", "[hf]") {
  for (const char* name : kArchitectures) {
    INFO("architecture " << name);
    const config::Config config = hf_config(kFixtures + name);
    model::Policy policy(config.model, config.moe);
    const model::ParameterReport counted = model::parameter_report(*policy);
    const model::ParameterReport expected = model::expected_parameter_report(config.model, config.moe);
    for (const model::ParameterCount& c : counted.components) {
      INFO("component " << c.component);
      CHECK(c.total == expected.component(c.component).total);
      CHECK(c.active == expected.component(c.component).active);
    }
    CHECK(counted.total == expected.total);
  }
}
