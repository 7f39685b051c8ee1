#include "moerl/rollout/trajectory.h"

#include <algorithm>

#include "moerl/env/env_messages.h"

namespace moerl::rollout {

void WorkRequest::encode(runtime::ByteWriter& w) const {
  w.put(free_slots);
  w.put_vector(delivered);
  w.put<std::uint8_t>(done_sending);
}

WorkRequest WorkRequest::decode(runtime::ByteReader& r) {
  WorkRequest m;
  m.free_slots = r.get<std::int32_t>();
  m.delivered = r.get_vector<std::uint64_t>();
  m.done_sending = r.get<std::uint8_t>() != 0;
  return m;
}

void TaskAssignment::encode(runtime::ByteWriter& w) const {
  w.put<std::uint8_t>(finished);
  w.put<std::uint64_t>(groups.size());
  for (const TaskGroup& g : groups) {
    w.put(g.group_id);
    env::write_task(w, g.task);
    w.put(g.size);
    w.put<std::uint8_t>(g.evaluation);
    w.put<std::uint8_t>(g.greedy);
    w.put(g.min_version);
  }
}

TaskAssignment TaskAssignment::decode(runtime::ByteReader& r) {
  TaskAssignment m;
  m.finished = r.get<std::uint8_t>() != 0;
  const auto count = r.get<std::uint64_t>();
  if (count > r.remaining()) throw runtime::WireError("task group count exceeds the payload");
  for (std::uint64_t i = 0; i < count; ++i) {
    TaskGroup g;
    g.group_id = r.get<std::uint64_t>();
    g.task = env::read_task(r);
    g.size = r.get<std::int32_t>();
    g.evaluation = r.get<std::uint8_t>() != 0;
    g.greedy = r.get<std::uint8_t>() != 0;
    g.min_version = r.get<std::int64_t>();
    if (g.size < 1 || g.size > 4096) throw runtime::WireError("task group size " + std::to_string(g.size));
    m.groups.push_back(std::move(g));
  }
  return m;
}

std::int32_t Trajectory::min_version() const {
  std::int32_t oldest = -1;
  for (size_t i = 0; i < versions.size(); ++i)
    if (generated[i] && (oldest < 0 || versions[i] < oldest)) oldest = versions[i];
  return oldest;
}

std::pair<size_t, size_t> Trajectory::window(std::int32_t w) const {
  const size_t begin = w == 0 ? 0 : static_cast<size_t>(window_starts.at(static_cast<size_t>(w - 1)));
  const size_t end = static_cast<size_t>(w) < window_starts.size()
                         ? static_cast<size_t>(window_starts[static_cast<size_t>(w)])
                         : tokens.size();
  return {begin, end};
}

void Trajectory::encode(runtime::ByteWriter& w) const {
  w.put(episode_id);
  w.put(group_id);
  w.put(actor);
  env::write_task(w, task);
  w.put<std::uint8_t>(evaluation);
  w.put_vector(tokens);
  w.put_vector(generated);
  w.put_vector(behaviour_logprobs);
  w.put_vector(versions);
  w.put_vector(window_starts);
  w.put_vector(routing);
  w.put(moe_layers);
  w.put(top_k);
  w.put_vector(turn_rewards);
  w.put(reward);
  w.put<std::uint8_t>(success);
  w.put<std::uint8_t>(truncated);
  w.put(dropped_turns);
  w.put(wall_s);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(failure));
  w.put_string(error);
  w.put(failure_turn);
  w.put(failure_attempts);
  w.put(failure_streak);
}

namespace {

// Reads one field, naming it when the bytes do not hold it (a receiver's
// warning then says which field of which sender's message was bad).
template <typename F>
void read_field(const char* name, F&& read) {
  try {
    read();
  } catch (const runtime::WireError& error) {
    throw runtime::WireError(std::string("field ") + name + ": " + error.what());
  }
}

}  // namespace

Trajectory Trajectory::decode(runtime::ByteReader& r) {
  Trajectory t;
  read_field("episode_id", [&] { t.episode_id = r.get<std::uint64_t>(); });
  read_field("group_id", [&] { t.group_id = r.get<std::uint64_t>(); });
  read_field("actor", [&] { t.actor = r.get<std::int32_t>(); });
  read_field("task", [&] { t.task = env::read_task(r); });
  read_field("evaluation", [&] { t.evaluation = r.get<std::uint8_t>() != 0; });
  read_field("tokens", [&] { t.tokens = r.get_vector<std::int32_t>(); });
  read_field("generated", [&] { t.generated = r.get_vector<std::uint8_t>(); });
  read_field("behaviour_logprobs", [&] { t.behaviour_logprobs = r.get_vector<float>(); });
  read_field("versions", [&] { t.versions = r.get_vector<std::int32_t>(); });
  read_field("window_starts", [&] { t.window_starts = r.get_vector<std::int32_t>(); });
  read_field("routing", [&] { t.routing = r.get_vector<std::uint8_t>(); });
  read_field("moe_layers", [&] { t.moe_layers = r.get<std::int32_t>(); });
  read_field("top_k", [&] { t.top_k = r.get<std::int32_t>(); });
  read_field("turn_rewards", [&] { t.turn_rewards = r.get_vector<float>(); });
  read_field("reward", [&] { t.reward = r.get<double>(); });
  read_field("success", [&] { t.success = r.get<std::uint8_t>() != 0; });
  read_field("truncated", [&] { t.truncated = r.get<std::uint8_t>() != 0; });
  read_field("dropped_turns", [&] { t.dropped_turns = r.get<std::int32_t>(); });
  read_field("wall_s", [&] { t.wall_s = r.get<double>(); });
  read_field("failure", [&] { t.failure = env::read_failure_reason(r); });
  read_field("error", [&] { t.error = r.get_string(); });
  read_field("failure_turn", [&] { t.failure_turn = r.get<std::int32_t>(); });
  read_field("failure_attempts", [&] { t.failure_attempts = r.get<std::int32_t>(); });
  read_field("failure_streak", [&] { t.failure_streak = r.get<std::int32_t>(); });
  if (t.failed() && !t.tokens.empty())
    throw runtime::WireError("trajectory: a failure record (" + std::string(env::failure_reason_name(t.failure)) +
                             ") carries " + std::to_string(t.tokens.size()) + " tokens");
  if (!t.failed() && !t.error.empty()) throw runtime::WireError("trajectory: an error text without a failure reason");
  const size_t n = t.tokens.size();
  if (t.generated.size() != n || t.behaviour_logprobs.size() != n || t.versions.size() != n)
    throw runtime::WireError(
        "trajectory fields generated/behaviour_logprobs/versions disagree in length with tokens (" +
        std::to_string(t.generated.size()) + "/" + std::to_string(t.behaviour_logprobs.size()) + "/" +
        std::to_string(t.versions.size()) + " vs " + std::to_string(n) + ")");
  // Every window holds at least 2 tokens (one position scores the next).
  size_t previous = 0;
  for (const std::int32_t start : t.window_starts) {
    if (start < 0 || static_cast<size_t>(start) < previous + 2 || static_cast<size_t>(start) + 2 > n)
      throw runtime::WireError("trajectory field window_starts: " + std::to_string(start) +
                               " does not leave 2 tokens per window of " + std::to_string(n));
    previous = static_cast<size_t>(start);
  }
  const size_t windows = t.window_starts.size() + 1;
  const size_t per_position =
      static_cast<size_t>(std::max(0, t.moe_layers)) * static_cast<size_t>(std::max(0, t.top_k));
  if (per_position && n > 0 && t.routing.size() != (n - windows) * per_position)
    throw runtime::WireError("trajectory field routing holds " + std::to_string(t.routing.size()) +
                             " entries, expected " + std::to_string((n - windows) * per_position));
  if (!per_position && !t.routing.empty())
    throw runtime::WireError("trajectory field routing holds " + std::to_string(t.routing.size()) +
                             " entries without moe_layers and top_k");
  return t;
}

}  // namespace moerl::rollout
