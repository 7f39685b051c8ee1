// Configuration loading: every error names the source, line and key; valid
// input resolves to the documented defaults; show -> load round-trips.

#include <catch2/catch.hpp>

#include <fstream>

#include "moerl/config/config.h"
#include "moerl/config/schema.h"
#include "temp_dir.h"

using namespace moerl::config;

namespace {

// The issues a load raises; fails the test if it loads cleanly.
std::vector<ConfigIssue> issues_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    load_config_text(text, "test.toml", overrides);
  } catch (const ConfigError& error) {
    return error.issues();
  }
  FAIL("configuration loaded without errors:\n" << text);
  return {};
}

}  // namespace

TEST_CASE("an empty file gives the documented defaults", "[config]") {
  const Config c = load_config_text("", "empty.toml");
  CHECK(c.cluster.learners == 1);
  CHECK(c.cluster.actors == 1);
  CHECK(c.moe.num_experts == 8);
  CHECK(c.moe.top_k == 2);
  CHECK(c.moe.router == RouterMode::SoftmaxThenTopK);
  CHECK(c.telemetry.log_level == LogLevel::Info);
  CHECK(c.run_directory() == "runs/moerl");
}

TEST_CASE("values are read into the typed sections", "[config]") {
  const Config c = load_config_text(R"(
[cluster]
learners = 2
message_timeout_s = 5     # an integer is accepted for a float
[moe]
router = "topk_softmax"
capacity_factor = 1.25
[run]
name = "exp"
)",
                                    "x.toml");
  CHECK(c.cluster.learners == 2);
  CHECK(c.cluster.message_timeout_s == 5.0);
  CHECK(c.moe.router == RouterMode::TopKThenSoftmax);
  CHECK(c.moe.capacity_factor == 1.25);
  CHECK(c.run.name == "exp");
  REQUIRE(c.origins.count("cluster.learners"));
  CHECK(c.origins.at("cluster.learners").line == 3);
}

TEST_CASE("an unknown key names file, line and key with a suggestion", "[config]") {
  const auto issues = issues_of("[cluster]\nlearners = 1\nactros = 2\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].source == "test.toml");
  CHECK(issues[0].line == 3);
  CHECK(issues[0].key == "cluster.actros");
  CHECK_THAT(issues[0].message, Catch::Contains("unknown key") && Catch::Contains("did you mean 'actors'"));
  CHECK(issues[0].text() == "test.toml:3: [cluster] actros: unknown key; did you mean 'actors'?");
}

TEST_CASE("an unknown section is suggested its nearest name", "[config]") {
  const auto issues = issues_of("[clustr]\nlearners = 1\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "clustr");
  CHECK_THAT(issues[0].message, Catch::Contains("did you mean [cluster]"));
}

TEST_CASE("far-off names get no suggestion", "[config]") {
  const auto issues = issues_of("[model]\nzzzzzz = 1\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].message == "unknown key");
}

TEST_CASE("wrong types are errors naming the expected type", "[config]") {
  const auto issues = issues_of("[model]\nd_model = \"wide\"\ntie_embeddings = 1\n[moe]\nrouter = \"random\"\n");
  REQUIRE(issues.size() == 3);
  CHECK(issues[0].key == "model.d_model");
  CHECK(issues[0].line == 2);
  CHECK_THAT(issues[0].message, Catch::Contains("expected an integer, got a string"));
  CHECK(issues[1].key == "model.tie_embeddings");
  CHECK_THAT(issues[1].message, Catch::Contains("expected true or false"));
  CHECK(issues[2].key == "moe.router");
  CHECK_THAT(issues[2].message, Catch::Contains("softmax_topk | topk_softmax"));
}

TEST_CASE("out-of-range values are errors naming the bound", "[config]") {
  const auto issues = issues_of("[cluster]\nlearners = 0\nmessage_timeout_s = 0.0\n");
  REQUIRE(issues.size() == 2);
  CHECK(issues[0].key == "cluster.learners");
  CHECK(issues[0].message == "must be >= 1, got 0");
  CHECK(issues[1].key == "cluster.message_timeout_s");
  CHECK(issues[1].message == "must be > 0, got 0.0");
}

TEST_CASE("inconsistent fields are errors at the line of the key", "[config]") {
  const auto issues = issues_of("[moe]\nnum_experts = 4\ntop_k = 6\n[model]\nnum_heads = 4\nnum_kv_heads = 3\n");
  REQUIRE(issues.size() == 2);
  CHECK(issues[0].key == "model.num_kv_heads");
  CHECK(issues[0].line == 6);
  CHECK(issues[1].key == "moe.top_k");
  CHECK(issues[1].line == 3);
  CHECK(issues[1].message == "must be <= num_experts (4), got 6");
}

TEST_CASE("more than 256 experts is refused at its line: episodes record expert indices as bytes", "[config]") {
  const auto issues = issues_of("[moe]\nnum_experts = 300\ntop_k = 2\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "moe.num_experts");
  CHECK(issues[0].line == 2);
  CHECK(issues[0].message == "must be <= 256 (episodes record each token's experts as bytes), got 300");
  CHECK(load_config_text("[moe]\nnum_experts = 256\n", "x.toml").moe.num_experts == 256);
  CHECK(load_config_text("[moe]\nenabled = false\nnum_experts = 300\n", "x.toml").moe.num_experts == 300);
}

TEST_CASE("a group larger than an actor's sessions is refused at its line: no actor would ask for it", "[config]") {
  const auto issues = issues_of("[rollout]\nsessions_per_actor = 4\ngroup_size = 8\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "rollout.group_size");
  CHECK(issues[0].line == 3);
  CHECK(issues[0].message ==
        "must be <= rollout.sessions_per_actor (4: an actor runs a whole group at once, so it would never ask for "
        "work), got 8");
  // The default sessions_per_actor (16) bounds a group set alone; equal sizes are fine.
  CHECK(issues_of("[rollout]\ngroup_size = 17\n").at(0).key == "rollout.group_size");
  CHECK(load_config_text("[rollout]\nsessions_per_actor = 8\ngroup_size = 8\n", "x.toml").rollout.group_size == 8);
}

TEST_CASE("rollout.moe_top_k: bounded by num_experts, refused with routing replay of another k", "[config]") {
  // 0 (the default) routes rollouts like the learner.
  CHECK(load_config_text("", "x.toml").rollout.moe_top_k == 0);
  const Config ok = load_config_text("[rollout]\nmoe_top_k = 8\n[algo]\nrouting_replay = false\n", "x.toml");
  CHECK(ok.rollout.moe_top_k == 8);
  CHECK(ok.moe.top_k == 2);
  // The model's own k replays fine.
  CHECK(load_config_text("[rollout]\nmoe_top_k = 2\n", "x.toml").rollout.moe_top_k == 2);

  auto only_issue = [](const std::string& text) {
    const auto issues = issues_of(text);
    REQUIRE(issues.size() == 1);
    CHECK(issues[0].key == "rollout.moe_top_k");
    return issues[0];
  };
  CHECK(only_issue("[rollout]\nmoe_top_k = 9\n[algo]\nrouting_replay = false\n").message ==
        "must be <= moe.num_experts (8), got 9");
  CHECK(only_issue("[rollout]\nmoe_top_k = -1\n").message == "must be >= 0, got -1");
  const ConfigIssue replay = only_issue("[rollout]\nmoe_top_k = 1\n");
  CHECK(replay.line == 2);
  CHECK(replay.message ==
        "= 1 differs from moe.top_k = 2, and algo.routing_replay = true cannot replay 1 experts per token in a "
        "learner that routes with 2: set algo.routing_replay = false (the importance weights then correct for the "
        "other routing) or rollout.moe_top_k = 0");
  CHECK(only_issue("[moe]\nenabled = false\n[rollout]\nmoe_top_k = 1\n[algo]\nrouting_replay = false\n").message ==
        "has no effect on a dense model (moe.enabled = false): leave it 0");
  // The bound follows [moe] num_experts, also when set on the command line.
  CHECK(issues_of("", {"moe.num_experts=4", "rollout.moe_top_k=6", "algo.routing_replay=false"})[0].message ==
        "must be <= moe.num_experts (4), got 6");
}

TEST_CASE("TOML syntax errors carry their line", "[config]") {
  const auto issues = issues_of("[run]\nname = \"unterminated\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].line == 2);
  CHECK(issues[0].source == "test.toml");
}

TEST_CASE("a config path that is a directory or missing is one issue naming the path", "[config]") {
  moerl_test::TempDir dir;
  const auto issue_of_file = [](const std::string& path) -> ConfigIssue {
    try {
      load_config_file(path);
    } catch (const ConfigError& error) {
      REQUIRE(error.issues().size() == 1);
      return error.issues()[0];
    }
    FAIL("'" << path << "' loaded as a configuration");
    return {};
  };
  const ConfigIssue directory = issue_of_file(dir.path.string());
  CHECK(directory.source == dir.path.string());
  CHECK(directory.key.empty());
  CHECK(directory.text() == dir.path.string() + ": is a directory, not a TOML configuration file");
  const ConfigIssue missing = issue_of_file(dir.file("missing.toml"));
  CHECK(missing.text() == dir.file("missing.toml") + ": no such configuration file");
  const ConfigIssue below_a_file = issue_of_file(dir.file("missing.toml/run.toml"));
  CHECK_THAT(below_a_file.text(), Catch::StartsWith(dir.file("missing.toml/run.toml") + ": "));
  // A readable file still loads, also an empty one (every key at its default).
  std::ofstream(dir.file("empty.toml")).close();
  CHECK(load_config_file(dir.file("empty.toml")).cluster.learners == 1);
  std::ofstream(dir.file("run.toml")) << "[cluster]\nactors = 3\n";
  CHECK(load_config_file(dir.file("run.toml")).cluster.actors == 3);
}

TEST_CASE("command-line overrides (--set) get the same validation", "[config]") {
  const Config c =
      load_config_text("[moe]\ntop_k = 2\n", "x.toml",
                       {"moe.top_k=4", "run.name=exp7", "telemetry.log_level=debug", "cluster.message_timeout_s=1.5"});
  CHECK(c.moe.top_k == 4);
  CHECK(c.run.name == "exp7");  // a bare word is a string
  CHECK(c.telemetry.log_level == LogLevel::Debug);
  CHECK(c.cluster.message_timeout_s == 1.5);
  CHECK(c.origins.at("moe.top_k").source == "--set moe.top_k=4");

  const auto bad = issues_of("", {"moe.top_k=99", "model.d_modle=3", "nodot=1"});
  REQUIRE(bad.size() == 3);
  CHECK(bad[0].source == "--set nodot=1");
  CHECK_THAT(bad[0].message, Catch::Contains("section.key=value"));
  CHECK(bad[1].source == "--set model.d_modle=3");
  CHECK_THAT(bad[1].message, Catch::Contains("did you mean 'd_model'"));
  CHECK(bad[2].source == "--set moe.top_k=99");
  CHECK(bad[2].key == "moe.top_k");
}

TEST_CASE("the rank counts must match the world size", "[config]") {
  const Config c = load_config_text("[cluster]\nlearners = 2\nactors = 2\nenv_workers = 1\n", "c.toml");
  CHECK_NOTHROW(check_world_size(c, 5));
  try {
    check_world_size(c, 4);
    FAIL("a 4-rank world passed a 5-rank layout");
  } catch (const ConfigError& error) {
    REQUIRE(error.issues().size() == 1);
    CHECK(error.issues()[0].line == 2);
    CHECK_THAT(error.issues()[0].message, Catch::Contains("= 5 ranks, but the job has 4"));
  }
}

TEST_CASE("config show output loads back to the same configuration", "[config]") {
  const Config original = load_config_text(
      "[moe]\ncapacity_factor = 1.1\nrouter = \"topk_softmax\"\n[run]\nname = \"quote\\\"d\"\n[model]\nrope_theta = "
      "500000.0\n",
      "x.toml");
  const std::string shown = to_toml(original);
  const Config reloaded = load_config_text(shown, "shown.toml");
  CHECK(config_fingerprint(reloaded) == config_fingerprint(original));
  CHECK(reloaded.run.name == "quote\"d");
  CHECK(reloaded.moe.capacity_factor == 1.1);
  CHECK(config_fingerprint(reloaded) != config_fingerprint(Config{}));
}

TEST_CASE("the reference documents every key of every section", "[config]") {
  const std::string reference = reference_markdown();
  for (const SectionSpec& section : all_sections()) {
    CHECK_THAT(reference, Catch::Contains("## [" + section.name + "]"));
    for (const FieldSpec& field : section.fields) {
      INFO(section.name << "." << field.key);
      CHECK_THAT(reference, Catch::Contains("| `" + field.key + "` |"));
      CHECK_FALSE(field.doc.empty());
    }
  }
}

TEST_CASE("float literals read back exactly", "[config]") {
  for (double v : {0.1, 1e-5, 3.0, 1.0 / 3.0, 1e300, -2.5e-7}) {
    const std::string text = toml_float_literal(v);
    INFO(text);
    CHECK(std::strtod(text.c_str(), nullptr) == v);
    CHECK(text.find_first_of(".e") != std::string::npos);
  }
}

TEST_CASE("closest_match suggests within a small edit distance", "[config]") {
  CHECK(closest_match("actros", {"actors", "learners"}) == "actors");
  CHECK(closest_match("top_k", {"top_k", "topk"}) == "top_k");
  CHECK(closest_match("xyz", {"learners"}).empty());
}

TEST_CASE("nested sections: [env.<family>] tables and --set paths", "[config]") {
  const Config c = load_config_text(R"(
[env]
families = ["maze", "sort"]
difficulty = 2
[env.maze]
difficulty = 4
shaping = "shaped"
)",
                                    "env.toml", {"env.sort.max_turns=30"});
  CHECK(c.env.families == std::vector<std::string>{"maze", "sort"});
  CHECK(c.env.difficulty == 2);
  CHECK(c.env_families.at("maze").difficulty == 4);
  CHECK(c.env_families.at("maze").shaping == ShapingChoice::Shaped);
  CHECK(c.env_families.at("sort").max_turns == 30);
  CHECK(c.env_families.at("guess").difficulty == 0);
  // show prints the subsections and reads back identically.
  const std::string shown = to_toml(c);
  CHECK_THAT(shown, Catch::Contains("[env.maze]\ndifficulty = 4"));
  CHECK(config_fingerprint(load_config_text(shown, "shown.toml")) == config_fingerprint(c));

  const auto issues =
      issues_of("[env]\nfamilies = [\"maze\", \"sorting\"]\n[env.mze]\ndifficulty = 2\n[env.guess]\ndifficulty = 11\n");
  REQUIRE(issues.size() == 3);
  CHECK(issues[0].text() == "test.toml:3: [env] mze: unknown key; did you mean 'maze'?");
  CHECK(issues[1].text() == "test.toml:6: [env.guess] difficulty: must be <= 10 (valid range 0 to 10), got 11");
  CHECK(issues[2].key == "env.families");
  CHECK_THAT(issues[2].message, Catch::Contains("unknown task family 'sorting'; did you mean 'sort'?"));
}

TEST_CASE("arrays of strings are type-checked element by element", "[config]") {
  const auto issues = issues_of("[env]\nfamilies = [\"maze\", 3]\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].message == "expected an array of strings, element 1 is an integer");
}

TEST_CASE("cluster placement: host groups need training hosts, rank order takes no host lists", "[config]") {
  const Config c = load_config_text(
      "[cluster]\nplacement = \"host_groups\"\ntraining_hosts = [\"gpu-*\"]\ninference_hosts = [\"cpu-*\", \"n1\"]\n",
      "test.toml");
  CHECK(c.cluster.placement == Placement::HostGroups);
  CHECK(c.cluster.inference_hosts == std::vector<std::string>{"cpu-*", "n1"});

  auto issues = issues_of("[cluster]\nplacement = \"host_groups\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "cluster.training_hosts");
  CHECK_THAT(issues[0].message, Catch::Contains("must name the training hosts"));

  issues = issues_of("[cluster]\ntraining_hosts = [\"gpu-*\"]\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "cluster.placement");
  CHECK_THAT(issues[0].message, Catch::Contains("would be ignored"));

  issues = issues_of("[cluster]\nplacement = \"host_groups\"\ntraining_hosts = [\"gpu-*\", \"\"]\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "cluster.training_hosts");
  CHECK_THAT(issues[0].message, Catch::Contains("empty host pattern"));

  issues = issues_of("[cluster]\nplacement = \"by_host\"\n");
  REQUIRE(issues.size() == 1);
  CHECK_THAT(issues[0].message, Catch::Contains("rank_order | host_groups"));
}

TEST_CASE("run.device and run.dtype: cpu and float32 by default, named choices, errors at their line", "[config]") {
  const Config defaults = load_config_text("", "empty.toml");
  CHECK(defaults.run.device == RunDevice::Cpu);
  CHECK(defaults.run.dtype == RunDtype::Float32);

  const Config c = load_config_text("[run]\ndevice = \"cuda\"\ndtype = \"bfloat16\"\n", "test.toml");
  CHECK(c.run.device == RunDevice::Cuda);
  CHECK(c.run.dtype == RunDtype::BFloat16);
  CHECK(c.origins.at("run.device").line == 2);

  const Config overridden = load_config_text("", "test.toml", {"run.device=cuda", "run.dtype=bfloat16"});
  CHECK(overridden.run.device == RunDevice::Cuda);
  CHECK(overridden.run.dtype == RunDtype::BFloat16);

  auto issues = issues_of("[run]\nname = \"x\"\ndevice = \"gpu\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "run.device");
  CHECK(issues[0].line == 3);
  CHECK_THAT(issues[0].message, Catch::Contains("cpu | cuda"));

  issues = issues_of("[run]\ndtype = \"float16\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "run.dtype");
  CHECK(issues[0].line == 2);
  CHECK_THAT(issues[0].message, Catch::Contains("float32 | bfloat16"));

  issues = issues_of("[run]\ndevice = 1\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "run.device");
}
