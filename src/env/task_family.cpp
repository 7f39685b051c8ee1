#include "moerl/env/task_family.h"

#include "families.h"
#include "moerl/core/error.h"

namespace moerl::env {

const std::vector<TaskFamily>& builtin_families() {
  static const std::vector<TaskFamily> families = {
      {"arithmetic", "evaluate an integer expression with a `calc <expr>` tool, then `answer <n>`",
       detail::kArithmeticMaxDifficulty, detail::make_arithmetic_session},
      {"maze", "reach G in a maze seen through a 5x5 window by moving up|down|left|right", detail::kMazeMaxDifficulty,
       detail::make_maze_session},
      {"guess", "find a hidden integer with `guess <n>` and higher/lower feedback", detail::kGuessMaxDifficulty,
       detail::make_guess_session},
      {"sort", "sort a list ascending with `swap i j` commands", detail::kSortMaxDifficulty, detail::make_sort_session},
      {"lookup", "follow a chain of hidden key->value hops with `get <key>`, then `answer <value>`",
       detail::kLookupMaxDifficulty, detail::make_lookup_session},
  };
  return families;
}

const TaskFamily* find_builtin_family(const std::string& name) {
  for (const auto& family : builtin_families()) {
    if (family.name == name) return &family;
  }
  return nullptr;
}

std::unique_ptr<Environment> make_builtin_environment(const std::string& family) {
  if (const TaskFamily* found = find_builtin_family(family)) return found->make();
  std::string known;
  for (const auto& f : builtin_families()) known += (known.empty() ? "" : ", ") + f.name;
  throw Error("env: unknown task family '" + family + "' (built-in families: " + known + ")");
}

}  // namespace moerl::env
