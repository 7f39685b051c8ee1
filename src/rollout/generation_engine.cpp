#include "moerl/rollout/generation_engine.h"

#include <ATen/Parallel.h>

#include "moerl/comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "moerl/core/check.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::rollout {

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::StopNone: return "none";
    case StopReason::StopEndOfTurn: return "eot";
    case StopReason::StopString: return "stop_string";
    case StopReason::StopMaxTurnTokens: return "max_turn_tokens";
    case StopReason::StopEpisodeBudget: return "episode_budget";
    case StopReason::StopContextBudget: return "context_budget";
  }
  return "unknown";
}

GenerationEngine::GenerationEngine(model::Policy policy, EngineOptions options)
    : policy_(std::move(policy)),
      options_(options),
      cache_(policy_->model_config(), policy_->embed_tokens->weight.options().requires_grad(false),
             model::PagedCacheOptions{options.block_size, options.initial_kv_blocks, options.max_kv_blocks, 8,
                                      options.kv_cache_dtype}) {
  const auto& model = policy_->model_config();
  MOERL_CHECK(options_.max_step_tokens >= 1, "rollout: max_step_tokens must be >= 1");
  MOERL_CHECK(options_.truncate_keep_fraction > 0 && options_.truncate_keep_fraction < 1,
              "rollout: truncate_keep_fraction must be in (0, 1)");
  budget_ = options_.context_budget > 0 ? std::min(options_.context_budget, model.max_seq_len) : model.max_seq_len;
  if (options_.max_kv_blocks > 0) budget_ = std::min(budget_, options_.max_kv_blocks * options_.block_size);
  MOERL_CHECK(budget_ >= 2, "rollout: the context budget must allow at least 2 tokens");
  moe_layers_ = policy_->num_moe_layers();
  policy_->set_active_experts(options_.moe_top_k);
  top_k_ = policy_->active_experts();
  vocab_ = model.vocab_size;
}

GenerationEngine::Session& GenerationEngine::get(std::uint64_t id) {
  auto it = sessions_.find(id);
  MOERL_CHECK(it != sessions_.end(), "rollout: unknown session " + std::to_string(id));
  return it->second;
}

const GenerationEngine::Session& GenerationEngine::get(std::uint64_t id) const {
  auto it = sessions_.find(id);
  MOERL_CHECK(it != sessions_.end(), "rollout: unknown session " + std::to_string(id));
  return it->second;
}

void GenerationEngine::add_session(std::uint64_t id, std::uint64_t seed) {
  MOERL_CHECK(sessions_.count(id) == 0, "rollout: session " + std::to_string(id) + " already exists");
  Session s;
  s.id = id;
  s.seed = seed;
  s.admit_order = admit_counter_++;
  s.last_active_step = step_count_;
  sessions_.emplace(id, std::move(s));
}

void GenerationEngine::remove_session(std::uint64_t id) {
  Session& s = get(id);
  release_kv(s);
  finished_early_.erase(std::remove(finished_early_.begin(), finished_early_.end(), id), finished_early_.end());
  sessions_.erase(id);
}

void GenerationEngine::release_kv(Session& s) {
  if (s.kv >= 0) cache_.remove_sequence(s.kv);
  s.kv = -1;
  s.fed = 0;
  s.routing.clear();
}

void GenerationEngine::end_episode(Session& s, StopReason reason) {
  s.over = true;
  s.over_reason = reason;
}

bool GenerationEngine::truncate_context(Session& s) {
  const auto size = static_cast<std::int64_t>(s.context.size());
  const std::int64_t head = options_.format.head_length(s.context);
  const auto target = static_cast<std::int64_t>(options_.truncate_keep_fraction * static_cast<double>(budget_));
  const std::int64_t tail = target - head;
  if (tail < 1) return false;
  std::int64_t cut = std::max(head, size - tail);
  // Start the kept tail at a message boundary when there is one.
  for (std::int64_t i = cut; i < size; ++i) {
    if (options_.format.starts_message(s.context[static_cast<std::size_t>(i)])) {
      cut = i;
      break;
    }
  }
  if (head + (size - cut) > budget_ - 1) return false;
  std::vector<std::int64_t> kept(s.context.begin(), s.context.begin() + head);
  kept.insert(kept.end(), s.context.begin() + cut, s.context.end());
  reset_context(s, std::move(kept));
  return true;
}

void GenerationEngine::reset_context(Session& s, std::vector<std::int64_t> tokens) {
  release_kv(s);
  s.context = std::move(tokens);
  s.truncated_since_turn = true;
  telemetry::metrics().add("rollout.truncations");
}

void GenerationEngine::check_vocabulary(const std::vector<std::int64_t>& tokens, const char* what) const {
  for (std::int64_t t : tokens) {
    MOERL_CHECK(t >= 0 && t < vocab_, std::string("rollout: ") + what + " token " + std::to_string(t) +
                                          " outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  }
}

void GenerationEngine::append_prompt(std::uint64_t id, const std::vector<std::int64_t>& tokens) {
  Session& s = get(id);
  MOERL_CHECK(!s.generating, "rollout: append_prompt on session " + std::to_string(id) + " while it is generating");
  check_vocabulary(tokens, "prompt");
  if (s.over) return;  // the episode already ended; nothing more is fed
  const std::size_t before = s.context.size();
  s.context.insert(s.context.end(), tokens.begin(), tokens.end());
  // Room for at least one generated token must remain.
  if (static_cast<std::int64_t>(s.context.size()) > budget_ - 1) {
    const bool kept = options_.context_policy == ContextPolicy::ContextTruncate && truncate_context(s);
    if (!kept) {
      s.context.resize(before);
      end_episode(s, StopReason::StopContextBudget);
    }
  }
}

void GenerationEngine::replace_context(std::uint64_t id, std::vector<std::int64_t> tokens) {
  Session& s = get(id);
  MOERL_CHECK(!s.generating, "rollout: replace_context on session " + std::to_string(id) + " while it is generating");
  MOERL_CHECK(static_cast<std::int64_t>(tokens.size()) <= budget_ - 1,
              "rollout: replace_context: " + std::to_string(tokens.size()) +
                  " tokens do not fit the context budget of " + std::to_string(budget_));
  check_vocabulary(tokens, "context");
  reset_context(s, std::move(tokens));
}

void GenerationEngine::start_turn(std::uint64_t id, const SamplingParams& sampling, const StopParams& stop) {
  Session& s = get(id);
  MOERL_CHECK(!s.generating, "rollout: session " + std::to_string(id) + " is already generating");
  MOERL_CHECK(!s.ready, "rollout: session " + std::to_string(id) + " has an untaken turn");
  MOERL_CHECK(s.over || !s.context.empty(),
              "rollout: session " + std::to_string(id) + " has an empty context; append a prompt first");
  MOERL_CHECK(stop.max_turn_tokens >= 0 && stop.max_episode_tokens >= 0,
              "rollout: max_turn_tokens and max_episode_tokens must be >= 0");
  filter_distribution(std::vector<double>{0.0}, sampling);  // validates the parameters now
  s.sampling = sampling;
  s.stop = stop;
  s.turn = GeneratedTurn{};
  s.turn.context_truncated = s.truncated_since_turn;
  s.turn_routing.clear();
  s.turn_text.clear();
  s.generating = true;
  s.last_active_step = step_count_;
  std::vector<std::uint64_t> finished;
  if (s.over) {
    finish_turn(s, s.over_reason, finished);
  } else if (stop.max_episode_tokens > 0 && s.episode_tokens >= stop.max_episode_tokens) {
    end_episode(s, StopReason::StopEpisodeBudget);
    finish_turn(s, StopReason::StopEpisodeBudget, finished);
  }
  finished_early_.insert(finished_early_.end(), finished.begin(), finished.end());
}

void GenerationEngine::finish_turn(Session& s, StopReason reason, std::vector<std::uint64_t>& finished) {
  s.generating = false;
  s.ready = true;
  s.turn.stop_reason = reason;
  s.turn.episode_over = s.over;
  const auto n = static_cast<std::int64_t>(s.turn.tokens.size());
  if (moe_layers_ > 0) {
    s.turn.expert_indices = torch::tensor(s.turn_routing, torch::kLong).view({n, moe_layers_, top_k_}).clone();
  }
  s.truncated_since_turn = false;
  finished.push_back(s.id);
}

GeneratedTurn GenerationEngine::take_turn(std::uint64_t id) {
  Session& s = get(id);
  MOERL_CHECK(s.ready, "rollout: session " + std::to_string(id) + " has no finished turn");
  s.ready = false;
  GeneratedTurn turn = std::move(s.turn);
  s.turn = GeneratedTurn{};
  return turn;
}

bool GenerationEngine::is_generating(std::uint64_t id) const { return get(id).generating; }
bool GenerationEngine::turn_ready(std::uint64_t id) const { return get(id).ready; }
bool GenerationEngine::episode_over(std::uint64_t id) const { return get(id).over; }
const std::vector<std::int64_t>& GenerationEngine::context(std::uint64_t id) const { return get(id).context; }
std::int64_t GenerationEngine::fed_length(std::uint64_t id) const { return get(id).fed; }

torch::Tensor GenerationEngine::context_routing(std::uint64_t id) const {
  const Session& s = get(id);
  if (moe_layers_ == 0) return torch::Tensor();
  return torch::tensor(s.routing, torch::kLong).view({s.fed, moe_layers_, top_k_}).clone();
}

std::int64_t GenerationEngine::feed_target(const Session& s) const {
  const auto size = static_cast<std::int64_t>(s.context.size());
  // An idle session keeps its last token unfed: start_turn needs a position
  // whose logits it can sample from.
  return s.generating ? size : std::max<std::int64_t>(0, size - 1);
}

bool GenerationEngine::has_work() const {
  if (!finished_early_.empty()) return true;
  const bool room = cache_.blocks_available() > 0;
  for (const auto& kv : sessions_) {
    if (kv.second.generating) return true;
    // Idle prefill only counts while it can make progress (see schedule()).
    if (room && kv.second.fed < feed_target(kv.second)) return true;
  }
  return false;
}

void GenerationEngine::swap_weights(const std::vector<torch::Tensor>& new_params, std::int64_t version) {
  std::vector<torch::Tensor> params = policy_->parameters();
  MOERL_CHECK(new_params.size() == params.size(), "rollout: swap_weights got " + std::to_string(new_params.size()) +
                                                      " tensors, the policy has " + std::to_string(params.size()) +
                                                      " parameters");
  for (std::size_t i = 0; i < params.size(); ++i) {
    MOERL_CHECK(new_params[i].defined() && new_params[i].sizes() == params[i].sizes(),
                "rollout: swap_weights tensor " + std::to_string(i) + " has shape " +
                    (new_params[i].defined() ? c10::str(new_params[i].sizes()) : std::string("<undefined>")) +
                    ", the parameter has " + c10::str(params[i].sizes()));
  }
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(new_params[i]);
  }
  policy_version_ = version;
  if (options_.recompute_kv_on_swap) {
    for (auto& kv : sessions_) release_kv(kv.second);
  }
}

GenerationEngine::Session* GenerationEngine::pick_victim(const Session& needy, const std::vector<Row>& rows) {
  auto scheduled = [&](const Session& s) {
    for (const Row& r : rows) {
      if (r.session == &s) return true;
    }
    return false;
  };
  Session* best = nullptr;
  // An idle session's prefill is opportunistic (it only gets ahead of its
  // next turn): it never evicts anyone, or idle sessions could evict each
  // other forever.
  if (!needy.generating) return nullptr;
  // Idle sessions first, least recently active first.
  for (auto& kv : sessions_) {
    Session& s = kv.second;
    if (&s == &needy || s.kv < 0 || s.generating || scheduled(s) || cache_.blocks_of(s.kv) == 0) continue;
    if (best == nullptr || s.last_active_step < best->last_active_step) best = &s;
  }
  if (best != nullptr || !needy.generating) return best;
  // Then generating sessions admitted after the needy one, newest first.
  for (auto& kv : sessions_) {
    Session& s = kv.second;
    if (&s == &needy || s.kv < 0 || !s.generating || scheduled(s) || s.admit_order < needy.admit_order ||
        cache_.blocks_of(s.kv) == 0)
      continue;
    if (best == nullptr || s.admit_order > best->admit_order) best = &s;
  }
  return best;
}

std::vector<GenerationEngine::Row> GenerationEngine::schedule() {
  std::vector<Session*> decode, prefill;
  for (auto& kv : sessions_) {
    Session& s = kv.second;
    const std::int64_t pending = feed_target(s) - s.fed;
    if (pending <= 0) continue;
    (s.generating && pending == 1 && s.kv >= 0 ? decode : prefill).push_back(&s);
  }
  auto by_admission = [](const Session* a, const Session* b) { return a->admit_order < b->admit_order; };
  std::sort(decode.begin(), decode.end(), by_admission);
  // Prefills of generating sessions first: they block a turn in progress.
  std::stable_sort(prefill.begin(), prefill.end(), [](const Session* a, const Session* b) {
    if (a->generating != b->generating) return a->generating;
    return a->admit_order < b->admit_order;
  });

  std::vector<Row> rows;
  std::int64_t reserved = 0;  // blocks promised to rows of this step
  std::int64_t prefill_budget = options_.max_step_tokens;
  auto admit = [&](Session& s, bool is_decode) {
    std::int64_t count = feed_target(s) - s.fed;
    if (!is_decode) count = std::min(count, options_.isolate_sessions ? options_.max_step_tokens : prefill_budget);
    if (count <= 0) return;
    if (s.kv < 0) s.kv = cache_.add_sequence();
    std::int64_t need = cache_.blocks_needed({s.kv}, {count});
    while (need > cache_.blocks_available() - reserved) {
      Session* victim = pick_victim(s, rows);
      if (victim == nullptr) break;
      release_kv(*victim);
      telemetry::metrics().add("rollout.preemptions");
      if (victim->generating) ++victim->turn.preemptions;
    }
    const std::int64_t free = cache_.blocks_available() - reserved;
    if (need > free) {
      // Take what fits (a prefill chunk), else wait for a later step.
      const std::int64_t room = (cache_.blocks_of(s.kv) + free) * cache_.block_size() - s.fed;
      if (is_decode || room < 1) {
        if (is_decode && s.fed > 0) {
          // Nothing to preempt: this session yields its own blocks to the
          // older ones and is prefilled again later.
          release_kv(s);
          telemetry::metrics().add("rollout.preemptions");
          ++s.turn.preemptions;
        }
        return;
      }
      count = std::min(count, room);
      need = cache_.blocks_needed({s.kv}, {count});
    }
    reserved += need;
    if (!is_decode && !options_.isolate_sessions) prefill_budget -= count;
    rows.push_back(Row{&s, count});
  };
  for (Session* s : decode) admit(*s, true);
  for (Session* s : prefill) {
    if (prefill_budget <= 0) break;
    admit(*s, false);
  }
  return rows;
}

std::vector<SampledToken> GenerationEngine::sample_rows(const std::vector<Row>& rows,
                                                        const torch::Tensor& logits) const {
  // Each row's draw depends only on its logits and its session's (seed,
  // draw index), so rows sample in parallel and the result is the same for
  // any thread count; the session bookkeeping that follows stays serial.
  std::vector<SampledToken> sampled(rows.size());
  const auto B = static_cast<std::int64_t>(rows.size());
  at::parallel_for(0, B, 16, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t b = first; b < last; ++b) {
      const Row& r = rows[static_cast<std::size_t>(b)];
      const Session& s = *r.session;
      if (!(s.generating && s.fed + r.count == static_cast<std::int64_t>(s.context.size()))) continue;
      sampled[static_cast<std::size_t>(b)] =
          sample_token(logits.data_ptr<double>() + b * vocab_, vocab_, s.sampling, s.seed, s.draws);
    }
  });
  return sampled;
}

void GenerationEngine::take_sampled(Session& s, const SampledToken& tok, const std::int64_t* routing,
                                    std::vector<std::uint64_t>& finished) {
  ++s.draws;
  s.turn.tokens.push_back(tok.id);
  s.turn.logprobs.push_back(static_cast<float>(tok.log_prob));
  s.turn.model_logprobs.push_back(static_cast<float>(tok.model_log_prob));
  s.turn.policy_versions.push_back(policy_version_);
  if (moe_layers_ > 0) s.turn_routing.insert(s.turn_routing.end(), routing, routing + moe_layers_ * top_k_);
  s.context.push_back(tok.id);
  ++s.episode_tokens;
  telemetry::metrics().add("rollout.decode_tokens");

  if (s.stop.stop_on_eot && tok.id == options_.format.end_of_turn_id()) {
    finish_turn(s, StopReason::StopEndOfTurn, finished);
    return;
  }
  const std::string bytes = s.stop.stop_strings.empty() ? std::string() : options_.format.token_bytes(tok.id);
  if (!bytes.empty()) {  // special tokens add no text
    const std::size_t before = s.turn_text.size();
    s.turn_text += bytes;
    for (const std::string& stop : s.stop.stop_strings) {
      if (stop.empty()) continue;
      // Only a match that ends in the new bytes is new.
      const std::size_t from = before + 1 >= stop.size() ? before + 1 - stop.size() : 0;
      if (s.turn_text.find(stop, from) != std::string::npos) {
        finish_turn(s, StopReason::StopString, finished);
        return;
      }
    }
  }
  if (s.stop.max_episode_tokens > 0 && s.episode_tokens >= s.stop.max_episode_tokens) {
    end_episode(s, StopReason::StopEpisodeBudget);
    finish_turn(s, StopReason::StopEpisodeBudget, finished);
    return;
  }
  if (s.stop.max_turn_tokens > 0 && static_cast<std::int64_t>(s.turn.tokens.size()) >= s.stop.max_turn_tokens) {
    finish_turn(s, StopReason::StopMaxTurnTokens, finished);
    return;
  }
  if (static_cast<std::int64_t>(s.context.size()) >= budget_) {
    if (options_.context_policy == ContextPolicy::ContextTruncate && truncate_context(s)) {
      s.turn.context_truncated = true;
      return;  // keeps generating after the kept context is prefilled again
    }
    end_episode(s, StopReason::StopContextBudget);
    finish_turn(s, StopReason::StopContextBudget, finished);
  }
}

void GenerationEngine::run_rows(const std::vector<Row>& rows, std::vector<std::uint64_t>& finished) {
  if (rows.empty()) return;
  const auto B = static_cast<std::int64_t>(rows.size());
  std::int64_t width = 0;
  for (const Row& r : rows) width = std::max(width, r.count);
  std::vector<std::int64_t> host(static_cast<std::size_t>(B * width), options_.format.pad_id());
  std::vector<std::int64_t> lengths;
  std::vector<model::SequenceId> ids;
  for (std::int64_t b = 0; b < B; ++b) {
    const Row& r = rows[static_cast<std::size_t>(b)];
    std::copy(r.session->context.begin() + r.session->fed, r.session->context.begin() + r.session->fed + r.count,
              host.begin() + b * width);
    lengths.push_back(r.count);
    ids.push_back(r.session->kv);
  }
  const torch::Device device = policy_->embed_tokens->weight.device();
  const torch::Tensor tokens = torch::tensor(host, torch::kLong).view({B, width}).to(device);
  const torch::Tensor lens = torch::tensor(lengths, torch::kLong).to(device);
  const model::PolicyOutput out =
      policy_->forward_cached(tokens, lens, cache_, ids, torch::Tensor(), /*next_token_only=*/true);
  for (std::size_t layer = 0; layer < out.router_stats.size(); ++layer)
    expert_load_.add(layer, out.router_stats[layer].tokens_per_expert, out.router_stats[layer].dropped_tokens);

  // Host copies: routing of every fed token, logits of the rows that sample.
  torch::Tensor routing;
  if (out.expert_indices.defined()) routing = out.expert_indices.to(torch::kCPU).contiguous();
  const std::int64_t per_token = moe_layers_ * top_k_;
  const torch::Tensor last = out.last_token.to(torch::kCPU).contiguous();
  const std::int64_t* last_token = last.data_ptr<std::int64_t>();  // read per row: no tensor op per session
  bool any_sampling = false;
  for (const Row& r : rows)
    any_sampling |= r.session->generating && r.session->fed + r.count == feed_target(*r.session);
  torch::Tensor logits;
  // Sampling runs on the host (the counter-based per-session streams of
  // sampling.h): float32 logits cross the bus, then widen exactly to double.
  if (any_sampling) logits = out.next_token_logits().to(torch::kCPU).to(torch::kDouble).contiguous();
  const std::vector<SampledToken> sampled = sample_rows(rows, logits);

  std::int64_t offset = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const Row& r = rows[static_cast<std::size_t>(b)];
    Session& s = *r.session;
    if (routing.defined()) {
      const std::int64_t* p = routing.data_ptr<std::int64_t>() + offset * per_token;
      s.routing.insert(s.routing.end(), p, p + r.count * per_token);
    }
    s.fed += r.count;
    s.last_active_step = step_count_;
    offset += r.count;
    if (s.generating && s.fed == static_cast<std::int64_t>(s.context.size())) {
      const std::int64_t* route = nullptr;
      if (routing.defined()) route = routing.data_ptr<std::int64_t>() + last_token[b] * per_token;
      take_sampled(s, sampled[static_cast<std::size_t>(b)], route, finished);
    }
  }
}

std::int64_t GenerationEngine::agree_forwards(std::int64_t mine) {
  if (!lockstep_) return mine;
  // Each member's count in its own slot; one sum gathers them all.
  std::vector<double> slots(static_cast<std::size_t>(lockstep_->size()), 0.0);
  slots[static_cast<std::size_t>(lockstep_->rank())] = static_cast<double>(mine);
  lockstep_->allreduce_sum(slots.data(), slots.size(), comm::DataType::Float64, lockstep_timeout_s_);
  return static_cast<std::int64_t>(*std::max_element(slots.begin(), slots.end()));
}

std::vector<std::uint64_t> GenerationEngine::step() {
  const auto t0 = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  std::vector<std::uint64_t> finished;
  finished.swap(finished_early_);
  const std::vector<Row> rows = schedule();
  std::vector<Row> decode_rows, prefill_rows;
  std::int64_t prefill_tokens = 0;
  for (const Row& r : rows) {
    const bool is_decode = r.count == 1 && r.session->generating &&
                           r.session->fed + 1 == static_cast<std::int64_t>(r.session->context.size());
    (is_decode ? decode_rows : prefill_rows).push_back(r);
    if (!is_decode) prefill_tokens += r.count;
  }
  std::int64_t forwards = 0;
  if (options_.isolate_sessions) {
    // One forward per session: a [B, S] batch could round differently than the same row alone.
    forwards = static_cast<std::int64_t>(decode_rows.size() + prefill_rows.size());
  } else {
    forwards = static_cast<std::int64_t>(!decode_rows.empty()) + static_cast<std::int64_t>(!prefill_rows.empty());
  }
  const std::int64_t group_forwards = agree_forwards(forwards);
  if (options_.isolate_sessions) {
    for (const std::vector<Row>* group : {&decode_rows, &prefill_rows})
      for (const Row& r : *group) run_rows({r}, finished);
  } else {
    run_rows(decode_rows, finished);
    run_rows(prefill_rows, finished);
  }
  for (std::int64_t i = forwards; i < group_forwards; ++i) policy_->idle_expert_pass();
  ++step_count_;
  std::sort(finished.begin(), finished.end());

  auto& m = telemetry::metrics();
  m.add("rollout.prefill_tokens", static_cast<double>(prefill_tokens));
  m.set("rollout.batch_occupancy",
        sessions_.empty() ? 0.0 : static_cast<double>(rows.size()) / static_cast<double>(sessions_.size()));
  m.set("rollout.kv_bytes", static_cast<double>(cache_.used_bytes()));
  m.set("rollout.kv_bytes_allocated", static_cast<double>(cache_.memory_bytes()));
  if (step_count_ % kExpertLoadEverySteps == 0 && !expert_load_.empty()) {
    telemetry::record_expert_load(expert_load_);
    expert_load_ = telemetry::ExpertLoad();
  }
  m.record("rollout.step_latency_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return finished;
}

}  // namespace moerl::rollout
