#include "moerl/learner/evaluation_record.h"

#include <spdlog/fmt/fmt.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moerl/core/error.h"
#include "moerl/storage/atomic_file.h"

namespace moerl::learner {
namespace {

using nlohmann::json;

json scores_json(const ScoreTable& table) {
  json out = json::object();
  for (const auto& [family, s] : table) {
    const Interval ci = s.success_interval();
    out[family] = {{"success", s.success_rate()}, {"ci_low", ci.low},          {"ci_high", ci.high},
                   {"episodes", s.episodes},      {"successes", s.successes}, {"reward", s.mean_reward()},
                   {"env_failures", s.env_failures}};
  }
  return out;
}

ScoreTable scores_from(const json& object) {
  ScoreTable table;
  for (const auto& [family, s] : object.items()) {
    FamilyScore score;
    score.episodes = s.at("episodes").get<int>();
    score.successes = s.at("successes").get<int>();
    score.env_failures = s.value("env_failures", 0);
    score.reward = s.value("reward", 0.0) * score.episodes;
    table[family] = score;
  }
  return table;
}

}  // namespace

std::string EvaluationRecord::to_json() const {
  json out = {{"version", version},
              {"versions_played", {lowest_version, highest_version}},
              {"temperature", temperature},
              {"sampled", scores_json(sampled)},
              {"greedy", scores_json(greedy)}};
  return out.dump(2) + "\n";
}

EvaluationRecord EvaluationRecord::from_json(const std::string& text, const std::string& what) {
  try {
    const json in = json::parse(text);
    EvaluationRecord r;
    r.version = in.at("version").get<std::int64_t>();
    if (in.contains("versions_played")) {
      r.lowest_version = in["versions_played"].at(0).get<std::int64_t>();
      r.highest_version = in["versions_played"].at(1).get<std::int64_t>();
    }
    r.temperature = in.value("temperature", 0.0);
    r.sampled = scores_from(in.at("sampled"));
    if (in.contains("greedy")) r.greedy = scores_from(in["greedy"]);
    return r;
  } catch (const json::exception& error) {
    throw Error(what + ": not an evaluation record: " + error.what());
  }
}

std::string evaluation_path(const std::string& checkpoint_dir, std::int64_t version) {
  if (version < 0) return (std::filesystem::path(checkpoint_dir) / "base.eval.json").string();
  char name[32];
  std::snprintf(name, sizeof name, "v%06lld.eval.json", static_cast<long long>(version));
  return (std::filesystem::path(checkpoint_dir) / name).string();
}

void write_evaluation(const std::string& checkpoint_dir, const EvaluationRecord& record) {
  std::filesystem::create_directories(checkpoint_dir);
  storage::write_file_atomically(evaluation_path(checkpoint_dir, record.version), record.to_json());
}

std::optional<EvaluationRecord> read_evaluation(const std::string& checkpoint_dir, std::int64_t version) {
  const std::string path = evaluation_path(checkpoint_dir, version);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  return EvaluationRecord::from_json(storage::read_whole_file(path), path);
}

std::vector<std::string> regressions(const ScoreTable& reference, const ScoreTable& candidate) {
  std::vector<std::string> found;
  for (const auto& [family, ref] : reference) {
    const auto it = candidate.find(family);
    if (it == candidate.end() || ref.episodes == 0 || it->second.episodes == 0) continue;
    const Gain gain = success_gain(ref, it->second);
    if (gain.interval.high >= 0) continue;
    found.push_back(fmt::format("{} {:.0f}% vs {:.0f}% ({:+.0f} points, interval [{:+.0f}, {:+.0f}])", family,
                                100 * it->second.success_rate(), 100 * ref.success_rate(), 100 * gain.value,
                                100 * gain.interval.low, 100 * gain.interval.high));
  }
  return found;
}

}  // namespace moerl::learner
