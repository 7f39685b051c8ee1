#include "moerl/learner/evaluation_record.h"

#include <spdlog/fmt/fmt.h>

#include <cstdio>
#include <filesystem>

#include "moerl/core/error.h"
#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"
#include "moerl/storage/atomic_file.h"

namespace moerl::learner {
std::string EvaluationRecord::to_json() const {
  JsonWriter json;
  json.begin_object().key("version").value(version);
  json.key("versions_played").begin_array().value(lowest_version).value(highest_version).end_array();
  json.key("temperature").value(temperature).key("sampled");
  write_scores(json, sampled);
  json.key("greedy");
  write_scores(json, greedy);
  json.end_object();
  return json.str() + "\n";
}

EvaluationRecord EvaluationRecord::from_json(const std::string& text, const std::string& what) {
  try {
    const JsonValue in = JsonValue::parse(text);
    EvaluationRecord r;
    r.version = static_cast<std::int64_t>(in.at("version").as_number());
    const JsonArray played = in.at("versions_played").as_array();
    if (played.size() != 2) throw Error("versions_played must hold two versions");
    r.lowest_version = static_cast<std::int64_t>(played[0].as_number());
    r.highest_version = static_cast<std::int64_t>(played[1].as_number());
    r.temperature = in.at("temperature").as_number();
    r.sampled = read_scores(in.at("sampled"));
    r.greedy = read_scores(in.at("greedy"));
    return r;
  } catch (const Error& error) {
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
