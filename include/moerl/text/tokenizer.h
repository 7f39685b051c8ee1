#pragma once
// Byte-level tokenizer and the chat layout of multi-turn episodes.
//
// Token ids 0..255 are the raw byte values, so any byte string (UTF-8 or not,
// NUL included) round-trips exactly. Ids 256..263 are special tokens; the
// vocabulary therefore has 264 entries, matching ModelSection::vocab_size.
//
// Chat layout (one episode, rendered by render_chat):
//
//   <|bos|> <|system|> text <|eot|> <|user|> obs <|eot|> <|assistant|> action <|eot|>
//           <|user|> obs <|eot|> <|assistant|> action <|eot|> ...
//
// Every message is `role-token content-bytes <|eot|>`. The role header of an
// assistant turn is written by the framework (it is part of the prompt); the
// content bytes and the closing <|eot|> are what the policy generates, and the
// policy ends its turn by emitting <|eot|>. The assistant mask is therefore 1
// exactly on the assistant content bytes and their closing <|eot|>.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moerl::text {

// The special token ids. Kept as plain constants so that other modules (the
// rollout stop condition, the learner's masks) can use them without a
// Tokenizer object.
struct SpecialTokens {
  static constexpr std::int64_t kBos = 256;        // begin of an episode
  static constexpr std::int64_t kEos = 257;        // end of an episode
  static constexpr std::int64_t kPad = 258;        // padding; never attended to
  static constexpr std::int64_t kSystem = 259;     // role header: system prompt
  static constexpr std::int64_t kUser = 260;       // role header: user / environment observation
  static constexpr std::int64_t kAssistant = 261;  // role header: policy action
  static constexpr std::int64_t kEndOfTurn = 262;  // closes every message
  static constexpr std::int64_t kReserved = 263;   // unused; keeps the vocabulary at 264
  static constexpr std::int64_t kFirst = kBos;
  static constexpr std::int64_t kCount = 8;
};

enum class Role { RoleSystem, RoleUser, RoleAssistant };

struct ChatMessage {
  Role role = Role::RoleUser;
  std::string content;  // raw bytes; any value 0x00..0xFF is allowed
};

// A rendered conversation: token ids and, per token, whether the policy
// generated it (1) or it is context (0). Both vectors have the same length.
struct RenderedChat {
  std::vector<std::int64_t> tokens;
  std::vector<std::uint8_t> assistant_mask;
};

class ByteTokenizer {
 public:
  static constexpr std::int64_t kVocabSize = 256 + SpecialTokens::kCount;

  std::int64_t vocab_size() const { return kVocabSize; }

  // One id per byte; no special tokens are added.
  std::vector<std::int64_t> encode(std::string_view text) const;

  // Bytes back. Special tokens are dropped when skip_special is true, else
  // written as their names (e.g. "<|user|>"). Ids outside the vocabulary throw.
  std::string decode(const std::vector<std::int64_t>& ids, bool skip_special = true) const;

  static bool is_special(std::int64_t id) { return id >= SpecialTokens::kFirst && id < kVocabSize; }
  // "<|bos|>", "<|eot|>", ... for special ids; throws for other ids.
  static std::string special_name(std::int64_t id);
  static std::int64_t role_token(Role role);
};

// Renders a conversation in the chat layout above. With
// add_generation_prompt the assistant role header is appended at the end
// (mask 0), ready for the policy to continue. <|bos|> starts the rendering;
// no <|eos|> is appended (the rollout adds it when the episode ends).
RenderedChat render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt = false);

}  // namespace moerl::text
