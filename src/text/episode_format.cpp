#include "moerl/text/episode_format.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "moerl/hf/hf_config.h"
#include "moerl/text/tokenizer.h"

namespace moerl::text {

struct EpisodeFormat::Impl {
  std::optional<BpeTokenizer> tokenizer;  // none: the byte tokenizer
  std::string description;
  std::vector<std::int64_t> begin;
  std::vector<std::int64_t> headers[3];   // [system, user, assistant]
  std::vector<std::int64_t> trailers[3];  // after the end-of-turn token
  std::int64_t end_of_turn = -1;
  std::int64_t pad = -1;
  std::vector<std::int64_t> message_starts;  // first token of each non-empty header

  const std::vector<std::int64_t>& user_header() const { return headers[1]; }
  std::vector<std::int64_t> encode_content(std::string_view text) const {
    // Content never holds special tokens: "<|im_end|>" in an observation is text.
    return tokenizer ? tokenizer->encode(text, /*allow_special=*/false) : ByteTokenizer().encode(text);
  }
};

namespace {

std::shared_ptr<const EpisodeFormat::Impl> byte_impl() {
  static const std::shared_ptr<const EpisodeFormat::Impl> impl = [] {
    auto made = std::make_shared<EpisodeFormat::Impl>();
    made->description = "byte tokenizer";
    made->begin = {SpecialTokens::kBos};
    made->headers[0] = {SpecialTokens::kSystem};
    made->headers[1] = {SpecialTokens::kUser};
    made->headers[2] = {SpecialTokens::kAssistant};
    made->end_of_turn = SpecialTokens::kEndOfTurn;
    made->pad = SpecialTokens::kPad;
    made->message_starts = {SpecialTokens::kSystem, SpecialTokens::kUser, SpecialTokens::kAssistant};
    return made;
  }();
  return impl;
}

std::string escape_newlines(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

void append(std::vector<std::int64_t>& out, const std::vector<std::int64_t>& ids) {
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace

EpisodeFormat::EpisodeFormat() : impl_(byte_impl()) {}

EpisodeFormat::EpisodeFormat(const ChatRenderer& chat, const std::string& tokenizer_name) {
  auto impl = std::make_shared<Impl>();
  impl->tokenizer = chat.tokenizer();
  impl->description = "chat layout '" + escape_newlines(chat.layout().message) + "'";
  if (!tokenizer_name.empty()) impl->description += " with tokenizer " + tokenizer_name;
  impl->begin = chat.begin();
  const Role roles[3] = {Role::RoleSystem, Role::RoleUser, Role::RoleAssistant};
  for (int r = 0; r < 3; ++r) {
    impl->headers[r] = chat.header(roles[r]);
    impl->trailers[r] = chat.trailer(roles[r]);
    if (!impl->headers[r].empty()) impl->message_starts.push_back(impl->headers[r].front());
  }
  impl->end_of_turn = chat.end_of_turn_id();
  impl->pad = impl->end_of_turn;
  impl_ = std::move(impl);
}

bool EpisodeFormat::is_byte() const { return !impl_->tokenizer; }

const std::string& EpisodeFormat::description() const { return impl_->description; }

std::vector<std::int64_t> EpisodeFormat::prompt_turn(std::string_view observation, bool first,
                                                     bool previous_cut_off) const {
  const Impl& f = *impl_;
  std::vector<std::int64_t> prompt;
  if (first) {
    append(prompt, f.begin);
  } else {
    // A turn cut off by max_tokens_per_turn is closed here, as a fed token.
    if (previous_cut_off) prompt.push_back(f.end_of_turn);
    append(prompt, f.trailers[2]);
  }
  append(prompt, f.user_header());
  append(prompt, f.encode_content(observation));
  prompt.push_back(f.end_of_turn);
  append(prompt, f.trailers[1]);
  append(prompt, f.headers[2]);
  return prompt;
}

std::int64_t EpisodeFormat::end_of_turn_id() const { return impl_->end_of_turn; }

std::int64_t EpisodeFormat::pad_id() const { return impl_->pad; }

std::int64_t EpisodeFormat::vocab_size() const {
  return impl_->tokenizer ? impl_->tokenizer->vocab_size() : ByteTokenizer::kVocabSize;
}

std::string EpisodeFormat::token_bytes(std::int64_t id) const {
  if (!impl_->tokenizer) {
    return id >= 0 && id < 256 ? std::string(1, static_cast<char>(static_cast<unsigned char>(id))) : std::string();
  }
  const BpeTokenizer& tokenizer = *impl_->tokenizer;
  if (!tokenizer.has_id(id) || tokenizer.is_special(id)) return {};
  return tokenizer.decode({id});
}

std::string EpisodeFormat::action_text(const std::vector<std::int64_t>& ids) const {
  std::string text;
  for (std::int64_t id : ids) text += token_bytes(id);
  return text;
}

std::string EpisodeFormat::debug_text(const std::vector<std::int32_t>& ids) const {
  std::string text;
  for (std::int32_t id : ids) {
    if (impl_->tokenizer ? impl_->tokenizer->has_id(id) : id >= 0 && id < ByteTokenizer::kVocabSize) {
      text += impl_->tokenizer ? impl_->tokenizer->decode({id}) : ByteTokenizer().decode({id}, /*skip_special=*/false);
    } else {
      text += "<|id " + std::to_string(id) + "|>";
    }
  }
  return text;
}

bool EpisodeFormat::starts_message(std::int64_t id) const {
  const std::vector<std::int64_t>& starts = impl_->message_starts;
  return std::find(starts.begin(), starts.end(), id) != starts.end();
}

std::int64_t EpisodeFormat::head_length(const std::vector<std::int64_t>& context) const {
  const Impl& f = *impl_;
  const auto user = std::search(context.begin(), context.end(), f.user_header().begin(), f.user_header().end());
  if (user == context.end()) return 0;
  const auto eot = std::find(user, context.end(), f.end_of_turn);
  if (eot == context.end()) return 0;
  auto end = eot + 1;
  const std::vector<std::int64_t>& trailer = f.trailers[1];
  if (static_cast<std::size_t>(context.end() - end) >= trailer.size() &&
      std::equal(trailer.begin(), trailer.end(), end))
    end += static_cast<std::ptrdiff_t>(trailer.size());
  return static_cast<std::int64_t>(end - context.begin());
}

// ---------------------------------------------------------------------------
// From the run configuration

namespace {

namespace fs = std::filesystem;
using config::ChatLayoutPreset;

struct Override {
  const char* key;
  const std::string* value;
  std::string ChatLayout::*field;
};

std::vector<Override> overrides_of(const config::ChatSection& chat) {
  return {{"begin", &chat.begin, &ChatLayout::begin},
          {"message", &chat.message, &ChatLayout::message},
          {"end_of_turn", &chat.end_of_turn, &ChatLayout::end_of_turn},
          {"system_role", &chat.system_role, &ChatLayout::system_role},
          {"user_role", &chat.user_role, &ChatLayout::user_role},
          {"assistant_role", &chat.assistant_role, &ChatLayout::assistant_role}};
}

const char* preset_name(ChatLayoutPreset preset) {
  switch (preset) {
    case ChatLayoutPreset::Auto: return "auto";
    case ChatLayoutPreset::Byte: return "byte";
    case ChatLayoutPreset::ChatMl: return "chatml";
    case ChatLayoutPreset::Llama3: return "llama3";
  }
  return "?";
}

EpisodeFormat byte_format(const config::ModelSection& model, const config::ChatSection& chat, const std::string& dir) {
  for (const Override& o : overrides_of(chat)) {
    if (!o.value->empty())
      throw EpisodeFormatError(std::string("chat.") + o.key,
                               "the byte layout is fixed; layout overrides apply to the chatml and llama3 layouts");
  }
  if (!chat.tokenizer.empty())
    throw EpisodeFormatError("chat.tokenizer", "the byte layout takes no tokenizer file (layout = \"" +
                                                   std::string(preset_name(chat.layout)) +
                                                   "\"); set chat.layout = \"chatml\" or \"llama3\" to use it");
  if (model.vocab_size < ByteTokenizer::kVocabSize) {
    const std::string where = dir.empty() ? "" : " (" + (fs::path(dir) / "config.json").string() + ")";
    throw EpisodeFormatError(
        dir.empty() ? "model.vocab_size" : "chat.layout",
        "the byte layout needs a vocabulary of at least " + std::to_string(ByteTokenizer::kVocabSize) +
            " ids (256 bytes and 8 special tokens), the model has " + std::to_string(model.vocab_size) + where);
  }
  return EpisodeFormat();
}

EpisodeFormat chat_format(const config::ModelSection& model, const config::ChatSection& chat, ChatLayoutPreset preset,
                          const std::string& dir) {
  const std::string name = preset_name(preset);
  if (chat.tokenizer.empty() && dir.empty())
    throw EpisodeFormatError("chat.layout", "the " + name +
                                                " layout needs a tokenizer: set [model] source = \"hf:DIR\" (its "
                                                "tokenizer.json) or chat.tokenizer, or use chat.layout = \"byte\"");
  const std::string tokenizer_key = chat.tokenizer.empty() ? "model.source" : "chat.tokenizer";
  const std::string path = chat.tokenizer.empty() ? (fs::path(dir) / "tokenizer.json").string() : chat.tokenizer;
  if (!fs::exists(path))
    throw EpisodeFormatError(tokenizer_key, path + " does not exist; the " + name +
                                                " layout needs the model's tokenizer (set chat.tokenizer, or "
                                                "chat.layout = \"byte\")");
  std::optional<BpeTokenizer> tokenizer;
  try {
    tokenizer = BpeTokenizer::from_file(path);
  } catch (const Error& error) {
    throw EpisodeFormatError(tokenizer_key, error.what());
  }
  const std::string model_vocab =
      dir.empty() ? "model.vocab_size" : (fs::path(dir) / "config.json").string() + " vocab_size";
  if (tokenizer->vocab_size() > model.vocab_size)
    throw EpisodeFormatError(tokenizer_key, "tokenizer " + path + " has ids up to " +
                                                std::to_string(tokenizer->vocab_size() - 1) +
                                                ", beyond the model's vocabulary (" + model_vocab + " = " +
                                                std::to_string(model.vocab_size) + ")");
  ChatLayout layout = preset == ChatLayoutPreset::Llama3 ? ChatLayout::llama3() : ChatLayout::chatml();
  for (const Override& o : overrides_of(chat))
    if (!o.value->empty()) layout.*o.field = *o.value;
  try {
    return EpisodeFormat(ChatRenderer(*tokenizer, layout), path);
  } catch (const ChatLayoutError& error) {
    throw EpisodeFormatError("chat." + error.field(),
                             std::string(error.what()) + " (layout " + name + ", tokenizer " + path + ")");
  }
}

}  // namespace

bool episode_format_undecided(const config::ModelSection& model, const config::ChatSection& chat) {
  const std::string dir = hf::hf_directory(model.source);
  return chat.layout == ChatLayoutPreset::Auto && !dir.empty() && chat.tokenizer.empty() &&
         !fs::exists(fs::path(dir) / "tokenizer.json");
}

EpisodeFormat make_episode_format(const config::ModelSection& model, const config::ChatSection& chat) {
  const std::string dir = hf::hf_directory(model.source);
  ChatLayoutPreset preset = chat.layout;
  if (preset == ChatLayoutPreset::Auto) {
    if (episode_format_undecided(model, chat))
      throw EpisodeFormatError("chat.layout", "layout \"auto\" is chatml for an hf: source, but " + dir +
                                                  " has no tokenizer.json: set chat.tokenizer, or chat.layout = "
                                                  "\"byte\" for a model with the byte vocabulary");
    preset = dir.empty() ? ChatLayoutPreset::Byte : ChatLayoutPreset::ChatMl;
  }
  if (preset == ChatLayoutPreset::Byte) return byte_format(model, chat, dir);
  return chat_format(model, chat, preset, dir);
}

}  // namespace moerl::text
