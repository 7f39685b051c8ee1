// The actor's context budget policy (rollout.context_policy) and the
// routing of the context windows it feeds.
//
// drop_oldest_turns: before a turn's prompt, when the window fed so far,
// the prompt and a whole next action (max_tokens_per_turn) would not fit
// the context budget, the actor keeps the head (system prompt and task
// statement, EpisodeFormat::head_length) and the newest whole turns that
// fit in about half the budget, drops the older ones, and has the engine
// prefill that rebuilt context afresh (so a rebuild, which prefills all it
// keeps, comes every few turns rather than every turn).
// The trajectory records the new window (Trajectory::window_starts) with the
// kept tokens re-fed as not generated, so that the learner scores every
// generated token in the context the actor sampled it in. Cuts fall only at
// turn starts (the prompt that follows an action), never inside an action.

#include <spdlog/spdlog.h>

#include <optional>

#include "moerl/rollout/actor.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::rollout {
namespace {

// Runs of generated tokens in [begin, end): the actions there.
std::int32_t actions_in(const std::vector<std::uint8_t>& generated, size_t begin, size_t end) {
  std::int32_t actions = 0;
  for (size_t i = begin; i < end; ++i)
    if (generated[i] && (i == begin || !generated[i - 1])) ++actions;
  return actions;
}

std::vector<std::uint8_t> routing_bytes(const torch::Tensor& routing) {
  const torch::Tensor bytes = routing.to(torch::kCPU, torch::kUInt8).contiguous();
  return std::vector<std::uint8_t>(bytes.data_ptr<std::uint8_t>(), bytes.data_ptr<std::uint8_t>() + bytes.numel());
}

}  // namespace

bool Actor::make_room(Episode& episode, size_t prompt_tokens) {
  Trajectory& t = episode.trajectory;
  const auto budget = static_cast<size_t>(engine_.context_budget());
  const size_t need = prompt_tokens + static_cast<size_t>(settings_.rollout.max_tokens_per_turn);
  const size_t window = t.tokens.size() - episode.window_start;
  // The engine needs one position free after the context for each token it generates.
  if (window + need < budget) return true;
  const std::vector<std::int64_t> current(t.tokens.begin() + static_cast<std::ptrdiff_t>(episode.window_start),
                                          t.tokens.end());
  const auto head = static_cast<size_t>(format_.head_length(current));
  if (head == 0 || head + need >= budget) return false;  // the engine ends the episode at the budget (flagged)
  // The oldest cut (a turn start past the head) that brings the context down
  // to half the budget, so that the next rebuild (a prefill of everything
  // kept) is some turns away; else the oldest that fits at all; else the
  // head alone.
  auto oldest_cut_within = [&](size_t limit) -> std::optional<size_t> {
    for (const size_t start : episode.turn_starts) {
      const size_t offset = start - episode.window_start;
      if (offset >= head && head + (window - offset) + need < limit) return offset;
    }
    return std::nullopt;
  };
  const size_t cut =
      oldest_cut_within(std::max(budget / 2, head + need + 1)).value_or(oldest_cut_within(budget).value_or(window));
  if (moe_layers_ > 0) {
    const torch::Tensor routing = engine_.context_routing(episode.id);  // [fed, layers, k]
    if (routing.size(0) == static_cast<std::int64_t>(window) - 1) {
      const std::vector<std::uint8_t> bytes = routing_bytes(routing);
      episode.window_routing.insert(episode.window_routing.end(), bytes.begin(), bytes.end());
    } else {
      episode.window_routing_lost = true;
    }
  }
  const std::int32_t dropped = actions_in(t.generated, episode.window_start + head, episode.window_start + cut);
  std::vector<std::int64_t> kept(current.begin(), current.begin() + static_cast<std::ptrdiff_t>(head));
  kept.insert(kept.end(), current.begin() + static_cast<std::ptrdiff_t>(cut), current.end());
  // The new window: the kept tokens again, fed but not generated (their
  // first window trained on them); its turn starts shift with them.
  const size_t new_start = t.tokens.size();
  std::vector<size_t> turn_starts;
  for (const size_t start : episode.turn_starts)
    if (start - episode.window_start >= cut)
      turn_starts.push_back(new_start + head + (start - episode.window_start - cut));
  t.window_starts.push_back(static_cast<std::int32_t>(new_start));
  for (const std::int64_t token : kept) {
    t.tokens.push_back(static_cast<std::int32_t>(token));
    t.generated.push_back(0);
    t.behaviour_logprobs.push_back(0.f);
    t.versions.push_back(-1);
  }
  episode.window_start = new_start;
  episode.turn_starts = std::move(turn_starts);
  t.dropped_turns += dropped;
  telemetry::metrics().add("actor.context_rebuilds");
  telemetry::metrics().add("actor.context_dropped_turns", static_cast<double>(dropped));
  spdlog::debug("episode {}: context rebuilt to {} tokens (head {}, {} turns dropped)", t.episode_id, kept.size(), head,
                dropped);
  engine_.replace_context(episode.id, std::move(kept));
  return true;
}

void Actor::collect_routing(Episode& episode) {
  Trajectory& t = episode.trajectory;
  const torch::Tensor routing = engine_.context_routing(episode.id);  // [fed, layers, k] of the current window
  const auto window = static_cast<std::int64_t>(t.tokens.size() - episode.window_start);
  if (!episode.window_routing_lost && routing.size(0) == window - 1) {
    t.routing = episode.window_routing;
    const std::vector<std::uint8_t> bytes = routing_bytes(routing);
    t.routing.insert(t.routing.end(), bytes.begin(), bytes.end());
    return;
  }
  telemetry::metrics().add("actor.routing_mismatch");  // the learner routes itself for this one
  spdlog::debug("episode {}: routing of {} positions for a window of {} tokens; not replayed", t.episode_id,
                routing.size(0), window);
  t.routing.clear();
  t.moe_layers = t.top_k = 0;
}

}  // namespace moerl::rollout
