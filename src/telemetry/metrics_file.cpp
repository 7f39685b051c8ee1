#include "moerl/telemetry/metrics_file.h"

#include <filesystem>

#include "moerl/core/error.h"
#include "moerl/core/json_value.h"

namespace moerl::telemetry {

JsonLinesFile::JsonLinesFile(const std::string& path) : path_(path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  file_.open(path, std::ios::app);
  if (!file_) throw Error("cannot open metrics file '" + path + "' for appending");
}

std::optional<std::int64_t> metrics_line_step(const std::string& line) {
  try {
    const std::optional<JsonValue> at = JsonValue::parse(line).find("step");
    if (at) return static_cast<std::int64_t>(at->as_number());
  } catch (const JsonError&) {
  }
  return std::nullopt;
}

std::optional<std::string> last_metrics_line_through(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  std::optional<std::string> found;
  std::string line;
  while (std::getline(in, line)) {
    const std::optional<std::int64_t> at = metrics_line_step(line);
    if (at && *at <= step) found = line;
  }
  return found;
}

std::int64_t keep_lines_through_step(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  if (!in) return 0;
  std::string kept, line;
  std::int64_t dropped = 0;
  while (std::getline(in, line)) {
    const std::optional<std::int64_t> at = metrics_line_step(line);
    if (at && *at <= step) {
      kept += line + "\n";
    } else {
      ++dropped;
    }
  }
  in.close();
  if (dropped == 0) return 0;
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << kept;
    out.flush();
    if (!out) throw Error("cannot rewrite metrics file '" + path + "' (writing '" + temporary + "')");
  }
  std::filesystem::rename(temporary, path);
  return dropped;
}

void JsonLinesFile::append(const std::string& line) {
  file_ << line << '\n';
  file_.flush();
  if (!file_) throw Error("error while writing metrics file '" + path_ + "'");
}

}  // namespace moerl::telemetry
