#pragma once
// GenerationEngine: the rollout actor's decoding loop over one Policy, with
// continuous batching over a paged KV cache.
//
// Sessions (one per environment episode) join and leave at any step. Each
// holds a context: every token of the episode so far (prompts appended by
// the caller, tokens the policy generated), of which the first `fed` are in
// the KV cache. One step():
//   1. schedules rows: a decode row (1 token) for every generating session
//      whose context is fed up to its last token, then prefill rows for
//      sessions with unfed context, oldest session first, up to
//      EngineOptions::max_step_tokens prefill tokens (longer prompts are
//      prefilled in chunks over several steps);
//   2. runs at most two Policy::forward_cached calls: all decode rows
//      together, all prefill rows together (kept apart because a [B, S]
//      batch pads every row to the longest, so one long prompt would make
//      every decode row S times dearer);
//   3. for every generating session whose whole context is now fed, samples
//      the next token from the logits of its last position (sampling.h:
//      per-session counter-based RNG), records it and checks the stop
//      conditions.
// The sampled token joins the context unfed; the next step feeds it (as a
// decode row, or with the next observation as part of a prefill row). A
// session that is not generating is prefilled up to, but not including, its
// last context token, so that start_turn always has a position left whose
// logits start the turn.
//
// Memory. The KV cache is paged (model/kv_cache.h): a session holds
// ceil(fed / block_size) blocks; kv_bytes_in_use() reports them. With
// max_kv_blocks > 0 the pool is capped and never overflows: when a step's
// rows need more blocks than are free, the engine preempts sessions
// (recompute-style, as vLLM does): first idle sessions (not generating,
// least recently active first), then generating sessions admitted after the
// one that needs room (newest first). A preempted session loses its KV blocks
// and its whole context is prefilled again when blocks are free; nothing
// else about it changes. Prefill rows that do not fit wait for a later step.
// Prefill of idle sessions (prompt appended, no turn started yet) is done
// ahead of time when blocks are free, but never evicts anyone.
// The context budget is clamped to the pool (max_kv_blocks * block_size), so
// a session alone always fits.
//
// Context budget. A context never exceeds EngineOptions::context_budget
// (default model.max_seq_len). When a prompt or a generated token would
// reach it, context_policy decides:
//   ContextEndEpisode: the turn ends with StopContextBudget and the episode
//     is over (episode_over(id); later start_turn calls finish at once).
//     A prompt that does not fit is not appended.
//   ContextTruncate: the context is cut to about truncate_keep_fraction of
//     the budget: the head (up to the end-of-turn closing the first user
//     message, i.e. system prompt + task statement) is kept, followed by the
//     newest tokens starting at a message boundary (a role header) where one
//     exists.
//     The KV cache of the session is dropped and the kept tokens are prefilled
//     again. The turn records context_truncated. When the head alone leaves
//     no room, the episode ends as with ContextEndEpisode.
//
// Policy versions. set_policy_version / swap_weights act between steps
// (the engine is single-threaded: call them from the thread that calls
// step()). Every generated token carries the version of the step that
// sampled it. By default the KV entries computed under older weights are
// kept (in-flight weight update, as PipelineRL does); recompute_kv_on_swap
// drops every session's KV so that everything after the swap is computed
// with the new weights only.
//
// Token layout. EngineOptions::format (text/episode_format.h) names the
// end-of-turn token a turn stops on, the bytes of each token that stop
// strings are matched on, the message boundaries and head that truncation
// keeps, and the id that pads rows; the default is the byte tokenizer's.
//
// Routing capture. For generated token i of a turn, expert_indices[i] is the
// routing (per MoE layer, k experts) of the position whose logits it was
// sampled from, i.e. of the token before it. context_routing(id) gives the
// routing of every fed context position, the input of routing replay. k is
// routing_top_k(): EngineOptions::moe_top_k, or the model's moe.top_k.
//
// Metrics (telemetry::metrics()): counters rollout.decode_tokens,
// rollout.prefill_tokens, rollout.preemptions, rollout.truncations; gauges
// rollout.batch_occupancy (rows in the step / live sessions),
// rollout.kv_bytes (KV bytes in use), rollout.kv_bytes_allocated;
// histogram rollout.step_latency_s.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "moerl/text/episode_format.h"
#include "moerl/model/kv_cache.h"
#include "moerl/model/policy.h"
#include "moerl/rollout/sampling.h"
#include "moerl/telemetry/expert_load.h"

namespace moerl::rollout {

enum class StopReason {
  StopNone,           // still generating
  StopEndOfTurn,      // the policy emitted the end-of-turn token
  StopString,         // a stop string appeared in the turn's decoded bytes
  StopMaxTurnTokens,  // StopParams::max_turn_tokens generated this turn
  StopEpisodeBudget,  // StopParams::max_episode_tokens generated this episode
  StopContextBudget,  // the context budget was reached (see ContextPolicy)
};
const char* stop_reason_name(StopReason reason);

struct StopParams {
  bool stop_on_eot = true;                // stop after emitting the end-of-turn token (kept in the turn)
  std::vector<std::string> stop_strings;  // matched on the decoded bytes of this turn
  std::int64_t max_turn_tokens = 256;     // 0 = unlimited (the context budget still applies)
  std::int64_t max_episode_tokens = 0;    // generated tokens over the episode; 0 = unlimited
};

enum class ContextPolicy { ContextEndEpisode, ContextTruncate };

struct EngineOptions {
  std::int64_t block_size = 16;         // KV positions per block
  std::int64_t initial_kv_blocks = 64;  // pool blocks allocated up front
  std::int64_t max_kv_blocks = 0;       // cap on pool blocks; 0 = unbounded
  std::int64_t context_budget = 0;      // 0 = model.max_seq_len (clamped to it and to the pool)
  ContextPolicy context_policy = ContextPolicy::ContextEndEpisode;
  double truncate_keep_fraction = 0.5;  // ContextTruncate: kept context <= this * budget
  std::int64_t max_step_tokens = 2048;  // prefill tokens per step (decode rows come on top)
  bool recompute_kv_on_swap = false;    // drop all KV on swap_weights
  // Deterministic mode ([run] deterministic): every row runs as a forward of
  // its own and max_step_tokens applies per session, so a session's logits
  // (and tokens) do not depend on which sessions share the step. Bitwise
  // reproducible as long as nothing is preempted (max_kv_blocks = 0).
  bool isolate_sessions = false;
  // Experts per token the policy routes to while this engine decodes
  // (rollout.moe_top_k): 0 = the model's moe.top_k. The engine sets it on
  // its policy (Policy::set_active_experts), the actor's inference copy,
  // when it is built: engines that share one policy share the setting too
  // (the last one built decides).
  std::int64_t moe_top_k = 0;
  // KV storage (rollout.kv_cache_dtype): Float, or Int8 (model/kv_cache.h).
  model::KVCacheDtype kv_cache_dtype = model::KVCacheDtype::Float;
  text::EpisodeFormat format;  // token layout (see above); default: the byte tokenizer
};

// One finished turn of a session.
struct GeneratedTurn {
  std::vector<std::int64_t> tokens;           // [n] generated token ids (the end-of-turn token included)
  std::vector<float> logprobs;                // [n] behaviour log-probs: sampling distribution used
  std::vector<float> model_logprobs;          // [n] raw model log-probs (temperature 1, unfiltered)
  torch::Tensor expert_indices;               // [n, moe_layers, k] int64 (k = routing_top_k()); undefined without MoE
  std::vector<std::int64_t> policy_versions;  // [n]
  StopReason stop_reason = StopReason::StopNone;
  bool episode_over = false;       // episode/context budget: the episode cannot continue
  bool context_truncated = false;  // the context was truncated before or during this turn
  std::int64_t preemptions = 0;    // times the session lost its KV during this turn
};

}  // namespace moerl::rollout

namespace moerl::comm {
class Communicator;
}  // namespace moerl::comm

namespace moerl::rollout {

class GenerationEngine {
 public:
  GenerationEngine(model::Policy policy, EngineOptions options = {});

  // ---- sessions ----
  void add_session(std::uint64_t id, std::uint64_t seed);
  void remove_session(std::uint64_t id);  // drops its KV and any untaken turn
  bool has_session(std::uint64_t id) const { return sessions_.count(id) != 0; }
  std::int64_t num_sessions() const { return static_cast<std::int64_t>(sessions_.size()); }

  // Appends tokens to the session's context (queued for prefill). Not while
  // the session is generating. May apply the context policy (see above).
  void append_prompt(std::uint64_t id, const std::vector<std::int64_t>& tokens);
  // Replaces the session's context with `tokens` (a caller's rebuilt one,
  // e.g. the actor's drop_oldest_turns): its KV and recorded routing are
  // dropped and the new context is prefilled by the next steps. Not while
  // generating. Counts rollout.truncations; the next turn records
  // context_truncated.
  void replace_context(std::uint64_t id, std::vector<std::int64_t> tokens);
  // The session generates from the end of its context until a stop condition.
  // Its previous turn must have been taken.
  void start_turn(std::uint64_t id, const SamplingParams& sampling, const StopParams& stop);
  // One engine iteration; returns the sessions whose turn finished (their
  // turns are ready for take_turn), in increasing id order.
  std::vector<std::uint64_t> step();
  // The finished turn; throws when the session has none ready.
  GeneratedTurn take_turn(std::uint64_t id);

  bool is_generating(std::uint64_t id) const;
  bool turn_ready(std::uint64_t id) const;
  bool episode_over(std::uint64_t id) const;
  // Any generating session, any turn finished outside step(), or unfed idle
  // context while KV blocks are free: `while (has_work()) step();` ends.
  bool has_work() const;
  const std::vector<std::int64_t>& context(std::uint64_t id) const;  // current (kept) context
  std::int64_t fed_length(std::uint64_t id) const;                   // positions in the KV cache
  torch::Tensor context_routing(std::uint64_t id) const;             // [fed, moe_layers, routing_top_k()] int64
  // Experts per token of the recorded routing: the policy's active experts; 0 without MoE layers.
  std::int64_t routing_top_k() const { return top_k_; }

  // ---- expert parallelism ----
  // The policy's experts are split over `group`'s members (one engine each,
  // each with its own sessions): every step() then agrees with the others
  // how many forwards the step runs (one all-reduce) and runs the ones it has
  // no rows for as Policy::idle_expert_pass, so the MoE layers' exchanges
  // stay matched. The caller must call step() on every member together;
  // the agreement waits at most timeout_s.
  void set_expert_lockstep(comm::Communicator* group, double timeout_s) {
    lockstep_ = group;
    lockstep_timeout_s_ = timeout_s;
  }

  // ---- weights ----
  void set_policy_version(std::int64_t version) { policy_version_ = version; }
  std::int64_t policy_version() const { return policy_version_; }
  // Copies new_params (in policy->parameters() order, same shapes) into the
  // policy in place and sets the version. Validates everything before
  // copying anything.
  void swap_weights(const std::vector<torch::Tensor>& new_params, std::int64_t version);

  // ---- memory ----
  std::int64_t kv_bytes_in_use() const { return cache_.used_bytes(); }
  std::int64_t kv_bytes_allocated() const { return cache_.memory_bytes(); }
  std::int64_t kv_blocks_in_use() const { return cache_.blocks_in_use(); }
  std::int64_t context_budget() const { return budget_; }
  model::KVCacheDtype kv_cache_dtype() const { return cache_.dtype(); }
  const EngineOptions& options() const { return options_; }
  model::Policy& policy() { return policy_; }

 private:
  // The most forwards any member of the lockstep group runs this step (`mine` without one).
  std::int64_t agree_forwards(std::int64_t mine);
  comm::Communicator* lockstep_ = nullptr;
  double lockstep_timeout_s_ = 60;
  struct Session {
    std::uint64_t id = 0;
    std::uint64_t seed = 0;
    std::int64_t admit_order = 0;
    std::vector<std::int64_t> context;  // tokens of the current context
    std::int64_t fed = 0;               // context tokens in the KV cache
    model::SequenceId kv = -1;          // KV sequence; -1 = none (new or preempted)
    std::vector<std::int64_t> routing;  // [fed * moe_layers * top_k] routing of the fed positions
    std::uint64_t draws = 0;            // tokens sampled this episode: the RNG counter
    std::int64_t episode_tokens = 0;
    std::int64_t last_active_step = 0;
    bool generating = false;
    bool ready = false;  // a finished turn waits for take_turn
    bool over = false;   // the episode cannot continue
    bool truncated_since_turn = false;
    StopReason over_reason = StopReason::StopNone;
    SamplingParams sampling;
    StopParams stop;
    GeneratedTurn turn;
    std::vector<std::int64_t> turn_routing;  // [n * moe_layers * top_k]
    std::string turn_text;                   // decoded bytes of this turn (stop strings)
  };
  struct Row {
    Session* session = nullptr;
    std::int64_t count = 0;  // tokens fed in this row
  };

  Session& get(std::uint64_t id);
  const Session& get(std::uint64_t id) const;
  std::int64_t feed_target(const Session& s) const;  // context tokens that should be fed now
  void release_kv(Session& s);
  bool truncate_context(Session& s);  // false: the head leaves no room
  // The one way a context is cut or replaced: KV dropped, the next turn flagged context_truncated.
  void reset_context(Session& s, std::vector<std::int64_t> tokens);
  void check_vocabulary(const std::vector<std::int64_t>& tokens, const char* what) const;  // throws naming `what`
  void finish_turn(Session& s, StopReason reason, std::vector<std::uint64_t>& finished);
  void end_episode(Session& s, StopReason reason);
  std::vector<Row> schedule();
  Session* pick_victim(const Session& needy, const std::vector<Row>& rows);
  void run_rows(const std::vector<Row>& rows, std::vector<std::uint64_t>& finished);
  // The next token of every row that samples this step (others: default).
  std::vector<SampledToken> sample_rows(const std::vector<Row>& rows, const torch::Tensor& logits) const;
  // Appends a row's sampled token to its session and ends the turn or the
  // episode where a stop condition says so.
  void take_sampled(Session& s, const SampledToken& tok, const std::int64_t* routing,
                    std::vector<std::uint64_t>& finished);

  model::Policy policy_;
  EngineOptions options_;
  model::KVCache cache_;
  std::int64_t budget_ = 0;
  std::int64_t moe_layers_ = 0;
  std::int64_t top_k_ = 0;
  std::int64_t vocab_ = 0;
  std::int64_t policy_version_ = 0;
  std::int64_t step_count_ = 0;
  // Expert load of the forwards since it was last recorded (every
  // kExpertLoadEverySteps engine steps: one gauge per expert and layer is
  // too many to set on every decode step of a large model).
  telemetry::ExpertLoad expert_load_;
  static constexpr std::int64_t kExpertLoadEverySteps = 64;
  std::int64_t admit_counter_ = 0;
  std::map<std::uint64_t, Session> sessions_;  // ordered: deterministic iteration
  std::vector<std::uint64_t> finished_early_;  // turns finished outside step() (start_turn)
};

}  // namespace moerl::rollout
