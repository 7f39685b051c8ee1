// The safetensors reader/writer, sharded directories, and config.json ->
// [model]/[moe] for the Hugging Face fixtures under tests/parity/fixtures.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "moerl/config/config.h"
#include "moerl/hf/hf_config.h"
#include "moerl/hf/hf_weights.h"
#include "moerl/hf/safetensors.h"
#include "moerl/setup/config_loading.h"
#include "temp_dir.h"

using namespace moerl::hf;
using Catch::Matchers::Contains;
using moerl_test::TempDir;

namespace {

const std::string kFixtures = std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file with a hand-written header (for headers our writer never makes).
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes) {
  std::string bytes(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) bytes[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
  write_bytes(path, bytes + header + std::string(data_bytes, '\0'));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

struct Sample {
  std::vector<float> a{1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 7.0f};  // [2, 3] F32
  std::vector<std::uint16_t> b{0x3c00, 0xc000, 0x3800};         // [3] F16: 1, -2, 0.5
  std::vector<std::uint16_t> c{0x3fc0, 0xbf80};                 // [1, 2] BF16: 1.5, -1
  std::vector<TensorToWrite> tensors() const {
    return {{"model.a", DType::F32, {2, 3}, a.data(), a.size() * 4},
            {"model.b", DType::F16, {3}, b.data(), b.size() * 2},
            {"model.c", DType::BF16, {1, 2}, c.data(), c.size() * 2}};
  }
};

}  // namespace

TEST_CASE("safetensors: a written file reads back with dtypes, shapes, bytes and metadata", "[hf]") {
  TempDir dir;
  Sample s;
  const std::string path = dir.file("x.safetensors");
  const std::uint64_t size = write_safetensors(path, s.tensors(), {{"format", "pt"}});
  CHECK(size == std::filesystem::file_size(path));
  const SafetensorsFile file(path);
  REQUIRE(file.tensors().size() == 3);
  CHECK(file.metadata().at("format") == "pt");
  const TensorInfo& a = file.info("model.a");
  CHECK(a.dtype == DType::F32);
  CHECK(a.shape == std::vector<std::int64_t>{2, 3});
  CHECK(std::memcmp(file.data(a), s.a.data(), 24) == 0);
  // The data section starts 8-byte aligned (the header is padded).
  CHECK(reinterpret_cast<std::uintptr_t>(file.data(a)) % 8 == 0);
  CHECK(file.info("model.b").dtype == DType::F16);
  CHECK(std::memcmp(file.data(file.info("model.c")), s.c.data(), 4) == 0);
  CHECK(file.info("model.c").shape == std::vector<std::int64_t>{1, 2});
  CHECK(file.find("model.d") == nullptr);
  CHECK_THAT(error_of([&] { file.info("model.d"); }), Contains(path) && Contains("model.d"));
}

TEST_CASE("safetensors: truncated and corrupt files are refused, naming the file and tensor", "[hf]") {
  TempDir dir;
  Sample s;
  const std::string path = dir.file("x.safetensors");
  write_safetensors(path, s.tensors());
  const std::string good = read_bytes(path);

  SECTION("truncated data") {
    write_bytes(path, good.substr(0, good.size() - 3));
    const std::string e = error_of([&] { SafetensorsFile f(path); });
    CHECK_THAT(e, Contains(path) && Contains("model.c") && Contains("truncated"));
  }
  SECTION("truncated header") {
    write_bytes(path, good.substr(0, 40));
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains(path) && Contains("header length"));
  }
  SECTION("shorter than the length field") {
    write_bytes(path, good.substr(0, 5));
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains(path) && Contains("truncated"));
  }
  SECTION("header that is not JSON") {
    write_raw(path, "{\"model.a\": [", 0);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains(path) && Contains("not valid JSON"));
  }
  SECTION("byte count that disagrees with shape and dtype") {
    write_raw(path, R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 12);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains("'w'") && Contains("need 16"));
  }
  SECTION("overlapping tensors") {
    write_raw(path,
              R"({"u": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
              R"( "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
              12);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains("'v'") && Contains("overlaps"));
  }
  SECTION("unsupported dtype") {
    write_raw(path, R"({"ids": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains("'ids'") && Contains("I64"));
  }
  SECTION("negative or fractional extents") {
    write_raw(path, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
    CHECK_THAT(error_of([&] { SafetensorsFile f(path); }), Contains("'w'") && Contains("non-negative integer"));
  }
  SECTION("the writer refuses a byte count that disagrees with the shape") {
    std::vector<TensorToWrite> bad = s.tensors();
    bad[1].bytes = 4;
    CHECK_THAT(error_of([&] { write_safetensors(dir.file("y.safetensors"), bad); }),
               Contains("model.b") && Contains("needs 6 bytes"));
    CHECK_FALSE(std::filesystem::exists(dir.file("y.safetensors")));
  }
}

TEST_CASE("safetensors: sharded directories via model.safetensors.index.json", "[hf]") {
  TempDir dir;
  Sample s;
  // 24 + 6 + 4 bytes with at most 10 per shard: a, then b+c.
  const auto shards = write_sharded_safetensors(dir.path.string(), s.tensors(), 10);
  REQUIRE(shards == std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"});
  const SafetensorsDirectory files(dir.path.string());
  CHECK(files.num_files() == 2);
  CHECK(files.tensor_names() == std::vector<std::string>{"model.a", "model.b", "model.c"});
  CHECK(files.total_bytes() == 34);
  CHECK(std::memcmp(files.data("model.c"), s.c.data(), 4) == 0);
  CHECK_THAT(files.file_of("model.b").path(), Contains("model-00002-of-00002"));
  CHECK_THAT(error_of([&] { files.info("model.z"); }), Contains("model.z") && Contains("missing"));

  SECTION("an index that names a missing file") {
    std::filesystem::remove(dir.file(shards[1]));
    CHECK_THAT(error_of([&] { SafetensorsDirectory d(dir.path.string()); }),
               Contains(shards[1]) && Contains("does not exist"));
  }
  SECTION("an index that names a tensor its file lacks") {
    std::string index = read_bytes(dir.file("model.safetensors.index.json"));
    index.replace(index.find("\"model.c\""), 9, "\"model.q\"");
    write_bytes(dir.file("model.safetensors.index.json"), index);
    CHECK_THAT(error_of([&] { SafetensorsDirectory d(dir.path.string()); }),
               Contains("model.q") && Contains(shards[1]));
  }
  SECTION("a directory without weights") {
    TempDir empty;
    CHECK_THAT(error_of([&] { SafetensorsDirectory d(empty.path.string()); }), Contains("model.safetensors"));
  }
}

TEST_CASE("hf config: the four architectures map onto [model] and [moe]", "[hf]") {
  const HfModel mixtral = read_hf_model(kFixtures + "mixtral");
  CHECK(mixtral.architecture == Architecture::Mixtral);
  CHECK(mixtral.model.d_model == 32);
  CHECK(mixtral.model.num_layers == 3);
  CHECK(mixtral.model.num_kv_heads == 2);
  CHECK(mixtral.model.sliding_window == 5);
  CHECK(mixtral.model.rope_theta == 1e6);
  CHECK(mixtral.model.norm_eps == 1e-5);
  CHECK(mixtral.moe.num_experts == 4);
  CHECK(mixtral.moe.d_expert == 16);
  CHECK(mixtral.moe.renormalize);

  const HfModel qwen2 = read_hf_model(kFixtures + "qwen2_moe");
  CHECK(qwen2.architecture == Architecture::Qwen2Moe);
  CHECK(qwen2.model.qkv_bias);
  CHECK_FALSE(qwen2.model.o_bias);
  CHECK(qwen2.model.tie_embeddings);
  CHECK(qwen2.model.d_ff == 24);
  CHECK(qwen2.moe.shared_experts == 1);
  CHECK(qwen2.moe.d_shared_expert == 20);
  CHECK(qwen2.moe.shared_expert_gate);
  CHECK(qwen2.moe.first_dense_layers == 1);
  CHECK_FALSE(qwen2.moe.renormalize);

  const HfModel qwen3 = read_hf_model(kFixtures + "qwen3_moe");
  CHECK(qwen3.model.qk_norm == moerl::config::QkNorm::PerHead);
  CHECK(qwen3.model.head_dim == 12);
  CHECK(qwen3.model.qkv_bias);
  CHECK(qwen3.model.o_bias);
  CHECK(qwen3.moe.sparse_step == 2);
  CHECK(qwen3.moe.renormalize);

  const HfModel olmoe = read_hf_model(kFixtures + "olmoe");
  CHECK(olmoe.model.qk_norm == moerl::config::QkNorm::Full);
  CHECK(olmoe.moe.num_experts == 6);
  CHECK(olmoe.moe.top_k == 3);
  CHECK_FALSE(olmoe.moe.renormalize);
}

TEST_CASE("hf config: unknown architectures, unsupported features and conflicts are errors", "[hf]") {
  TempDir dir;
  std::string json = read_bytes(kFixtures + "mixtral/config.json");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = json;
    REQUIRE(text.find(from) != std::string::npos);
    text.replace(text.find(from), from.size(), to);
    write_bytes(dir.file("config.json"), text);
  };
  with("\"model_type\": \"mixtral\"", "\"model_type\": \"llama\"");
  CHECK_THAT(error_of([&] { read_hf_model(dir.path.string()); }),
             Contains(dir.file("config.json")) && Contains("model_type") && Contains("llama"));
  with("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"");
  CHECK_THAT(error_of([&] { read_hf_model(dir.path.string()); }), Contains("yarn") && Contains("rope_parameters"));
  with("\"hidden_size\": 32,", "");
  CHECK_THAT(error_of([&] { read_hf_model(dir.path.string()); }), Contains("hidden_size") && Contains("missing"));

  // Through the run config: the source decides; an explicit disagreeing key is an error.
  const std::string toml = "[model]\nsource = \"hf:" + kFixtures + "mixtral\"\n";
  const moerl::config::Config config = moerl::setup::load_config_text(toml, "run.toml");
  CHECK(config.model.d_model == 32);
  CHECK(config.model.vocab_size == 128);
  CHECK(config.model.max_seq_len == 64);
  CHECK(config.moe.num_experts == 4);
  CHECK_THAT(error_of([&] { moerl::setup::load_config_text(toml + "d_model = 64\n", "run.toml"); }),
             Contains("model.d_model") && Contains("config.json"));
  // A shorter context is the run's choice.
  CHECK(moerl::setup::load_config_text(toml + "max_seq_len = 32\n", "run.toml").model.max_seq_len == 32);
  CHECK_THAT(error_of([&] { moerl::setup::load_config_text("[model]\nsource = \"hf:/nonexistent\"\n", "r.toml"); }),
             Contains("r.toml") && Contains("[model] source") && Contains("/nonexistent/config.json"));
}

TEST_CASE("hf names: Mixtral and Qwen layouts, stacked experts expand to one tensor each", "[hf]") {
  CHECK(hf_tensor_names("lm_head.weight", 4, Architecture::Mixtral) == std::vector<std::string>{"lm_head.weight"});
  CHECK(hf_tensor_names("layers.1.mlp.gate.weight", 4, Architecture::Mixtral) ==
        std::vector<std::string>{"model.layers.1.block_sparse_moe.gate.weight"});
  CHECK(hf_tensor_names("layers.1.mlp.experts.up_proj", 2, Architecture::Mixtral) ==
        std::vector<std::string>{"model.layers.1.block_sparse_moe.experts.0.w3.weight",
                                 "model.layers.1.block_sparse_moe.experts.1.w3.weight"});
  CHECK(hf_tensor_names("layers.0.mlp.experts.down_proj", 2, Architecture::Olmoe) ==
        std::vector<std::string>{"model.layers.0.mlp.experts.0.down_proj.weight",
                                 "model.layers.0.mlp.experts.1.down_proj.weight"});
  CHECK(hf_tensor_names("layers.0.mlp.shared_expert_gate.weight", 2, Architecture::Qwen2Moe) ==
        std::vector<std::string>{"model.layers.0.mlp.shared_expert_gate.weight"});
  CHECK(hf_tensor_names("layers.2.self_attn.q_norm.weight", 2, Architecture::Qwen3Moe) ==
        std::vector<std::string>{"model.layers.2.self_attn.q_norm.weight"});
}

TEST_CASE("hf export: the built-in model exports as Mixtral, what no architecture has is refused", "[hf]") {
  moerl::config::ModelSection m;
  moerl::config::MoeSection e;
  CHECK(export_architecture(m, e) == Architecture::Mixtral);
  // No source: no architecture default token ids (they belong to another vocabulary).
  const moerl::JsonValue json = moerl::JsonValue::parse(hf_config_json(Architecture::Olmoe, m, e));
  CHECK(json.at("eos_token_id").is_null());
  CHECK(json.at("num_experts").as_number() == 8);
  e.renormalize = false;
  CHECK_THAT(error_of([&] { export_architecture(m, e); }), Contains("cannot export"));
  e.renormalize = true;
  e.shared_experts = 1;
  CHECK_THAT(error_of([&] { export_architecture(m, e); }), Contains("shared_expert_gate"));
  e.shared_expert_gate = true;
  CHECK(export_architecture(m, e) == Architecture::Qwen2Moe);
  e = {};
  m.qk_norm = moerl::config::QkNorm::PerHead;
  CHECK(export_architecture(m, e) == Architecture::Qwen3Moe);
  m.qkv_bias = true;
  CHECK_THAT(error_of([&] { export_architecture(m, e); }), Contains("attention_bias"));
  m.o_bias = true;
  CHECK(export_architecture(m, e) == Architecture::Qwen3Moe);
}

TEST_CASE("safetensors: F16 and BF16 convert to their float32 values", "[hf]") {
  const std::uint16_t half[] = {0x3c00, 0xc000, 0x3800, 0x0001, 0x03ff, 0x7bff, 0x7c00, 0x8000};
  float out[8];
  to_float32(DType::F16, half, 8, out);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == -2.0f);
  CHECK(out[2] == 0.5f);
  CHECK(out[3] == std::ldexp(1.0f, -24));     // smallest subnormal
  CHECK(out[4] == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(out[5] == 65504.0f);                  // largest normal
  CHECK(std::isinf(out[6]));
  CHECK((out[7] == 0.0f && std::signbit(out[7])));
  const std::uint16_t bf16[] = {0x3fc0, 0xbf80, 0x4049};
  to_float32(DType::BF16, bf16, 3, out);
  CHECK(out[0] == 1.5f);
  CHECK(out[1] == -1.0f);
  CHECK(out[2] == 3.140625f);
}
