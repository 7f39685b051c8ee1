#pragma once
// A portable snapshot of one session: its task, the actions taken so far and
// the environment's own snapshot bytes. Any env worker can restore it (from
// the native bytes, or by replaying the actions), which is how a session
// outlives the worker or actor that drove it.

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/env/environment.h"

namespace moerl::env {

struct SessionSnapshot {
  std::uint64_t session = 0;
  TaskSpec task;
  std::vector<std::string> actions;  // every action applied, in order
  std::vector<std::uint8_t> native;  // Environment::snapshot()

  std::vector<std::uint8_t> encode() const;
  static SessionSnapshot decode(const std::vector<std::uint8_t>& bytes);  // throws Error

  // Atomic file write (temporary name, then rename) and read.
  void write_file(const std::string& path) const;
  static SessionSnapshot read_file(const std::string& path);
};

}  // namespace moerl::env
