#pragma once
// EpisodeFormat: how the tokens of one multi-turn RL episode are laid out,
// for whichever tokenizer the policy uses. The actor builds episodes with it,
// the generation engine ends turns, matches stop strings, truncates contexts
// and pads rows with it, and the configuration checks a run's [chat] section
// by building one.
//
// Two layouts, one rule (that of render_chat() and ChatRenderer::render()):
//   byte   the built-in byte tokenizer and its chat layout (tokenizer.h),
//          token for token what render_chat() writes;
//   chat   a Hugging Face tokenizer.json (BpeTokenizer) with a ChatLayout
//          (chat_layout.h: ChatML, Llama-3, or one set in [chat]).
// An episode, as the actor feeds and samples it:
//
//   begin  user-header obs <eot> user-trailer  assistant-header | action <eot> |
//          assistant-trailer  user-header obs <eot> user-trailer  assistant-header | action <eot> | ...
//
// The policy generates the action and its end-of-turn token (mask 1, between
// the bars); everything else is context that the actor feeds (mask 0). The
// assistant trailer (ChatML's "\n" after <|im_end|>) is context too: it is
// fed with the next observation. An action cut off by max_tokens_per_turn
// before its end-of-turn is closed by the framework, which then feeds the
// end-of-turn token as context. The episode ends after the last action's
// end-of-turn; that action's trailer is never fed (nothing follows it), so a
// finished episode is render() of its messages without the last trailer.
//
// Configuration ([chat], config/sections.h; checked when the config loads):
//   layout       "auto" (byte for the built-in model, chatml for hf:DIR),
//                "byte", "chatml" or "llama3"
//   tokenizer    the tokenizer.json of the chat layouts; "" = DIR/tokenizer.json
//                of [model] source = "hf:DIR"
//   begin, message, end_of_turn, system_role, user_role, assistant_role
//                override the preset's ChatLayout field of that name ("" keeps
//                the preset's); the byte layout has none to override.
// The tokenizer's ids must fit the model's vocabulary, and the byte layout
// needs a vocabulary of at least 264.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moerl/config/sections.h"
#include "moerl/core/error.h"
#include "moerl/text/chat_layout.h"

namespace moerl::text {

// A [chat] (or [model]) setting that gives no usable format; key() is the
// configuration key at fault ("chat.end_of_turn", "model.vocab_size", ...).
class EpisodeFormatError : public Error {
 public:
  EpisodeFormatError(std::string key, const std::string& message) : Error(message), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

class EpisodeFormat {
 public:
  EpisodeFormat();  // the byte layout
  // A BPE tokenizer with a chat layout; tokenizer_name (its file) is for the description.
  explicit EpisodeFormat(const ChatRenderer& chat, const std::string& tokenizer_name = "");

  bool is_byte() const;
  // "byte tokenizer" or "chat layout '<|im_start|>{role}\n...' with tokenizer PATH", for logs.
  const std::string& description() const;

  // The tokens the actor feeds before a turn of the policy: the episode's
  // begin when `first`; else the end-of-turn token when the previous action
  // was cut off before it, and the assistant trailer; then the observation
  // as a user message and the assistant header.
  std::vector<std::int64_t> prompt_turn(std::string_view observation, bool first, bool previous_cut_off) const;

  std::int64_t end_of_turn_id() const;
  // Fills unused positions of padded rows (never attended to; any id of the
  // vocabulary would do): <|pad|> for the byte layout, the end-of-turn token
  // for chat layouts.
  std::int64_t pad_id() const;
  // One past the largest id the tokenizer uses.
  std::int64_t vocab_size() const;

  // The bytes a generated token adds to the action text and to the text stop
  // strings are matched on: "" for special tokens and for ids the tokenizer
  // does not have.
  std::string token_bytes(std::int64_t id) const;
  std::string action_text(const std::vector<std::int64_t>& ids) const;
  // Every token as text, special ones by name ("<|im_start|>"), unknown ids
  // as "<|id N|>": the actor's debug dump of an episode.
  std::string debug_text(const std::vector<std::int32_t>& ids) const;

  // Whether a message (its header) starts at a token with this id: the
  // boundaries context truncation cuts at.
  bool starts_message(std::int64_t id) const;
  // Length of the head that context truncation keeps: up to the end of the
  // first user message (its end-of-turn token and trailer), i.e. the system
  // prompt and the task statement; 0 when the context has no complete user
  // message.
  std::int64_t head_length(const std::vector<std::int64_t>& context) const;

  struct Impl;  // defined in episode_format.cpp; immutable once built

 private:
  std::shared_ptr<const Impl> impl_;  // shared: copies are cheap
};

// The format of a run's policy from [model] and [chat] (see above). Throws
// EpisodeFormatError naming the key at fault (and the files involved) for a
// layout that does not fit the model or its tokenizer.
EpisodeFormat make_episode_format(const config::ModelSection& model, const config::ChatSection& chat);

// Whether layout "auto" finds no layout: an hf: source without
// tokenizer.json (and no chat.tokenizer). Such a configuration loads, since
// commands like `moerl eval --tokens` render no episode; make_episode_format
// throws for it, naming chat.layout.
bool episode_format_undecided(const config::ModelSection& model, const config::ChatSection& chat);

}  // namespace moerl::text
