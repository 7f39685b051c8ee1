#include "moerl/text/tokenizer.h"

#include "moerl/core/check.h"

namespace moerl::text {

std::vector<std::int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<std::int64_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<std::int64_t>(static_cast<unsigned char>(c)));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<std::int64_t>& ids, bool skip_special) const {
  std::string out;
  out.reserve(ids.size());
  for (std::int64_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (is_special(id)) {
      if (!skip_special) out += special_name(id);
    } else {
      MOERL_CHECK(false, "token id " + std::to_string(id) + " is outside the byte vocabulary [0, " +
                             std::to_string(kVocabSize) + ")");
    }
  }
  return out;
}

std::string ByteTokenizer::special_name(std::int64_t id) {
  switch (id) {
    case SpecialTokens::kBos: return "<|bos|>";
    case SpecialTokens::kEos: return "<|eos|>";
    case SpecialTokens::kPad: return "<|pad|>";
    case SpecialTokens::kSystem: return "<|system|>";
    case SpecialTokens::kUser: return "<|user|>";
    case SpecialTokens::kAssistant: return "<|assistant|>";
    case SpecialTokens::kEndOfTurn: return "<|eot|>";
    case SpecialTokens::kReserved: return "<|reserved|>";
    default: break;
  }
  MOERL_CHECK(false, "token id " + std::to_string(id) + " is not a special token");
  return {};
}

std::int64_t ByteTokenizer::role_token(Role role) {
  switch (role) {
    case Role::RoleSystem: return SpecialTokens::kSystem;
    case Role::RoleUser: return SpecialTokens::kUser;
    case Role::RoleAssistant: return SpecialTokens::kAssistant;
  }
  return SpecialTokens::kUser;
}

RenderedChat render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  RenderedChat out;
  auto push = [&out](std::int64_t id, bool generated) {
    out.tokens.push_back(id);
    out.assistant_mask.push_back(generated ? 1 : 0);
  };
  push(SpecialTokens::kBos, false);
  for (const ChatMessage& message : messages) {
    const bool generated = message.role == Role::RoleAssistant;
    push(ByteTokenizer::role_token(message.role), false);  // the header is prompt, not action
    for (char c : message.content) {
      push(static_cast<std::int64_t>(static_cast<unsigned char>(c)), generated);
    }
    push(SpecialTokens::kEndOfTurn, generated);  // the policy closes its own turn
  }
  if (add_generation_prompt) push(SpecialTokens::kAssistant, false);
  return out;
}

}  // namespace moerl::text
