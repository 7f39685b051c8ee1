#pragma once
// A configurable chat layout for multi-turn episodes with a BPE tokenizer
// (ChatML for Qwen, the Llama-3 header layout, ...), rendering a
// conversation into tokens and the assistant mask with the same rule as
// render_chat() of the byte tokenizer (moerl/text/tokenizer.h): the mask is
// 1 exactly on the assistant's content tokens and its closing end-of-turn
// token, which the policy generates; everything else is context (0).
//
// Every message is rendered from the `message` template: the text before
// {content} (with {role} replaced) is the header, then the content, then the
// end-of-turn token, then the rest of the template (e.g. "\n"). The three
// parts are encoded separately, as generation sees them: the framework
// writes the header, the policy continues from there. Headers and `begin`
// may contain special tokens; content never does (a "<|im_end|>" typed by a
// user or environment is plain text).

#include <cstdint>
#include <string>
#include <vector>

#include "moerl/core/error.h"
#include "moerl/text/bpe_tokenizer.h"
#include "moerl/text/tokenizer.h"

namespace moerl::text {

// A layout that does not fit its tokenizer. field() names the ChatLayout
// member at fault ("message", "end_of_turn"), so that a caller can point at
// the configuration key that set it.
class ChatLayoutError : public Error {
 public:
  ChatLayoutError(std::string field, const std::string& message) : Error(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

struct ChatLayout {
  std::string begin;  // written once before the first message, e.g. "<|begin_of_text|>"
  std::string message = "<|im_start|>{role}\n{content}<|im_end|>\n";
  std::string system_role = "system";
  std::string user_role = "user";
  std::string assistant_role = "assistant";
  std::string end_of_turn = "<|im_end|>";  // one token; `message` continues {content} with it

  static ChatLayout chatml() { return {}; }
  static ChatLayout llama3();
};

class ChatRenderer {
 public:
  // Validates the layout against the tokenizer; throws ChatLayoutError
  // naming the layout field at fault.
  ChatRenderer(BpeTokenizer tokenizer, ChatLayout layout);

  RenderedChat render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = false) const;

  std::int64_t end_of_turn_id() const { return end_of_turn_id_; }
  // The assistant header: what the framework writes before the policy's turn.
  const std::vector<std::int64_t>& generation_prompt() const { return headers_[2]; }
  // The parts render() writes: `begin` once, then per message the header,
  // the content, the end-of-turn token and the trailer (e.g. ChatML's "\n").
  const std::vector<std::int64_t>& begin() const { return begin_; }
  const std::vector<std::int64_t>& header(Role role) const { return headers_[role_index(role)]; }
  const std::vector<std::int64_t>& trailer(Role role) const { return trailers_[role_index(role)]; }
  const BpeTokenizer& tokenizer() const { return tokenizer_; }
  const ChatLayout& layout() const { return layout_; }

 private:
  static int role_index(Role role) { return role == Role::RoleSystem ? 0 : role == Role::RoleUser ? 1 : 2; }

  BpeTokenizer tokenizer_;
  ChatLayout layout_;
  std::vector<std::int64_t> begin_;
  std::vector<std::int64_t> headers_[3];   // [system, user, assistant]
  std::vector<std::int64_t> trailers_[3];  // after the end-of-turn token
  std::int64_t end_of_turn_id_ = -1;
};

}  // namespace moerl::text
