#pragma once
// Configuration errors. Loading collects every problem it finds, each naming
// where it came from (file and line, or the --set option) and the key, so a
// user fixes a config in one pass instead of one error per launch.

#include <string>
#include <vector>

#include "moerl/core/error.h"

namespace moerl::config {

struct ConfigIssue {
  std::string source;   // file path, or "--set KEY=VALUE" for command-line overrides
  int line = 0;         // 1-based; 0 when not tied to a line
  std::string key;      // "section.key", "section" for a section-level issue, "" for the file itself
  std::string message;  // what is wrong and, when possible, how to fix it

  // "configs/x.toml:12: [cluster] actros: unknown key; did you mean 'actors'?"
  std::string text() const;
};

class ConfigError : public Error {
 public:
  explicit ConfigError(std::vector<ConfigIssue> issues);
  const std::vector<ConfigIssue>& issues() const { return issues_; }

 private:
  std::vector<ConfigIssue> issues_;
};

// The process exit status of a run stopped by a configuration error.
constexpr int kConfigErrorExitStatus = 2;

}  // namespace moerl::config
