#include "moerl/text/chat_layout.h"

#include "moerl/core/error.h"

namespace moerl::text {

namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

[[noreturn]] void layout_error(const std::string& field, const std::string& what) {
  throw ChatLayoutError(field, "chat layout: " + field + ": " + what);
}

}  // namespace

ChatLayout ChatLayout::llama3() {
  ChatLayout layout;
  layout.begin = "<|begin_of_text|>";
  layout.message = "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>";
  layout.end_of_turn = "<|eot_id|>";
  return layout;
}

ChatRenderer::ChatRenderer(BpeTokenizer tokenizer, ChatLayout layout)
    : tokenizer_(std::move(tokenizer)), layout_(std::move(layout)) {
  const std::string& message = layout_.message;
  const std::size_t content = message.find("{content}");
  if (content == std::string::npos || message.find("{content}", content + 1) != std::string::npos) {
    layout_error("message", "needs exactly one {content}, got '" + message + "'");
  }
  const std::optional<std::int64_t> eot = tokenizer_.token_id(layout_.end_of_turn);
  if (!eot || tokenizer_.encode(layout_.end_of_turn) != std::vector<std::int64_t>{*eot}) {
    layout_error("end_of_turn", "'" + layout_.end_of_turn + "' is not a single token of the tokenizer");
  }
  end_of_turn_id_ = *eot;
  const std::string after = message.substr(content + 9);
  if (after.compare(0, layout_.end_of_turn.size(), layout_.end_of_turn) != 0) {
    layout_error("message", "{content} must be followed by the end_of_turn token '" + layout_.end_of_turn + "', got '" +
                                message + "'");
  }
  const std::string roles[3] = {layout_.system_role, layout_.user_role, layout_.assistant_role};
  for (int r = 0; r < 3; ++r) {
    headers_[r] = tokenizer_.encode(replace_all(message.substr(0, content), "{role}", roles[r]));
    trailers_[r] = tokenizer_.encode(replace_all(after.substr(layout_.end_of_turn.size()), "{role}", roles[r]));
  }
  begin_ = tokenizer_.encode(layout_.begin);
}

RenderedChat ChatRenderer::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  RenderedChat out;
  const auto append = [&out](const std::vector<std::int64_t>& ids, bool generated) {
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    out.assistant_mask.insert(out.assistant_mask.end(), ids.size(), generated ? 1 : 0);
  };
  append(begin_, false);
  for (const ChatMessage& message : messages) {
    const int r = role_index(message.role);
    const bool generated = message.role == Role::RoleAssistant;
    append(headers_[r], false);  // the header is prompt, not action
    append(tokenizer_.encode(message.content, /*allow_special=*/false), generated);
    append({end_of_turn_id_}, generated);  // the policy closes its own turn
    append(trailers_[r], false);
  }
  if (add_generation_prompt) append(headers_[2], false);
  return out;
}

}  // namespace moerl::text
