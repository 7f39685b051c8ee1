#pragma once
// The run's metrics file (RUN_DIR/metrics.jsonl, one line per learner step,
// telemetry/metrics_aggregator.h): appending to it, and reading and trimming
// it by step.

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace moerl::telemetry {

// A resumed run writes the steps after its checkpoint again: keeps the lines
// of `path` whose "step" is at most `step` (a line that does not parse is
// dropped too) and returns how many were dropped. Rewrites the file through a
// temporary name and a rename; a missing file is left missing.
std::int64_t keep_lines_through_step(const std::string& path, std::int64_t step);
// The "step" of one metrics line; nullopt for a line that does not parse (cut
// short by a crash) or has no step.
std::optional<std::int64_t> metrics_line_step(const std::string& line);
// The text of the last line of `path` whose step is at most `step` (for a
// resumed run, the one written after the resume); nullopt when none is.
std::optional<std::string> last_metrics_line_through(const std::string& path, std::int64_t step);

// Appends lines to a JSON-lines file, flushing each so a crash loses nothing written.
class JsonLinesFile {
 public:
  explicit JsonLinesFile(const std::string& path);  // creates parent directories
  void append(const std::string& line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream file_;
};

}  // namespace moerl::telemetry
