#pragma once
// The registry of task families: name -> factory, difficulty range, and what
// each family asks of the agent (for `moerl env play` and the docs).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moerl/env/environment.h"

namespace moerl::env {

struct TaskFamily {
  std::string name;
  std::string summary;  // one line: what the agent must do
  int max_difficulty = 1;
  std::function<std::unique_ptr<Environment>()> make;
};

// The built-in families: arithmetic, maze, guess, sort, lookup.
const std::vector<TaskFamily>& builtin_families();
const TaskFamily* find_builtin_family(const std::string& name);

// A fresh, unopened session of a built-in family; throws moerl::Error naming
// the family (and listing the known ones) when it is unknown.
std::unique_ptr<Environment> make_builtin_environment(const std::string& family);

}  // namespace moerl::env
